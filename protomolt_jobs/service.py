"""The background-service base every duty shares (River's ``BaseStartStop``, in threads).

A :class:`Service` owns one thread, one stop flag, one lock, its start/stop log records,
its jitter and backoff, and its supervision. A duty writes only what is its own: one pass
(:meth:`PeriodicService.run_once`) or its loop body (:meth:`Service._run`).

Lifecycle::

    STOPPED --start()--> STARTING --thread runs--> RUNNING --loop raised--> BACKING_OFF
       ^                                            |   ^                        |
       |                                            |   +----- after the backoff-+
       +------------- stop(timeout_s) --------------+  (stop() ends any state)

- ``start()`` is idempotent and returns at once (the loop runs in a daemon thread). After a
  ``stop()`` whose join timed out (the loop is stuck in a call), the old thread is still
  alive: ``start()`` tells it to carry on instead of starting a second one.
- ``stop(timeout_s)`` asks the loop to end, waits at most ``timeout_s`` seconds and returns
  True once the thread has ended (then :meth:`Service._on_stopped` runs: producers and
  consumers close there). Never-started and double stops return True at once; a stop that
  timed out returns False, logs it, keeps the thread and skips ``_on_stopped``.
- Supervision: an exception out of the loop body is logged with its traceback, the state
  becomes BACKING_OFF for a capped exponential backoff (:class:`Backoff`), and the loop is
  run again. A loop that makes progress calls :meth:`Service._progressed`, which resets the
  backoff. :meth:`Service.health` tells the state, restarts and the last error; the role's
  ``/health`` reads it.
- Test hook: :meth:`Service.inject_failure` makes the loop raise at its next
  :meth:`Service._checkpoint` (every loop calls it once per iteration).

Jitter and backoff live here only: :func:`jittered` and :class:`Backoff`.
"""

from __future__ import annotations

import abc
import enum
import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Backoff",
    "InjectedFailure",
    "PeriodicService",
    "Service",
    "ServiceHealth",
    "ServiceState",
    "Startable",
    "jittered",
]

#: Default spread of a jittered wait: the wait is the interval times a factor in
#: ``[1 - JITTER, 1 + JITTER]`` (so a fleet does not act in lock-step).
JITTER = 0.2


def jittered(seconds: float, spread: float = JITTER) -> float:
    """``seconds`` times a uniform factor in ``[1 - spread, 1 + spread]``."""
    return seconds * random.uniform(1.0 - spread, 1.0 + spread)


class Backoff:
    """A capped exponential backoff with jitter: ``first_s``, ``2 * first_s``, ... up to
    ``cap_s`` (each jittered by :func:`jittered`).

    :param first_s: the first wait, seconds (> 0).
    :param cap_s: the longest wait, seconds (>= ``first_s``).
    """

    def __init__(self, first_s: float, cap_s: float) -> None:
        if not 0 < first_s <= cap_s:
            raise ValueError(f"backoff: need 0 < first_s <= cap_s; got {first_s!r}, {cap_s!r}")
        self.first_s = float(first_s)
        self.cap_s = float(cap_s)
        self._next_s = self.first_s

    def next(self) -> float:
        """The next wait in seconds (jittered); doubles the one after, up to the cap."""
        wait_s = self._next_s
        self._next_s = min(self.cap_s, self._next_s * 2)
        return jittered(wait_s)

    def peek(self) -> float:
        """The un-jittered wait :meth:`next` would start from, seconds."""
        return self._next_s

    def reset(self) -> None:
        """Back to ``first_s`` (after progress)."""
        self._next_s = self.first_s


class ServiceState(enum.StrEnum):
    """Where a service's loop is (see the module docstring)."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKING_OFF = "BACKING_OFF"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class ServiceHealth:
    """One component's state as ``/health`` shows it.

    :ivar name: the component's name (``sweeper``, ``relay``, ``worker``, ...).
    :ivar state: :class:`ServiceState`.
    :ivar restarts: times the loop was restarted after raising.
    :ivar last_error: ``"ExcType: message"`` of the last exception out of the loop, or "".
    :ivar parts: the sub-components of a composite (the worker's loops), by name.
    """

    name: str
    state: ServiceState
    restarts: int = 0
    last_error: str = ""
    parts: tuple[ServiceHealth, ...] = ()

    @property
    def ok(self) -> bool:
        """True when running (and every part too)."""
        return self.state is ServiceState.RUNNING and all(p.ok for p in self.parts)

    def failing(self) -> list[ServiceHealth]:
        """This component and its parts that are not ok, innermost first."""
        out = [f for p in self.parts for f in p.failing()]
        if self.state is not ServiceState.RUNNING:
            out.append(self)
        return out

    def to_json(self) -> dict[str, Any]:
        """``{"status": "UP"|"DOWN", "state": ..., "restarts": n, "lastError": ...}``."""
        body: dict[str, Any] = {
            "status": "UP" if self.ok else "DOWN",
            "state": self.state.value,
        }
        if self.restarts:
            body["restarts"] = self.restarts
        if self.last_error:
            body["lastError"] = self.last_error
        if self.parts:
            body["parts"] = {p.name: p.to_json() for p in self.parts}
        return body


@runtime_checkable
class Startable(Protocol):
    """What a composition root and a mount need of a component: the shape of
    :class:`Service`, also met by composites such as the worker."""

    name: str

    def start(self) -> None: ...

    def stop(self, timeout_s: float | None = None) -> bool: ...

    def health(self) -> ServiceHealth: ...


class InjectedFailure(RuntimeError):
    """Raised by :meth:`Service._checkpoint` after :meth:`Service.inject_failure` (tests)."""


class Service(abc.ABC):
    """A named background duty in one daemon thread (see the module docstring).

    Subclasses set ``name`` and implement :meth:`_run`; optionally :meth:`_wake` (interrupt
    their own waits), :meth:`_on_stopped` (close clients after the thread ended) and
    :meth:`_started_fields` (extra fields of the start record).

    :param worker_id: the node's worker id (thread names, log fields).
    """

    #: The component's name; the logger is ``protomolt_jobs.<name>``.
    name: str = "service"
    #: Default bound of :meth:`stop`, seconds.
    stop_timeout_s: float = 10.0
    #: First and longest wait before a loop that raised is run again, seconds.
    restart_first_s: float = 0.5
    restart_cap_s: float = 30.0

    def __init__(self, *, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self.log = logging.getLogger(f"protomolt_jobs.{self.name}")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = ServiceState.STOPPED
        self._restarts = 0
        self._last_error = ""
        self._injected: BaseException | None = None
        # True between a logged start and its logged stop (each is logged once).
        self._announced = False
        # True after a stop timed out while the thread is still in a call.
        self._abandoned = False
        self._restart_backoff = Backoff(self.restart_first_s, self.restart_cap_s)
        #: Completed loop iterations that made progress (tests poll it).
        self.passes = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def thread_name(self) -> str:
        suffix = f"-{self.worker_id}" if self.worker_id else ""
        return f"protomolt-jobs-{self.name.replace('_', '-')}{suffix}"

    @property
    def running(self) -> bool:
        """True while the loop thread is alive and not asked to stop."""
        with self._lock:
            return self._thread is not None and not self._stop.is_set()

    def start(self) -> None:
        """Start the loop in its thread; returns at once. Idempotent.

        A start that finds the loop still stopping (another thread is in :meth:`stop`) waits
        for it to end (at most :attr:`stop_timeout_s`) and starts a fresh one. A loop left
        behind by a stop that timed out is told to carry on instead.
        """
        while True:
            with self._lock:
                thread = self._thread
                if thread is None:
                    self._stop.clear()
                    self._wakeup.clear()
                    self._abandoned = False
                    self._state = ServiceState.STARTING
                    self._restart_backoff = Backoff(self.restart_first_s, self.restart_cap_s)
                    thread = threading.Thread(
                        target=self._supervise, name=self.thread_name, daemon=True
                    )
                    self._thread = thread
                    thread.start()
                    announce = not self._announced
                    self._announced = True
                    break
                if not self._stop.is_set():
                    return
                if self._abandoned:
                    # The loop is stuck in a call since a stop timed out: it carries on (it
                    # checks the flag under this lock before it exits).
                    self._abandoned = False
                    self._stop.clear()
                    return
            thread.join(self.stop_timeout_s)
            if thread.is_alive():
                with self._lock:
                    if self._thread is thread:
                        self._abandoned = True
        if announce:
            self.log.info(
                "%s started",
                self.name,
                extra={
                    "action": f"{self.name}_started",
                    **self._log_fields(),
                    **self._started_fields(),
                },
            )

    def request_stop(self) -> None:
        """Ask the loop to end without waiting (a composite stops its parts together)."""
        self._stop.set()
        self._wakeup.set()
        self._wake()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the loop and return once it has ended.

        :param timeout_s: join bound, seconds (None: :attr:`stop_timeout_s`).
        :returns: True when stopped (also never-started and double stop); False when the
            thread did not end in time (it is kept, and ends after its current call).
        """
        bound_s = self.stop_timeout_s if timeout_s is None else max(0.0, timeout_s)
        with self._lock:
            thread = self._thread
            if thread is not None:
                self._stop.set()
        if thread is not None:
            self.request_stop()
            thread.join(bound_s)
            if thread.is_alive():
                with self._lock:
                    if self._thread is thread:
                        self._abandoned = True
                self.log.warning(
                    "%s did not stop within %ss; it ends after its current call",
                    self.name,
                    bound_s,
                    extra={"action": f"{self.name}_stop_timeout", **self._log_fields()},
                )
                return False
        with self._lock:
            if self._thread is not None:
                return True  # started again meanwhile (another thread's start())
            self._state = ServiceState.STOPPED
            announce, self._announced = self._announced, False
        if announce:
            self._on_stopped()
            self.log.info(
                "%s stopped",
                self.name,
                extra={"action": f"{self.name}_stopped", **self._log_fields()},
            )
        return True

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the thread to end, without asking it to (a composite
        first lets its parts finish, then stops them). True when no thread runs."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return True
        thread.join(max(0.0, timeout_s))
        return not thread.is_alive()

    def health(self) -> ServiceHealth:
        """The current state (a snapshot)."""
        with self._lock:
            return ServiceHealth(self.name, self._state, self._restarts, self._last_error)

    def inject_failure(self, exc: BaseException | None = None) -> None:
        """Test hook: the loop raises ``exc`` (default :class:`InjectedFailure`) at its next
        :meth:`_checkpoint`, as a defect would."""
        self._injected = exc or InjectedFailure(f"{self.name}: injected failure")
        self._wakeup.set()
        self._wake()

    # -- for subclasses ----------------------------------------------------------------------

    @abc.abstractmethod
    def _run(self, stop: threading.Event) -> None:
        """The loop body: return once ``stop`` is set; raise on a defect (supervision
        restarts it). Call :meth:`_checkpoint` once per iteration."""

    def _wake(self) -> None:
        """Interrupt the loop's own waits (stop or an injected failure). Default: nothing
        (waits through :meth:`_sleep` are woken already)."""

    def _on_stopped(self) -> None:
        """Called once the thread has ended (not after a timed-out stop)."""

    def _started_fields(self) -> dict[str, Any]:
        """Extra fields of the ``<name>_started`` record."""
        return {}

    def _log_fields(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id} if self.worker_id else {}

    def _checkpoint(self) -> None:
        """Raise the injected failure, if any (every loop calls this once per iteration)."""
        injected, self._injected = self._injected, None
        if injected is not None:
            if not self._stop.is_set():
                self._wakeup.clear()  # the wake-up was for this; the backoff must not skip
            raise injected

    def _progressed(self) -> None:
        """The loop made progress: count a pass and reset the restart backoff."""
        self.passes += 1
        if self._state is not ServiceState.RUNNING:
            with self._lock:
                if self._state is not ServiceState.STOPPED:
                    self._state = ServiceState.RUNNING
        self._restart_backoff.reset()

    def _backing_off(self, error: str) -> None:
        """The loop waits before retrying something it needs (a connection): health shows
        BACKING_OFF with ``error`` until the next :meth:`_progressed`."""
        with self._lock:
            if self._state is not ServiceState.STOPPED:
                self._state = ServiceState.BACKING_OFF
                self._last_error = error

    def _sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds`` or until stopped (or a failure is injected).

        :returns: True when the loop should end.
        """
        if self._wakeup.wait(max(0.0, seconds)):
            self._wakeup.clear()
        return self._stop.is_set()

    # -- internals ---------------------------------------------------------------------------

    def _supervise(self) -> None:
        stop = self._stop
        while True:
            with self._lock:
                if stop.is_set():
                    # Under the lock: start() either sees this thread gone or keeps it going.
                    self._thread = None
                    self._state = ServiceState.STOPPED
                    return
                self._state = ServiceState.RUNNING
            try:
                self._run(stop)
                continue
            except Exception as exc:  # supervision: a defect restarts the loop, never ends it
                if stop.is_set():
                    continue
                wait_s = self._restart_backoff.next()
                with self._lock:
                    self._restarts += 1
                    self._last_error = f"{type(exc).__name__}: {exc}"
                    self._state = ServiceState.BACKING_OFF
                self.log.exception(
                    "%s loop failed; restarting in %.1fs",
                    self.name,
                    wait_s,
                    extra={
                        "action": f"{self.name}_loop_failed",
                        "restarts": self._restarts,
                        "retry_in_s": round(wait_s, 3),
                        **self._log_fields(),
                    },
                )
                self._sleep(wait_s)


class PeriodicService(Service):
    """A service whose loop is one :meth:`run_once` per (jittered) interval.

    A pass that raises ``transient`` errors (the store or a broker lane unreachable) is
    logged as a warning and retried after a capped exponential backoff; any other exception
    is a defect and goes to supervision (traceback, BACKING_OFF, restart).

    :param interval_s: the cadence, seconds (> 0).
    :param worker_id: see :class:`Service`.
    """

    #: Exceptions a pass may raise that are not defects (set by subclasses).
    transient: tuple[type[BaseException], ...] = ()
    #: First and longest wait after a failed pass, seconds.
    retry_first_s: float = 0.5
    retry_cap_s: float = 10.0

    def __init__(self, *, interval_s: float, worker_id: str = "") -> None:
        if not interval_s > 0:
            raise ValueError(f"{self.name}: interval must be > 0 seconds; got {interval_s!r}")
        super().__init__(worker_id=worker_id)
        self.interval_s = float(interval_s)
        self._retry = Backoff(self.retry_first_s, self.retry_cap_s)

    @abc.abstractmethod
    def run_once(self) -> Any:
        """One pass; returns what the duty counts."""

    def _wait_before_first_pass(self) -> bool:
        """Whether the loop waits one interval before its first pass (the sweeper does)."""
        return False

    def _next_wait_s(self, result: Any) -> float:
        """How long to wait after a successful pass (default: one jittered interval)."""
        return jittered(self.interval_s)

    def _failed_pass(self, exc: BaseException) -> None:
        self.log.warning(
            "%s pass failed (%s); retrying",
            self.name,
            exc,
            extra={"action": f"{self.name}_pass_failed", "error": str(exc), **self._log_fields()},
        )

    def _run(self, stop: threading.Event) -> None:
        if self._wait_before_first_pass() and self._sleep(jittered(self.interval_s)):
            return
        while not stop.is_set():
            self._checkpoint()
            try:
                result = self.run_once()
            except self.transient as exc:
                self._failed_pass(exc)
                if self._sleep(self._retry.next()):
                    return
                continue
            self._retry.reset()
            self._progressed()
            wait_s = self._next_wait_s(result)
            if wait_s > 0 and self._sleep(wait_s):
                return
