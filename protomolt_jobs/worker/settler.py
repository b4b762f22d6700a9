"""The one writer of a claimed job's settlement: :meth:`Settler.apply` writes the
:class:`~.settlement.Write` that :func:`~.settlement.decide` picked, under the job's fence.

:meth:`Settler.apply` ends the run one of four ways:

- the write committed: its ``Settlement`` and one log line (action, message and level per kind,
  in :data:`_ROWS`);
- ``LeaseLost`` (a fenced write matched no row: the sweeper took the job, or a graceful stop
  released it): ``ABANDONED``, nothing more is written, ``action="lease_lost"``;
- ``StoreError``: logged, ``UNSETTLED``; the job is left to the sweeper (its lease expires; the
  next claim resumes from the checkpoints);
- the write came back CANCELLED or PAUSED: an operator's request recorded on the row was
  honoured by the database inside this write (migration 0002's trigger): ``CONTROLLED``.

A ``ValueError``/``TypeError`` from a store write (it refused its arguments) is a defect in the
worker and propagates to the claim loop's supervision; the sweeper requeues the job either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from protomolt_jobs import crashpoints
from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.heartbeat import LeaseGuard
from protomolt_jobs.worker.settlement import LogContext, Settlement, Write, WriteKind

__all__ = ["SettleStore", "Settler"]

log = logging.getLogger("protomolt_jobs.worker")

# The statuses an operator request gives a job inside the worker's own fenced write.
_CONTROL_STATUSES = ("CANCELLED", "PAUSED")


class SettleStore(Protocol):
    """The fenced writes that settle a claimed job (``JobStore``'s). Each raises ``LeaseLost``
    when the fence matches no row and ``StoreError`` on a database failure; those that return
    a status return CANCELLED or PAUSED when a pending operator request won."""

    def job_complete(
        self,
        lease: Lease,
        result: dict[str, Any],
        verdict: str,
        *,
        final_entry: dict[str, Any] | None = None,
    ) -> str: ...

    def job_park(self, lease: Lease, step: str) -> str: ...

    def job_park_approval(
        self, lease: Lease, step: str, timers: tuple[dict[str, Any], ...] = ()
    ) -> str: ...

    def job_park_input(self, lease: Lease, step: str, reason: str) -> str: ...

    def job_recovery_required(self, lease: Lease, step: str, reason: str) -> str: ...

    def job_budget_pause(self, lease: Lease, error: str, step: str = "") -> str: ...

    def job_loop_pause(self, lease: Lease, error: str, step: str = "") -> str: ...

    def job_fail(self, lease: Lease, error: str, step: str = "") -> str: ...

    def job_retry(self, lease: Lease, backoff_s: float, error: str) -> object: ...

    def job_dead(self, lease: Lease, error: str, step: str = "") -> str: ...

    def job_stop(self, lease: Lease) -> str: ...

    def job_release(self, lease: Lease) -> None: ...


@dataclass(frozen=True)
class _Row:
    """One kind of write: what it settles as, its log line, and its store call."""

    settlement: Settlement
    action: str
    message: str
    level: int
    #: the Write's fields on the log line, in order
    logged: tuple[str, ...]
    send: Callable[[SettleStore, Lease, Write], object]
    #: the Write's fields filling the message's ``%s`` placeholders, in order (the record's
    #: ``msg`` stays one template per kind; its text names the run's own cause)
    args: tuple[str, ...] = ()


# fmt: off
_ROWS: dict[WriteKind, _Row] = {
    WriteKind.COMPLETE: _Row(
        Settlement.COMPLETED, "job_completed", "job completed", logging.INFO, ("verdict",),
        lambda s, lease, w: s.job_complete(
            lease, result=w.result, verdict=w.verdict, final_entry=w.final_entry
        ),
    ),
    WriteKind.PARK: _Row(
        Settlement.PARKED, "job_parked", "job parked on an external step", logging.INFO,
        ("step",),
        lambda s, lease, w: s.job_park(lease, w.step),
    ),
    WriteKind.PARK_APPROVAL: _Row(
        Settlement.PARKED, "job_parked_for_approval", "job waiting for approval",
        logging.INFO, ("step",),
        lambda s, lease, w: s.job_park_approval(lease, w.step, w.timers),
    ),
    WriteKind.PARK_INPUT: _Row(
        Settlement.PARKED, "job_parked_for_input", "job waiting for input", logging.INFO,
        ("step", "error"),
        lambda s, lease, w: s.job_park_input(lease, w.step, w.error),
    ),
    # the cause is the run's error: an external step's unproven effect, a checkpoint-mismatch
    # or a progress-mismatch (the first words of each name it)
    WriteKind.RECOVERY: _Row(
        Settlement.RECOVERY_REQUIRED, "job_recovery_required",
        "job needs recovery at step '%s': %s", logging.WARNING, ("step", "error"),
        lambda s, lease, w: s.job_recovery_required(lease, w.step, w.error),
        args=("step", "error"),
    ),
    WriteKind.BUDGET_PAUSE: _Row(
        Settlement.CONTROLLED, "job_paused_by_budget", "job PAUSED by its budget",
        logging.WARNING, ("step", "error"),
        lambda s, lease, w: s.job_budget_pause(lease, w.error, w.step),
    ),
    WriteKind.LOOP_PAUSE: _Row(
        Settlement.CONTROLLED, "job_paused_by_loop", "job PAUSED: a loop exhausted",
        logging.WARNING, ("step", "error"),
        lambda s, lease, w: s.job_loop_pause(lease, w.error, w.step),
    ),
    WriteKind.FAIL: _Row(
        Settlement.FAILED, "job_failed", "job FAILED", logging.WARNING, ("step", "error"),
        lambda s, lease, w: s.job_fail(lease, w.error, w.step),
    ),
    WriteKind.RETRY: _Row(
        Settlement.RETRIED, "job_retry_scheduled", "job requeued after a retryable failure",
        logging.INFO, ("error", "backoff_s"),
        lambda s, lease, w: s.job_retry(lease, w.backoff_s, w.error),
    ),
    WriteKind.DEAD: _Row(
        Settlement.DEAD, "job_dead", "job is DEAD: retries exhausted", logging.WARNING,
        ("error", "max_attempts"),
        lambda s, lease, w: s.job_dead(lease, w.error, w.step),
    ),
    # An operator request applied with a boundary write of its own; its outcome is logged as
    # job_cancelled / job_paused, or the job is given back when the request was withdrawn.
    WriteKind.STOP: _Row(
        Settlement.CONTROLLED, "", "", logging.INFO, (),
        lambda s, lease, w: s.job_stop(lease),
    ),
}
# fmt: on


class Settler:
    """The only writer of a claimed job's settlement (and of its graceful-stop release).

    :param store: the fenced settling writes.
    """

    def __init__(self, store: SettleStore) -> None:
        self._store = store

    def apply(self, write: Write, guard: LeaseGuard, ctx: LogContext) -> Settlement:
        """Write ``write`` under ``guard``'s fence and log the result once.

        :returns: the write's settlement; ``ABANDONED`` when the lease was lost (or the guard
            already was), ``UNSETTLED`` on a ``StoreError``, ``CONTROLLED`` when the write came
            back CANCELLED or PAUSED.
        :raises ValueError, TypeError: the store refused the write's arguments (a defect).
        """
        row = _ROWS[write.kind]
        stop = write.kind is WriteKind.STOP
        operation = "stop" if stop else "settle"
        if guard.lost:
            return self.abandon(guard, ctx, operation)
        guard.settling = True
        try:
            status = row.send(self._store, guard.lease, write)
        except LeaseLost:
            guard.mark_lost("lease_lost")
            return self.abandon(guard, ctx, operation)
        except StoreError as exc:
            # Only the database's failures: a ValueError/TypeError (the store refused the
            # write's arguments) is a defect in our code and propagates to the claim loop,
            # whose supervision logs its traceback; the sweeper requeues the job either way.
            if stop:
                log.error(
                    "applying an operator request failed; the sweeper will apply it",
                    extra={"action": "control_stop_failed", "error": str(exc), **ctx},
                )
            else:
                log.error(
                    "settling the job failed; the sweeper will requeue it when its lease expires",
                    extra={
                        "action": "settle_failed",
                        "settlement": row.settlement.value,
                        "error": str(exc),
                        **ctx,
                    },
                )
            return Settlement.UNSETTLED
        if stop:
            return self._stopped(status, guard, ctx)
        if status in _CONTROL_STATUSES:
            guard.status = str(status)
            # A budget pause that came back PAUSED is itself: logged as a budget pause.
            if not (row.settlement is Settlement.CONTROLLED and status == "PAUSED"):
                return self._controlled(ctx, guard.status, row.settlement.value)
        fields = {name: getattr(write, name) for name in row.logged}
        log.log(
            row.level,
            row.message,
            *(getattr(write, name) for name in row.args),
            extra={"action": row.action, **fields, **ctx},
        )
        if write.kind is WriteKind.COMPLETE and write.final_entry is not None:
            crashpoints.reached("after_checkpoint", str(write.final_entry.get("name", "")))
        return row.settlement

    def abandon(self, guard: LeaseGuard, ctx: LogContext, operation: str) -> Settlement:
        """The run ends without a write: ``CONTROLLED`` when an operator's request took the
        job at a checkpoint, else ``ABANDONED`` (released by a graceful stop, or lost).

        :param operation: where the run learnt it (``segment``, ``checkpoint``, ``settle``,
            ``stop``), logged.
        """
        if guard.controlled:
            return self._controlled(ctx, guard.status, operation)
        if guard.released:
            log.info(
                "run stopped after its job was released", extra={"action": "run_released", **ctx}
            )
        else:
            guard.mark_lost("lease_lost")
            log.warning(
                "lease lost; the run is abandoned and writes nothing",
                extra={"action": "lease_lost", "operation": operation, **ctx},
            )
        return Settlement.ABANDONED

    def release(self, guard: LeaseGuard) -> bool:
        """Graceful stop: give the guard's job back to QUEUED (``job_release``, which also
        gives back the attempt). Only the first caller for a guard writes.

        :returns: True when the release was written.
        """
        if not guard.mark_lost("released"):
            return False
        lease = guard.lease
        ctx = {"job_id": str(lease.job_id), "worker_id": lease.owner, "attempt": lease.attempt}
        try:
            self._store.job_release(lease)
        except LeaseLost:
            # The segment settled (or the sweeper took the job) first: nothing to give back.
            log.info("job settled before its release", extra={"action": "release_skipped", **ctx})
            return False
        except StoreError as exc:
            log.warning(
                "could not release the job; the sweeper will requeue it when its lease expires",
                extra={"action": "release_failed", "error": str(exc), **ctx},
            )
            return False
        log.info("job released back to QUEUED", extra={"action": "job_released", **ctx})
        return True

    def _stopped(self, status: object, guard: LeaseGuard, ctx: LogContext) -> Settlement:
        if status in _CONTROL_STATUSES:
            guard.status = str(status)
            guard.mark_lost("controlled")
            return self._controlled(ctx, guard.status, "stop")
        # The request was withdrawn meanwhile (resume of a pending pause): give the job back.
        guard.control = None
        self.release(guard)
        return Settlement.ABANDONED

    @staticmethod
    def _controlled(ctx: LogContext, status: str, at: str) -> Settlement:
        if status == "QUEUED":  # a preemption's yield (docs/long-steps.md, Preemption)
            log.info(
                "job yielded at a chunk boundary (preempted; back to QUEUED, attempt kept)",
                extra={"action": "job_yielded", "applied_at": at, **ctx},
            )
            return Settlement.CONTROLLED
        action = "job_cancelled" if status == "CANCELLED" else "job_paused"
        log.info(
            "job %s by operator request",
            status,
            extra={"action": action, "applied_at": at, **ctx},
        )
        return Settlement.CONTROLLED
