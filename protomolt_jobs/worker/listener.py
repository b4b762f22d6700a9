"""The LISTEN listener and the doorbell it rings: how idle claim loops learn of new jobs.

Wake-up model (DESIGN 5: pickup in milliseconds, not the poll interval; the claim loops' side
is in ``claim.py``):

- Every enqueue and requeue commits a ``NOTIFY protomolt_jobs``. One :class:`Listener` per
  worker holds an autocommit connection that ``LISTEN``s on that channel and rings the
  :class:`Doorbell` once per notification. A ring wakes one idle claim loop.
- The listener reconnects with a capped exponential backoff. Notifications sent while it
  was disconnected are lost, so after every (re)connect it rings every loop once.
- Only an idle worker listens (DESIGN 5: "idle workers LISTEN"). Once every loop has been
  busy for :data:`UNLISTEN_AFTER_S`, or :data:`UNLISTEN_AFTER_NOTIFIES` notifications came
  while every loop was busy (a burst), the listener sends ``UNLISTEN``: a busy loop claims
  again as soon as its job ends, so notifications would only wake nobody, and PostgreSQL
  reads each one into an idle listening session in a transaction of its own (one commit
  per job per worker process under load). The first loop to go idle again wakes the
  listener, which sends ``LISTEN`` and then rings every idle loop once: a job committed
  between that loop's empty claim and the ``LISTEN`` is found by the claim after it, and
  every later one is announced. A loop whose claim began before the ``LISTEN`` and ended
  after it (busy when the idle loops were rung) claims once more instead of waiting
  (:meth:`Doorbell.relistened`): its claim may have missed such a job too.

Ringing is cheap and a spurious ring costs one empty claim; tokens are capped at the
number of loops so a burst of notifications cannot queue up a burst of empty claims.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from protomolt_jobs.service import Backoff, Service

__all__ = [
    "CHANNEL",
    "UNLISTEN_AFTER_NOTIFIES",
    "UNLISTEN_AFTER_S",
    "Doorbell",
    "Listener",
]

#: The NOTIFY channel enqueue and requeue announce on.
CHANNEL = "protomolt_jobs"

#: Every claim loop busy (none waiting on the doorbell) this long, seconds: stop listening.
UNLISTEN_AFTER_S = 0.5

#: Notifications received while every claim loop was busy that also stop listening at once:
#: more than an ``UNLISTEN``, a ``LISTEN`` and a claim cost when a loop is idle again.
UNLISTEN_AFTER_NOTIFIES = 4

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
        self._waiting = 0
        # monotonic time since which no thread has waited (every loop busy)
        self._busy_since = time.monotonic()
        self._on_idle: Callable[[], None] | None = None
        # LISTENs that followed an UNLISTEN so far (see relistened)
        self._listens = 0

    @property
    def waiting(self) -> int:
        """Threads blocked in :meth:`wait` right now (tests wait on it, not on a sleep)."""
        with self._cond:
            return self._waiting

    def busy_for(self) -> float:
        """Seconds since a thread last waited in :meth:`wait` (0.0 while one waits)."""
        with self._cond:
            if self._waiting:
                return 0.0
            return time.monotonic() - self._busy_since

    def watch_idle(self, hook: Callable[[], None] | None) -> None:
        """Call ``hook()`` whenever the first thread starts to wait (no waiter -> one).

        The hook runs in the waiting thread with the doorbell's lock held: it must only
        signal (the listener writes one byte to a pipe), never block or touch the doorbell.
        """
        with self._cond:
            self._on_idle = hook

    def ring(self, n: int = 1) -> None:
        """Add ``n`` tokens (capped) and wake as many waiters."""
        with self._cond:
            self._tokens = min(self.capacity, self._tokens + max(0, n))
            self._cond.notify(n)

    def listens(self) -> int:
        """LISTENs after an UNLISTEN so far: a loop reads it before its claim and passes it to
        :meth:`wait` (``since``)."""
        with self._cond:
            return self._listens

    def relistened(self) -> None:
        """A ``LISTEN`` that followed an ``UNLISTEN`` is in effect: ring every waiting loop
        once, and make a loop whose claim began before it (it still claims, or is about to
        wait with an older ``since``) claim once more instead of waiting. Jobs committed
        before the ``LISTEN`` were announced to nobody; a claim that began before it may have
        missed them."""
        with self._cond:
            self._listens += 1
            n = max(1, self._waiting)
            self._tokens = min(self.capacity, self._tokens + n)
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
            self._busy_since = time.monotonic()

    def wait(self, timeout_s: float | None, since: int | None = None) -> bool:
        """Wait for a token for at most ``timeout_s`` seconds (None: until a ring or close).

        :param since: :meth:`listens` as read before the caller's last claim: when a
            ``LISTEN`` came since, return True at once (claim again; no token is taken).
        :returns: True when woken by a ring (a token was taken) or a ``LISTEN`` since
            ``since``, False on timeout or close.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            if since is not None and since != self._listens and not self._closed:
                return True
            while not self._closed:
                if self._tokens > 0:
                    self._tokens -= 1
                    return True
                if deadline is None:
                    remaining = None
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                self._waiting += 1
                if self._waiting == 1 and self._on_idle is not None:
                    self._on_idle()
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
                    if not self._waiting:
                        self._busy_since = time.monotonic()
            return False


class Listener(Service):
    """``LISTEN protomolt_jobs`` on a dedicated autocommit connection; rings the doorbell.

    A lost connection is retried with a capped exponential backoff (health shows
    BACKING_OFF meanwhile); the first connect happens in the thread, so a database that is
    down does not block the worker's start. While every loop is busy the listener stops
    listening (``UNLISTEN`` after :data:`UNLISTEN_AFTER_S`, or after
    :data:`UNLISTEN_AFTER_NOTIFIES` unanswered notifications) and listens again when a loop
    goes idle (see the module doc).

    :param dsn: libpq connection string.
    :param doorbell: rung once per notification, ``ring_all`` after each (re)connect, once
        per idle loop after each ``LISTEN`` that follows an ``UNLISTEN``.
    :param worker_id: for log records.
    :param unlisten_after_s: seconds every loop must have been busy before ``UNLISTEN``
        (None: never; the listener then listens for as long as it is connected).
    """

    name = "listener"

    def __init__(
        self,
        dsn: str,
        *,
        doorbell: Doorbell,
        worker_id: str,
        unlisten_after_s: float | None = UNLISTEN_AFTER_S,
    ) -> None:
        if not dsn:
            raise ValueError("the listener needs a dsn (jobs.dsn)")
        super().__init__(worker_id=worker_id)
        self._dsn = dsn
        self._doorbell = doorbell
        #: Seconds every loop must have been busy before ``UNLISTEN`` (None: never; set while
        #: not listening, the listener listens again at its next pass).
        self.unlisten_after_s = unlisten_after_s
        self._reconnect = Backoff(_RECONNECT_FIRST_S, _RECONNECT_CAP_S)
        # The self-pipe an idle loop writes to while the listener does not listen; it
        # exists while the listener thread runs (guarded by _wake_lock).
        self._wake_lock = threading.Lock()
        self._pipe: tuple[int, int] | None = None
        #: Connections made so far (tests watch reconnects through it).
        self.connects = 0
        #: Set while ``LISTEN`` is in effect on an established connection.
        self.listening = threading.Event()
        #: Notifications received so far. PostgreSQL reads each one into an idle listening
        #: session in a transaction of its own, so each also counts as one commit of this
        #: database (the benchmark reports them within its transactions per job).
        self.notifications = 0
        #: ``UNLISTEN``s sent because every loop was busy (tests and the benchmark read it).
        self.unlistens = 0
        # Notifications received since a loop last waited on the doorbell (none could answer).
        self._unanswered = 0

    def run_once(self, conn: Any, timeout_s: float = _LISTEN_SLICE_S) -> int:
        """Wait up to ``timeout_s`` on ``conn`` for notifications (or an idle loop's wake-up),
        ring once for each, then ``UNLISTEN`` or ``LISTEN`` as the loops' state asks.

        :returns: the number of notifications received.
        :raises psycopg.Error: when the connection fails.
        """
        wake = self._pipe
        poll = select.poll()  # not select.select: a busy process may hold fds past 1024
        poll.register(conn.fileno(), select.POLLIN)
        if wake is not None:
            poll.register(wake[0], select.POLLIN)
        ready = poll.poll(max(0.0, timeout_s) * 1000.0)
        if wake is not None and any(fd == wake[0] for fd, _ in ready):
            with contextlib.suppress(BlockingIOError):
                os.read(wake[0], 512)
        # Also drains what psycopg kept from the last (UN)LISTEN's reply.
        received = 0
        for _ in conn.notifies(timeout=0):
            received += 1
            self.notifications += 1
            self._doorbell.ring(1)
        if self._doorbell.waiting:
            self._unanswered = 0
        else:
            self._unanswered += received
        self._follow_loops(conn)
        return received

    def _follow_loops(self, conn: Any) -> None:
        if self.listening.is_set():
            if self.unlisten_after_s is None:
                return
            busy_s = self._doorbell.busy_for()
            if not busy_s or (
                busy_s < self.unlisten_after_s and self._unanswered < UNLISTEN_AFTER_NOTIFIES
            ):
                return
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(CHANNEL)))
            self.listening.clear()
            self.unlistens += 1
            self._unanswered = 0
            # A loop that went idle just before the flag changed did not write to the pipe.
            if not self._doorbell.waiting:
                return
        elif not self._doorbell.waiting and self.unlisten_after_s is not None:
            return
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        self.listening.set()
        # A job committed between an idle loop's empty claim and this LISTEN was announced
        # to nobody: every idle loop claims once more, and so does a loop whose claim began
        # before the LISTEN and ends after it (not yet idle, so not rung).
        self._doorbell.relistened()

    def _loop_idle(self) -> None:
        # Runs in a claim loop under the doorbell's lock (Doorbell.watch_idle): one byte
        # wakes the listener while it does not listen; nothing to do while it does.
        if not self.listening.is_set():
            self._wake()

    def _wake(self) -> None:
        # Stop, an injected failure or an idle loop: end the listener's select at once.
        with self._wake_lock:
            if self._pipe is not None:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._pipe[1], b"\0")

    def _connect(self) -> Any:
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        except BaseException:  # close on any failure, re-raised
            conn.close()
            raise
        return conn

    def _run(self, stop: threading.Event) -> None:
        wake = os.pipe()
        for fd in wake:
            os.set_blocking(fd, False)
        with self._wake_lock:
            self._pipe = wake
        self._doorbell.watch_idle(self._loop_idle)
        try:
            self._listen(stop)
        finally:
            self._doorbell.watch_idle(None)
            with self._wake_lock:
                self._pipe = None
                for fd in wake:
                    os.close(fd)

    def _listen(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._checkpoint()
            conn = None
            try:
                conn = self._connect()
                self.connects += 1
                self.listening.set()
                self._progressed()
                self.log.info(
                    "listening for new jobs",
                    extra={
                        "action": "listener_connected",
                        "worker_id": self.worker_id,
                        "connects": self.connects,
                    },
                )
                self._reconnect.reset()
                # Notifications sent while we were away are lost: every loop polls once.
                self._doorbell.ring_all()
                while not stop.is_set():
                    self._checkpoint()
                    self.run_once(conn)
            except (psycopg.Error, OSError) as exc:
                self.listening.clear()
                if stop.is_set():
                    break
                retry_s = self._reconnect.next()
                self._backing_off(f"{type(exc).__name__}: {exc}")
                self.log.warning(
                    "listener connection failed; reconnecting",
                    extra={
                        "action": "listener_disconnected",
                        "worker_id": self.worker_id,
                        "error": str(exc),
                        "retry_in_s": round(retry_s, 3),
                    },
                )
                self._sleep(retry_s)
            finally:
                self.listening.clear()
                if conn is not None:
                    # Closing a broken connection may fail; there is nothing left to do.
                    with contextlib.suppress(Exception):
                        conn.close()
