"""The Worker: claim loops, the listener, the heartbeat and the per-target permits of one
process, with a graceful stop.

Concurrency model: threads (see docs/worker.md). ``worker_count`` claim loops each run one
segment at a time, so ``worker_count`` is the number of in-flight segments in the process.
A loop holds a pooled connection only inside a store call, never across a gRPC call, so a
pool of 10 carries hundreds of in-flight jobs.

Graceful stop (STYLE 5), in this order:

1. stop claiming: the loops finish their current job and exit;
2. wait up to ``shutdown_grace_seconds`` for the in-flight segments to settle;
3. release each job still in flight back to QUEUED with ``job_release`` (fenced): the
   attempt it was claimed with is given back (``attempt - 1``), because a stop is not a
   failure of the job; its checkpoints stay, so the next claim resumes after them. The
   segment, if still running, is marked released and writes nothing more;
4. end the heartbeat, the listener and the poller, join the threads.

A segment stuck in a gRPC call after its release keeps its (daemon) thread until the call
returns; it then writes nothing. Stopping never waits on a call beyond a short join.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import StoreError
from protomolt_jobs.service import ServiceHealth, ServiceState
from protomolt_jobs.store.records import JobRecord
from protomolt_jobs.telemetry import metrics, tracing
from protomolt_jobs.worker.claim import ClaimLoop, Poller
from protomolt_jobs.worker.grants import GrantPolicy
from protomolt_jobs.worker.heartbeat import Heartbeat, HeartbeatStore
from protomolt_jobs.worker.listener import Doorbell, Listener
from protomolt_jobs.worker.permits import TargetPermits
from protomolt_jobs.worker.segment import SegmentExecutor, SegmentStore
from protomolt_jobs.worker.settlement import Settlement
from protomolt_jobs.workflow.types import Runtime

__all__ = ["Worker", "WorkerStore"]

log = logging.getLogger("protomolt_jobs.worker")

#: How often a worker re-reads which queues have fleet-wide limits, seconds.
LIMITS_REFRESH_S = 30.0

# After the release pass, how long to wait for loop threads that are still in a call.
_JOIN_AFTER_RELEASE_S = 2.0


class WorkerStore(SegmentStore, HeartbeatStore, Protocol):
    """Everything a worker asks of the store (``JobStore``): the claim and the queue limits,
    the heartbeat, and each segment's reads and fenced writes."""

    def job_claim(
        self,
        worker_id: str,
        lease_s: float,
        *,
        queues: Sequence[str] = ...,
        limited: Collection[str] = (),
    ) -> JobRecord | None: ...

    def queue_limits_sync(self, limits: Mapping[str, Mapping[str, Any]]) -> frozenset[str]: ...


class Worker:
    """The job worker of one process.

    :param store: the job store.
    :param runtime: the workflow engine's ``Runtime``.
    :param config: ``JobsConfig`` (``worker_id``, ``worker_count``, ``lease_seconds``,
        ``poll_interval_ms``, ``backoff_base_seconds``, ``max_concurrent_per_target``,
        ``shutdown_grace_seconds``).
    :param dsn: connection string of the LISTEN connection (the pool's database).
    :param grants: the step grant policy (``worker/grants.py``); None: ``config.grants`` only.
    :param artifact_store: the node's ``ArtifactStore`` (``hooks/contract.py``): a publication
        step hashes the bytes it publishes again through it; None: not checked.
    :raises ValueError: when ``dsn`` is empty.
    """

    name = "worker"

    def __init__(
        self,
        store: WorkerStore,
        *,
        runtime: Runtime,
        config: JobsConfig,
        dsn: str,
        grants: GrantPolicy | None = None,
        artifact_store: Any = None,
    ) -> None:
        if not dsn:
            raise ValueError("the worker needs jobs.dsn for its LISTEN connection")
        self._store = store
        self._runtime = runtime
        self.config = config
        self.worker_id = config.worker_id
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self.doorbell = Doorbell(config.worker_count)
        self.permits = TargetPermits(config.max_concurrent_per_target)
        self.heartbeat = Heartbeat(store, lease_s=config.lease_seconds, worker_id=self.worker_id)
        self.listener = Listener(dsn, doorbell=self.doorbell, worker_id=self.worker_id)
        self.poller = Poller(
            doorbell=self.doorbell,
            interval_s=config.poll_interval_ms / 1000.0,
            worker_id=self.worker_id,
        )
        self.executor = SegmentExecutor(
            store,
            runtime=runtime,
            config=config,
            permits=self.permits,
            heartbeat=self.heartbeat,
            draining=self._draining,
            grants=grants,
            artifact_store=artifact_store,
        )
        self._loops: list[ClaimLoop] = []
        self._started = False
        # Sorted: claimers of several limited queues lock their limits rows in one order.
        self._queues: tuple[str, ...] = tuple(sorted(config.queues))
        self._limited: frozenset[str] = frozenset()
        self._limits_read_at = 0.0

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._started

    def start(self) -> None:
        """Start the heartbeat, the listener and ``worker_count`` claim loops; returns once
        they run. Idempotent; a stopped worker may be started again."""
        with self._lock:
            if self._started:
                return
            # A fresh stop flag per run: a loop thread of an earlier run that is still inside
            # a call (released on stop) must not resume claiming when this run clears its flag.
            self._stopping = threading.Event()
            self._draining.clear()
            self.doorbell.reopen()
            self._sync_queue_limits()
            self.heartbeat.start()
            self.listener.start()
            self._loops = [
                ClaimLoop(
                    claim=self._claim,
                    execute=self._execute,
                    doorbell=self.doorbell,
                    stopping=self._stopping,
                    name=f"claim_loop_{i}",
                    worker_id=self.worker_id,
                )
                for i in range(self.config.worker_count)
            ]
            for loop in self._loops:
                loop.start()
            self.poller.start()
            self._started = True
        log.info(
            "worker started",
            extra={
                "action": "worker_started",
                "worker_id": self.worker_id,
                "loops": self.config.worker_count,
                "lease_s": self.config.lease_seconds,
            },
        )

    def stop(self, timeout_s: float | None = None) -> bool:
        """Graceful stop (see the module docstring); returns once stopped. Never-started and
        double stop are fine.

        :param timeout_s: caps the grace period for in-flight segments, seconds: the grace
            is ``min(shutdown_grace_seconds, timeout_s)``; None uses ``shutdown_grace_seconds``.
            Stopping takes at most the grace plus about 2 s (the release pass and joins).
        :returns: True when every thread ended; False when a loop is still inside a call
            (released: it writes nothing more and ends when the call returns).
        """
        with self._lock:
            if not self._started:
                # run_once() may have started the heartbeat without start().
                return self.heartbeat.stop()
            self._started = False
            loops, self._loops = self._loops, []
            grace_s = self.config.shutdown_grace_seconds
            if timeout_s is not None:
                grace_s = max(0.0, min(grace_s, timeout_s))
            log.info(
                "worker stopping",
                extra={
                    "action": "worker_stopping",
                    "worker_id": self.worker_id,
                    "grace_s": grace_s,
                },
            )
            # 1. stop claiming (the listener goes too: nothing is left to wake).
            self._stopping.set()
            for loop in loops:
                loop.request_stop()
            self.doorbell.close()
            self.listener.request_stop()
            self.poller.request_stop()
            self.listener.stop()
            self.poller.stop()
            # 2. grace period for the segments in flight.
            deadline = time.monotonic() + grace_s
            for loop in loops:
                loop.join(deadline - time.monotonic())
            # 3. release the rest back to QUEUED.
            self._draining.set()
            released = 0
            for guard in self.heartbeat.tracked():
                if self.executor.release(guard):
                    released += 1
            self.permits.wake_all()
            join_deadline = time.monotonic() + _JOIN_AFTER_RELEASE_S
            left = sum(
                1 for loop in loops if not loop.stop(max(0.0, join_deadline - time.monotonic()))
            )
            # 4. heartbeats end with their segments.
            stopped = self.heartbeat.stop() and left == 0
        log.info(
            "worker stopped",
            extra={
                "action": "worker_stopped",
                "worker_id": self.worker_id,
                "released": released,
                "threads_left_in_calls": left,
            },
        )
        return stopped

    def health(self) -> ServiceHealth:
        """RUNNING while started and every part (heartbeat, listener, poller, claim loops)
        runs; the parts are listed by name."""
        with self._lock:
            parts = (
                self.heartbeat.health(),
                self.listener.health(),
                self.poller.health(),
                *(loop.health() for loop in self._loops),
            )
            state = ServiceState.RUNNING if self._started else ServiceState.STOPPED
        return ServiceHealth(self.name, state, parts=parts if self._started else ())

    def run_once(self) -> bool:
        """Claim one job and execute it in the calling thread (tests, tools).

        :returns: True when a job was claimed (and settled, abandoned or left unsettled).
        :raises StoreError: when the claim fails.
        """
        self.heartbeat.start()
        job = self._claim()
        if job is None:
            return False
        self._execute(job)
        return True

    # -- internals -----------------------------------------------------------------------

    def _sync_queue_limits(self) -> None:
        """Write this node's queue limits to the database and learn every limited queue (a
        queue another node limits is limited here too: the limits live in the database)."""
        limits = self.config.queue_limits
        self._limited = frozenset(self._store.queue_limits_sync(limits))
        self._limits_read_at = time.monotonic()
        if limits or self._limited:
            log.info(
                "queue limits in force",
                extra={
                    "action": "queue_limits",
                    "worker_id": self.worker_id,
                    "queues": list(self._queues),
                    "limited": sorted(self._limited),
                },
            )

    def _refresh_queue_limits(self) -> None:
        """Re-read the limited queues every :data:`LIMITS_REFRESH_S` (another node may have
        limited a queue this one serves since it started); one statement per interval per
        process, never per job. A failed read keeps the last set."""
        if time.monotonic() - self._limits_read_at < LIMITS_REFRESH_S:
            return
        self._limits_read_at = time.monotonic()
        try:
            self._limited = frozenset(self._store.queue_limits_sync({}))
        except StoreError:
            pass

    def _claim(self) -> JobRecord | None:
        self._refresh_queue_limits()
        if self._queues == ("default",) and not self._limited:
            job = self._store.job_claim(self.worker_id, self.config.lease_seconds)
        else:
            job = self._store.job_claim(
                self.worker_id,
                self.config.lease_seconds,
                queues=self._queues,
                limited=self._limited & set(self._queues),
            )
        if job is not None:
            metrics.CLAIMS.inc()
        return job

    def _execute(self, job: JobRecord) -> Settlement:
        started = time.monotonic()
        if tracing.enabled():
            with tracing.segment_span(job, self.worker_id) as span:
                settlement = self.executor.execute(job)
                span.set_attribute("protomolt.settlement", settlement.value)
        else:
            settlement = self.executor.execute(job)
        metrics.count_settled(settlement.value)
        _observe_latencies(job, settlement, time.monotonic() - started)
        return settlement


#: Settlements after which the run is finished (an operator's cancel is the operator's).
_TERMINAL = frozenset({Settlement.COMPLETED, Settlement.FAILED, Settlement.DEAD})


def _observe_latencies(job: JobRecord, settlement: Settlement, segment_s: float) -> None:
    """The run's queue wait and end-to-end time, from the claimed row's times and no statement.

    The claim wrote ``updated_at = now()``, so ``updated_at - created_at`` is submit to this
    claim in database time. It is the queue wait when this was the run's first claim:
    attempt 1 with nothing recorded yet (no checkpoint, no retry-step generation, no effect
    intent). A segment that wrote nothing (abandoned, released at a stop: the attempt is given
    back) is not counted, so its next claim is. A requeued run that had recorded nothing
    counts again. The end-to-end time adds this segment's duration (the worker's monotonic
    clock, never compared with the database's) when it settled the run for good.
    """
    if settlement in (Settlement.ABANDONED, Settlement.UNSETTLED):
        return
    claimed_s = (job.updated_at - job.created_at).total_seconds()
    first = job.attempt == 1 and not (job.checkpoints or job.step_generations or job.effect_intents)
    metrics.observe_run(
        job.workflow_name,
        job.queue,
        waited_s=claimed_s if first else None,
        total_s=claimed_s + segment_s if settlement in _TERMINAL else None,
    )
