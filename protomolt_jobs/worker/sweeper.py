"""Sweeper: expired leases back to QUEUED, or DEAD once their attempts are spent.

A lease expires only when its worker stopped heartbeating: the process died (SIGKILL, OOM,
a crash), stalled, or lost the database for longer than the lease. The sweeper runs on its
own cadence (``sweep_interval_ms``, jittered so a fleet does not sweep in lock-step), not
only when a claim loop is idle, so a fully busy fleet still recovers crashed jobs. The
decision is the store's, in database time: ``lease_until < now()`` and RUNNING; a swept row
whose ``attempt >= max_attempts`` goes DEAD (a job that crashes its worker every attempt
must end), otherwise back to QUEUED, resuming from its checkpoints on the next claim.

Several sweepers (one per process) are safe: the store's sweep locks the rows it changes.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

from protomolt_jobs.errors import StoreError

__all__ = ["Sweeper"]

log = logging.getLogger("protomolt_jobs.sweeper")

# Jitter of the sweep cadence: each wait is the interval times a factor in this range.
_JITTER = (0.8, 1.2)


class Sweeper:
    """The lease sweeper component.

    :param store: the job store (``job_sweep_expired()``).
    :param config: ``JobsConfig`` (``sweep_interval_ms``, ``worker_id``).
    """

    name = "sweeper"

    def __init__(self, store: Any, *, config: Any) -> None:
        if config.sweep_interval_ms <= 0:
            raise ValueError(
                f"jobs.sweep_interval_ms must be positive; got {config.sweep_interval_ms!r}"
            )
        self._store = store
        self.interval_s = config.sweep_interval_ms / 1000.0
        self.worker_id = config.worker_id
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sweeping on the cadence; returns at once. Idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name=f"protomolt-jobs-sweeper-{self.worker_id}", daemon=True
            )
            self._thread.start()
        log.info(
            "sweeper started",
            extra={
                "action": "sweeper_started",
                "worker_id": self.worker_id,
                "interval_s": self.interval_s,
            },
        )

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop and return once the loop has ended (a sweep in progress finishes first).
        Never-started and double stop are fine."""
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is None:
            return
        self._stop.set()
        thread.join(10.0 if timeout_s is None else timeout_s)
        log.info(
            "sweeper stopped", extra={"action": "sweeper_stopped", "worker_id": self.worker_id}
        )

    def run_once(self) -> Any:
        """One sweep pass.

        :returns: ``SweepResult(requeued, dead)``.
        :raises StoreError: when the sweep fails.
        """
        result = self._store.job_sweep_expired()
        if result.requeued:
            log.info(
                "expired leases requeued",
                extra={
                    "action": "sweep_requeued",
                    "worker_id": self.worker_id,
                    "count": result.requeued,
                },
            )
        if result.dead:
            log.warning(
                "expired leases with no attempts left went DEAD",
                extra={"action": "sweep_dead", "worker_id": self.worker_id, "count": result.dead},
            )
        return result

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s * random.uniform(*_JITTER)):
            try:
                self.run_once()
            except StoreError as exc:
                log.warning(
                    "sweep failed (next pass retries)",
                    extra={
                        "action": "sweep_failed",
                        "worker_id": self.worker_id,
                        "error": str(exc),
                    },
                )
            except Exception:  # a defect must not end the sweeper
                log.exception(
                    "sweep pass crashed (next pass retries)",
                    extra={"action": "sweep_failed", "worker_id": self.worker_id},
                )
