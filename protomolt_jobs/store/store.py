"""``JobStore``: the job row, the claim, fenced writes, the sweep, parked completions, the outbox.

The row is the truth; the broker is only propagation. Every commit point writes its outbox
row in the same transaction as the job change, so an event exists if and only if its change
committed.

Leases and fencing
------------------
``job_claim`` moves the oldest eligible QUEUED row to RUNNING in one statement, stamping
``lease_owner`` (the worker id), ``lease_token = gen_random_uuid()``, ``lease_until = now() +
lease_s`` and ``attempt + 1``. ``(job_id, lease_owner, attempt, lease_token)`` is the fence
(:class:`~.records.Lease`). Every later write of that worker about the job (heartbeat,
checkpoint, park, complete, fail, retry, dead, release) is conditioned on ``status =
'RUNNING'`` and the fence. A write that matches no row raises
:class:`~protomolt_jobs.errors.LeaseLost` and rolls back: nothing changed, no outbox row.

Who is authoritative: the database. A lease is live while ``lease_until >= now()`` by the
database clock; the worker extends it with heartbeats. When a worker stops heartbeating (crash,
partition, stall) the sweeper (``job_sweep_expired``) moves the row back to QUEUED, or to DEAD
when ``attempt >= max_attempts`` (a crash loop ends). The next claim stamps a new random
``lease_token``, so the old owner's fence can never match again, even if it wakes up and writes.
``attempt`` alone would not do: ``job_release`` gives the attempt back (``attempt - 1``) and
``job_complete_parked`` resets it to 0, so the same ``(job_id, owner, attempt)`` can be handed
out twice; the token never repeats.

Stored text
-----------
Text parameters and JSON values are passed through :mod:`~.scrub` at the write boundary: NUL
and lone surrogates (which PostgreSQL ``text``/``jsonb`` refuse) become U+FFFD, in the row and
in its event alike, so a worker can always settle a job whatever its error text or response.

Reading rows
------------
Job queries select the JSONB columns as ``::text``; :meth:`JobRecord.from_row` decodes them in
Python after the transaction commits and never raises: an undecodable column (e.g. nested
deeper than the decoder's recursion limit) is None on the record and named in
``JobRecord.unreadable``. A claim therefore commits even for such a row and hands it to the
worker, which fails it, instead of rolling back and blocking every later claim on it.

Failures
--------
- The worker dies: its lease expires, the sweep requeues (or kills) the job.
- The database cannot be reached: a call that gets no healthy connection within
  ``connect_timeout_s`` raises :class:`~protomolt_jobs.errors.StoreUnavailable` (a
  ``StoreError`` and an ``Unavailable``: verbs answer ``unavailable``), never a long wait.
- A pooled connection the server killed while it sat idle (restart, ``pg_terminate_backend``,
  an idle timeout) is noticed before it is used, without a round trip (its socket has the
  server's goodbye to read), closed, and the call goes on with a fresh connection
  (:meth:`JobStore._connection`).
- A read whose connection breaks under it (the server killed it after that look) runs once
  more on a fresh connection (``_read_retried_once``).
- The database connection drops mid-write: the transaction rolls back; the store raises
  :class:`~protomolt_jobs.errors.StoreUnavailable` (driver error as ``__cause__``) and does not
  retry, because it cannot know whether the server committed; the write may be retried by the
  caller while its lease is live.
- The process dies after commit and before the caller learns of it: the change and its event
  are both durable; the caller's next fenced write is either valid (same lease) or LeaseLost.

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

Transactions: every public method is exactly one transaction. Pooled connections are in
autocommit mode: a method that runs one statement (the claim, the heartbeat, reads, the outbox
calls) is that statement's own transaction, sent in one round trip; a method that runs more
(a fenced write and its outbox row, an insert and its NOTIFY, the parked gate) opens one with
``with pool.connection() as conn, conn.transaction():``. A private ``_name_txn(conn, ...)``
does the work when two steps must share it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import select
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from protomolt_jobs.errors import (
    ControlApplied,
    LeaseLost,
    NotFound,
    StoreError,
    StoreUnavailable,
)
from protomolt_jobs.store.events import MAX_ERROR_CHARS, EventType, build_event
from protomolt_jobs.store.queries import QUERIES
from protomolt_jobs.store.records import (
    JOB_STATUSES,
    OUTBOX_MAX_ATTEMPTS,
    AlreadyDone,
    ControlOutcome,
    History,
    InsertOutcome,
    JobRecord,
    Lease,
    NewJob,
    OutboxRow,
    ParkedCompletion,
    ParkedStepCompleted,
    SweepResult,
    Transition,
    WrongState,
)
from protomolt_jobs.store.scrub import needs_scrub, scrub_json, scrub_text

__all__ = [
    "LIST_LIMIT_DEFAULT",
    "LIST_LIMIT_MAX",
    "NOTIFY_CHANNEL",
    "OUTBOX_CLAIM_S_DEFAULT",
    "SWEEP_BATCH_DEFAULT",
    "SWEEP_MAX_BATCHES_DEFAULT",
    "JobStore",
]

log = logging.getLogger("protomolt_jobs.store")

#: LISTEN channel of idle claim loops; the payload is empty.
NOTIFY_CHANNEL = "protomolt_jobs"
#: ``job_list`` page size when the caller asks for 0.
LIST_LIMIT_DEFAULT = 50
#: ``job_list`` page size ceiling.
LIST_LIMIT_MAX = 500
#: How long an outbox claim keeps rows from other relays, seconds.
OUTBOX_CLAIM_S_DEFAULT = 30.0
#: Expired leases handled per sweep transaction.
SWEEP_BATCH_DEFAULT = 500
#: Rows one pruning statement deletes (small: each batch is one short transaction).
PRUNE_BATCH_DEFAULT = 500
#: Most sweep transactions per ``job_sweep_expired`` call (bounds one call's run time).
SWEEP_MAX_BATCHES_DEFAULT = 20
#: The queues a worker serves unless configured.
DEFAULT_QUEUES: tuple[str, ...] = ("default",)
#: Valid priorities (1 highest).
PRIORITIES = frozenset({1, 2, 3, 4, 5})
#: Inserts tried when a dedup key's live holder ends between the conflict and the read.
_DEDUP_TRIES = 5
#: Pool: how long to wait for the first connection at open, and for a connection while every
#: pooled one is busy with other calls (the database answers; it is only loaded), seconds.
POOL_TIMEOUT_S = 10.0
#: How long a call waits for a healthy connection before the database counts as unreachable
#: (``jobs.connect_timeout_seconds``), seconds.
CONNECT_TIMEOUT_S_DEFAULT = 2.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _translated(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn driver errors into StoreError (the driver's exception is the ``__cause__``)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except psycopg.OperationalError as exc:
            # The connection broke or the server refused to go on (shutting down, out of
            # connections, cancelled): an outage, not a defect. Not retried here: a write
            # whose connection died may have committed.
            raise StoreUnavailable(
                f"the jobs database failed during {fn.__name__}: {type(exc).__name__}: {exc}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"{fn.__name__} failed: {type(exc).__name__}: {exc}") from exc

    return wrapper


#: Session setting every store connection carries (``protomolt_jobs.session = store``). On a
#: database adopted from upstream's schema, the foreign-writer fence (migration 0007) lets
#: sessions with it through to our own fence and holds every other writer (a Java worker) off
#: the leases our workers hold.
SESSION_SETTING = "protomolt_jobs.session"


def session_options(dsn: str) -> str:
    """The libpq ``options`` for a store connection: the DSN's own, plus
    ``-c protomolt_jobs.session=store`` (one connection-start parameter, no statement)."""
    try:
        existing = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    except psycopg.ProgrammingError:
        existing = ""  # a malformed DSN fails at connect, with libpq's own message
    return f"{existing} -c {SESSION_SETTING}=store".strip()


def _read_retried_once(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Reads only: when the connection breaks under the read (its server was killed after
    :func:`_server_gone` looked), run it once more on a fresh connection. A read changes
    nothing, so running it twice is safe; writes are never retried here (one whose
    connection died may have committed)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except psycopg.OperationalError as exc:
            log.info(
                "%s: the connection broke (%s); reading once more on a fresh one",
                fn.__name__,
                type(exc).__name__,
                extra={"action": "store_read_retried", "operation": fn.__name__},
            )
            return fn(*args, **kwargs)

    return wrapper


class JobStore:
    """The durable store of jobs and their outbox, over a psycopg connection pool.

    :param pool: an open ``psycopg_pool.ConnectionPool``; the store closes it in :meth:`close`.
    :param connect_timeout_s: how long a call waits for a healthy connection before it raises
        :class:`StoreUnavailable`, seconds.
    """

    def __init__(
        self, pool: ConnectionPool, *, connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT
    ) -> None:
        self._pool = pool
        self.connect_timeout_s = connect_timeout_s
        # Connections this store has lent out right now: tells "every connection is busy"
        # (wait longer) from "the pool cannot connect" (unavailable) when a wait times out.
        self._in_use = 0
        self._in_use_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        max_size: int = 10,
        timeout_s: float = POOL_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
    ) -> JobStore:
        """Open a pool on ``dsn`` and wait for its first connection.

        Connections are not checked with a query before they are handed out: that is one
        more round trip and one more commit on every store call (it was about half the
        commits of a job). :meth:`_connection` instead looks at the idle connection's socket:
        one the server killed (restart, ``pg_terminate_backend``, an idle timeout) has the
        server's goodbye waiting there, and is replaced before any statement is sent.

        :param dsn: libpq connection string of a migrated database.
        :param max_size: most connections in the pool (>= 1).
        :param timeout_s: how long to wait for the first connection, and for a connection
            while all of them are busy, seconds.
        :param connect_timeout_s: how long a call waits for a healthy connection when the
            pool cannot make one (the database is unreachable), seconds.
        :raises ValueError: when ``max_size`` < 1.
        :raises StoreError: when the database cannot be reached within ``timeout_s``.
        """
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size: must be a positive integer; got {max_size!r}")
        pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=True,
            # Autocommit: a single-statement method is its own transaction in one round trip
            # (BEGIN and COMMIT would be two more); multi-statement methods open an explicit
            # transaction with conn.transaction().
            # libpq's own bound on one connection attempt (whole seconds, at least 2): a
            # black-holed host must not hold the pool's connector past the call's bound.
            # options: the session setting our fence trigger recognises (docs/interop.md).
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, math.ceil(connect_timeout_s)),
                "options": session_options(dsn),
            },
            timeout=timeout_s,
            name="protomolt-jobs-store",
        )
        try:
            pool.wait(timeout=timeout_s)
        except psycopg.Error as exc:
            pool.close()
            raise StoreError(
                f"cannot reach the jobs database within {timeout_s:g} s: {exc}"
            ) from exc
        return cls(pool, connect_timeout_s=connect_timeout_s)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A healthy pooled connection for one call (the call's transaction, if any, is the
        caller's ``conn.transaction()``); returned to the pool afterwards.

        A connection whose server side is gone is closed and the next one taken, without a
        round trip (:func:`_server_gone`). Waiting is bounded: ``connect_timeout_s`` when the
        pool has room to connect but gets nowhere (the database is unreachable), up to
        :data:`POOL_TIMEOUT_S` when every connection exists and is busy with other calls.

        :raises StoreUnavailable: no healthy connection within the bound.
        """
        conn = self._healthy_connection()
        with self._in_use_lock:
            self._in_use += 1
        try:
            with conn:  # commit or roll back what the call left open, as pool.connection()
                yield conn
        finally:
            with self._in_use_lock:
                self._in_use -= 1
            self._pool.putconn(conn)

    def _healthy_connection(self) -> psycopg.Connection[Any]:
        waited_busy = False
        # Each pass either hands out a connection or discards a dead one; more passes than
        # connections would mean the pool keeps handing out dead ones.
        for _ in range(self._pool.max_size + 2):
            try:
                conn = self._pool.getconn(timeout=self.connect_timeout_s)
            except PoolTimeout as exc:
                # The pool's own size counts connections it is still trying to make, so
                # "busy" is judged by what this store has lent out.
                busy = self._in_use >= self._pool.max_size and not waited_busy
                if not busy:
                    raise StoreUnavailable(
                        "the jobs database cannot be reached: no connection within "
                        f"{self.connect_timeout_s:g} s (jobs.connect_timeout_seconds)"
                    ) from exc
                # Every connection exists and is in use: the database answers, the node is
                # loaded. Wait longer, once.
                waited_busy = True
                try:
                    conn = self._pool.getconn(timeout=POOL_TIMEOUT_S)
                except PoolTimeout as busy_exc:
                    raise StoreUnavailable(
                        f"the jobs database is overloaded: all {self._pool.max_size} "
                        f"connections stayed busy for {POOL_TIMEOUT_S:g} s"
                    ) from busy_exc
            if not _server_gone(conn):
                return conn
            log.info(
                "discarding a pooled connection the server closed",
                extra={"action": "store_connection_discarded"},
            )
            conn.close()
            self._pool.putconn(conn)  # a closed connection is dropped and replaced by the pool
        raise StoreUnavailable(
            "the jobs database cannot be reached: every pooled connection was closed by the server"
        )

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool (for LISTEN connections, use a dedicated connection instead)."""
        return self._pool

    def close(self) -> None:
        """Close the pool. Idempotent."""
        if not self._pool.closed:
            self._pool.close()

    @_translated
    def ping(self, timeout_s: float = 1.0) -> None:
        """One trivial round trip (readiness probes).

        :param timeout_s: longest wait for a pooled connection, seconds (the statement
            itself is bounded by the caller: see ``app.DatabaseProbe``).
        :raises StoreError: no connection within ``timeout_s``, or the statement failed.
        """
        with self._pool.connection(timeout=timeout_s) as conn:
            _execute(conn, "database_ping", {})

    # -- insert and reads -------------------------------------------------------------------

    @_translated
    def job_insert(self, new: NewJob) -> InsertOutcome:
        """Insert a job idempotently on ``job_id``, with its event, and wake workers.

        SQL: one statement (``job_insert``): ``INSERT ... ON CONFLICT (job_id) DO NOTHING`` and,
        when a row was created, its outbox row (ACCEPTED, attempt 0, ``detail.status`` QUEUED;
        or FAILED with the error for a job failed at birth) and ``NOTIFY protomolt_jobs``
        (QUEUED only), returning the stored row. A resubmission changes nothing and returns the
        existing row untouched (read by a second statement).

        Transaction: the one statement (autocommit); a conflict's reads are their own.

        NUL and lone surrogates in ``workflow_name``, ``error`` and the JSON values are stored
        as U+FFFD (see :mod:`~.scrub`).

        :returns: the stored row and whether this call created it (``unreadable`` set when an
            existing row's JSON does not decode).
        :raises ValueError: on a malformed ``new`` (the message names the field).
        :raises TypeError: when ``workflow_definition`` or ``input`` is not a JSON object.
        :raises StoreError: on a database failure.
        """
        job_id = _uuid("job_id", new.job_id)
        if new.status not in ("QUEUED", "FAILED"):
            raise ValueError(f"status: a new job is QUEUED or FAILED; got {new.status!r}")
        if new.status == "FAILED" and not new.error:
            raise ValueError("error: a job failed at birth must say why")
        _text("workflow_name", new.workflow_name)
        _positive_int("max_attempts", new.max_attempts)
        if isinstance(new.priority, bool) or new.priority not in PRIORITIES:
            raise ValueError(f"priority: must be an integer 1..5; got {new.priority!r}")
        _text("queue", new.queue)
        _text("fairness_key", new.fairness_key)
        _positive_seconds("fairness_weight", new.fairness_weight)
        if new.dedup_key is not None:
            _text("dedup_key", new.dedup_key)
        if new.deadline_s is not None:
            _positive_seconds("deadline_s", new.deadline_s)
        error = scrub_text(new.error)
        params = {
            "job_id": job_id,
            "workflow_name": scrub_text(new.workflow_name),
            "workflow_definition": _jsonb("workflow_definition", new.workflow_definition, dict),
            "input": _jsonb("input", new.input, dict),
            "status": new.status,
            "max_attempts": new.max_attempts,
            "error": error,
            "trace_context": new.trace_context,
            "priority": new.priority,
            "queue": scrub_text(new.queue),
            "fairness_key": scrub_text(new.fairness_key),
            "stride": 1.0 / float(new.fairness_weight),
            # A failed-at-birth row never holds its key (it is terminal already).
            "dedup_key": scrub_text(new.dedup_key) if new.status == "QUEUED" else None,
            "deadline_s": float(new.deadline_s) if new.deadline_s is not None else None,
            "actor": scrub_text(new.actor or "api"),
        }
        existing: dict[str, Any] | None = None
        deduplicated = False
        with self._connection() as conn:
            # Autocommit: the insert, its event and the NOTIFY are one statement (job_insert);
            # the reads after a conflict are statements of their own (each its own snapshot,
            # as they were in one READ COMMITTED transaction).
            # The dedup holder may end between our conflict and our read: then the key is free
            # and the insert is tried again (a holder cannot end more than once per attempt).
            for _ in range(_DEDUP_TRIES):
                row = _one(conn, "job_insert", params)
                if row is not None:
                    break
                existing = _one(conn, "job_get", {"job_id": job_id})
                if existing is not None:
                    break
                if params["dedup_key"] is not None:
                    existing = _one(conn, "job_get_live_dedup", {"dedup_key": params["dedup_key"]})
                    if existing is not None:
                        deduplicated = True
                        break
                    continue
                raise NotFound(f"workflow run not found: {job_id}")
            else:
                raise StoreError(
                    f"dedup key {new.dedup_key!r} kept changing hands; insert not settled"
                )
        if existing is not None:
            return InsertOutcome(
                JobRecord.from_row(existing), created=False, deduplicated=deduplicated
            )
        assert row is not None
        return InsertOutcome(JobRecord.from_row(row), created=True)

    @_translated
    @_read_retried_once
    def job_get(self, job_id: uuid.UUID | str) -> JobRecord | None:
        """One job's full row.

        SQL: ``SELECT ... FROM workflow_run WHERE job_id = %(job_id)s``. Transaction: one,
        read only; JSON is decoded after it.

        :returns: the row, or None for an unknown id. A row whose stored JSON does not decode
            is returned with ``unreadable`` set and the bad column None (never an exception);
            callers report it as ``job-corrupt``.
        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        with self._connection() as conn:
            row = _one(conn, "job_get", {"job_id": key})
        return JobRecord.from_row(row) if row else None

    @_translated
    @_read_retried_once
    def job_list(
        self,
        status: str | None = None,
        workflow_name: str | None = None,
        limit: int = LIST_LIMIT_DEFAULT,
        offset: int = 0,
        *,
        queue: str | None = None,
        fairness_key: str | None = None,
    ) -> list[JobRecord]:
        """Jobs newest first (``created_at DESC, job_id DESC``), optionally filtered.

        SQL: ``SELECT ... WHERE status/workflow_name match (None = any) LIMIT OFFSET``.
        Transaction: one, read only. ``limit`` 0 means 50; above 500 it is clamped to 500.
        A row whose stored JSON does not decode is listed with ``unreadable`` set (see
        :class:`JobRecord`); one bad row never fails the page.

        :param status: one of the six statuses, or None.
        :param workflow_name: exact name, or None.
        :param queue: exact queue, or None.
        :param fairness_key: exact fairness key, or None.
        :param limit: page size, >= 0.
        :param offset: rows to skip, >= 0.
        :raises ValueError: for an unknown status, or a negative limit or offset.
        :raises StoreError: on a database failure.
        """
        if status is not None and status not in JOB_STATUSES:
            raise ValueError(
                f"status: must be one of {', '.join(sorted(JOB_STATUSES))}; got {status!r}"
            )
        _non_negative_int("limit", limit)
        _non_negative_int("offset", offset)
        effective = LIST_LIMIT_DEFAULT if limit == 0 else min(limit, LIST_LIMIT_MAX)
        params = {
            "status": status,
            "workflow_name": workflow_name,
            "queue": queue,
            "fairness_key": fairness_key,
            "limit": effective,
            "offset": offset,
        }
        with self._connection() as conn:
            rows = _rows(conn, "job_list", params)
        return [JobRecord.from_row(r) for r in rows]

    @_translated
    def job_statuses(self, job_ids: list[uuid.UUID | str]) -> list[dict[str, Any]]:
        """The status columns of ``job_ids`` (absent ids are left out), for progress displays.

        SQL: ``job_statuses`` (``WHERE job_id = ANY(...)``, the primary key). Transaction: one,
        read only. No definition, input, checkpoints or result are read.

        :returns: rows with ``job_id, workflow_name, status, attempt, outstanding_step, error,
            created_at, updated_at, completed_at``.
        :raises ValueError: an id is not a UUID.
        :raises StoreError: on a database failure.
        """
        keys = [_uuid("job_id", j) for j in job_ids]
        with self._connection() as conn:
            return _rows(conn, "job_statuses", {"job_ids": keys})

    @_translated
    @_read_retried_once
    def metrics_counts(self) -> tuple[dict[tuple[str, str], int], int]:
        """Runs per status and queue, and the number of PENDING outbox rows (``/metrics``).

        SQL: ``metrics_run_counts`` (two counts, one statement). Transaction: one, read only.

        :returns: ``({(status, queue): runs}, outbox_pending)``; pairs without runs are absent.
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            rows = _rows(conn, "metrics_run_counts", {})
        runs = {(r["status"], r["queue"]): int(r["n"]) for r in rows if r["kind"] == "run"}
        pending = sum(int(r["n"]) for r in rows if r["kind"] == "outbox")
        return runs, pending

    # -- the claim and the fenced writes ----------------------------------------------------

    @_translated
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
            ``.lease`` is its fence), or None when nothing is eligible. When ``unreadable`` is
            set the caller must not run the job: it fails it under ``.lease``.
        :raises ValueError: for a blank worker id, a non-positive lease or no queues.
        :raises StoreError: on a database failure.
        """
        _text("worker_id", worker_id)
        _positive_seconds("lease_s", lease_s)
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
            row = _one(conn, query, params)
        return JobRecord.from_row(row) if row else None

    @_translated
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
            _text("queue", queue)
            running = limit.get("max_running")
            rate = limit.get("max_starts_per_second")
            if running is not None:
                _positive_int(f"queue_limits.{queue}.max_running", running)
            if rate is not None:
                _positive_seconds(f"queue_limits.{queue}.max_starts_per_second", rate)
            rows.append(
                {
                    "queue": queue,
                    "max_running": running,
                    "max_starts_per_second": float(rate) if rate is not None else None,
                }
            )
        with self._connection() as conn, conn.transaction():
            for params in rows:
                _execute(conn, "queue_limits_upsert", params)
            listed = _rows(conn, "queue_limits_list", {})
        return frozenset(r["queue"] for r in listed)

    @_translated
    def job_heartbeat(self, lease: Lease, lease_s: float) -> datetime:
        """Extend a live lease.

        SQL: fenced ``UPDATE ... SET lease_until = now() + lease_s``. Transaction: one. No event.

        :returns: the new ``lease_until`` (database time).
        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises ValueError: for a non-positive ``lease_s``.
        :raises StoreError: on a database failure.
        """
        return self.job_heartbeat_control(lease, lease_s)[0]

    @_translated
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
        _positive_seconds("lease_s", lease_s)
        with self._connection() as conn:
            row = _fenced(conn, "job_heartbeat", lease, {"lease_s": float(lease_s)})
        control = json.loads(row["control"]) if row["control"] else None
        lease_until: datetime = row["lease_until"]
        return lease_until, control

    @_translated
    def job_checkpoint(self, lease: Lease, entry: dict[str, Any]) -> None:
        """Append one checkpoint entry, with its STEP_CHECKPOINT event.

        SQL: one statement (autocommit): fenced ``UPDATE ... SET checkpoints = checkpoints ||
        [entry]`` and its outbox row (STEP_CHECKPOINT, step = ``entry["name"]``,
        ``detail.status`` RUNNING), plus the CANCELLED or PAUSED row when the trigger applied a
        pending request (then :class:`ControlApplied` is raised after the commit).

        :param entry: ``{"name": str, "skipped": bool, "response"?: object}`` (stored as is).
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises ValueError: when ``entry`` has no non-blank ``name`` or cannot be JSON.
        :raises StoreError: on a database failure.
        """
        step = scrub_text(_entry_name(entry))
        entry_json = _jsonb("entry", entry, dict)
        with self._connection() as conn:
            row = _fenced(conn, "job_checkpoint", lease, {"entry": entry_json, "step": step})
        if row["status"] != "RUNNING":
            raise ControlApplied(
                lease.job_id, lease.owner, lease.attempt, "job_checkpoint", row["status"]
            )

    @_translated
    def job_compensate(self, lease: Lease, entry: dict[str, Any]) -> None:
        """Append a compensation step's entry to a run an operator cancelled (graph workflows:
        the steps that undo succeeded steps run after the cancel was applied), with its
        STEP_CHECKPOINT event (``detail.status`` CANCELLED).

        SQL: ``UPDATE ... SET checkpoints = checkpoints || [entry]`` fenced on status
        CANCELLED, the lease's attempt and no entry of that step yet (the cancel cleared the
        lease, so owner and token cannot fence it), recorded in the history as ``compensate``;
        then one outbox row. Transaction: one.

        :raises LeaseLost: when the fence matches no row (not cancelled at this attempt, or the
            step already has its entry): nothing changed, no event.
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises ValueError: when ``entry`` has no non-blank ``name`` or cannot be JSON.
        :raises StoreError: on a database failure.
        """
        step = scrub_text(_entry_name(entry))
        entry_json = _jsonb("entry", entry, dict)
        with self._connection() as conn, conn.transaction():
            row = _fenced(conn, "job_compensate", lease, {"entry": entry_json, "step": step})
            self._outbox_txn(conn, row, EventType.TYPE_STEP_CHECKPOINT, step=step)

    @_translated
    def job_park(self, lease: Lease, step: str) -> str:
        """Park the job on an external step, with its WAITING event.

        SQL: fenced ``UPDATE ... SET status='WAITING', outstanding_step=step``, lease cleared;
        and its outbox row (WAITING, step; CANCELLED or PAUSED when the trigger applied a
        pending request), in one statement (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank step.
        :raises StoreError: on a database failure.
        """
        _text("step", step)
        step = scrub_text(step)
        with self._connection() as conn:
            row = _fenced(conn, "job_park", lease, {"step": step})
        return str(row["status"])

    @_translated
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
        lease cleared; then one outbox row (COMPLETED, verdict). With ``final_entry`` the same
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
        _text("verdict", verdict)
        verdict = scrub_text(verdict)
        result_json = _jsonb("result", result, dict)
        params: dict[str, Any] = {"result": result_json, "verdict": verdict}
        step = ""
        if final_entry is not None:
            step = scrub_text(_entry_name(final_entry))
            params["entry"] = _jsonb("final_entry", final_entry, dict)
            params["step"] = step
        query = "job_complete" if final_entry is None else "job_complete_with_checkpoint"
        with self._connection() as conn:
            row = _fenced(conn, query, lease, params)
        return str(row["status"])

    @_translated
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
        _text("error", error)
        error = scrub_text(error)
        step = scrub_text(step or "")
        with self._connection() as conn:
            row = _fenced(conn, "job_fail", lease, {"error": error, "step": step})
        return str(row["status"])

    @_translated
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
        _non_negative_seconds("backoff_s", backoff_s)
        with self._connection() as conn:
            row = _fenced(
                conn,
                "job_retry",
                lease,
                {"backoff_s": float(backoff_s), "error": scrub_text(error)},
            )
        run_after: datetime = row["run_after"]
        return run_after

    @_translated
    def job_dead(self, lease: Lease, error: str, step: str = "") -> str:
        """Dead-letter the job (retryable failure, attempts exhausted), with its DEAD event.

        SQL: fenced ``UPDATE ... SET status='DEAD', error, completed_at=now()``, lease cleared;
        and its outbox row (DEAD, error; CANCELLED for a pending cancel), in one statement
        (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        _text("error", error)
        error = scrub_text(error)
        step = scrub_text(step or "")
        with self._connection() as conn:
            row = _fenced(conn, "job_dead", lease, {"error": error, "step": step})
        return str(row["status"])

    @_translated
    def job_release(self, lease: Lease) -> None:
        """Give a claimed job back on a graceful stop.

        SQL: fenced ``UPDATE ... SET status='QUEUED', run_after=now(), attempt = attempt - 1``,
        lease cleared (the interrupted run does not count as an attempt); ``NOTIFY
        protomolt_jobs`` (or the CANCELLED/PAUSED event of a pending request the trigger
        applied). No event. One statement (autocommit).

        :raises LeaseLost: when the fence matches no row (nothing changed).
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            _fenced(conn, "job_release", lease, {})

    # -- the sweeper ------------------------------------------------------------------------

    @_translated
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
        _positive_int("limit", limit)
        _positive_int("max_batches", max_batches)
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
            rows = _rows(conn, "job_sweep_expired", {"limit": limit})
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
                _execute(conn, "job_notify", {})
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

    # -- parked completions -----------------------------------------------------------------

    @_translated
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
        _positive_int("limit", limit)
        with self._connection() as conn, conn.transaction():
            rows = _rows(conn, "job_budget_expired", {"limit": limit})
            for row in rows:
                # A cancel pending on a RUNNING row is binding: the trigger settles it
                # CANCELLED (migration 0002), and its event says so.
                if not self._control_event_txn(conn, row, ""):
                    self._outbox_txn(conn, row, EventType.TYPE_FAILED, error=row["error"] or "")
            paused = _rows(conn, "job_budget_expired_pause", {"limit": limit})
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

    @_translated
    def job_budget_pause(self, lease: Lease, error: str, step: str = "") -> str:
        """Pause the run because its budget is spent (``budget.onExceeded = pause``; the
        worker's ``budget.maxCost`` path), with its PAUSED event.

        SQL: fenced ``job_budget_pause``: PAUSED (``paused_from`` QUEUED, so ``resume-job``
        queues it again), ``error`` = the reason naming the budget, lease cleared; the
        transition log records kind ``budget``, actor ``worker:<id>``. A pending cancel
        request wins (the trigger settles CANCELLED). Transaction: one.

        :returns: the status after (PAUSED, or CANCELLED).
        :raises LeaseLost: when the fence matches no row.
        :raises ValueError: for a blank error.
        :raises StoreError: on a database failure.
        """
        _text("error", error)
        error = scrub_text(error)
        step = scrub_text(step or "")
        with self._connection() as conn, conn.transaction():
            row = _fenced(conn, "job_budget_pause", lease, {"error": error, "step": step})
            if row["status"] == "PAUSED":
                self._outbox_txn(conn, row, EventType.TYPE_PAUSED, step=step, error=error)
            else:
                self._control_event_txn(conn, row, step)
        return str(row["status"])

    @_translated
    def job_budget_cost_pauses(self, job_id: uuid.UUID | str) -> int:
        """How many times the run was paused by ``budget.maxCost`` (each resume after such a
        pause grants one more ``maxCost``). Transaction: none (one read).

        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        with self._connection() as conn:
            row = _one(conn, "job_budget_cost_pauses", {"job_id": key})
        return int(row["pauses"]) if row is not None else 0

    @_translated
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
        concurrent completions, so exactly one of them is ParkedStepCompleted.

        :param entry: the checkpoint entry; its ``name`` must equal ``step``.
        :returns: ParkedStepCompleted(), AlreadyDone(status) or WrongState(status, outstanding_step).
        :raises NotFound: for an unknown job id.
        :raises ValueError: for a malformed id, blank step or an entry not naming ``step``.
        :raises TypeError: when ``entry`` is not a JSON object.
        :raises StoreError: on a database failure or unreadable stored checkpoints.
        """
        key = _uuid("job_id", job_id)
        _text("step", step)
        if _entry_name(entry) != step:
            raise ValueError(
                f"entry.name: must be the completed step {step!r}; got {entry['name']!r}"
            )
        entry_json = _jsonb("entry", entry, dict)
        step = scrub_text(step)
        with self._connection() as conn, conn.transaction():
            refusal = self._parked_gate_txn(conn, key, step)
            if refusal is not None:
                return refusal
            row = _one(
                conn,
                "job_complete_parked",
                {"job_id": key, "step": step, "entry": entry_json, "actor": scrub_text(actor)},
            )
            if row is None:  # pragma: no cover - the row lock makes the gate authoritative
                raise StoreError(f"job {key} changed under its row lock")
            self._outbox_txn(conn, row, EventType.TYPE_STEP_CHECKPOINT, step=step)
            _execute(conn, "job_notify", {})
        return ParkedStepCompleted()

    @_translated
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
        key = _uuid("job_id", job_id)
        _text("step", step)
        _text("error", error)
        step = scrub_text(step)
        error = scrub_text(error)
        with self._connection() as conn, conn.transaction():
            refusal = self._parked_gate_txn(conn, key, step)
            if refusal is not None:
                return refusal
            row = _one(
                conn,
                "job_fail_parked",
                {"job_id": key, "step": step, "error": error, "actor": scrub_text(actor)},
            )
            if row is None:  # pragma: no cover - the row lock makes the gate authoritative
                raise StoreError(f"job {key} changed under its row lock")
            self._outbox_txn(conn, row, EventType.TYPE_FAILED, step=step, error=error)
        return ParkedStepCompleted()

    def _parked_gate_txn(
        self, conn: psycopg.Connection[Any], job_id: uuid.UUID, step: str
    ) -> AlreadyDone | WrongState | None:
        """Lock the row and decide: None means the job is WAITING on ``step`` (proceed)."""
        row = _one(conn, "job_lock", {"job_id": job_id})
        if row is None:
            raise NotFound(f"workflow run not found: {job_id}")
        record = JobRecord.from_row(row)
        checkpoints = record.checkpoints
        if checkpoints is None:
            raise StoreError(
                f"stored checkpoints of job {job_id} are unreadable: {record.unreadable}"
            )
        if any(isinstance(c, dict) and c.get("name") == step for c in checkpoints):
            return AlreadyDone(row["status"])
        if row["status"] != "WAITING" or row["outstanding_step"] != step:
            return WrongState(row["status"], row["outstanding_step"])
        return None

    # -- operator control (the verbs) -------------------------------------------------------

    @_translated
    def job_cancel(
        self, job_id: uuid.UUID | str, *, actor: str, reason: str | None = None
    ) -> ControlOutcome:
        """Cancel a job: QUEUED, WAITING or PAUSED -> CANCELLED now (one CANCELLED event, error
        ``"CANCELLED by <actor>[: <reason>]"``, checkpoints kept); RUNNING -> a cancel request
        recorded in ``control`` (a CONTROL_REQUESTED event), binding: the worker's next boundary
        write settles the job CANCELLED (migration 0002's trigger), whatever it was writing.

        SQL: one conditional ``UPDATE`` (``job_control_cancel``) and its event; the row lock
        orders it against the worker's writes, so a cancel racing a completion has exactly
        one outcome. Transaction: one.

        :returns: ``changed`` with the status after (CANCELLED, or RUNNING = requested), or
            not ``changed`` with the current status (terminal, or RUNNING with a cancel
            already pending; None for an unknown job).
        :raises ValueError: malformed id or blank actor.
        :raises StoreError: on a database failure.
        """
        return self._control(job_id, "job_control_cancel", actor, reason)

    @_translated
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

    @_translated
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
        key = _uuid("job_id", job_id)
        _text("actor", actor)
        params = {
            "job_id": key,
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
            "at": at,
        }
        reason_text = scrub_text(reason) if reason else ""
        with self._connection() as conn, conn.transaction():
            row = _one(conn, "job_control_resume", params)
            if row is not None:
                self._outbox_txn(conn, row, EventType.TYPE_RESUMED, error=reason_text)
                if row["due"]:
                    _execute(conn, "job_notify", {})
                return ControlOutcome(
                    True, row["status"], None, row["outstanding_step"], row["run_after"]
                )
            row = _one(conn, "job_control_withdraw_pause", params)
            if row is not None:
                return ControlOutcome(True, "RUNNING")
        return self._control_refusal(key)

    @_translated
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
            "checkpoints": None if checkpoints is None else _jsonb("checkpoints", checkpoints, list)
        }
        return self._control(job_id, "job_control_requeue", actor, reason, extra)

    @_translated
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
    ) -> ControlOutcome:
        """Queue a FAILED, DEAD, CANCELLED, PAUSED or COMPLETED job again with only
        ``checkpoints`` kept (the caller dropped ``step``'s and its dependants'): attempt 0,
        result, verdict and error cleared; a REQUEUED event naming ``step``, NOTIFY.
        ``intents`` become the row's external-step intents (None: none); the caller keeps the
        intents of unproven effects, so the resumed run probes them instead of calling blindly.

        Optimistic: applies only while the row is still ``expected_status`` at
        ``expected_history_seq`` (nothing changed since the caller read it).

        :returns: ``changed`` (QUEUED), or not ``changed`` with the current status.
        :raises ValueError: malformed id, blank step or actor.
        :raises TypeError: when ``checkpoints`` is not a list.
        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        _text("step", step)
        _text("actor", actor)
        params = {
            "job_id": key,
            "step": scrub_text(step),
            "checkpoints": _jsonb("checkpoints", checkpoints, list),
            "intents": _jsonb("intents", intents, dict) if intents else None,
            "status": expected_status,
            "history_seq": int(expected_history_seq),
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
        }
        try:
            with self._connection() as conn, conn.transaction():
                row = _one(conn, "job_control_retry_step", params)
                if row is not None:
                    self._outbox_txn(
                        conn,
                        row,
                        EventType.TYPE_REQUEUED,
                        step=scrub_text(step),
                        error=scrub_text(reason) if reason else "",
                    )
                    _execute(conn, "job_notify", {})
                    return ControlOutcome(True, row["status"])
        except psycopg.errors.UniqueViolation as exc:
            return self._dedup_conflict(key, exc)
        return self._control_refusal(key)

    @_translated
    def job_stop(self, lease: Lease) -> str:
        """Apply a pending operator request to a job whose step has not started (the worker
        learnt of it from a heartbeat while it waited for a permit): a fenced boundary write
        with no change of its own, which the trigger turns into CANCELLED or PAUSED (with its
        event). Transaction: one.

        :returns: the status after (RUNNING when no request was pending).
        :raises LeaseLost: when the fence matches no row.
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn, conn.transaction():
            row = _fenced(conn, "job_stop", lease, {})
            self._control_event_txn(conn, row, "")
        return str(row["status"])

    # -- effects (migration 0006) -----------------------------------------------------------

    @_translated
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
        _text("step", step)
        step = scrub_text(step)
        params = {"step": step, "intent": _jsonb("intent", intent, dict)}
        with self._connection() as conn, conn.transaction():
            row = _fenced(conn, "job_intent", lease, params)
            self._control_event_txn(conn, row, step)
        if row["status"] != "RUNNING":
            raise ControlApplied(
                lease.job_id, lease.owner, lease.attempt, "job_intent", row["status"]
            )

    @_translated
    def job_recovery_required(self, lease: Lease, step: str, reason: str) -> str:
        """Stop the run as RECOVERY_REQUIRED on ``step`` (``outstanding_step``) with ``reason``
        (``error``), lease cleared, with its RECOVERY_REQUIRED event (step, error).

        SQL: fenced ``UPDATE``, then one outbox row. Transaction: one.

        :returns: the status after (CANCELLED or PAUSED when a pending request won).
        :raises LeaseLost: when the fence matches no row.
        :raises ValueError: blank step or reason.
        :raises StoreError: on a database failure.
        """
        _text("step", step)
        _text("reason", reason)
        step, reason = scrub_text(step), scrub_text(reason)
        with self._connection() as conn, conn.transaction():
            row = _fenced(conn, "job_recovery_required", lease, {"step": step, "reason": reason})
            if not self._control_event_txn(conn, row, step):
                self._outbox_txn(
                    conn, row, EventType.TYPE_RECOVERY_REQUIRED, step=step, error=reason
                )
        return str(row["status"])

    @_translated
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
    ) -> ControlOutcome:
        """Send a RECOVERY_REQUIRED run back to QUEUED with ``checkpoints`` and ``intents`` as
        given (``reconcile-step``, ``migrate-checkpoint``): attempt 0, error cleared; a
        fingerprinted entry without ``at`` gets the database's time. Recorded as ``kind`` by
        ``actor``; a REQUEUED event naming ``step``; NOTIFY.

        Optimistic: applies only while the row is still RECOVERY_REQUIRED at
        ``expected_history_seq``.

        :returns: ``changed`` (QUEUED), or not ``changed`` with the current status.
        :raises ValueError: malformed id, blank step, kind or actor.
        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        _text("step", step)
        _text("kind", kind)
        _text("actor", actor)
        params = {
            "job_id": key,
            "step": scrub_text(step),
            "checkpoints": _jsonb("checkpoints", checkpoints, list),
            "intents": None if not intents else _jsonb("intents", intents, dict),
            "history_seq": int(expected_history_seq),
            "kind": kind,
            "actor": scrub_text(actor),
            "reason": scrub_text(reason) if reason else None,
        }
        with self._connection() as conn, conn.transaction():
            row = _one(conn, "job_recover", params)
            if row is not None:
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

    @_translated
    def job_history(self, job_id: uuid.UUID | str) -> History | None:
        """A job's transition log, oldest first, with its hash chain checked.

        SQL: ``job_history`` (one statement, so one snapshot) reads the row's head and the log,
        recomputing each row's hash from the previous *stored* hash and its own fields
        (``workflow_run_transition_hash``) and checking the sequence has no gap; the last
        hash must be the row's ``history_head`` and the count its ``history_seq`` (a deleted
        tail is caught). Transaction: one, read only.

        :returns: the history (``first_bad_seq`` None when intact), or None for an unknown job.
        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        with self._connection() as conn:
            found = _rows(conn, "job_history", {"job_id": key})
        if not found:
            return None
        head = found[0]
        rows = [r for r in found if r["seq"] is not None]
        first_bad: int | None = None
        for row in rows:
            if not (row["hash_ok"] and row["seq_ok"]):
                first_bad = int(row["seq"])
                break
        if first_bad is None:
            count = len(rows)
            if count < head["history_seq"]:
                first_bad = count + 1
            elif rows and bytes(rows[-1]["hash"]) != bytes(head["history_head"] or b""):
                first_bad = int(rows[-1]["seq"])
        transitions = tuple(
            Transition(
                seq=int(r["seq"]),
                prev_status=r["prev_status"],
                new_status=r["new_status"],
                kind=r["kind"],
                actor=r["actor"],
                reason=r["reason"],
                attempt=int(r["attempt"]),
                step=r["step"],
                at=r["at"],
            )
            for r in rows
        )
        return History(transitions, first_bad)

    def _control(
        self,
        job_id: uuid.UUID | str,
        query: str,
        actor: str,
        reason: str | None,
        extra: dict[str, Any] | None = None,
    ) -> ControlOutcome:
        key = _uuid("job_id", job_id)
        _text("actor", actor)
        reason = scrub_text(reason) if reason else None
        params = {"job_id": key, "actor": scrub_text(actor), "reason": reason, **(extra or {})}
        try:
            with self._connection() as conn, conn.transaction():
                row = _one(conn, query, params)
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
            row = _one(conn, "job_get", {"job_id": key})
            holder = (
                _one(conn, "job_get_live_dedup", {"dedup_key": row["dedup_key"]})
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
            row = _one(conn, "job_get", {"job_id": key})
        if row is None:
            return ControlOutcome(False, None)
        control = json.loads(row["control"]) if row["control"] else None
        return ControlOutcome(False, row["status"], control, row["outstanding_step"])

    def _control_event_txn(
        self, conn: psycopg.Connection[Any], row: dict[str, Any], step: str
    ) -> bool:
        """After a worker's or the sweeper's write: when the trigger honoured a pending
        request (the row came back CANCELLED or PAUSED), write that event instead of the
        write's own. :returns: True when it did."""
        status = row["status"]
        if status == "CANCELLED":
            self._outbox_txn(
                conn, row, EventType.TYPE_CANCELLED, step=step, error=row["error"] or ""
            )
            return True
        if status == "PAUSED":
            self._outbox_txn(conn, row, EventType.TYPE_PAUSED, step=step)
            return True
        return False

    # -- outbox -----------------------------------------------------------------------------

    @_translated
    def outbox_claim(
        self, limit: int, *, claim_s: float = OUTBOX_CLAIM_S_DEFAULT
    ) -> list[OutboxRow]:
        """Hand out up to ``limit`` PENDING events to this relay, oldest first by ``seq``.

        SQL (one statement): select PENDING rows not leased (``claimed_until`` NULL or past)
        and with no earlier PENDING row of the same ``kafka_key``, ``ORDER BY seq LIMIT
        %(limit)s FOR UPDATE SKIP LOCKED``, and lease them: ``claimed_until = now() + claim_s``.
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
        _positive_int("limit", limit)
        _positive_seconds("claim_s", claim_s)
        with self._connection() as conn:
            rows = _rows(conn, "outbox_claim", {"limit": limit, "claim_s": float(claim_s)})
        return sorted((OutboxRow.from_row(r) for r in rows), key=lambda r: r.seq)

    @_translated
    def outbox_mark_published(self, event_ids: Iterable[uuid.UUID | str]) -> int:
        """Mark acked events PUBLISHED (rows are kept for ever).

        SQL: ``UPDATE ... SET status='PUBLISHED', published_at=now(), claimed_until=NULL WHERE
        event_id = ANY(...) AND status='PENDING'``. Transaction: one.

        :returns: how many rows moved (a row already PUBLISHED or FAILED is not counted).
        :raises ValueError: when an id is not a UUID.
        :raises StoreError: on a database failure.
        """
        ids = [_uuid("event_ids", e) for e in event_ids]
        if not ids:
            return 0
        with self._connection() as conn:
            cur = _execute(conn, "outbox_mark_published", {"event_ids": ids})
            return cur.rowcount

    @_translated
    def outbox_mark_failed(self, event_id: uuid.UUID | str, error: str) -> OutboxRow | None:
        """Record one failed publish of a PENDING event.

        SQL: ``UPDATE ... SET attempts = attempts + 1, last_error = error[:4000],
        claimed_until = NULL`` and ``status = 'FAILED'`` when this is the 10th failure (the
        relay's dead letter, never handed out again). Transaction: one.

        :returns: the updated row, or None when the row is missing or no longer PENDING.
        :raises ValueError: when ``event_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = _uuid("event_id", event_id)
        params = {
            "event_id": key,
            "error": scrub_text((error or "")[:MAX_ERROR_CHARS]),
            "max_attempts": OUTBOX_MAX_ATTEMPTS,
        }
        with self._connection() as conn:
            row = _one(conn, "outbox_mark_failed", params)
        if row is not None and row["status"] == "FAILED":
            log.warning(
                "outbox event %s FAILED after %d attempts: %s",
                key,
                row["attempts"],
                row["last_error"],
                extra={"action": "outbox_event_failed", "event_id": str(key)},
            )
        return OutboxRow.from_row(row) if row else None

    @_translated
    @_read_retried_once
    def outbox_for_job(self, job_id: uuid.UUID | str) -> list[OutboxRow]:
        """Every outbox row of one job, in ``seq`` order (whatever their status).

        SQL: ``SELECT ... WHERE kafka_key = job_id ORDER BY seq``. Transaction: one, read only.

        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = _uuid("job_id", job_id)
        with self._connection() as conn:
            rows = _rows(conn, "outbox_for_job", {"kafka_key": str(key)})
        return [OutboxRow.from_row(r) for r in rows]

    # -- request-topic rejects --------------------------------------------------------------

    @_translated
    def reject_insert(
        self, raw: bytes | None, topic: str, partition: int, offset: int, reason: str
    ) -> int:
        """Keep a request-topic record that could not be decoded or validated.

        SQL: ``INSERT INTO workflow_run_rejects (topic, partition, offset, raw, reason)``
        (``received_at`` = now()). Transaction: one.

        :param raw: the record value as received (None for a tombstone).
        :returns: the reject's id.
        :raises ValueError: for a blank topic or reason.
        :raises StoreError: on a database failure.
        """
        _text("topic", topic)
        _text("reason", reason)
        params = {
            "topic": scrub_text(topic),
            "partition": int(partition),
            "offset": int(offset),
            "raw": bytes(raw) if raw is not None else None,
            "reason": scrub_text(reason),
        }
        with self._connection() as conn:
            row = _one(conn, "reject_insert", params)
        assert row is not None
        return int(row["id"])

    # -- retention (the pruner) -------------------------------------------------------------

    @_translated
    def outbox_prune_published(self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT) -> int:
        """Delete one batch of PUBLISHED outbox rows published more than ``retention_s``
        seconds ago (database time), oldest first.

        SQL: ``outbox_prune_published`` (a ``DELETE`` over a ``FOR UPDATE SKIP LOCKED`` batch;
        its ``WHERE`` keeps to ``status = 'PUBLISHED'``: PENDING and FAILED rows are never
        deleted). Transaction: one statement, autocommit, so locks last one short batch.

        :param retention_s: age of ``published_at`` beyond which a row goes, seconds (> 0).
        :param limit: most rows deleted (> 0).
        :returns: rows deleted (a full batch means more may be waiting).
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        _positive_seconds("retention_s", retention_s)
        _positive_int("limit", limit)
        with self._connection() as conn:
            cur = _execute(
                conn, "outbox_prune_published", {"retention_s": retention_s, "limit": limit}
            )
            return cur.rowcount

    @_translated
    def job_prune_terminal(self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT) -> int:
        """Delete one batch of terminal runs (COMPLETED, FAILED, DEAD) completed more than
        ``retention_s`` seconds ago (database time), oldest first.

        SQL: ``job_prune_terminal`` (a ``DELETE`` over a ``FOR UPDATE SKIP LOCKED`` batch,
        index ``idx_workflow_run_terminal_completed``; its ``WHERE`` re-checks the terminal
        status under the row lock, so a run requeued meanwhile is kept). The run's outbox rows
        are left to :meth:`outbox_prune_published` (a PENDING one is never deleted).
        Transaction: one statement, autocommit.

        :param retention_s: age of ``completed_at`` beyond which a run goes, seconds (> 0).
        :param limit: most runs deleted (> 0).
        :returns: runs deleted.
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        _positive_seconds("retention_s", retention_s)
        _positive_int("limit", limit)
        with self._connection() as conn:
            cur = _execute(conn, "job_prune_terminal", {"retention_s": retention_s, "limit": limit})
            return cur.rowcount

    @_translated
    def job_prune_cancelled(self, retention_s: float, limit: int = PRUNE_BATCH_DEFAULT) -> int:
        """Delete one batch of CANCELLED runs cancelled more than ``retention_s`` seconds ago,
        oldest first (a query of its own: migration 0004's partial index predates the status,
        and cancelled runs are few). SQL: ``job_prune_cancelled``; its ``WHERE`` re-checks
        ``status = 'CANCELLED'`` under the row lock (a PAUSED run is never deleted); the
        run's transition log goes with it (``ON DELETE CASCADE``). Transaction: one statement.

        :returns: runs deleted.
        :raises ValueError: for a non-positive retention or limit.
        :raises StoreError: on a database failure.
        """
        _positive_seconds("retention_s", retention_s)
        _positive_int("limit", limit)
        with self._connection() as conn:
            cur = _execute(
                conn, "job_prune_cancelled", {"retention_s": retention_s, "limit": limit}
            )
            return cur.rowcount

    @_translated
    @_read_retried_once
    def outbox_pending_count(self, cap: int) -> int:
        """PENDING outbox rows, counted up to ``cap`` (a bounded read however large the
        backlog). SQL: ``outbox_pending_count``. Transaction: one read.

        :raises StoreError: on a database failure.
        """
        _positive_int("cap", cap)
        with self._connection() as conn:
            row = _one(conn, "outbox_pending_count", {"cap": cap})
        return int(row["n"]) if row else 0

    # -- shared pieces ----------------------------------------------------------------------

    def _outbox_txn(
        self,
        conn: psycopg.Connection[Any],
        row: dict[str, Any],
        type: int,
        *,
        step: str = "",
        verdict: str = "",
        error: str = "",
        notify: bool = False,
    ) -> None:
        """Write the event of a change in the change's transaction. ``row`` carries job_id,
        workflow_name, status (after), attempt and tx_now (the transaction's now()). With
        ``notify`` the same statement also sends ``NOTIFY protomolt_jobs``."""
        event = build_event(
            job_id=row["job_id"],
            workflow_name=row["workflow_name"],
            type=type,
            attempt=row["attempt"],
            status_after=row["status"],
            occurred_at=row["tx_now"],
            step=step,
            verdict=verdict,
            error=error,
        )
        _execute(
            conn,
            "outbox_insert_notify" if notify else "outbox_insert",
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "payload": event.payload,
                "kafka_key": event.kafka_key,
            },
        )


# -- statement helpers ----------------------------------------------------------------------


def _server_gone(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection's server side is gone, without a round trip.

    An idle connection has nothing to read; a killed backend leaves its FATAL message and the
    end of the stream there. Any waiting input counts as gone: it is almost always that
    goodbye, and the rare stray notice costs one reconnect.
    """
    if conn.closed or conn.broken:
        return True
    poller = select.poll()
    try:
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def _execute(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> psycopg.Cursor[Any]:
    return conn.execute(QUERIES[name], params)


def _rows(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall()


def _one(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchone()


def _fenced(
    conn: psycopg.Connection[Any], name: str, lease: Lease, params: dict[str, Any]
) -> dict[str, Any]:
    """Run a fenced query; no row back means the lease is lost (the caller's transaction then
    rolls back as LeaseLost propagates)."""
    if not isinstance(lease, Lease):
        raise TypeError(f"lease: expected a Lease; got {type(lease).__name__}")
    row = _one(
        conn,
        name,
        {
            "job_id": lease.job_id,
            "owner": lease.owner,
            "attempt": lease.attempt,
            "token": lease.token,
            **params,
        },
    )
    if row is None:
        log.info(
            "lease lost on job %s during %s",
            lease.job_id,
            name,
            extra={
                "action": "lease_lost",
                "job_id": str(lease.job_id),
                "worker_id": lease.owner,
                "attempt": lease.attempt,
                "operation": name,
            },
        )
        raise LeaseLost(lease.job_id, lease.owner, lease.attempt, name)
    return row


# -- argument checks (programming errors of the caller; messages name the field) -------------


def _uuid(field: str, value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValueError(f"{field}: must be a UUID; got {value!r}")


def _text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field}: must be a non-blank string; got {value!r}")


def _positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}: must be a positive integer; got {value!r}")


def _non_negative_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: must be an integer >= 0; got {value!r}")


def _positive_seconds(field: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{field}: must be a positive number of seconds; got {value!r}")


def _non_negative_seconds(field: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{field}: must be a number of seconds >= 0; got {value!r}")


def _entry_name(entry: Any) -> str:
    if not isinstance(entry, dict):
        raise TypeError(f"entry: must be a JSON object; got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"entry.name: must be a non-blank string; got {name!r}")
    return name


def _jsonb(field: str, value: Any, kind: type) -> Jsonb:
    """Serialise now, so a value JSON cannot hold fails here with the field's name; strings and
    keys PostgreSQL refuses (NUL, lone surrogates) are scrubbed to U+FFFD first."""
    if not isinstance(value, kind):
        raise TypeError(f"{field}: must be a JSON {kind.__name__}; got {type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False)
        if needs_scrub(text):
            text = json.dumps(scrub_json(value), allow_nan=False)
    except RecursionError:
        raise ValueError(f"{field}: not representable as JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}: not representable as JSON: {exc}") from None
    return Jsonb(value, dumps=lambda _obj: text)
