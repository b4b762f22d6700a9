"""``extend-loop`` (issue 27 item 1; docs/verbs.md "extend-loop"): raise one bounded loop's
bound for one run.

``{jobId, step, by, reason?}``: ``step`` names a step of the run's workflow that declares a
``loop``; ``by`` (a whole number >= 1) is added to the re-runs that loop may make in this run,
up to ``jobs.loop_extend_cap`` iterations in all (``loop.max`` plus every extension). The
extension is stored with the run (``loop_extensions``) under its row lock with an
``extend-loop`` transition naming the caller and the reason; a run PAUSED because that loop
exhausted (``onExhausted: "park"``) is QUEUED again and goes on with the next iteration.
Scope ``job-control`` like the other operator verbs.
"""

from __future__ import annotations

from typing import Any

from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import (
    ControlVerb,
    JobsBackend,
    actor,
    control_schema,
    corrupt_snapshot,
    invalid,
    not_found,
    refused,
    require_string,
)

__all__ = ["EXTEND_LOOP_STATUSES", "ExtendLoopAction"]

#: The statuses extend-loop acts on (a finished run has no loop left to extend); the store's
#: ``EXTENDABLE`` holds its write to the same.
EXTEND_LOOP_STATUSES = ("QUEUED", "RUNNING", "WAITING", "PAUSED")


class ExtendLoopAction(ControlVerb):
    """``extend-loop`` (scope ``job-control``): let one loop of a run iterate ``by`` more times."""

    name = "extend-loop"
    description = (
        "Raise the bound of one loop of a run ('jobId', 'step': the loop step, 'by': re-runs to "
        "add, optional 'reason'), up to the node's jobs.loop_extend_cap iterations in all; a run "
        "PAUSED because that loop exhausted is QUEUED again. QUEUED, RUNNING, WAITING and PAUSED "
        "runs only."
    )
    fields = ("jobId", "step", "by", "reason")
    statuses = EXTEND_LOOP_STATUSES

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = control_schema(
            {
                "step": {"type": "string", "description": "the step that declares the loop"},
                "by": {"type": "integer", "minimum": 1, "description": "re-runs to add"},
            },
            ("step", "by"),
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status, step, max, extendedBy, requeued}`` (``max``: the
            loop's bound now, ``extendedBy``: every extension of this run) or ``{ok: false,
            status, error}`` (a finished run, the cap, a pending cancel or pause request).

        :raises Unavailable: no database configured.
        :raises InvalidInput: ``step`` missing or naming no loop step of the run's workflow,
            ``by`` not a whole number >= 1, an unknown field.
        :raises JobCorrupt: the run's stored definition cannot be read.
        """
        store, job_id, reason = self._begin(input)
        step = require_string(input, "step")
        by = input.get("by")
        if isinstance(by, float) and by.is_integer():
            by = int(by)
        if isinstance(by, bool) or not isinstance(by, int) or not 1 <= by <= 1000:
            raise invalid("by", "Field 'by' must be a whole number from 1 to 1000")
        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        if job.status not in EXTEND_LOOP_STATUSES:
            return refused(job_id, job.status, "only a run that has not finished can be extended")
        try:
            stored = StoredRun.load(job, self.runtime)
        except SnapshotError as exc:
            raise corrupt_snapshot(exc) from exc
        declared = stored.workflow.step(step)
        if declared is None or declared.loop is None:
            loops = ", ".join(s.name for s in stored.workflow.loops) or "none"
            raise invalid("step", f"step '{step}' declares no loop (loop steps: {loops})")
        cap = self.backend.loop_extend_cap
        outcome = store.job_extend_loop(
            job_id,
            step,
            by,
            cap=cap,
            declared=declared.loop.max,
            actor=actor(),
            reason=reason,
        )
        self._log(job_id, outcome.status, reason)
        if outcome.changed:
            return {
                "ok": True,
                "status": outcome.status,
                "step": step,
                "max": declared.loop.max + outcome.total,
                "extendedBy": outcome.total,
                "requeued": outcome.requeued,
            }
        if outcome.refusal == "cap":
            return refused(
                job_id,
                outcome.status,
                f"loop '{step}' may reach at most {cap} iterations (jobs.loop_extend_cap); its "
                f"bound is {declared.loop.max + outcome.total} and 'by' {by} would pass it",
            )
        if outcome.refusal == "pending-request":
            return refused(
                job_id, outcome.status, "a cancel or pause request is pending; it applies first"
            )
        return refused(job_id, outcome.status, "only a run that has not finished can be extended")
