"""``get-workflow``: a stored workflow's definition, version, retention and last test result.

Input ``{"workflowName": "...", "version"?: n}`` (``version``: an integer >= 1; absent: the
current version). Answer::

    {"ok": true, "workflowName", "version": n | null, "latestVersion": n | null,
     "current": bool, "definition": {...}, "storedAt", "storedBy",
     "retention": {"completed": {"seconds", "source"}, "failed": ..., "cancelled": ...,
                   "dead": ...},
     "lastTest": {"ok", "passed", "failed", "cases": [{"name", "passed", "difference"?,
                  "step"?}], "error"?, "at", "by", "via"} | null}

``retention`` is the object ``check-workflow`` answers (``runs/retention.effective``: per
final status, the seconds a finished run is kept and whether the workflow or the node says
so; ``seconds`` null: kept), here for every definition, with or without the key. ``version``
is null (and ``lastTest`` null) for a definition the registry holds without a version record
(a file copied in by hand, or a registry that does not number versions). An unknown workflow
or version is the answer ``{"ok": false, "error": "No stored workflow named '...'"}`` (as
``check-workflow``, ``run-workflow`` and ``test-workflow`` answer a name they cannot find).
Scope ``schema-read``, as the registry's ``GET /protomolt/workflows/{name}``.
"""

from __future__ import annotations

import logging
from typing import Any

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.hooks.contract import WorkflowVersions
from protomolt_jobs.input_rules import check_text
from protomolt_jobs.runs import retention
from protomolt_jobs.verbs.base import Verb, as_integer, only_known

__all__ = ["GetWorkflowAction"]

log = logging.getLogger("protomolt_jobs.workflow")

#: The highest version number a request may name.
MAX_VERSION = 10**15


class GetWorkflowAction(Verb):
    """``get-workflow`` (module docstring).

    :param repository: the node's stored workflows (a ``WorkflowRepository``; versions and
        test results when it is a ``WorkflowVersions``), or None.
    :param run_retention_s: ``jobs.run_retention_seconds`` (the statuses a workflow leaves out).
    """

    name = "get-workflow"
    description = (
        "Read a stored workflow: its definition, version, effective retention per final status "
        "and the last result of its tests."
    )
    scope = "schema-read"
    fields = ("workflowName", "version")

    def __init__(self, repository: Any, *, run_retention_s: float = 0.0) -> None:
        self.repository = repository
        self.run_retention_s = run_retention_s
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflowName": {"type": "string", "description": "the stored workflow's name"},
                "version": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "a stored version (absent: the current one)",
                },
            },
            "required": ["workflowName"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Read the stored workflow.

        :raises InvalidInput: the input is not an object; a field other than ``workflowName``
            and ``version``; ``workflowName`` missing, not a string or blank; ``version`` not
            an integer from 1 to 10^15.
        """
        if not isinstance(input, dict):
            raise InvalidInput("the input must be a JSON object", {"field": ""})
        only_known(self.name, input, self.fields)
        name = input.get("workflowName")
        if name is None:
            raise InvalidInput("'workflowName' is required", {"field": "workflowName"})
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(
                "'workflowName' must be a non-empty string", {"field": "workflowName"}
            )
        check_text("workflowName", name)
        raw = input.get("version")
        version = None
        if raw is not None:
            version = as_integer(raw)
            if version is None or not 1 <= version <= MAX_VERSION:
                raise InvalidInput(
                    f"'version' must be an integer from 1 to {MAX_VERSION}; got {raw!r}",
                    {"field": "version"},
                )
        if self.repository is None:
            return {"ok": False, "error": "No workflow repository is mounted"}
        try:
            found = self._read(name, version)
        except Exception as exc:  # a stored definition that cannot be read is an answer
            log.warning(
                "stored workflow unreadable",
                exc_info=True,
                extra={"action": "stored_workflow_unreadable", "workflow_name": name},
            )
            return {"ok": False, "error": f"stored workflow '{name}' cannot be read: {exc}"}
        if found is None:
            which = f" with version {version}" if version is not None else ""
            return {"ok": False, "error": f"No stored workflow named '{name}'{which}"}
        definition = found["definition"]
        return {
            "ok": True,
            "workflowName": name,
            "version": found.get("version"),
            "latestVersion": found.get("latestVersion"),
            "current": bool(found.get("current", version is None)),
            "definition": definition,
            "storedAt": found.get("storedAt"),
            "storedBy": found.get("storedBy"),
            "retention": retention.effective(definition, self.run_retention_s),
            "lastTest": found.get("lastTest"),
        }

    def _read(self, name: str, version: int | None) -> dict[str, Any] | None:
        if isinstance(self.repository, WorkflowVersions):
            return self.repository.stored(name, version)
        if version is not None:
            return None  # this repository does not number versions
        definition = self.repository.workflow(name)
        if definition is None:
            return None
        return {"definition": definition, "version": None, "current": True}
