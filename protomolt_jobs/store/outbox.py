"""The relay's side of the transactional outbox: claim PENDING rows, mark them PUBLISHED or
FAILED, read a job's rows, count the backlog. (The rows themselves are written by the change
they announce, in its transaction: ``Database._outbox_txn`` and the one-statement writes.)

Outbox claims
-------------
``outbox_claim`` hands out PENDING rows oldest first by ``seq`` and *leases* them
(``claimed_until = now() + claim_s``) in one committed statement, skipping rows locked or leased
by another relay and any row whose job has an earlier PENDING row. So two relays never publish
the same row at once while the lease lasts, and a job's later event is never handed out before
its earlier one is PUBLISHED or FAILED. ``outbox_mark_published`` / ``outbox_mark_failed`` end
the lease (a failed row is handed out again on the next claim). A relay that dies holding rows
delays them by at most ``claim_s``; a relay slower than ``claim_s`` may see its rows published
twice (at-least-once; consumers dedupe on ``event_id``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import MAX_ERROR_CHARS
from protomolt_jobs.store.records import OUTBOX_MAX_ATTEMPTS, OutboxRow
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["OUTBOX_CLAIM_S_DEFAULT", "OutboxMixin"]

log = logging.getLogger("protomolt_jobs.store")

#: How long an outbox claim keeps rows from other relays, seconds.
OUTBOX_CLAIM_S_DEFAULT = 30.0


class OutboxMixin(db.Database):
    """``JobStore``'s outbox calls for the relay."""

    @db.translated
    def outbox_claim(
        self, limit: int, *, claim_s: float = OUTBOX_CLAIM_S_DEFAULT
    ) -> list[OutboxRow]:
        """Hand out up to ``limit`` PENDING events to this relay, oldest first by ``seq``.

        SQL (one statement): among the first ``8 * limit`` PENDING rows by ``seq``, each
        ``kafka_key``'s first one (a prefix by ``seq`` holds every earlier row of the keys it
        holds, so that is the job's oldest PENDING row; found by one sort, not a probe per
        row), not leased (``claimed_until`` NULL or past, re-checked on the row's latest
        version), ``ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED``, and lease them:
        ``claimed_until = now() + claim_s``. Under a backlog deeper than ``8 * limit`` a pass
        may hand out fewer than ``limit`` rows (those prefix rows belong to jobs whose first
        row another relay holds); the next passes go on as rows are marked. When the full
        prefix yields nothing (every one of its jobs' first rows leased or locked, e.g. by a
        relay that crashed holding them), the same statement takes each job's first PENDING
        row past it by a probe per row, so another relay's leases never stop other jobs.
        Transaction: one, committed before returning; the lease (not a held lock) keeps other
        relays off these rows until this relay calls :meth:`outbox_mark_published` or
        :meth:`outbox_mark_failed`, or ``claim_s`` passes.

        Per-job order: at most one row per job is handed out at a time (the oldest PENDING
        one), so a job's later event is never published before its earlier one is PUBLISHED
        or FAILED, also across relays and partial failures.

        :param limit: most rows (> 0).
        :param claim_s: lease length, seconds (> 0); keep it above the publish timeout.
        :returns: the rows, ordered by ``seq``.
        :raises ValueError: for a non-positive limit or claim_s.
        :raises StoreError: on a database failure.
        """
        checks.positive_int("limit", limit)
        checks.positive_seconds("claim_s", claim_s)
        with self._connection() as conn:
            rows = db.rows(conn, "outbox_claim", {"limit": limit, "claim_s": float(claim_s)})
        return sorted((OutboxRow.from_row(r) for r in rows), key=lambda r: r.seq)

    @db.translated
    def outbox_mark_published(self, event_ids: Iterable[uuid.UUID | str]) -> int:
        """Mark acked events PUBLISHED (rows are kept for ever).

        SQL: ``UPDATE ... SET status='PUBLISHED', published_at=now(), claimed_until=NULL WHERE
        event_id = ANY(...) AND status='PENDING'``. Transaction: one.

        :returns: how many rows moved (a row already PUBLISHED or FAILED is not counted).
        :raises ValueError: when an id is not a UUID.
        :raises StoreError: on a database failure.
        """
        ids = [checks.uuid("event_ids", e) for e in event_ids]
        if not ids:
            return 0
        with self._connection() as conn:
            cur = db.execute(conn, "outbox_mark_published", {"event_ids": ids})
            return cur.rowcount

    @db.translated
    def outbox_mark_failed(self, event_id: uuid.UUID | str, error: str) -> OutboxRow | None:
        """Record one failed publish of a PENDING event.

        SQL: ``UPDATE ... SET attempts = attempts + 1, last_error = error[:4000],
        claimed_until = NULL`` and ``status = 'FAILED'`` when this is the 10th failure (the
        relay's dead letter, never handed out again). Transaction: one.

        :returns: the updated row, or None when the row is missing or no longer PENDING.
        :raises ValueError: when ``event_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("event_id", event_id)
        params = {
            "event_id": key,
            "error": scrub_text((error or "")[:MAX_ERROR_CHARS]),
            "max_attempts": OUTBOX_MAX_ATTEMPTS,
        }
        with self._connection() as conn:
            row = db.one(conn, "outbox_mark_failed", params)
        if row is not None and row["status"] == "FAILED":
            log.warning(
                "outbox event %s FAILED after %d attempts: %s",
                key,
                row["attempts"],
                row["last_error"],
                extra={"action": "outbox_event_failed", "event_id": str(key)},
            )
        return OutboxRow.from_row(row) if row else None

    @db.translated
    @db.read_retried_once
    def outbox_for_job(self, job_id: uuid.UUID | str) -> list[OutboxRow]:
        """Every outbox row of one job, in ``seq`` order (whatever their status).

        SQL: ``SELECT ... WHERE kafka_key = job_id ORDER BY seq``. Transaction: one, read only.

        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            rows = db.rows(conn, "outbox_for_job", {"kafka_key": str(key)})
        return [OutboxRow.from_row(r) for r in rows]

    @db.translated
    @db.read_retried_once
    def outbox_pending_count(self, cap: int) -> int:
        """PENDING outbox rows, counted up to ``cap`` (a bounded read however large the
        backlog). SQL: ``outbox_pending_count``. Transaction: one read.

        :raises StoreError: on a database failure.
        """
        checks.positive_int("cap", cap)
        with self._connection() as conn:
            row = db.one(conn, "outbox_pending_count", {"cap": cap})
        return int(row["n"]) if row else 0
