"""Claim loops: each claims until the queue is empty, then waits on the doorbell.

Wake-up model (DESIGN 5: pickup in milliseconds, not the poll interval; the listener and the
doorbell are in ``listener.py``):

- A ring of the :class:`~.listener.Doorbell` (a NOTIFY, another loop, the poller) wakes one
  idle :class:`ClaimLoop`. A loop claims until the queue is empty: after a claim that shows a
  backlog it rings once more (passing the baton to another idle loop, since more jobs are
  likely waiting), runs the job, and claims again. When a claim finds nothing the loop waits
  on the doorbell, with no timeout of its own.
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

The listener's names are importable from here too (``Doorbell``, ``Listener``, ``CHANNEL``,
``UNLISTEN_AFTER_S``, ``UNLISTEN_AFTER_NOTIFIES``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from protomolt_jobs.errors import StoreError
from protomolt_jobs.service import PeriodicService, Service
from protomolt_jobs.worker.listener import (
    CHANNEL,
    UNLISTEN_AFTER_NOTIFIES,
    UNLISTEN_AFTER_S,
    Doorbell,
    Listener,
)

__all__ = [
    "BACKLOG_S",
    "CHANNEL",
    "UNLISTEN_AFTER_NOTIFIES",
    "UNLISTEN_AFTER_S",
    "ClaimLoop",
    "Doorbell",
    "Listener",
    "Poller",
    "backlogged",
]

#: A claimed job that waited at least this long (seconds, database time) signals a backlog.
BACKLOG_S = 0.05


class Poller(PeriodicService):
    """Rings the doorbell once per poll interval (jittered): the fallback wake-up.

    :param doorbell: rung once per interval.
    :param interval_s: the poll interval, seconds (> 0).
    :param worker_id: for the thread name.
    """

    name = "poller"
    stop_timeout_s = 5.0

    def __init__(self, *, doorbell: Doorbell, interval_s: float, worker_id: str) -> None:
        if not interval_s > 0:
            raise ValueError(f"poll interval: must be > 0 seconds; got {interval_s!r}")
        super().__init__(interval_s=interval_s, worker_id=worker_id)
        self._doorbell = doorbell
        #: Rings so far (tests watch the cadence through it).
        self.rings = 0

    def run_once(self) -> int:
        """Ring once; returns the rings so far."""
        self.rings += 1
        self._doorbell.ring(1)
        return self.rings

    def _wait_before_first_pass(self) -> bool:
        return True


def backlogged(job: Any) -> bool:
    """Whether a claimed job waited in the queue long enough to suggest others are waiting.

    ``updated_at`` (the claim's ``now()``) minus ``max(created_at, run_after)``, database
    times all, against :data:`BACKLOG_S`; True when the record lacks them (pass the baton
    when in doubt: a spare ring costs one empty claim, a missing one a poll interval).
    """
    try:
        waited = job.updated_at - max(job.created_at, job.run_after)
        return bool(waited.total_seconds() >= BACKLOG_S)
    except (AttributeError, TypeError):
        return True


class ClaimLoop(Service):
    """One claim loop: claim, execute, repeat until the queue is empty, then wait.

    A failed claim (store error) is a warning and the loop waits for the next wake-up; any
    other exception (a defect; the claimed job is left to the sweeper) goes to supervision.

    :param claim: ``() -> JobRecord | None`` (``store.job_claim(worker_id, lease_s)``).
    :param execute: runs and settles a claimed job.
    :param doorbell: wakes the loop (the listener, the poller, other loops); rung after a
        claim that shows a backlog (:func:`backlogged`).
    :param stopping: set when the worker stops claiming (the worker then closes the doorbell,
        which wakes every waiting loop).
    :param name: the loop's name (``claim_loop_<i>``; the thread is named after it).
    """

    name = "claim_loop"

    def __init__(
        self,
        *,
        claim: Callable[[], Any],
        execute: Callable[[Any], Any],
        doorbell: Doorbell,
        stopping: threading.Event | None = None,
        name: str = "claim_loop",
        worker_id: str,
    ) -> None:
        self.name = name
        super().__init__(worker_id=worker_id)
        self.log = logging.getLogger("protomolt_jobs.worker")
        self._claim = claim
        self._execute = execute
        self._doorbell = doorbell
        self._stopping = stopping if stopping is not None else self._stop
        # True while the loop claims job after job without waiting on the doorbell.
        self._continuing = False

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

    def _wake(self) -> None:
        # A stop of the whole worker closes the doorbell; a lone loop (tests, an injected
        # failure) is woken by one ring.
        self._doorbell.ring(1)

    def _run(self, stop: threading.Event) -> None:
        while not (stop.is_set() or self._stopping.is_set()):
            self._checkpoint()
            # read before the claim: a LISTEN after it makes the wait below claim once more
            listens = self._doorbell.listens()
            try:
                claimed = self.run_once()
            except StoreError as exc:
                self.log.warning(
                    "claim failed; retrying at the next wake-up (at most a poll interval)",
                    extra={
                        "action": "claim_failed",
                        "worker_id": self.worker_id,
                        "error": str(exc),
                    },
                )
                claimed = False
            if claimed:
                self._progressed()
            if claimed or stop.is_set() or self._stopping.is_set():
                continue
            # No timeout: the poller rings once per poll interval for the whole worker.
            self._continuing = False
            self._doorbell.wait(None, since=listens)
