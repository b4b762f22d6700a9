"""Sweeper: expired leases back to QUEUED, or DEAD once their attempts are spent.

A lease expires only when its worker stopped heartbeating: the process died (SIGKILL, OOM,
a crash), stalled, or lost the database for longer than the lease. The sweeper runs on its
own cadence (``sweep_interval_ms``, jittered so a fleet does not sweep in lock-step), not
only when a claim loop is idle, so a fully busy fleet still recovers crashed jobs. The
decision is the store's, in database time: ``lease_until < now()`` and RUNNING; a swept row
whose ``attempt >= max_attempts`` goes DEAD (a job that crashes its worker every attempt
must end), otherwise back to QUEUED, resuming from its checkpoints on the next claim.

Each pass also ends live runs past their whole-run deadline (``budget.deadline``, stamped at
submit as ``deadline_at``): ``JobStore.job_budget_sweep``, FAILED with the budget named, or
PAUSED (a RUNNING run: asked to pause at its next checkpoint) when ``budget.onExceeded`` is
``pause``.

Each pass also fires approval timers that are due (docs/approvals.md *Expiry and
escalation*): ``JobStore.approval_timers_sweep`` over the partial index on ``wake_at``, in
database time: an escalation widens who may vote and emits APPROVAL_ESCALATED; an expiry ends
the wait by its ``onExpire`` (``reject`` decides reject, ``fail``, ``pause``), never accepting.

Each pass also runs the preemption rules (``[jobs.queue_preemption.<queue>]``;
docs/long-steps.md *Preemption*): per declared queue, ``JobStore.job_preempt`` asks at most
one low-priority run inside a resumable step to yield for a more urgent run waiting at the
queue's cap. The run yields at its next chunk boundary; nothing is killed.

Several sweepers (one per process) are safe: the store's sweep locks the rows it changes.
"""

from __future__ import annotations

from typing import Any

from protomolt_jobs.config import JobsConfig, preemption_rule
from protomolt_jobs.errors import StoreError
from protomolt_jobs.service import PeriodicService
from protomolt_jobs.workflow.approval import decision_entry

__all__ = ["Sweeper", "expired_entry"]


def expired_entry(
    step: str, decision: str, tally: dict[str, int], votes: list[Any]
) -> dict[str, Any]:
    """The checkpoint entry of an approval step whose expiry decided ``decision`` (reject):
    the votes cast so far, and ``expired: true``."""
    voters = [
        {"principal": v.principal, "decision": v.decision}
        | ({"comment": v.comment} if v.comment else {})
        for v in votes
    ]
    entry = decision_entry(step, decision, tally, voters)
    entry["expired"] = True
    return entry


class Sweeper(PeriodicService):
    """The lease sweeper component (a :class:`~protomolt_jobs.service.PeriodicService`:
    one pass per jittered ``sweep_interval_ms``, the first after one interval; a store
    failure is a warning and the pass is retried after a backoff).

    :param store: the job store (``job_sweep_expired()``).
    :param config: ``JobsConfig`` (``sweep_interval_ms``, ``worker_id``; validated there).
    """

    name = "sweeper"
    transient = (StoreError,)

    def __init__(self, store: Any, *, config: JobsConfig) -> None:
        super().__init__(interval_s=config.sweep_interval_ms / 1000.0, worker_id=config.worker_id)
        self._store = store
        self._preemption = {
            queue: preemption_rule(rule) for queue, rule in config.queue_preemption.items()
        }

    def run_once(self) -> Any:
        """One sweep pass.

        :returns: ``SweepResult(requeued, dead)``.
        :raises StoreError: when the sweep fails.
        """
        result = self._store.job_sweep_expired()
        budget_sweep = getattr(self._store, "job_budget_sweep", None)
        if budget_sweep is not None:
            # Runs past their whole-run deadline (budget.deadline) end FAILED; the store logs
            # each one.
            budget_sweep()
        timer_sweep = getattr(self._store, "approval_timers_sweep", None)
        if timer_sweep is not None:
            # Approval timers due by the database clock: escalations widen who may vote, an
            # expiry rejects, fails or pauses (never accepts); the store logs what fired.
            timer_sweep(expired_entry)
        if self._preemption:
            self._preempt()
        if result.requeued:
            self.log.info(
                "expired leases requeued",
                extra={
                    "action": "sweep_requeued",
                    "worker_id": self.worker_id,
                    "count": result.requeued,
                },
            )
        if result.dead:
            self.log.warning(
                "expired leases with no attempts left went DEAD",
                extra={"action": "sweep_dead", "worker_id": self.worker_id, "count": result.dead},
            )
        return result

    def _preempt(self) -> None:
        """One preemption pass per declared queue (``JobStore.job_preempt``).

        :raises StoreError: when a pass fails (the sweep's pass is retried).
        """
        for queue, rule in self._preemption.items():
            asked = self._store.job_preempt(
                queue,
                min_gap=rule["min_priority_gap"],
                after_s=rule["after_ms"] / 1000.0,
                min_run_s=rule["min_run_ms"] / 1000.0,
                actor="sweeper",
            )
            if asked is not None:
                self.log.info(
                    "run asked to yield for a more urgent run",
                    extra={
                        "action": "preempt_requested",
                        "worker_id": self.worker_id,
                        "queue": queue,
                        "job_id": str(asked.job_id),
                        "for_job_id": str(asked.for_job_id),
                    },
                )

    def _wait_before_first_pass(self) -> bool:
        return True

    def _started_fields(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s}

    def _failed_pass(self, exc: BaseException) -> None:
        self.log.warning(
            "sweep failed (next pass retries)",
            extra={"action": "sweep_failed", "worker_id": self.worker_id, "error": str(exc)},
        )
