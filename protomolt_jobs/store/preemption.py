"""Preemption: the sweeper asks a low-priority run inside a resumable step to yield.

A queue may declare a preemption rule (``[jobs.queue_preemption.<queue>]``, config.py;
docs/long-steps.md *Preemption*). :meth:`PreemptionMixin.job_preempt` is the sweeper's pass
of one queue: under the queue's limits row lock (``job_preempt_lock``), when the queue is at
its ``max_running`` with no yield pending and its most urgent ready QUEUED run has waited
``after_s``, it records ``control = {kind: 'yield', ...}`` on the lowest-priority RUNNING run
of the queue that is ``min_gap`` levels less urgent, has run ``min_run_s`` since its claim and
is inside a ``resumable`` step (an unfinished progress report of its current attempt; a
resumable step never has an external effect). Migration 0024's trigger honours the request at
that run's next progress report only: the chunk is stored and the run goes back to QUEUED,
its attempt kept, in one statement; until then it is RUNNING and counts against the cap.
Nothing is killed. :class:`PreemptionMixin` is one of
:class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from protomolt_jobs.store import checks, db

__all__ = ["PreemptionMixin", "YieldAsked"]


@dataclass(frozen=True, slots=True)
class YieldAsked:
    """A yield the pass recorded.

    :ivar job_id: the RUNNING run asked to yield.
    :ivar priority: its priority (1 most urgent .. 5).
    :ivar for_job_id: the QUEUED run it yields for.
    :ivar for_priority: that run's priority.
    """

    job_id: UUID
    priority: int
    for_job_id: UUID
    for_priority: int


class PreemptionMixin(db.Database):
    """``JobStore``'s preemption pass."""

    @db.translated
    def job_preempt(
        self,
        queue: str,
        *,
        min_gap: int,
        after_s: float,
        min_run_s: float,
        actor: str,
    ) -> YieldAsked | None:
        """One preemption pass over ``queue`` (see the module text).

        SQL: ``job_preempt_lock`` (the queue's limits row, FOR UPDATE; none: the queue has no
        ``max_running`` and nothing is done), then ``job_preempt_request`` (one UPDATE: the
        yield request and its ``yield-request`` transition). Transaction: one.

        :param queue: the queue's name.
        :param min_gap: the least priority difference (1..4) between the waiting run and the
            run asked to yield.
        :param after_s: how long the waiting run must have been ready, seconds (>= 0).
        :param min_run_s: how long the run asked must have run since its claim, seconds (>= 0).
        :param actor: who asks (``sweeper``), logged with the transition.
        :returns: the yield recorded, or None.
        :raises ValueError, TypeError: a blank queue or actor, a gap outside 1..4, a negative
            or non-finite time.
        :raises StoreError: on a database failure.
        """
        checks.text("queue", queue)
        checks.text("actor", actor)
        if isinstance(min_gap, bool) or not isinstance(min_gap, int) or not 1 <= min_gap <= 4:
            raise ValueError(f"min_gap: must be an integer within 1..4; got {min_gap!r}")
        checks.non_negative_seconds("after_s", after_s)
        checks.non_negative_seconds("min_run_s", min_run_s)
        with self._connection() as conn, conn.transaction():
            limit = db.one(conn, "job_preempt_lock", {"queue": queue})
            if limit is None:
                return None
            row = db.one(
                conn,
                "job_preempt_request",
                {
                    "queue": queue,
                    "max_running": limit["max_running"],
                    "min_gap": min_gap,
                    "after_s": float(after_s),
                    "min_run_s": float(min_run_s),
                    "actor": actor,
                },
            )
        if row is None:
            return None
        return YieldAsked(
            job_id=row["job_id"],
            priority=int(row["priority"]),
            for_job_id=row["for_job_id"],
            for_priority=int(row["for_priority"]),
        )
