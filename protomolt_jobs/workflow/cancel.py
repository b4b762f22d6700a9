"""What a cancel of a run does with its compensations: the definition's ``cancel`` object.

``cancel: {"compensate": true | false}`` (top level, optional; docs/workflows.md *Workflow keys*) is the
default of ``cancel-job``'s ``compensate``: whether the compensation steps of the succeeded
steps of a cancelled graph run are called. Absent, true (as before the key existed). The
operator's ``compensate`` on the cancel request wins over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protomolt_jobs.workflow.types import Finding

__all__ = ["FINDING_KIND", "compensates", "findings"]

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
    if "compensate" in value and not isinstance(value["compensate"], bool):
        return [Finding("", FINDING_KIND, "'cancel.compensate' must be a boolean")]
    return []


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
