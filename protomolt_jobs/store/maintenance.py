"""The store's side of the background duties: the lease sweep and the budget sweep (the
sweeper), and the retention deletes (the pruner). Each works in bounded batches, one short
transaction per batch, with ``FOR UPDATE SKIP LOCKED`` so it never waits on a worker."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.records import SweepResult

__all__ = [
    "PRUNE_BATCH_DEFAULT",
    "SWEEP_BATCH_DEFAULT",
    "SWEEP_MAX_BATCHES_DEFAULT",
    "MaintenanceMixin",
]

log = logging.getLogger("protomolt_jobs.store")

#: Expired leases handled per sweep transaction.
SWEEP_BATCH_DEFAULT = 500
#: Rows one pruning statement deletes (small: each batch is one short transaction).
PRUNE_BATCH_DEFAULT = 500
#: Most sweep transactions per ``job_sweep_expired`` call (bounds one call's run time).
SWEEP_MAX_BATCHES_DEFAULT = 20


class MaintenanceMixin(db.Database):
    """``JobStore``'s sweeps and prunes."""

    # -- the sweeper ------------------------------------------------------------------------

    @db.translated
    def job_sweep_expired(
        self, limit: int = SWEEP_BATCH_DEFAULT, *, max_batches: int = SWEEP_MAX_BATCHES_DEFAULT
    ) -> SweepResult:
        """Recover RUNNING jobs whose lease expired (``lease_until < now()``), batch by batch.

        SQL per batch: one ``UPDATE`` over a ``FOR UPDATE SKIP LOCKED`` batch of up to
        ``limit`` rows (oldest expiry first): ``attempt < max_attempts`` -> QUEUED now (attempt
        kept, lease and token cleared, no event); ``attempt >= max_attempts`` -> DEAD with the
        error "lease expired after attempt N of M (worker W stopped heartbeating); ..." and
        ``completed_at``, plus one DEAD outbox row each. ``NOTIFY protomolt_jobs`` when the
        batch requeued anything. Transactions: one per batch (a batch's changes commit
        together); the call runs another batch while the last one came back full, up to
        ``max_batches``, so a backlog larger than one batch is drained without the caller
        looping (at most ``limit * max_batches`` rows per call; the next call continues).

        :param limit: most rows per batch (> 0).
        :param max_batches: most batches in this call (> 0).
        :returns: the counts of requeued and dead jobs over all batches (and the dead jobs'
            ids). Batches already committed stay committed if a later batch fails.
        :raises ValueError: for a non-positive limit or max_batches.
        :raises StoreError: on a database failure.
        """
        checks.positive_int("limit", limit)
        checks.positive_int("max_batches", max_batches)
        requeued = 0
        dead_ids: list[uuid.UUID] = []
        for _ in range(max_batches):
            batch_requeued, batch_dead, full = self._sweep_batch(limit)
            requeued += batch_requeued
            dead_ids.extend(batch_dead)
            if not full:
                break
        if requeued or dead_ids:
            log.info(
                "lease sweep: %d requeued, %d dead",
                requeued,
                len(dead_ids),
                extra={"action": "lease_sweep", "requeued": requeued, "dead": len(dead_ids)},
            )
        return SweepResult(requeued=requeued, dead=len(dead_ids), dead_job_ids=tuple(dead_ids))

    def _sweep_batch(self, limit: int) -> tuple[int, list[uuid.UUID], bool]:
        """One sweep transaction: ``(requeued, dead job ids, whether the batch was full)``."""
        with self._connection() as conn, conn.transaction():
            rows = db.rows(conn, "job_sweep_expired", {"limit": limit})
            dead = [r for r in rows if r["status"] == "DEAD"]
            for row in dead:
                self._outbox_txn(conn, row, EventType.TYPE_DEAD, error=row["error"] or "")
            # no attempts left with an unproven external effect (issue #17): not a dead letter
            recovery = [r for r in rows if r["status"] == "RECOVERY_REQUIRED"]
            for row in recovery:
                self._outbox_txn(
                    conn,
                    row,
                    EventType.TYPE_RECOVERY_REQUIRED,
                    step=row["outstanding_step"] or "",
                    error=row["error"] or "",
                )
            controlled = [r for r in rows if self._control_event_txn(conn, r, "")]
            requeued = len(rows) - len(dead) - len(recovery) - len(controlled)
            if requeued:
                db.execute(conn, "job_notify", {})
        for row in dead:
            log.warning(
                "job %s is DEAD: %s",
                row["job_id"],
                row["error"],
                extra={
                    "action": "job_dead_lease_expired",
                    "job_id": str(row["job_id"]),
                    "attempt": row["attempt"],
                },
            )
        return requeued, [r["job_id"] for r in dead], len(rows) >= limit

    @db.translated
    def job_budget_sweep(self, limit: int = SWEEP_BATCH_DEFAULT) -> list[uuid.UUID]:
        """End (or pause) live runs whose whole-run deadline (``budget.deadline``) has passed.

        SQL: ``job_budget_expired``: rows with ``deadline_at < now()`` (database time) in a
        live status (QUEUED, RUNNING, WAITING, and PAUSED / RECOVERY_REQUIRED where they
        exist), oldest deadline first, ``FOR UPDATE SKIP LOCKED``, up to ``limit``: FAILED with
        ``error = "BUDGET: budget.deadline <duration> exceeded: ..."``, lease and parked step
        cleared, ``completed_at = now()``; one FAILED outbox row each. A RUNNING row's worker
        loses its lease (its next fenced write is LeaseLost and it abandons the run).
        Runs whose ``budget.onExceeded`` is ``pause`` go through ``job_budget_expired_pause``
        instead: QUEUED/WAITING -> PAUSED now (PAUSED event with the reason), RUNNING -> a
        pause request from ``sweeper`` (CONTROL_REQUESTED event), applied at the worker's next
        boundary write. Transaction: one.

        :returns: the ids of the runs ended, paused or asked to pause.
        :raises StoreError: on a database failure.
        """
        checks.positive_int("limit", limit)
        with self._connection() as conn, conn.transaction():
            rows = db.rows(conn, "job_budget_expired", {"limit": limit})
            for row in rows:
                # A cancel pending on a RUNNING row is binding: the trigger settles it
                # CANCELLED (migration 0002), and its event says so.
                if not self._control_event_txn(conn, row, ""):
                    self._outbox_txn(conn, row, EventType.TYPE_FAILED, error=row["error"] or "")
            paused = db.rows(conn, "job_budget_expired_pause", {"limit": limit})
            for row in paused:
                if row["status"] == "RUNNING":
                    self._outbox_txn(
                        conn,
                        row,
                        EventType.TYPE_CONTROL_REQUESTED,
                        verdict="pause",
                        error=row["reason"] or "",
                    )
                else:
                    self._outbox_txn(
                        conn,
                        row,
                        EventType.TYPE_PAUSED,
                        step=row["outstanding_step"] or "",
                        error=row["reason"] or "",
                    )
        for row in rows:
            log.warning(
                "job %s FAILED: %s",
                row["job_id"],
                row["error"],
                extra={"action": "budget_exceeded", "job_id": str(row["job_id"])},
            )
        for row in paused:
            log.warning(
                "job %s %s: %s",
                row["job_id"],
                "PAUSED" if row["status"] == "PAUSED" else "asked to pause",
                row["reason"],
                extra={"action": "budget_paused", "job_id": str(row["job_id"])},
            )
        return [row["job_id"] for row in rows] + [row["job_id"] for row in paused]

    # -- retention (the pruner) -------------------------------------------------------------

    @db.translated
    def outbox_prune_published(
        self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT, *, foreign_rows: bool = False
    ) -> int:
        """Delete one batch of PUBLISHED outbox rows published more than ``retention_s``
        seconds ago (database time), oldest first.

        SQL: ``outbox_prune_published`` (a ``DELETE`` over a ``FOR UPDATE SKIP LOCKED`` batch;
        its ``WHERE`` keeps to ``status = 'PUBLISHED'``: PENDING and FAILED rows are never
        deleted). Transaction: one statement, autocommit, so locks last one short batch.

        :param retention_s: age of ``published_at`` beyond which a row goes, seconds (> 0).
        :param limit: most rows deleted (> 0).
        :param foreign_rows: also rows our store did not write (``origin`` NULL, migration
            0013: a Java node's, or unproven on an adopted database); ``jobs.prune_foreign_rows``.
        :returns: rows deleted (a full batch means more may be waiting).
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        return self._prune_batch("outbox_prune_published", retention_s, limit, foreign_rows)

    @db.translated
    def job_prune_terminal(
        self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT, *, foreign_rows: bool = False
    ) -> int:
        """Delete one batch of terminal runs (COMPLETED, FAILED, DEAD) completed more than
        ``retention_s`` seconds ago (database time), oldest first.

        SQL: ``job_prune_terminal`` (a ``DELETE`` over a ``FOR UPDATE SKIP LOCKED`` batch,
        index ``idx_workflow_run_terminal_completed_node``; its ``WHERE`` re-checks the terminal
        status under the row lock, so a run requeued meanwhile is kept). Only runs without a
        workflow retention (``retention`` NULL, migration 0020): :meth:`job_prune_retention`
        deletes the others. The run's outbox rows
        are left to :meth:`outbox_prune_published` (a PENDING one is never deleted).
        Transaction: one statement, autocommit.

        :param retention_s: age of ``completed_at`` beyond which a run goes, seconds (> 0).
        :param limit: most runs deleted (> 0).
        :param foreign_rows: also runs our store did not insert (``origin`` NULL, migration
            0013); ``jobs.prune_foreign_rows``.
        :returns: runs deleted.
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        return self._prune_batch("job_prune_terminal", retention_s, limit, foreign_rows)

    @db.translated
    def job_prune_cancelled(
        self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT, *, foreign_rows: bool = False
    ) -> int:
        """Delete one batch of CANCELLED runs cancelled more than ``retention_s`` seconds ago,
        oldest first (a query of its own: migration 0004's partial index predates the status,
        and cancelled runs are few). Only runs without a workflow retention (migration 0020).
        SQL: ``job_prune_cancelled``; its ``WHERE`` re-checks
        ``status = 'CANCELLED'`` under the row lock (a PAUSED run is never deleted); the
        run's transition log goes with it (``ON DELETE CASCADE``). Runs our store did not
        insert are kept unless ``foreign_rows``. Transaction: one statement.

        :returns: runs deleted.
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        return self._prune_batch("job_prune_cancelled", retention_s, limit, foreign_rows)

    @db.translated
    def job_prune_retention(
        self, limit: int = PRUNE_BATCH_DEFAULT, *, foreign_rows: bool = False
    ) -> tuple[int, int]:
        """Delete one batch of terminal runs whose workflow's own retention has ended
        (``completed_at`` plus the seconds the run's ``retention`` column gives its final
        status is before the database's ``now()``; migration 0020), soonest expiry first.

        SQL: ``job_prune_retention``: one statement, autocommit, over a ``FOR UPDATE SKIP
        LOCKED`` batch found through ``idx_workflow_run_retention_expires``; it deletes the
        runs (their transition log and votes go with them, ``ON DELETE CASCADE``) and their
        PUBLISHED outbox rows written while they ran. A status the run's retention does not
        name is kept; a live run, and a PENDING or FAILED outbox row, never go.

        :param limit: most runs deleted (> 0).
        :param foreign_rows: also rows our store did not write (``jobs.prune_foreign_rows``).
        :returns: ``(runs deleted, outbox rows deleted)``.
        :raises ValueError: for a non-positive limit.
        :raises StoreError: on a database failure.
        """
        checks.positive_int("limit", limit)
        params = {"limit": limit, "foreign_rows": bool(foreign_rows)}
        with self._connection() as conn:
            row = db.one(conn, "job_prune_retention", params)
        if row is None:
            return 0, 0
        return int(row["runs"]), int(row["outbox_rows"])

    @db.translated
    def artifact_bytes_doomed(self, limit: int = PRUNE_BATCH_DEFAULT) -> list[tuple[str, bool]]:
        """Byte keys of deleted runs waiting for the pruner (migration 0027), oldest first:
        ``[(uri, referenced)]``, ``referenced`` when a kept artifact or a stored run still
        names the uri (its bytes must stay).

        SQL: ``artifact_bytes_doomed``. Transaction: one, read only.

        :raises ValueError: for a non-positive limit.
        :raises StoreError: on a database failure.
        """
        checks.positive_int("limit", limit)
        with self._connection() as conn:
            rows = db.rows(conn, "artifact_bytes_doomed", {"limit": limit})
        return [(str(r["uri"]), bool(r["referenced"])) for r in rows]

    @db.translated
    def artifact_bytes_forget(self, uris: list[str]) -> int:
        """Drop ``uris`` from the byte keys waiting for the pruner.

        SQL: ``artifact_bytes_forget``, one statement, autocommit. :returns: rows deleted.
        :raises StoreError: on a database failure.
        """
        if not uris:
            return 0
        with self._connection() as conn:
            return db.execute(conn, "artifact_bytes_forget", {"uris": list(uris)}).rowcount

    @db.translated
    def artifact_retract(
        self, artifact: dict[str, Any], *, current: str, actor: str, reason: str | None
    ) -> bool:
        """Retract one artifact (``retract-artifact``): its ``workflow_artifact`` row becomes
        ``retracted`` (made from ``artifact`` when it had none: ``{artifactId, jobId, step,
        iteration, port, kind, sha256, sizeBytes?, mediaType?, uri?}``), with a transition from
        its state (``current`` when it had no row) naming ``actor`` and ``reason``.

        SQL: ``artifact_retract``, one statement, autocommit.
        :returns: True when it was retracted now (False: it already was).
        :raises StoreError: on a database failure.
        """
        params = {
            "artifact_id": artifact["artifactId"],
            "job_id": artifact["jobId"],
            "step": artifact["step"],
            "iteration": artifact["iteration"],
            "port": artifact["port"],
            "kind": artifact["kind"],
            "sha256": artifact.get("sha256"),
            "size_bytes": artifact.get("sizeBytes"),
            "media_type": artifact.get("mediaType"),
            "uri": artifact.get("uri"),
            "current": current,
            "actor": actor,
            "reason": reason,
        }
        with self._connection() as conn:
            row = db.one(conn, "artifact_retract", params)
        return bool(row and row["changed"])

    @db.translated
    def artifact_promote(
        self, artifact: dict[str, Any], *, current: str, actor: str, reason: str
    ) -> tuple[bool, str]:
        """Promote one verified artifact (``promote-artifact``): its ``workflow_artifact`` row
        becomes ``promoted`` (made from ``artifact`` as :meth:`artifact_retract` does when it
        had none and ``current``, its state derived from the entries, is ``verified``), only
        from ``verified``, with a transition naming ``actor`` and ``reason``.

        SQL: ``artifact_promote``, one statement, autocommit.
        :returns: ``(promoted now, the state it was found in)``: ``(False, "draft")`` for an
            artifact that was not verified (nothing written).
        :raises StoreError: on a database failure.
        """
        params = {
            "artifact_id": artifact["artifactId"],
            "job_id": artifact["jobId"],
            "step": artifact["step"],
            "iteration": artifact["iteration"],
            "port": artifact["port"],
            "kind": artifact["kind"],
            "sha256": artifact.get("sha256"),
            "size_bytes": artifact.get("sizeBytes"),
            "media_type": artifact.get("mediaType"),
            "uri": artifact.get("uri"),
            "current": current,
            "actor": actor,
            "reason": reason,
        }
        with self._connection() as conn:
            row = db.one(conn, "artifact_promote", params)
        if row is None:  # pragma: no cover - the statement always answers one row
            return False, current
        return bool(row["changed"]), str(row["before"])

    @db.translated
    def artifact_transitions(self, artifact_id: Any) -> list[dict[str, Any]]:
        """The state changes of one artifact (``workflow_artifact_transition``), in order:
        ``{seq, at, actor, from_state, to_state, reason}`` rows.

        SQL: ``artifact_transitions``. Transaction: one, read only.
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            return [
                dict(r) for r in db.rows(conn, "artifact_transitions", {"artifact_id": artifact_id})
            ]

    @db.translated
    def artifact_kept(self, job_id: Any) -> list[dict[str, Any]]:
        """The ``workflow_artifact`` rows of run ``job_id`` (its ports, receipts and state
        changes; after its deletion, its promoted artifacts, detached), as ``{column: value}``
        rows.

        SQL: ``artifact_kept``. Transaction: one, read only.
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            return [dict(r) for r in db.rows(conn, "artifact_kept", {"job_id": job_id})]

    def _prune_batch(self, query: str, retention_s: float, limit: int, foreign_rows: bool) -> int:
        """One pruning ``DELETE`` (``query``) of up to ``limit`` rows older than
        ``retention_s`` seconds (only rows our store wrote unless ``foreign_rows``), in
        autocommit: :returns: the rows deleted."""
        checks.positive_seconds("retention_s", retention_s)
        checks.positive_int("limit", limit)
        params = {"retention_s": retention_s, "limit": limit, "foreign_rows": bool(foreign_rows)}
        with self._connection() as conn:
            cur = db.execute(conn, query, params)
            return cur.rowcount
