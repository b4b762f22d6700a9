"""What a cancel of a run does: the definition's ``cancel`` object.

``cancel: {"compensate": true | false, "interruptCalls": true | false}`` (top level, optional;
docs/workflows.md *Workflow keys*):

- ``compensate`` is the default of ``cancel-job``'s ``compensate``: whether the compensation
  steps of the succeeded steps of a cancelled graph run are called. Absent, true (as before the
  key existed). The operator's ``compensate`` on the cancel request wins over it.
- ``interruptCalls``: a cancel stops the call in flight of a step without an external effect at
  once (the service sees its call cancelled) instead of letting it finish. Absent, false: such
  a call is made as a gRPC future, which costs about 0.25 ms more CPU per call than the
  blocking call (docs/worker.md), so a workflow pays it only when it asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protomolt_jobs.workflow.types import Finding

__all__ = ["FINDING_KIND", "compensates", "findings", "interrupts_calls"]

#: The ``kind`` of the findings this module makes.
FINDING_KIND = "cancel"


def findings(obj: Any) -> list[Finding]:
    """Findings for a malformed ``cancel`` object of the definition ``obj`` (none when absent).

    :returns: a ``cancel`` finding when ``cancel`` is not an object or ``cancel.compensate``
        is present and not a boolean.
    """
    if not isinstance(obj, Mapping) or "cancel" not in obj:
        return []
    value = obj["cancel"]
    if not isinstance(value, Mapping):
        return [Finding("", FINDING_KIND, "'cancel' must be an object such as {compensate: false}")]
    return [
        Finding("", FINDING_KIND, f"'cancel.{key}' must be a boolean")
        for key in ("compensate", "interruptCalls")
        if key in value and not isinstance(value[key], bool)
    ]


def interrupts_calls(definition: Any) -> bool:
    """Whether a cancel stops the calls in flight (``cancel.interruptCalls``; absent: False).

    :param definition: the stored definition (a JSON object).
    """
    cancel = definition.get("cancel") if isinstance(definition, Mapping) else None
    value = cancel.get("interruptCalls") if isinstance(cancel, Mapping) else None
    return value is True


def compensates(definition: Any, requested: Any = None) -> bool:
    """Whether a cancel runs the compensation steps.

    :param definition: the stored definition (a JSON object).
    :param requested: the cancel request's ``compensate`` (True, False, or None: the
        workflow's default).
    :returns: ``requested`` when it is a boolean, else the definition's
        ``cancel.compensate`` when it is a boolean, else True.
    """
    if isinstance(requested, bool):
        return requested
    cancel = definition.get("cancel") if isinstance(definition, Mapping) else None
    default = cancel.get("compensate") if isinstance(cancel, Mapping) else None
    return default if isinstance(default, bool) else True
