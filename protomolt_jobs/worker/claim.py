"""Claim loops and the LISTEN listener that wakes them.

Wake-up model (DESIGN 5: pickup in milliseconds, not the poll interval):

- Every enqueue and requeue commits a ``NOTIFY protomolt_jobs``. One :class:`Listener` per
  worker holds an autocommit connection that ``LISTEN``s on that channel and rings the
  :class:`Doorbell` once per notification.
- A ring wakes one idle :class:`ClaimLoop`. A loop claims until the queue is empty: after
  a claim that shows a backlog it rings once more (passing the baton to another idle loop,
  since more jobs are likely waiting), runs the job, and claims again. When a claim finds
  nothing the loop waits on the doorbell, with no timeout of its own.
- Backlog: the claimed job waited at least :data:`BACKLOG_S` between becoming eligible
  (``max(created_at, run_after)``) and its claim (``updated_at``), all database time. A job
  announced by its own NOTIFY and picked up at once does not pass the baton: its
  notification already woke its loop, and a baton would only buy an empty claim (half a
  transaction per job when the loops keep up with the submitters). A burst that came with
  fewer notifications than jobs (one transaction, a lost notification, a poll) shows up as
  waiting jobs within one claim and spreads from there.
- One :class:`Poller` per worker rings once per poll interval (jittered): the fallback when
  a notification is lost (e.g. while the listener reconnects) or a backoff's ``run_after``
  passes, which nothing announces. One ring wakes one loop, and a claim that finds a job
  passes the baton on, so an idle worker costs one claim per poll interval, not one per
  loop (16 loops used to poll 32 times a second at the 500 ms default).
- The listener reconnects with a capped exponential backoff. Notifications sent while it
  was disconnected are lost, so after every (re)connect it rings every loop once.

Ringing is cheap and a spurious ring costs one empty claim; tokens are capped at the
number of loops so a burst of notifications cannot queue up a burst of empty claims.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from protomolt_jobs.errors import StoreError

__all__ = ["BACKLOG_S", "CHANNEL", "ClaimLoop", "Doorbell", "Listener", "Poller", "backlogged"]

#: The NOTIFY channel enqueue and requeue announce on.
CHANNEL = "protomolt_jobs"

#: A claimed job that waited at least this long (seconds, database time) signals a backlog.
BACKLOG_S = 0.05

# Listener reconnect backoff, seconds: first retry, cap.
_RECONNECT_FIRST_S = 0.1
_RECONNECT_CAP_S = 5.0
# How long one notifies() wait lasts before the listener re-checks its stop flag (seconds).
_LISTEN_SLICE_S = 0.25


class Doorbell:
    """Wake-up tokens for idle claim loops.

    :param capacity: most tokens kept (the number of loops).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self._cond = threading.Condition()
        self._tokens = 0
        self._closed = False

    def ring(self, n: int = 1) -> None:
        """Add ``n`` tokens (capped) and wake as many waiters."""
        with self._cond:
            self._tokens = min(self.capacity, self._tokens + max(0, n))
            self._cond.notify(n)

    def ring_all(self) -> None:
        """Wake every loop once (after a listener (re)connect)."""
        self.ring(self.capacity)

    def close(self) -> None:
        """Wake every waiter for good: :meth:`wait` returns at once from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        """Undo :meth:`close` (a worker started again)."""
        with self._cond:
            self._closed = False
            self._tokens = 0

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for a token for at most ``timeout_s`` seconds (None: until a ring or close).

        :returns: True when woken by a ring (a token was taken), False on timeout or close.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not self._closed:
                if self._tokens > 0:
                    self._tokens -= 1
                    return True
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return False


class Poller:
    """Rings the doorbell once per poll interval (jittered 0.9-1.1): the fallback wake-up.

    :param doorbell: rung once per interval.
    :param interval_s: the poll interval, seconds (> 0).
    :param worker_id: for the thread name.
    """

    name = "poller"

    def __init__(self, *, doorbell: Doorbell, interval_s: float, worker_id: str) -> None:
        if not interval_s > 0:
            raise ValueError(f"poll interval: must be > 0 seconds; got {interval_s!r}")
        self._doorbell = doorbell
        self._interval_s = float(interval_s)
        self.worker_id = worker_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Rings so far (tests watch the cadence through it).
        self.rings = 0

    def start(self) -> None:
        """Start ringing; returns at once. Idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._loop,
                args=(self._stop,),
                name=f"protomolt-jobs-poller-{self.worker_id}",
                daemon=True,
            )
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop ringing and join the thread. Never-started and double stop are fine."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(timeout_s)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval_s * random.uniform(0.9, 1.1)):
            self.rings += 1
            self._doorbell.ring(1)


class Listener:
    """``LISTEN protomolt_jobs`` on a dedicated autocommit connection; rings the doorbell.

    :param dsn: libpq connection string.
    :param doorbell: rung once per notification, ``ring_all`` after each (re)connect.
    :param worker_id: for log records.
    """

    name = "listener"

    def __init__(self, dsn: str, *, doorbell: Doorbell, worker_id: str) -> None:
        if not dsn:
            raise ValueError("the listener needs a dsn (jobs.dsn)")
        self._dsn = dsn
        self._doorbell = doorbell
        self.worker_id = worker_id
        self._log = logging.getLogger("protomolt_jobs.listener")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Connections made so far (tests watch reconnects through it).
        self.connects = 0
        #: Set while a LISTEN connection is established.
        self.listening = threading.Event()

    def start(self) -> None:
        """Start the listener thread; returns at once (the first connect happens in the
        thread, so a database that is down does not block the worker's start). Idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name=f"protomolt-jobs-listener-{self.worker_id}", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop and return once the thread has ended (within about a quarter second).
        Never-started and double stop are fine."""
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is None:
            return
        self._stop.set()
        thread.join(10.0 if timeout_s is None else timeout_s)

    def run_once(self, conn: Any, timeout_s: float = _LISTEN_SLICE_S) -> int:
        """Wait up to ``timeout_s`` on ``conn`` for notifications and ring for each.

        :returns: the number of notifications received.
        """
        received = 0
        for _ in conn.notifies(timeout=timeout_s):
            received += 1
            self._doorbell.ring(1)
            if self._stop.is_set():
                break
        return received

    def _connect(self) -> Any:
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _loop(self) -> None:
        backoff_s = _RECONNECT_FIRST_S
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                self.connects += 1
                self.listening.set()
                self._log.info(
                    "listening for new jobs",
                    extra={
                        "action": "listener_connected",
                        "worker_id": self.worker_id,
                        "connects": self.connects,
                    },
                )
                backoff_s = _RECONNECT_FIRST_S
                # Notifications sent while we were away are lost: every loop polls once.
                self._doorbell.ring_all()
                while not self._stop.is_set():
                    self.run_once(conn)
            except Exception as exc:  # noqa: BLE001 - any connection failure: reconnect with backoff
                self.listening.clear()
                if self._stop.is_set():
                    break
                self._log.warning(
                    "listener connection failed; reconnecting",
                    extra={
                        "action": "listener_disconnected",
                        "worker_id": self.worker_id,
                        "error": str(exc),
                        "retry_in_s": backoff_s,
                    },
                )
                self._stop.wait(backoff_s * random.uniform(0.8, 1.2))
                backoff_s = min(_RECONNECT_CAP_S, backoff_s * 2)
            finally:
                self.listening.clear()
                if conn is not None:
                    # Closing a broken connection may fail; there is nothing left to do.
                    with contextlib.suppress(Exception):
                        conn.close()


def backlogged(job: Any) -> bool:
    """Whether a claimed job waited in the queue long enough to suggest others are waiting.

    ``updated_at`` (the claim's ``now()``) minus ``max(created_at, run_after)``, database
    times all, against :data:`BACKLOG_S`; True when the record lacks them (pass the baton
    when in doubt: a spare ring costs one empty claim, a missing one a poll interval).
    """
    try:
        waited = job.updated_at - max(job.created_at, job.run_after)
        return waited.total_seconds() >= BACKLOG_S
    except (AttributeError, TypeError):
        return True


class ClaimLoop:
    """One claim loop: claim, execute, repeat until the queue is empty, then wait.

    :param claim: ``() -> JobRecord | None`` (``store.job_claim(worker_id, lease_s)``).
    :param execute: runs and settles a claimed job.
    :param doorbell: wakes the loop (the listener, the poller, other loops); rung after a
        claim that shows a backlog (:func:`backlogged`).
    :param stopping: set when the worker stops claiming (the worker then closes the doorbell,
        which wakes every waiting loop).
    :param name: the thread name.
    """

    def __init__(
        self,
        *,
        claim: Callable[[], Any],
        execute: Callable[[Any], Any],
        doorbell: Doorbell,
        stopping: threading.Event,
        name: str,
        worker_id: str,
    ) -> None:
        self._claim = claim
        self._execute = execute
        self._doorbell = doorbell
        self._stopping = stopping
        self.name = name
        self.worker_id = worker_id
        # True while the loop claims job after job without waiting on the doorbell.
        self._continuing = False
        self._log = logging.getLogger("protomolt_jobs.worker")
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def run_once(self) -> bool:
        """Claim one job and execute it in the calling thread.

        :returns: True when a job was claimed.
        :raises StoreError: when the claim itself fails.
        """
        if self._stopping.is_set():
            return False
        job = self._claim()
        if job is None:
            self._continuing = False
            return False
        if self._continuing:
            # Claimed straight after the previous job, without a wake-up: this job's
            # announcement is likely still a token that would wake another loop into an
            # empty claim. Drop one (a missed one costs at most a job's run or a poll).
            self._doorbell.wait(0)
        self._continuing = True
        if backlogged(job):
            # More jobs are likely waiting: pass the baton to another idle loop first.
            self._doorbell.ring(1)
        self._execute(job)
        return True

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                claimed = self.run_once()
            except StoreError as exc:
                self._log.warning(
                    "claim failed; retrying at the next wake-up (at most a poll interval)",
                    extra={
                        "action": "claim_failed",
                        "worker_id": self.worker_id,
                        "error": str(exc),
                    },
                )
                claimed = False
            except Exception:  # noqa: BLE001 - a defect must not kill the loop; the sweeper takes the job
                self._log.exception(
                    "claim loop iteration failed (loop continues)",
                    extra={"action": "claim_loop_failed", "worker_id": self.worker_id},
                )
                claimed = False
            if claimed or self._stopping.is_set():
                continue
            # No timeout: the poller rings once per poll interval for the whole worker.
            self._continuing = False
            self._doorbell.wait(None)
