"""Operator writes about a job, by id (the verbs): cancel, pause, resume, requeue, retry-step,
recover, and the parked gate (complete or fail a step a run waits on).

None of them holds a lease. Each is one transaction: a conditional write under the row lock
and its event, so a control write racing the worker's own write has exactly one outcome; a
write that changes nothing answers with the row as it is (``ControlOutcome`` with ``changed``
false, or ``AlreadyDone`` / ``WrongState`` at the parked gate).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg

from protomolt_jobs.errors import NotFound, StoreError
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.artifact_rows import artifact_rows, has_artifact_rows
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.records import (
    AlreadyDone,
    ControlOutcome,
    JobRecord,
    ParkedCompletion,
    ParkedStepCompleted,
    WrongState,
)
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["ControlMixin"]


class ControlMixin(db.Database):
    """``JobStore``'s operator writes and the parked gate."""

    @db.translated
    def job_cancel(
        self,
        job_id: uuid.UUID | str,
        *,
        actor: str,
        reason: str | None = None,
        compensate: bool | None = None,
    ) -> ControlOutcome:
        """Cancel a job: QUEUED, WAITING or PAUSED -> CANCELLED now (one CANCELLED event, error
        ``"CANCELLED by <actor>[: <reason>]"``, checkpoints kept); RUNNING -> a cancel request
        recorded in ``control`` (a CONTROL_REQUESTED event), binding: the worker's next boundary
        write settles the job CANCELLED (migration 0002's trigger), whatever it was writing.

        The request is also kept in ``cancel_request`` (``{actor, reason, requestedAt,
        compensate}``, migration 0015): ``compensate`` False means no compensation step runs
        for this cancel, None leaves it to the workflow's ``cancel.compensate`` (default true).

        SQL: one conditional ``UPDATE`` (``job_control_cancel``) and its event; the row lock
        orders it against the worker's writes, so a cancel racing a completion has exactly
        one outcome. Transaction: one.

        :returns: ``changed`` with the status after (CANCELLED, or RUNNING = requested), or
            not ``changed`` with the current status (terminal, or RUNNING with a cancel
            already pending; None for an unknown job).
        :raises ValueError: malformed id or blank actor.
        :raises StoreError: on a database failure.
        """
        if compensate is not None and not isinstance(compensate, bool):
            raise ValueError(f"compensate must be a boolean or None; got {compensate!r}")
        return self._control(
            job_id, "job_control_cancel", actor, reason, {"compensate": compensate}
        )

    @db.translated
    def job_pause(
        self, job_id: uuid.UUID | str, *, actor: str, reason: str | None = None
    ) -> ControlOutcome:
        """Pause a job: QUEUED or WAITING -> PAUSED now (``paused_from`` remembers which; a
        parked step stays ``outstanding_step``; a PAUSED event); RUNNING without a pending
        request -> a pause request (CONTROL_REQUESTED), applied by the worker's next boundary
        write (PAUSED after the step in flight is checkpointed; lease and permit released).

        :returns: as :meth:`job_cancel` (PAUSED, or RUNNING = requested).
        :raises ValueError: malformed id or blank actor.
        :raises StoreError: on a database failure.
        """
        return self._control(job_id, "job_control_pause", actor, reason)

    @db.translated
    def job_resume(
        self,
        job_id: uuid.UUID | str,
        *,
        actor: str,
        reason: str | None = None,
        at: datetime | None = None,
    ) -> ControlOutcome:
        """Resume a PAUSED job: back to WAITING on the same step when it was parked, else
        QUEUED with ``run_after = greatest(now(), at)`` (database clock) and attempt 0; a
        RESUMED event; NOTIFY when due now. A RUNNING job with a pending pause request has the
        request withdrawn instead (status stays RUNNING).

        :param at: earliest start (timezone-aware), or None for now.
        :returns: ``changed`` with the status after and ``run_after``, or not ``changed`` with
            the current status (None for an unknown job).
        :raises ValueError: malformed id, blank actor, naive ``at``.
        :raises StoreError: on a database failure.
        """
        offset = None if at is None else at.utcoffset()
        if at is not None and (at.tzinfo is None or offset is None):
            raise ValueError("at: must be timezone-aware")
        if (
            at is not None
            and offset is not None
            and at.replace(tzinfo=None) >= datetime(9999, 12, 30) + offset
        ):
            # Stored, but psycopg cannot load a time after year 9999 in the session's zone
            # (up to +14:00): every later read of the row would fail.
            raise ValueError("at: must be earlier than 9999-12-30T00:00:00Z")
        key = checks.uuid("job_id", job_id)
        checks.text("actor", actor)
        params = {
            "job_id": key,
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
            "at": at,
        }
        reason_text = scrub_text(reason) if reason else ""
        with self._connection() as conn, conn.transaction():
            row = db.one(conn, "job_control_resume", params)
            if row is not None:
                self._outbox_txn(conn, row, EventType.TYPE_RESUMED, error=reason_text)
                if row["due"]:
                    db.execute(conn, "job_notify", {})
                return ControlOutcome(
                    True, row["status"], None, row["outstanding_step"], row["run_after"]
                )
            row = db.one(conn, "job_control_withdraw_pause", params)
            if row is not None:
                return ControlOutcome(True, "RUNNING")
        return self._control_refusal(key)

    @db.translated
    def job_requeue(
        self,
        job_id: uuid.UUID | str,
        *,
        actor: str,
        reason: str | None = None,
        checkpoints: list[dict[str, Any]] | None = None,
    ) -> ControlOutcome:
        """Requeue a DEAD or FAILED job: QUEUED now, attempt 0, checkpoints kept, ``error``
        cleared from the row (the history keeps it); a REQUEUED event and NOTIFY.

        :param checkpoints: when given, stored instead of the row's (a graph run keeps only
            ``graph.requeue_checkpoints``: its failed entries are final on replay).
        :returns: ``changed`` (QUEUED), or not ``changed`` with the current status.
        :raises ValueError: malformed id or blank actor.
        :raises TypeError: when ``checkpoints`` is not a list.
        :raises StoreError: on a database failure.
        """
        extra = {
            "checkpoints": None
            if checkpoints is None
            else checks.jsonb("checkpoints", checkpoints, list)
        }
        return self._control(job_id, "job_control_requeue", actor, reason, extra)

    @db.translated
    def job_retry_step(
        self,
        job_id: uuid.UUID | str,
        *,
        step: str,
        checkpoints: list[dict[str, Any]],
        expected_status: str,
        expected_history_seq: int,
        actor: str,
        reason: str | None = None,
        intents: dict[str, Any] | None = None,
        bump_generation: bool = True,
    ) -> ControlOutcome:
        """Queue a FAILED, DEAD, CANCELLED, PAUSED or COMPLETED job again with only
        ``checkpoints`` kept (the caller dropped ``step``'s and, by the retry's scope, its
        dependants'): attempt 0, result, verdict and error cleared; a REQUEUED event naming
        ``step``, NOTIFY. ``intents`` become the row's external-step intents (None: none); the
        caller keeps the intents of unproven effects, so the resumed run probes them instead
        of calling blindly. ``step``'s generation (the last part of its idempotency key) grows
        by one unless ``bump_generation`` is false (an external step called again with its key).
        ``reason`` is recorded as given (the verb puts the scope in it).

        Optimistic: applies only while the row is still ``expected_status`` at
        ``expected_history_seq`` (nothing changed since the caller read it).

        :returns: ``changed`` (QUEUED), or not ``changed`` with the current status.
        :raises ValueError: malformed id, blank step or actor.
        :raises TypeError: when ``checkpoints`` is not a list.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        checks.text("actor", actor)
        params = {
            "job_id": key,
            "step": scrub_text(step),
            "checkpoints": checks.jsonb("checkpoints", checkpoints, list),
            "intents": checks.jsonb("intents", intents, dict) if intents else None,
            "bump": bool(bump_generation),
            "status": expected_status,
            "history_seq": int(expected_history_seq),
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
        }
        try:
            with self._connection() as conn, conn.transaction():
                row = db.one(conn, "job_control_retry_step", params)
                if row is not None:
                    self._outbox_txn(
                        conn,
                        row,
                        EventType.TYPE_REQUEUED,
                        step=scrub_text(step),
                        error=scrub_text(reason) if reason else "",
                    )
                    db.execute(conn, "job_notify", {})
                    return ControlOutcome(True, row["status"])
        except psycopg.errors.UniqueViolation as exc:
            return self._dedup_conflict(key, exc)
        return self._control_refusal(key)

    @db.translated
    def job_recover(
        self,
        job_id: uuid.UUID | str,
        *,
        step: str,
        checkpoints: list[dict[str, Any]],
        intents: dict[str, Any] | None,
        expected_history_seq: int,
        kind: str,
        actor: str,
        reason: str | None = None,
        progress: str | None = None,
        answer: dict[str, Any] | None = None,
    ) -> ControlOutcome:
        """Send a RECOVERY_REQUIRED run back to QUEUED with ``checkpoints`` and ``intents`` as
        given (``reconcile-step``, ``migrate-checkpoint``): attempt 0, error cleared; a
        fingerprinted entry without ``at`` gets the database's time. Recorded as ``kind`` by
        ``actor``; a REQUEUED event naming ``step``; NOTIFY.

        ``answer``: the entry among ``checkpoints`` the operator gave now (``reconcile-step
        done``, ``migrate-checkpoint replace``), or None. When it asks for artifact rows
        (``store/artifact_rows.py``: declared ports, a declared receipt, validated artifacts)
        the write is ``job_recover_artifacts``, which upserts them into ``workflow_artifact``
        with ``actor`` as the transitions' actor in the same statement; otherwise (and for
        every other entry, whose rows were written with it) nothing but the run is written.

        ``progress`` (a ``progress-mismatch``; docs/long-steps.md): ``"accept"`` makes the
        step's unfinished progress rows forget their fingerprints (the step continues from the
        saved state; ``job_progress_accept``), ``"drop"`` deletes them (the step starts from
        zero; ``job_progress_drop``), in the same transaction. None: progress untouched.

        Optimistic: applies only while the row is still RECOVERY_REQUIRED at
        ``expected_history_seq``.

        :returns: ``changed`` (QUEUED), or not ``changed`` with the current status.
        :raises ValueError: malformed id, blank step, kind or actor.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        checks.text("kind", kind)
        checks.text("actor", actor)
        params: dict[str, Any] = {
            "job_id": key,
            "step": scrub_text(step),
            "checkpoints": checks.jsonb("checkpoints", checkpoints, list),
            "intents": None if not intents else checks.jsonb("intents", intents, dict),
            "history_seq": int(expected_history_seq),
            "kind": kind,
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
        }
        if progress not in (None, "accept", "drop"):
            raise ValueError(f"progress: must be 'accept' or 'drop'; got {progress!r}")
        query = "job_recover"
        if answer is not None and has_artifact_rows(answer):
            # its artifact rows go in with it, in the same statement (store/artifact_rows.py)
            query = "job_recover_artifacts"
            params["rows"] = checks.jsonb("rows", artifact_rows(answer, key), list)
        with self._connection() as conn, conn.transaction():
            row = db.one(conn, query, params)
            if row is not None:
                if progress is not None:
                    db.rows(
                        conn,
                        f"job_progress_{progress}",
                        {"job_id": key, "step": params["step"]},
                    )
                self._outbox_txn(
                    conn,
                    row,
                    EventType.TYPE_REQUEUED,
                    step=scrub_text(step),
                    error=scrub_text(reason) if reason else "",
                    notify=True,
                )
                return ControlOutcome(True, row["status"])
        return self._control_refusal(key)

    def _control(
        self,
        job_id: uuid.UUID | str,
        query: str,
        actor: str,
        reason: str | None,
        extra: dict[str, Any] | None = None,
    ) -> ControlOutcome:
        """Cancel, pause and requeue: one conditional write (``query``, with ``extra``
        parameters) and the event of what it did; the row as it is when it did nothing."""
        key = checks.uuid("job_id", job_id)
        checks.text("actor", actor)
        reason = scrub_text(reason) if reason else None
        params = {"job_id": key, "actor": scrub_text(actor), "reason": reason, **(extra or {})}
        try:
            with self._connection() as conn, conn.transaction():
                row = db.one(conn, query, params)
                if row is not None:
                    self._control_changed_txn(conn, query, row, reason)
                    return ControlOutcome(True, row["status"], None, row.get("outstanding_step"))
        except psycopg.errors.UniqueViolation as exc:
            return self._dedup_conflict(key, exc)
        return self._control_refusal(key)

    def _dedup_conflict(
        self, key: uuid.UUID, exc: psycopg.errors.UniqueViolation
    ) -> ControlOutcome:
        """A requeue or retry-step of an ended run would make it live again while another live
        run holds its ``dedupKey`` (uq_workflow_run_dedup_live): nothing changed; say which run
        holds the key. Any other unique violation is re-raised."""
        if getattr(exc.diag, "constraint_name", None) != "uq_workflow_run_dedup_live":
            raise exc
        with self._connection() as conn:
            row = db.one(conn, "job_get", {"job_id": key})
            holder = (
                db.one(conn, "job_get_live_dedup", {"dedup_key": row["dedup_key"]})
                if row is not None and row["dedup_key"] is not None
                else None
            )
        if row is None:
            return ControlOutcome(False, None)
        held_by = (
            f"the live run {holder['job_id']} ({holder['status']})"
            if holder is not None
            else "another live run"
        )
        return ControlOutcome(
            False,
            row["status"],
            None,
            row["outstanding_step"],
            conflict=(
                f"its dedupKey {row['dedup_key']!r} is held by {held_by}; cancel that run or "
                "wait for it to end"
            ),
        )

    def _control_changed_txn(
        self, conn: psycopg.Connection[Any], query: str, row: dict[str, Any], reason: str | None
    ) -> None:
        status = row["status"]
        if status == "RUNNING":
            kind = "cancel" if query == "job_control_cancel" else "pause"
            self._outbox_txn(
                conn, row, EventType.TYPE_CONTROL_REQUESTED, verdict=kind, error=reason or ""
            )
        elif status == "CANCELLED":
            self._outbox_txn(conn, row, EventType.TYPE_CANCELLED, error=row["error"] or "")
        elif status == "PAUSED":
            self._outbox_txn(
                conn,
                row,
                EventType.TYPE_PAUSED,
                step=row.get("outstanding_step") or "",
                error=reason or "",
            )
        elif status == "QUEUED":
            self._outbox_txn(conn, row, EventType.TYPE_REQUEUED, error=reason or "", notify=True)

    def _control_refusal(self, key: uuid.UUID) -> ControlOutcome:
        """The row as it is, for a control write that changed nothing."""
        with self._connection() as conn:
            row = db.one(conn, "job_get", {"job_id": key})
        if row is None:
            return ControlOutcome(False, None)
        control = json.loads(row["control"]) if row["control"] else None
        return ControlOutcome(False, row["status"], control, row["outstanding_step"])

    # -- parked completions -----------------------------------------------------------------

    @db.translated
    def job_complete_parked(
        self, job_id: uuid.UUID | str, step: str, entry: dict[str, Any], *, actor: str = "api"
    ) -> ParkedCompletion:
        """Complete a parked step: the human-in-the-loop gate.

        SQL: ``SELECT ... FOR UPDATE`` of the row, then in order: any checkpoint named ``step``
        -> AlreadyDone (a redelivery; nothing changes); not WAITING on ``step`` -> WrongState;
        else ``UPDATE ... SET status='QUEUED', checkpoints = checkpoints || [entry],
        outstanding_step = NULL, run_after = now(), attempt = 0`` (the next segment gets its own
        ``max_attempts`` tries), one outbox row (STEP_CHECKPOINT, step, ``detail.status``
        QUEUED) and ``NOTIFY protomolt_jobs``. Transaction: one; the row lock serialises
        concurrent completions, so exactly one of them is ParkedStepCompleted. An entry that
        asks for artifact rows (``store/artifact_rows.py``: declared ports, a declared
        receipt, validated artifacts) is written by ``job_complete_parked_artifacts``, its rows
        upserted by the same statement with ``actor`` as the transitions' actor.

        :param entry: the checkpoint entry; its ``name`` must equal ``step``.
        :returns: ParkedStepCompleted(), AlreadyDone(status) or WrongState(status, outstanding_step).
        :raises NotFound: for an unknown job id.
        :raises ValueError: for a malformed id, blank step or an entry not naming ``step``.
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises StoreError: on a database failure or unreadable stored checkpoints.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        if checks.entry_name(entry) != step:
            raise ValueError(
                f"entry.name: must be the completed step {step!r}; got {entry['name']!r}"
            )
        entry_json = checks.jsonb("entry", entry, dict)
        query = "job_complete_parked"
        params: dict[str, Any] = {"entry": entry_json, "actor": scrub_text(actor)}
        if has_artifact_rows(entry):
            # its artifact rows go in with it, in the same statement (store/artifact_rows.py)
            query = "job_complete_parked_artifacts"
            params["rows"] = checks.jsonb("rows", artifact_rows(entry, key), list)
        return self._parked_write(
            query,
            key,
            scrub_text(step),
            params,
            EventType.TYPE_STEP_CHECKPOINT,
            notify=True,
        )

    @db.translated
    def job_fail_parked(
        self, job_id: uuid.UUID | str, step: str, error: str, *, actor: str = "api"
    ) -> ParkedCompletion:
        """Fail a parked job as a verdict (its completion was rejected, e.g. by validation).

        SQL: the same gate as :meth:`job_complete_parked` under ``FOR UPDATE``; then ``UPDATE
        ... SET status='FAILED', error, outstanding_step = NULL, completed_at = now()`` and one
        outbox row (FAILED, step, error). Transaction: one.

        :returns: ParkedStepCompleted() when this call failed the job, else AlreadyDone / WrongState.
        :raises NotFound: for an unknown job id.
        :raises ValueError: for a malformed id, blank step or blank error.
        :raises StoreError: on a database failure or unreadable stored checkpoints.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        checks.text("error", error)
        error = scrub_text(error)
        return self._parked_write(
            "job_fail_parked",
            key,
            scrub_text(step),
            {"error": error, "actor": scrub_text(actor)},
            EventType.TYPE_FAILED,
            error=error,
        )

    def _parked_write(
        self,
        query: str,
        key: uuid.UUID,
        step: str,
        params: dict[str, Any],
        event: int,
        *,
        error: str = "",
        notify: bool = False,
    ) -> ParkedCompletion:
        """The parked gate and, when it lets the run through, ``query`` (with ``job_id`` and
        ``step``) and its ``event``, then ``NOTIFY`` when ``notify``: one transaction."""
        with self._connection() as conn, conn.transaction():
            refusal = self._parked_gate_txn(conn, key, step)
            if refusal is not None:
                return refusal
            row = db.one(conn, query, {"job_id": key, "step": step, **params})
            if row is None:  # pragma: no cover - the row lock makes the gate authoritative
                raise StoreError(f"job {key} changed under its row lock")
            self._outbox_txn(conn, row, event, step=step, error=error)
            if notify:
                db.execute(conn, "job_notify", {})
        return ParkedStepCompleted()

    def _parked_gate_txn(
        self, conn: psycopg.Connection[Any], job_id: uuid.UUID, step: str
    ) -> AlreadyDone | WrongState | None:
        """Lock the row and decide: None means the job is WAITING on ``step`` (proceed)."""
        row = db.one(conn, "job_lock", {"job_id": job_id})
        if row is None:
            raise NotFound(f"workflow run not found: {job_id}")
        record = JobRecord.from_row(row)
        checkpoints = record.checkpoints
        if checkpoints is None:
            raise StoreError(
                f"stored checkpoints of job {job_id} are unreadable: {record.unreadable}"
            )
        # An entry a retry-step marked (``retryOf``: kept on the condition that the retried
        # step's output is unchanged) does not answer the step: a run parked on it again
        # found that output changed (workflow/retry_scope.py).
        if any(
            isinstance(c, dict) and c.get("name") == step and "retryOf" not in c
            for c in checkpoints
        ):
            return AlreadyDone(row["status"])
        if row["status"] != "WAITING" or row["outstanding_step"] != step:
            return WrongState(row["status"], row["outstanding_step"])
        return None
