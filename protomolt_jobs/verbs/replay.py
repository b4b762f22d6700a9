"""``replay-check``: which runs of a workflow would drift if resumed under a candidate version.

Read only: it reads the workflow's live runs (QUEUED, RUNNING, WAITING, PAUSED,
RECOVERY_REQUIRED), newest first, and on request its most recent finished ones, and replays
each run's stored checkpoints against the candidate with the rules of a resumed segment
(:mod:`protomolt_jobs.workflow.replay_check`). Nothing is written, nothing is called.

Scope ``workflow-write``: it is the check an author runs before ``PUT`` of a new version (the
scope that stores one), and its answer names runs and their steps, which the registry's
``schema-read`` viewers are not otherwise shown.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from protomolt_jobs.store.records import JOB_STATUSES, TERMINAL_STATUSES
from protomolt_jobs.verbs.base import JobsBackend, JobVerb, as_integer, invalid, require_string
from protomolt_jobs.workflow import check, parse_workflow
from protomolt_jobs.workflow.replay_check import drift

__all__ = ["DEFAULT_LIMIT", "MAX_FINISHED", "MAX_LIMIT", "ReplayCheckAction"]

log = logging.getLogger("protomolt_jobs.verbs")

#: Live runs examined when ``limit`` is not given, and the most it may ask for.
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
#: Most finished runs ``finished`` may ask for (default 0: live runs only).
MAX_FINISHED = 100
#: The statuses of a run that may still resume.
LIVE_STATUSES = sorted(JOB_STATUSES - TERMINAL_STATUSES)


class _Repository(Protocol):
    def workflow(self, name: str) -> dict[str, Any] | None: ...


def _bounded(input: dict[str, Any], field: str, default: int, least: int, most: int) -> int:
    raw = input.get(field)
    if raw is None:
        return default
    value = as_integer(raw)
    if value is None or not least <= value <= most:
        raise invalid(field, f"'{field}' must be a whole number from {least} to {most}")
    return value


class ReplayCheckAction(JobVerb):
    """``replay-check`` (scope ``workflow-write``).

    Input ``{"workflowName": str, "candidate": {...}, "limit"?: 1..500 (100), "finished"?:
    0..100 (0)}``. Answer ``{"ok": true, "workflowName", "examined": {"live", "finished"},
    "more": bool, "drifting": [{"jobId", "status", "outstandingStep"?, "storedVersion",
    "checkpoint", "step", "rule", "reason"}], "unreadable": [jobId, ...]}``: ``more`` is true
    when ``limit`` live runs were examined (older live runs may exist); ``storedVersion`` says
    whether the run was submitted with the definition stored under the name now.

    :param backend: the role's store.
    :param runtime: the engine's runtime (the candidate's types).
    :param repository: the stored workflows (None: ``storedVersion`` is always false).
    """

    name = "replay-check"
    scope = "workflow-write"
    description = (
        "List the live (and, optionally, recently finished) runs of a workflow whose "
        "checkpoints would not replay under a candidate definition; reads only."
    )
    fields = ("workflowName", "candidate", "limit", "finished")

    def __init__(
        self, backend: JobsBackend, runtime: Any, repository: _Repository | None = None
    ) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.repository = repository
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflowName": {"type": "string", "description": "the workflow's name"},
                "candidate": {"type": "object", "description": "the candidate definition"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                "finished": {"type": "integer", "minimum": 0, "maximum": MAX_FINISHED},
            },
            "required": ["workflowName", "candidate"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Replay the runs' checkpoints against the candidate (see the class docstring).

        :raises Unavailable: no database configured.
        :raises InvalidInput: naming the field: ``workflowName`` missing or not a string;
            ``candidate`` missing, not an object, or not verifying (the first finding said);
            ``limit`` or ``finished`` out of range; an unknown field.
        """
        store, _ = self._accept(input)
        name = require_string(input, "workflowName").strip()
        if not name:
            raise invalid("workflowName", "'workflowName' must not be blank")
        candidate = input.get("candidate")
        if not isinstance(candidate, dict):
            raise invalid("candidate", "'candidate' must be a workflow definition (an object)")
        limit = _bounded(input, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        finished = _bounded(input, "finished", 0, 0, MAX_FINISHED)
        findings = check(candidate, self.runtime)
        if findings:
            first = findings[0]
            where = f" (step '{first.step}')" if first.step else ""
            raise invalid(
                "candidate",
                f"the candidate does not verify ({len(findings)} finding"
                f"{'s' if len(findings) != 1 else ''}); first: [{first.kind}] {first.error}"
                f"{where}; check it with check-workflow",
            )
        compiled = parse_workflow(candidate, self.runtime)
        stored = self._stored(name)
        runs = store.job_replay_runs(name, LIVE_STATUSES, limit)
        live = len(runs)
        if finished:
            runs += store.job_replay_runs(name, sorted(TERMINAL_STATUSES), finished)
        drifting: list[dict[str, Any]] = []
        unreadable: list[str] = []
        for run in runs:
            if run.unreadable or not isinstance(run.checkpoints, list):
                unreadable.append(str(run.job_id))
                continue
            found = drift(compiled, run.checkpoints)
            if found is None:
                continue
            row: dict[str, Any] = {"jobId": str(run.job_id), "status": run.status}
            if run.outstanding_step is not None:
                row["outstandingStep"] = run.outstanding_step
            row["storedVersion"] = stored is not None and run.workflow_definition == stored
            row.update(found.to_json())
            drifting.append(row)
        log.info(
            "replay-check of %s: %d of %d runs would drift",
            name,
            len(drifting),
            len(runs),
            extra={
                "action": "replay_check",
                "workflow_name": name,
                "examined": len(runs),
                "drifting": len(drifting),
            },
        )
        return {
            "ok": True,
            "workflowName": name,
            "examined": {"live": live, "finished": len(runs) - live},
            "more": live >= limit,
            "drifting": drifting,
            "unreadable": unreadable,
        }

    def _stored(self, name: str) -> dict[str, Any] | None:
        if self.repository is None:
            return None
        try:
            return self.repository.workflow(name)
        except Exception:  # a stored file that cannot be read: no run is "of the stored version"
            log.warning(
                "stored workflow unreadable",
                exc_info=True,
                extra={"action": "stored_workflow_unreadable", "workflow_name": name},
            )
            return None
