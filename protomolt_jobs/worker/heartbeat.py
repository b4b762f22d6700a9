"""Heartbeat: keeps the leases of a worker's in-flight jobs alive.

Lease model (DESIGN 5, STYLE 3):

- A claim stamps ``lease_owner = worker_id``, ``attempt = attempt + 1`` and
  ``lease_until = now() + lease_s`` (database time). ``(job_id, owner, attempt)`` is the
  :class:`~protomolt_jobs.store.records.Lease`, the fence every later write carries.
- While the job is in flight (waiting for a permit, running its segment, settling) the
  heartbeat extends ``lease_until = now() + lease_s`` about every third of the lease, under
  the same fence. A segment longer than the lease therefore keeps its claim, and the
  sweeper never re-queues it.
- The heartbeat's statement also returns the row's pending operator request (``control``),
  kept on the guard: a job still waiting for its permit stops at once (``job_stop``); a job
  in a step is stopped by its next fenced write, which honours the request itself.
- A heartbeat that matches no row raises ``LeaseLost``: the sweeper re-queued the job (the
  process stalled past its lease) or a graceful stop released it. The :class:`LeaseGuard`
  is marked lost and the segment writes nothing more. A heartbeat that fails for another
  reason (store outage) is retried soon; if the outage outlasts the lease, the sweeper
  takes the job and the next fenced write finds the lease lost.

The cancel poll: a job whose call in flight can be stopped (``LeaseGuard.watch_cancel``, a
definition with ``cancel.interruptCalls``) must learn of a cancel sooner than the next beat (a
third of the lease: 10 s for a 30 s lease). While such calls are in flight, the heartbeat's
thread also reads the pending requests of exactly those jobs every :data:`CANCEL_POLL_S` with
one read-only statement (``JobStore.job_controls``) and hands a cancel to their watchers. No
watched call in flight, no statement: a run without ``interruptCalls`` costs nothing more.

One :class:`Heartbeat` serves every in-flight job of a :class:`~protomolt_jobs.worker.Worker`
from a single thread (a schedule of due times), so 256 in-flight jobs cost one thread and
at most one pooled connection at a time, never one thread per job. The cadence is the
local monotonic clock; only the database's ``now()`` decides when a lease has expired.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.service import Service
from protomolt_jobs.store.records import Lease
from protomolt_jobs.telemetry import metrics

__all__ = ["CANCEL_POLL_S", "Heartbeat", "HeartbeatStore", "LeaseGuard"]

log = logging.getLogger("protomolt_jobs.heartbeat")

# After a heartbeat fails for a reason other than a lost lease, retry after this share of
# the interval (a store blip should not cost a third of the lease).
_RETRY_SHARE = 0.25

#: Seconds between two reads of the pending requests of the jobs with a watched call in flight
#: (the cancel poll): a cancel stops such a call within about this time plus the call's own
#: cancellation, whatever the lease length.
CANCEL_POLL_S = 0.5


def _nothing() -> None:
    """The withdrawal of a watcher that was called at once."""


class HeartbeatStore(Protocol):
    """The heartbeat's one fenced write (``JobStore.job_heartbeat_control``)."""

    def job_heartbeat_control(
        self, lease: Lease, lease_s: float
    ) -> tuple[datetime, dict[str, Any] | None]:
        """Extend the lease by ``lease_s`` seconds; returns ``(lease_until, control)``.

        :raises LeaseLost: when the fence matches no row.
        :raises StoreError: on a database failure.
        """
        ...

    def job_controls(self, job_ids: list[UUID]) -> dict[UUID, dict[str, Any]]:
        """The pending requests (``control``) of ``job_ids``; jobs without one are absent.

        :raises StoreError: on a database failure.
        """
        ...


class LeaseGuard:
    """This worker's hold on one claimed job: the lease and whether it is still ours.

    ``lost`` is set once, by whoever first learns the lease is gone (a heartbeat or a
    fenced write that raised ``LeaseLost``, or a graceful stop that released the job).
    After that the segment writes nothing.
    """

    __slots__ = (
        "_lost",
        "_on_watch",
        "_watch_lock",
        "_watchers",
        "control",
        "failures",
        "lease",
        "next_due",
        "reason",
        "settling",
        "status",
    )

    def __init__(self, lease: Lease, next_due: float) -> None:
        #: The fence: ``Lease(job_id, owner, attempt)``.
        self.lease = lease
        self._lost = threading.Event()
        #: Why the lease is no longer ours: ``"lease_lost"`` or ``"released"``; "" while held.
        self.reason = ""
        #: Monotonic time (seconds) of the next heartbeat.
        self.next_due = next_due
        #: Consecutive heartbeat failures other than a lost lease.
        self.failures = 0
        #: Set just before the settling write: from then on a heartbeat that finds no row
        #: is the settlement winning the race, not a lost lease.
        self.settling = False
        #: The operator request the last heartbeat found on the row (``{kind, actor, ...}``),
        #: or None. The fenced writes honour it themselves; this only lets a job that has
        #: not started its step (waiting for a permit) stop without waiting.
        self.control: dict[str, Any] | None = None
        #: The status an operator request gave the job (CANCELLED, PAUSED) once applied.
        self.status = ""
        self._watch_lock = threading.Lock()
        #: Callbacks of the calls in flight that a cancel stops (:meth:`watch_cancel`).
        self._watchers: dict[int, Callable[[], None]] = {}
        #: Called (no arguments) when a first watcher is registered: the heartbeat's cancel
        #: poll starts (set by :meth:`Heartbeat.track`).
        self._on_watch: Callable[[], None] | None = None

    @property
    def watched(self) -> bool:
        """True while a call in flight waits to be stopped by a cancel (:meth:`watch_cancel`)."""
        return bool(self._watchers)

    @property
    def cancel_requested(self) -> bool:
        """True once the heartbeat found a cancel request on the row."""
        control = self.control
        return control is not None and control.get("kind") == "cancel"

    def set_control(self, control: dict[str, Any] | None) -> None:
        """Keep what the heartbeat found on the row; a cancel request calls every watcher
        (:meth:`watch_cancel`) once: the calls in flight that can stop are cancelled."""
        self.control = control
        if not self.cancel_requested:
            return
        with self._watch_lock:
            watchers, self._watchers = list(self._watchers.values()), {}
        for fn in watchers:
            try:
                fn()
            except Exception:  # a watcher that fails must not stop the heartbeat
                log.debug("cancel watcher failed", exc_info=True, extra={"action": "cancel_watch"})

    def watch_cancel(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` (no arguments, e.g. a gRPC future's ``cancel``) once a cancel request
        reaches this job, at once when one already has.

        :returns: a function that withdraws ``fn`` (call it when the call ended).
        """
        if self.cancel_requested:
            fn()
            return _nothing
        key = id(fn)
        with self._watch_lock:
            self._watchers[key] = fn
        if self._on_watch is not None:
            self._on_watch()

        def unwatch() -> None:
            with self._watch_lock:
                self._watchers.pop(key, None)

        return unwatch

    @property
    def lost(self) -> bool:
        """True once the lease is no longer ours (lost or released)."""
        return self._lost.is_set()

    @property
    def control_pending(self) -> bool:
        """True while the last heartbeat found an operator request on the row (``control``)."""
        return self.control is not None

    @property
    def controlled(self) -> bool:
        """True when an operator request stopped the job (``reason == "controlled"``)."""
        return self._lost.is_set() and self.reason == "controlled"

    @property
    def released(self) -> bool:
        """True when a graceful stop gave the job back (``job_release``)."""
        return self._lost.is_set() and self.reason == "released"

    def mark_lost(self, reason: str = "lease_lost") -> bool:
        """Mark the lease gone. Returns True for the first caller only."""
        if self._lost.is_set():
            return False
        self.reason = reason
        self._lost.set()
        if reason == "lease_lost":
            metrics.LEASE_LOST.inc()
        return True


class Heartbeat(Service):
    """Extends the leases of tracked jobs every ``lease_s / 3`` seconds.

    A :class:`~protomolt_jobs.service.Service`. Its stop keeps the base's rule for a join
    that times out (a beat blocked in the store): the thread is kept, ends after its beat,
    and a ``start()`` meanwhile tells it to carry on instead of starting a second one.

    :param store: the job store (``job_heartbeat(lease, lease_s)``).
    :param lease_s: lease length, seconds (> 0).
    :param worker_id: for log records.
    :raises ValueError: when ``lease_s`` is not positive.
    """

    name = "heartbeat"

    def __init__(self, store: HeartbeatStore, *, lease_s: float, worker_id: str) -> None:
        if not lease_s or lease_s <= 0:
            raise ValueError(f"lease_s must be a positive number of seconds; got {lease_s!r}")
        super().__init__(worker_id=worker_id)
        self._store = store
        self.lease_s = float(lease_s)
        self.interval_s = self.lease_s / 3.0
        self._cond = threading.Condition()
        self._guards: dict[int, LeaseGuard] = {}
        #: Monotonic time of the next cancel poll; None while no watched call is in flight.
        self._poll_due: float | None = None

    # -- tracking ------------------------------------------------------------------------

    def track(self, lease: Lease) -> LeaseGuard:
        """Start heartbeating ``lease``; the first beat is due a third of a lease after now
        (the claim has just stamped a full lease).

        :returns: the job's :class:`LeaseGuard`.
        """
        guard = LeaseGuard(lease, time.monotonic() + self.interval_s)
        guard._on_watch = self._watch_started
        with self._cond:
            # No wake-up: the loop's current wait ends at most a beat interval after it began,
            # never later than this guard's first beat (now + interval), so waking it for
            # every claim would only cost a thread switch and a scan of every guard.
            self._guards[id(guard)] = guard
        return guard

    def _watch_started(self) -> None:
        """A call that a cancel can stop went in flight: poll within :data:`CANCEL_POLL_S`."""
        with self._cond:
            due = time.monotonic() + min(CANCEL_POLL_S, self.interval_s)
            if self._poll_due is None or due < self._poll_due:
                self._poll_due = due
                self._cond.notify_all()

    def untrack(self, guard: LeaseGuard) -> None:
        """Stop heartbeating the guard's lease (the job settled or was abandoned)."""
        with self._cond:
            self._guards.pop(id(guard), None)

    def tracked(self) -> list[LeaseGuard]:
        """Guards of the jobs currently in flight (a snapshot)."""
        with self._cond:
            return list(self._guards.values())

    # -- lifecycle -----------------------------------------------------------------------

    def _started_fields(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s}

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run_once(self) -> int:
        """Extend every lease whose beat is due.

        :returns: the number of leases extended.
        """
        now = time.monotonic()
        with self._cond:
            due = [g for g in self._guards.values() if g.next_due <= now and not g.lost]
        extended = 0
        for guard in due:
            # The beats run outside the lock, so a guard of the snapshot may have settled
            # (and been untracked) while earlier beats ran: its row is no longer ours to beat.
            if not self._is_tracked(guard) or guard.lost:
                continue
            if self._beat(guard):
                extended += 1
        self._poll_controls(now)
        return extended

    def _poll_controls(self, now: float) -> None:
        """The cancel poll (module docstring): one read of the watched jobs' requests when due;
        a cancel found calls the guard's watchers. A failed read is retried at the next poll."""
        with self._cond:
            if self._poll_due is None or self._poll_due > now:
                return
            watched = [g for g in self._guards.values() if g.watched and not g.lost]
            self._poll_due = now + min(CANCEL_POLL_S, self.interval_s) if watched else None
        if not watched:
            return
        try:
            controls = self._store.job_controls([g.lease.job_id for g in watched])
        except StoreError as exc:
            log.debug(
                "cancel poll failed", extra={"action": "cancel_poll_failed", "error": str(exc)}
            )
            return
        for guard in watched:
            control = controls.get(guard.lease.job_id)
            if control is not None and control.get("kind") == "cancel":
                guard.set_control(control)

    # -- internals -----------------------------------------------------------------------

    def _is_tracked(self, guard: LeaseGuard) -> bool:
        with self._cond:
            return self._guards.get(id(guard)) is guard

    def _beat(self, guard: LeaseGuard) -> bool:
        lease = guard.lease
        try:
            _, control = self._store.job_heartbeat_control(lease, self.lease_s)
        except LeaseLost:
            if guard.settling or not self._is_tracked(guard):
                # The job settled while this beat was in flight: the fenced write cleared the
                # lease. If the lease really was lost, the settling write says so itself.
                log.debug(
                    "heartbeat found the job already settled",
                    extra={
                        "action": "heartbeat_after_settle",
                        "job_id": str(lease.job_id),
                        "worker_id": lease.owner,
                        "attempt": lease.attempt,
                    },
                )
                self.untrack(guard)
                return False
            if guard.mark_lost("lease_lost"):
                log.warning(
                    "lease lost on heartbeat; the run is abandoned",
                    extra={
                        "action": "lease_lost",
                        "job_id": str(lease.job_id),
                        "worker_id": lease.owner,
                        "attempt": lease.attempt,
                        "operation": "heartbeat",
                    },
                )
            self.untrack(guard)
            return False
        except StoreError as exc:
            guard.failures += 1
            guard.next_due = time.monotonic() + self.interval_s * _RETRY_SHARE
            log.warning(
                "heartbeat failed; retrying",
                extra={
                    "action": "heartbeat_failed",
                    "job_id": str(lease.job_id),
                    "worker_id": lease.owner,
                    "attempt": lease.attempt,
                    "failures": guard.failures,
                    "error": str(exc),
                },
            )
            return False
        guard.failures = 0
        guard.next_due = time.monotonic() + self.interval_s
        guard.set_control(control)
        return True

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._cond:
                if stop.is_set():
                    return
                now = time.monotonic()
                pending = [g.next_due for g in self._guards.values() if not g.lost]
                if self._poll_due is not None:
                    pending.append(self._poll_due)
                wait_s = (min(pending) - now) if pending else self.interval_s
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    self._checkpoint()
                    continue
            self._checkpoint()
            self.run_once()
            self._progressed()
