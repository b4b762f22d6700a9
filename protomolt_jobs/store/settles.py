"""The fenced writes of a claimed run: checkpoint, compensate, park, complete, fail, retry,
dead, release, budget pause, stop, intent, recovery required.

Each is conditioned on the lease's fence (``status``, ``lease_owner``, ``attempt``,
``lease_token``); zero rows back is :class:`~protomolt_jobs.errors.LeaseLost` and nothing
changed. A write that meets a pending operator request is turned by the trigger into CANCELLED
or PAUSED, and writes that event instead of its own. The worker's hot writes (checkpoint, park,
complete, fail, retry, dead, release) are one statement each in autocommit, their outbox rows
written by the same statement; the others open a transaction for the write and its event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from protomolt_jobs.errors import ControlApplied
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.artifact_rows import artifact_rows, has_artifact_rows
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.group_commit import GroupCommit
from protomolt_jobs.store.records import Lease
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["SettlesMixin"]

#: The fenced writes group commit may carry together: each writes its own run row and its
#: outbox rows, nothing another run's write touches.
_GROUPED = frozenset(
    {
        "job_checkpoint",
        "job_park",
        "job_complete",
        "job_complete_with_checkpoint",
        "job_fail",
        "job_dead",
    }
)


class SettlesMixin(db.Database):
    """``JobStore``'s fenced writes about a claimed run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The claim loops' hot fenced writes, carried together under load (group_commit.py).
        self._group_commit = GroupCommit(self._connection)

    @db.translated
    def job_checkpoint(self, lease: Lease, entry: dict[str, Any]) -> None:
        """Append one checkpoint entry, with its STEP_CHECKPOINT event.

        SQL: one statement (autocommit): fenced ``UPDATE ... SET checkpoints = checkpoints ||
        [entry]`` and its outbox row (STEP_CHECKPOINT, step = ``entry["name"]``,
        ``detail.status`` RUNNING), plus the CANCELLED or PAUSED row when the trigger applied a
        pending request (then :class:`ControlApplied` is raised after the commit).

        :param entry: ``{"name": str, "skipped": bool, "response"?: object}`` (stored as is).
            An entry that asks for artifact rows (``store/artifact_rows.py``: ports, a declared
            receipt, validated or consumed artifacts) is written by ``job_checkpoint_artifacts``,
            which upserts them into ``workflow_artifact`` and logs each state change in the
            same statement.
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises ValueError: when ``entry`` has no non-blank ``name`` or cannot be JSON.
        :raises StoreError: on a database failure.
        """
        step = scrub_text(checks.entry_name(entry))
        entry_json = checks.jsonb("entry", entry, dict)
        params: dict[str, Any] = {"entry": entry_json, "step": step}
        query = "job_checkpoint"
        if has_artifact_rows(entry):
            # its artifact rows go in with it, in the same statement (store/artifact_rows.py)
            query = "job_checkpoint_artifacts"
            params["rows"] = checks.jsonb("rows", artifact_rows(entry, lease.job_id), list)
            params["actor"] = f"worker:{lease.owner}"
        status = self._fenced_status(query, lease, params)
        if status != "RUNNING":
            raise ControlApplied(lease.job_id, lease.owner, lease.attempt, "job_checkpoint", status)

    @db.translated
    def job_compensate(self, lease: Lease, entry: dict[str, Any]) -> None:
        """Append a compensation step's entry to a graph run stopped between its steps (an
        operator cancelled it, or its budget failed it: the steps that undo succeeded steps run
        after that settled), with its STEP_CHECKPOINT event (``detail.status`` the run's).

        SQL: ``UPDATE ... SET checkpoints = checkpoints || [entry]`` fenced on status
        CANCELLED or FAILED, the lease's attempt and no entry of that step yet (the settle
        cleared the lease, so owner and token cannot fence it), recorded in the history as
        ``compensate``;
        then one outbox row. Transaction: one.

        :raises LeaseLost: when the fence matches no row (not cancelled at this attempt, or the
            step already has its entry): nothing changed, no event.
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises ValueError: when ``entry`` has no non-blank ``name`` or cannot be JSON.
        :raises StoreError: on a database failure.
        """
        step = scrub_text(checks.entry_name(entry))
        entry_json = checks.jsonb("entry", entry, dict)
        with self._connection() as conn, conn.transaction():
            row = db.fenced(conn, "job_compensate", lease, {"entry": entry_json, "step": step})
            self._outbox_txn(conn, row, EventType.TYPE_STEP_CHECKPOINT, step=step)

    @db.translated
    def job_park(self, lease: Lease, step: str) -> str:
        """Park the job on an external step, with its WAITING event.

        SQL: fenced ``UPDATE ... SET status='WAITING', outstanding_step=step``, lease cleared;
        and its outbox row (WAITING, step; CANCELLED or PAUSED when the trigger applied a
        pending request), in one statement (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank step.
        :raises StoreError: on a database failure.
        """
        checks.text("step", step)
        return self._fenced_status("job_park", lease, {"step": scrub_text(step)})

    @db.translated
    def job_complete(
        self,
        lease: Lease,
        result: dict[str, Any],
        verdict: str,
        *,
        final_entry: dict[str, Any] | None = None,
    ) -> str:
        """Complete the job, with its COMPLETED event; optionally append the last checkpoint.

        A cancel pending on the row wins (CANCELLED, the final checkpoint kept, no result; a
        CANCELLED event instead of COMPLETED), and so does a pending pause (PAUSED with every
        checkpoint; a resume completes it without calling any step). Returns the status.

        SQL: fenced ``UPDATE ... SET status='COMPLETED', result, verdict, completed_at=now()``,
        ``error`` and the lease cleared (a failure of an earlier attempt stays in the history:
        the retry's transition reason; a pending cancel sets its own error); then one outbox row (COMPLETED, verdict). With ``final_entry`` the same
        fenced UPDATE also appends it to ``checkpoints``, and the outbox gets STEP_CHECKPOINT
        (step = ``final_entry["name"]``, ``detail.status`` RUNNING, as :meth:`job_checkpoint`
        writes it) before COMPLETED: the events a separate checkpoint would have written, in
        the same order, one commit fewer. One statement (autocommit): the update and its outbox
        rows, whose types come from the status the row ended in.

        :param result: the composed output (proto3 JSON object).
        :param verdict: one-line summary, not blank (the event's ``completed-carries-verdict``).
        :param final_entry: the last step's checkpoint entry (as for :meth:`job_checkpoint`),
            or None when every checkpoint is already stored.
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises TypeError: when ``result`` or ``final_entry`` is not a JSON object.
        :raises ValueError: when ``verdict`` is blank, ``final_entry`` has no non-blank
            ``name``, or either cannot be JSON.
        :raises StoreError: on a database failure.
        """
        checks.text("verdict", verdict)
        verdict = scrub_text(verdict)
        result_json = checks.jsonb("result", result, dict)
        params: dict[str, Any] = {"result": result_json, "verdict": verdict}
        step = ""
        if final_entry is not None:
            step = scrub_text(checks.entry_name(final_entry))
            params["entry"] = checks.jsonb("final_entry", final_entry, dict)
            params["step"] = step
        query = "job_complete" if final_entry is None else "job_complete_with_checkpoint"
        return self._fenced_status(query, lease, params)

    @db.translated
    def job_fail(self, lease: Lease, error: str, step: str = "") -> str:
        """Fail the job (a verdict or a non-retryable error), with its FAILED event.

        SQL: fenced ``UPDATE ... SET status='FAILED', error, completed_at=now()``, lease
        cleared, and its outbox row (FAILED, step, error truncated to 4000 in the event only;
        CANCELLED for a pending cancel), in one statement (autocommit).

        :param error: the verbatim error, not blank; stored whole.
        :param step: the failing step, or "".
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        return self._fenced_end("job_fail", lease, error, step)

    @db.translated
    def job_retry(self, lease: Lease, backoff_s: float, error: str) -> datetime:
        """Requeue after a retryable failure.

        SQL: fenced ``UPDATE ... SET status='QUEUED', run_after = now() + backoff_s, error``,
        lease cleared (``attempt`` kept: the next claim increments it); ``NOTIFY
        protomolt_jobs``. No event (a retry is not a lifecycle commit point; a pending request the
        trigger applied writes its CANCELLED or PAUSED event instead of the NOTIFY). One
        statement (autocommit).

        :param backoff_s: delay before the job is eligible again, seconds (>= 0).
        :param error: the failure that caused the retry (kept in the row).
        :returns: the new ``run_after`` (database time).
        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises ValueError: for a negative backoff.
        :raises StoreError: on a database failure.
        """
        checks.non_negative_seconds("backoff_s", backoff_s)
        with self._connection() as conn:
            row = db.fenced(
                conn,
                "job_retry",
                lease,
                {"backoff_s": float(backoff_s), "error": scrub_text(error)},
            )
        run_after: datetime = row["run_after"]
        return run_after

    @db.translated
    def job_dead(self, lease: Lease, error: str, step: str = "") -> str:
        """Dead-letter the job (retryable failure, attempts exhausted), with its DEAD event.

        SQL: fenced ``UPDATE ... SET status='DEAD', error, completed_at=now()``, lease cleared;
        and its outbox row (DEAD, error; CANCELLED for a pending cancel), in one statement
        (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        return self._fenced_end("job_dead", lease, error, step)

    @db.translated
    def job_release(self, lease: Lease) -> None:
        """Give a claimed job back on a graceful stop.

        SQL: fenced ``UPDATE ... SET status='QUEUED', run_after=now(), attempt = attempt - 1``,
        lease cleared (the interrupted run does not count as an attempt); ``NOTIFY
        protomolt_jobs`` (or the CANCELLED/PAUSED event of a pending request the trigger
        applied). No event. One statement (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises StoreError: on a database failure.
        """
        self._fenced_status("job_release", lease, {})

    @db.translated
    def job_budget_pause(self, lease: Lease, error: str, step: str = "") -> str:
        """Pause the run because its budget is spent (``budget.onExceeded = pause``; the
        worker's ``budget.maxCost`` path), with its PAUSED event.

        SQL: fenced ``job_worker_pause`` (kind ``budget``): PAUSED (``paused_from`` QUEUED, so
        ``resume-job`` queues it again), ``error`` = the reason naming the budget, lease
        cleared; the transition log records kind ``budget``, actor ``worker:<id>``. A pending
        cancel request wins (the trigger settles CANCELLED). Transaction: one.

        :returns: the status after (PAUSED, or CANCELLED).
        :raises LeaseLost: when the fence matches no row.
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        return self._worker_pause(lease, "budget", error, step)

    @db.translated
    def job_loop_pause(self, lease: Lease, error: str, step: str = "") -> str:
        """Pause a run whose loop exhausted with ``onExhausted: "park"``, with its PAUSED event.

        SQL: fenced ``job_worker_pause`` (kind ``loop``): PAUSED (``paused_from`` QUEUED),
        ``error`` naming the loop, lease cleared; transition kind ``loop``, actor
        ``worker:<id>``. A pending cancel request wins (the trigger settles CANCELLED).
        Transaction: one.

        :returns: the status after (PAUSED, or CANCELLED / PAUSED by a request).
        :raises LeaseLost: when the fence matches no row.
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        return self._worker_pause(lease, "loop", error, step)

    def _worker_pause(self, lease: Lease, kind: str, error: str, step: str) -> str:
        """The worker's own pause of its run (``kind`` ``budget`` or ``loop``): the fenced
        ``job_worker_pause`` and, in its transaction, the PAUSED event, or the event of the
        operator's request the trigger applied instead. Shapes and errors: the callers'."""
        checks.text("error", error)
        error, step = scrub_text(error), scrub_text(step or "")
        with self._connection() as conn, conn.transaction():
            row = db.fenced(
                conn, "job_worker_pause", lease, {"kind": kind, "error": error, "step": step}
            )
            if row["status"] == "PAUSED" and row["error"] == error:
                self._outbox_txn(conn, row, EventType.TYPE_PAUSED, step=step, error=error)
            else:
                self._control_event_txn(conn, row, step)
        return str(row["status"])

    @db.translated
    def job_stop(self, lease: Lease) -> str:
        """Apply a pending operator request to a job whose step has not started (the worker
        learnt of it from a heartbeat while it waited for a permit): a fenced boundary write
        with no change of its own, which the trigger turns into CANCELLED or PAUSED (with its
        event). Transaction: one.

        :returns: the status after (RUNNING when no request was pending).
        :raises LeaseLost: when the fence matches no row.
        :raises StoreError: on a database failure.
        """
        return self._fenced_boundary("job_stop", lease, {}, "")

    @db.translated
    def job_intent(self, lease: Lease, step: str, intent: dict[str, Any]) -> None:
        """Record the intent of an external step before its call (``effect_intents[step] =
        intent + {at: now()}``). A boundary write: a pending cancel or pause is applied here
        (its event written), so the step is not called.

        SQL: one fenced ``UPDATE`` (no event of its own). Transaction: one.

        :raises LeaseLost: when the fence matches no row.
        :raises ControlApplied: when a pending request stopped the run (after the commit).
        :raises ValueError: blank step.
        :raises StoreError: on a database failure.
        """
        checks.text("step", step)
        step = scrub_text(step)
        params = {"step": step, "intent": checks.jsonb("intent", intent, dict)}
        status = self._fenced_boundary("job_intent", lease, params, step)
        if status != "RUNNING":
            raise ControlApplied(lease.job_id, lease.owner, lease.attempt, "job_intent", status)

    @db.translated
    def job_recovery_required(self, lease: Lease, step: str, reason: str) -> str:
        """Stop the run as RECOVERY_REQUIRED on ``step`` (``outstanding_step``) with ``reason``
        (``error``), lease cleared, with its RECOVERY_REQUIRED event (step, error).

        SQL: fenced ``UPDATE``, then one outbox row. Transaction: one.

        :returns: the status after (CANCELLED or PAUSED when a pending request won).
        :raises LeaseLost: when the fence matches no row.
        :raises ValueError: blank step or reason.
        :raises StoreError: on a database failure.
        """
        checks.text("step", step)
        checks.text("reason", reason)
        step, reason = scrub_text(step), scrub_text(reason)
        with self._connection() as conn, conn.transaction():
            row = db.fenced(conn, "job_recovery_required", lease, {"step": step, "reason": reason})
            if not self._control_event_txn(conn, row, step):
                self._outbox_txn(
                    conn, row, EventType.TYPE_RECOVERY_REQUIRED, step=step, error=reason
                )
        return str(row["status"])

    # -- the shapes the writes above share --------------------------------------------------

    def _fenced_status(self, query: str, lease: Lease, params: dict[str, Any]) -> str:
        """One fenced statement: the write and the outbox rows it derives from the status the
        row ends in, in autocommit or, when other claim loops' writes are ready at the same
        moment, in their transaction (``group_commit.py``; never a write with artifact rows,
        whose upserts touch rows other runs share). :returns: that status."""
        if self.group_commit and query in _GROUPED:
            return str(self._group_commit.write(query, lease, params)["status"])
        with self._connection() as conn:
            row = db.fenced(conn, query, lease, params)
        return str(row["status"])

    def _fenced_end(self, query: str, lease: Lease, error: str, step: str) -> str:
        """:meth:`_fenced_status` for a write that ends the run with ``error`` (not blank) on
        ``step`` ("" for none): FAILED, DEAD."""
        checks.text("error", error)
        params = {"error": scrub_text(error), "step": scrub_text(step or "")}
        return self._fenced_status(query, lease, params)

    def _fenced_boundary(self, query: str, lease: Lease, params: dict[str, Any], step: str) -> str:
        """A fenced boundary write with no event of its own, in one transaction with the
        CANCELLED or PAUSED event of a pending request the trigger applied (naming ``step``).
        :returns: the status after (RUNNING when no request was pending)."""
        with self._connection() as conn, conn.transaction():
            row = db.fenced(conn, query, lease, params)
            self._control_event_txn(conn, row, step)
        return str(row["status"])
