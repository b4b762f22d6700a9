"""The claim and the lease: ``job_claim`` leases the first eligible QUEUED row of the served
queues, ``queue_limits_sync`` records the fleet-wide limits the claim enforces, and the
heartbeats extend a live lease (and bring back a pending operator request)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.records import JobRecord, Lease
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["DEFAULT_QUEUES", "ClaimsMixin"]

#: The queues a worker serves unless configured.
DEFAULT_QUEUES: tuple[str, ...] = ("default",)


class ClaimsMixin(db.Database):
    """``JobStore``'s claim, queue limits and heartbeats."""

    @db.translated
    def job_claim(
        self,
        worker_id: str,
        lease_s: float,
        *,
        queues: Sequence[str] = DEFAULT_QUEUES,
        limited: Collection[str] = (),
    ) -> JobRecord | None:
        """Lease the first eligible QUEUED job of the served queues.

        SQL (one statement): per served queue, the first QUEUED row with ``run_after <=
        now()`` in ``(priority, fairness_pass, created_at, job_id)`` order (the claim index),
        ``FOR UPDATE SKIP LOCKED``; of those heads the first in the same order; ``UPDATE ...
        SET status='RUNNING', lease_owner, lease_token = gen_random_uuid(), lease_until =
        now() + lease_s, attempt = attempt + 1 ... RETURNING``. When a served queue is in
        ``limited`` (it has a fleet-wide ``max_running`` or ``max_starts_per_second``), its
        head is looked for only when ``workflow_queue_permit(queue)`` allows a start (that
        function locks the queue's limits row until this statement commits, so claimers of a
        limited queue are serialised and the count of its RUNNING rows is exact), and a start
        moves the queue's rate limiter on in the same statement. A limited queue that may not
        start never blocks the other served queues; when other queues are served too, a
        limited queue whose row another claimer holds is passed over (``SKIP LOCKED``) rather
        than waited for. Unlimited queues take no lock. A served queue not in ``limited`` that
        has a limits row (limited by another node since this worker read them) is passed over:
        never claimed past its limits.
        Concurrent claimers never get the same row. Transaction: one, committed before the
        row's JSON is decoded, so an undecodable row is still claimed (and handed back with
        ``unreadable`` set) rather than rolled back to block every later claim. No event (a
        claim is not a lifecycle commit point).

        :param worker_id: stamped into ``lease_owner``; not blank.
        :param lease_s: lease length, seconds (> 0).
        :param queues: the queues this worker serves (non-empty; default ``["default"]``).
        :param limited: the served queues with fleet-wide limits (see
            :meth:`queue_limits_sync`).
        :returns: the claimed row (RUNNING, attempt incremented, a fresh ``lease_token``;
            ``.lease`` is its fence), or None when nothing is eligible. Its
            ``workflow_definition`` is shared with other claims of the same text (read-only;
            :func:`~.records.decoded_definition`). When ``unreadable`` is
            set the caller must not run the job: it fails it under ``.lease``.
        :raises ValueError: for a blank worker id, a non-positive lease or no queues.
        :raises StoreError: on a database failure.
        """
        checks.text("worker_id", worker_id)
        checks.positive_seconds("lease_s", lease_s)
        served = list(queues)
        if not served:
            raise ValueError("queues: a worker serves at least one queue")
        limits = [q for q in served if q in limited]
        params: dict[str, Any] = {
            "worker_id": scrub_text(worker_id),
            "lease_s": float(lease_s),
            "queues": served,
        }
        if limits:
            query = "job_claim_limited"
            params["limited"] = limits
            # With other queues to go on to, a limited queue busy with another claimer is
            # passed over instead of waited for.
            params["skip_busy"] = len(served) > len(limits)
        elif len(served) == 1:
            # The same claim with a plan PostgreSQL keeps (queries._derive_one_queue_claim).
            query = "job_claim_one_queue"
            params["queue"] = served[0]
        else:
            query = "job_claim"
        with self._connection() as conn:
            row = db.one(conn, query, params)
        # Every job of a workflow stores the same definition: decoded once per text.
        return JobRecord.from_row(row, shared_definition=True) if row else None

    @db.translated
    def queue_limits_sync(self, limits: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
        """Record this node's fleet-wide queue limits and read back every limited queue.

        SQL: one ``queue_limits_upsert`` per configured queue (``max_running``,
        ``max_starts_per_second``; a missing key is NULL, unlimited), then
        ``queue_limits_list``. Transaction: one. The limits live in the database, so every
        worker enforces the same ones; the last node to start with a queue's limits sets them.

        :param limits: queue -> ``{"max_running"?: int > 0, "max_starts_per_second"?: float > 0}``.
        :returns: every queue that has a limit in the database (this node's and others').
        :raises ValueError: for a malformed limit (the message names it).
        :raises StoreError: on a database failure.
        """
        rows: list[dict[str, Any]] = []
        for queue, limit in limits.items():
            checks.text("queue", queue)
            running = limit.get("max_running")
            rate = limit.get("max_starts_per_second")
            if running is not None:
                checks.positive_int(f"queue_limits.{queue}.max_running", running)
            if rate is not None:
                checks.positive_seconds(f"queue_limits.{queue}.max_starts_per_second", rate)
            rows.append(
                {
                    "queue": queue,
                    "max_running": running,
                    "max_starts_per_second": float(rate) if rate is not None else None,
                }
            )
        with self._connection() as conn, conn.transaction():
            for params in rows:
                db.execute(conn, "queue_limits_upsert", params)
            listed = db.rows(conn, "queue_limits_list", {})
        return frozenset(r["queue"] for r in listed)

    @db.translated
    def job_heartbeat(self, lease: Lease, lease_s: float) -> datetime:
        """Extend a live lease.

        SQL: fenced ``UPDATE ... SET lease_until = now() + lease_s``. Transaction: one. No event.

        :returns: the new ``lease_until`` (database time).
        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises ValueError: for a non-positive ``lease_s``.
        :raises StoreError: on a database failure.
        """
        return self.job_heartbeat_control(lease, lease_s)[0]

    @db.translated
    def job_heartbeat_control(
        self, lease: Lease, lease_s: float
    ) -> tuple[datetime, dict[str, Any] | None]:
        """:meth:`job_heartbeat` that also hands back the row's pending operator request
        (``control``: ``{kind, actor, reason, requestedAt}`` or None), read by the same
        statement: control reaches the worker with no statement of its own.

        :returns: ``(lease_until, control)``.
        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises ValueError: for a non-positive ``lease_s``.
        :raises StoreError: on a database failure.
        """
        checks.positive_seconds("lease_s", lease_s)
        with self._connection() as conn:
            row = db.fenced(conn, "job_heartbeat", lease, {"lease_s": float(lease_s)})
        control = json.loads(row["control"]) if row["control"] else None
        lease_until: datetime = row["lease_until"]
        return lease_until, control

    @db.translated
    def job_controls(self, job_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        """The pending operator requests of ``job_ids`` (``{kind, actor, reason, ...}`` per
        job that has one; jobs without a request are absent), read by one statement with no
        lock and no fence: a read that only tells a worker to stop a call early. The fenced
        writes still honour the request themselves.

        :raises StoreError: on a database failure.
        """
        if not job_ids:
            return {}
        with self._connection() as conn:
            found = db.rows(conn, "job_controls", {"job_ids": list(job_ids)})
        return {r["job_id"]: json.loads(r["control"]) for r in found}
