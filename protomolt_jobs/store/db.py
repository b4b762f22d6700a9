"""The store's connection and statement plumbing, shared by every concern of ``JobStore``.

:class:`Database` owns the pool and hands out healthy connections (``_connection``); the
functions below run one named query of :data:`~.queries.QUERIES` on a connection
(:func:`execute`, :func:`rows`, :func:`one`, :func:`fenced`), and :func:`translated` turns
driver errors into :class:`~protomolt_jobs.errors.StoreError` at the store's boundary.

The concerns of :class:`~.store.JobStore` (``inserts``, ``reads``, ``claims``, ``settles``,
``control``, ``outbox``, ``maintenance``) are mixins over :class:`Database` and share nothing
else: what more than one of them writes with is a method here (``_outbox_txn``, the event of a
change in the change's transaction; ``_control_event_txn``, the event of an operator request
the trigger applied). They call the statement functions through this module
(``db.one(conn, ...)``), looked up at call time, so one wrapper here sees every statement the
store sends.
"""

from __future__ import annotations

import functools
import logging
import math
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ParamSpec, Self, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from protomolt_jobs.errors import LeaseLost, StoreError, StoreUnavailable
from protomolt_jobs.store import checks
from protomolt_jobs.store.events import EventType, build_event
from protomolt_jobs.store.queries import QUERIES
from protomolt_jobs.store.records import Lease

__all__ = [
    "CONNECT_TIMEOUT_S_DEFAULT",
    "NOTIFY_CHANNEL",
    "OUTBOX_PAYLOADS_SETTING",
    "POOL_TIMEOUT_S",
    "SESSION_SETTING",
    "Database",
    "execute",
    "fenced",
    "one",
    "read_retried_once",
    "rows",
    "server_gone",
    "session_options",
    "translated",
]

log = logging.getLogger("protomolt_jobs.store")

#: LISTEN channel of idle claim loops; the payload is empty.
NOTIFY_CHANNEL = "protomolt_jobs"
#: Pool: how long to wait for the first connection at open, and for a connection while every
#: pooled one is busy with other calls (the database answers; it is only loaded), seconds.
POOL_TIMEOUT_S = 10.0
#: How long a call waits for a healthy connection before the database counts as unreachable
#: (``jobs.connect_timeout_seconds``), seconds.
CONNECT_TIMEOUT_S_DEFAULT = 2.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


def translated(fn: Callable[_P, _R]) -> Callable[_P, _R]:
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

#: Session setting of a store in ``jobs.outbox_payloads = "always"`` mode: migration 0012's
#: trigger fills the payload of every outbox row such a session inserts as columns.
OUTBOX_PAYLOADS_SETTING = "protomolt_jobs.outbox_payloads"


def session_options(dsn: str, *, outbox_payloads: str = "columns") -> str:
    """The libpq ``options`` for a store connection: the DSN's own, plus
    ``-c protomolt_jobs.session=store`` and, when ``outbox_payloads`` is ``"always"``,
    ``-c protomolt_jobs.outbox_payloads=always`` (connection-start parameters, no statement).

    :raises ValueError: ``outbox_payloads`` is neither ``"columns"`` nor ``"always"``.
    """
    if outbox_payloads not in ("columns", "always"):
        raise ValueError(f"outbox_payloads must be 'columns' or 'always'; got {outbox_payloads!r}")
    try:
        existing = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    except psycopg.ProgrammingError:
        existing = ""  # a malformed DSN fails at connect, with libpq's own message
    options = f"{existing} -c {SESSION_SETTING}=store"
    if outbox_payloads == "always":
        options += f" -c {OUTBOX_PAYLOADS_SETTING}=always"
    return options.strip()


def read_retried_once(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Reads only: when the connection breaks under the read (its server was killed after
    :func:`server_gone` looked), run it once more on a fresh connection. A read changes
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


class Database:
    """The connection pool of a :class:`~.store.JobStore`, and the pieces every concern of the
    store writes with.

    :param pool: an open ``psycopg_pool.ConnectionPool``; the store closes it in :meth:`close`.
    :param connect_timeout_s: how long a call waits for a healthy connection before it raises
        :class:`StoreUnavailable`, seconds.
    """

    def __init__(
        self, pool: ConnectionPool, *, connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT
    ) -> None:
        self._pool = pool
        self.connect_timeout_s = connect_timeout_s
        #: Whether the claim loops' fenced writes may share a transaction (``open``'s
        #: ``group_commit``; store/group_commit.py).
        self.group_commit = True
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
        outbox_payloads: str = "columns",
        group_commit: bool = True,
    ) -> Self:
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
        :param outbox_payloads: ``"columns"`` (default) or ``"always"``: every outbox row
            this store writes carries its payload (``jobs.outbox_payloads``, migration 0012).
        :param group_commit: carry concurrent fenced checkpoint and settle writes in one
            transaction (store/group_commit.py; ``jobs.group_commit``); False: each write is its
            own statement in autocommit, always.
        :raises ValueError: when ``max_size`` < 1 or ``outbox_payloads`` is unknown.
        :raises StoreError: when the database cannot be reached within ``timeout_s``.
        """
        checks.positive_int("max_size", max_size)
        options = session_options(dsn, outbox_payloads=outbox_payloads)
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
            # options: the session settings our fence and outbox triggers recognise
            # (docs/interop.md).
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, math.ceil(connect_timeout_s)),
                "options": options,
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
        store = cls(pool, connect_timeout_s=connect_timeout_s)
        store.group_commit = group_commit
        return store

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A healthy pooled connection for one call (the call's transaction, if any, is the
        caller's ``conn.transaction()``); returned to the pool afterwards.

        A connection whose server side is gone is closed and the next one taken, without a
        round trip (:func:`server_gone`). Waiting is bounded: ``connect_timeout_s`` when the
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
            if not server_gone(conn):
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

    @translated
    def ping(self, timeout_s: float = 1.0) -> None:
        """One trivial round trip (readiness probes).

        :param timeout_s: longest wait for a pooled connection, seconds (the statement
            itself is bounded by the caller: see ``app.DatabaseProbe``).
        :raises StoreError: no connection within ``timeout_s``, or the statement failed.
        """
        with self._pool.connection(timeout=timeout_s) as conn:
            execute(conn, "database_ping", {})

    # -- events written inside a change's transaction ---------------------------------------

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
        later: int = 0,
    ) -> None:
        """Write the event of a change in the change's transaction. ``row`` carries job_id,
        workflow_name, status (after), attempt and tx_now (the transaction's now()). With
        ``notify`` the same statement also sends ``NOTIFY protomolt_jobs``. ``later``: the
        job's events this transaction wrote before this one; the row's ``created_at`` (and the
        event's ``occurred_at``) is that many microseconds after now(), so a Java relay, which
        claims by ``(created_at, event_id)``, keeps the job's order (docs/interop.md)."""
        event = build_event(
            job_id=row["job_id"],
            workflow_name=row["workflow_name"],
            type=type,
            attempt=row["attempt"],
            status_after=row["status"],
            occurred_at=row["tx_now"] + timedelta(microseconds=later),
            step=step,
            verdict=verdict,
            error=error,
        )
        execute(
            conn,
            "outbox_insert_notify" if notify else "outbox_insert",
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "payload": event.payload,
                "kafka_key": event.kafka_key,
                "later": later,
            },
        )

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


# -- statement helpers ----------------------------------------------------------------------


def server_gone(conn: psycopg.Connection[Any]) -> bool:
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


def execute(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> psycopg.Cursor[Any]:
    """Run the named query; :returns: its cursor (``rowcount`` for a write)."""
    return conn.execute(QUERIES[name], params)


def rows(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the named query; :returns: every row it gives, as dicts keyed by column."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall()


def one(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """Run the named query; :returns: its first row as a dict, or None when it gives none."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchone()


def fence_params(lease: Lease, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the lease's fence (``job_id``, ``owner``, ``attempt``, ``token``).

    :raises TypeError: when ``lease`` is not a :class:`~.records.Lease`.
    """
    if not isinstance(lease, Lease):
        raise TypeError(f"lease: expected a Lease; got {type(lease).__name__}")
    return {
        "job_id": lease.job_id,
        "owner": lease.owner,
        "attempt": lease.attempt,
        "token": lease.token,
        **params,
    }


def lease_lost(lease: Lease, name: str) -> LeaseLost:
    """The :class:`LeaseLost` of fenced query ``name`` that matched no row, logged with action
    ``lease_lost``."""
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
    return LeaseLost(lease.job_id, lease.owner, lease.attempt, name)


def fenced(
    conn: psycopg.Connection[Any], name: str, lease: Lease, params: dict[str, Any]
) -> dict[str, Any]:
    """Run a fenced query with the lease's fence (``job_id``, ``owner``, ``attempt``,
    ``token``) added to ``params``; no row back means the lease is lost (the caller's
    transaction then rolls back as LeaseLost propagates).

    :returns: the row the query returned.
    :raises TypeError: when ``lease`` is not a :class:`~.records.Lease`.
    :raises LeaseLost: when no row came back (logged with action ``lease_lost``).
    """
    row = one(conn, name, fence_params(lease, params))
    if row is None:
        raise lease_lost(lease, name)
    return row
