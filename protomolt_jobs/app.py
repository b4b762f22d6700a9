"""The composition root: one function builds the jobs runtime of a process from its config.

:meth:`JobsApp.open` is the one place the component graph is assembled; the jobs role
(``role.py``), the standalone worker process (``worker/__main__.py``) and the benchmark
(``bench/ours.py``) all call it, so a default changes in one place.

Start order (:meth:`JobsApp.start`): migrate and open the store (in :meth:`JobsApp.open`),
then the sweeper, the pruner, the topics (when a broker is set), the relay, the request consumer, and
the worker last, so nothing claims work before the duties that follow it run. Close order
(:meth:`JobsApp.close`) is the exact reverse (the worker first, so nothing is claimed
mid-shutdown; the relay last of the duties, so it drains what the others wrote), each
service stopped within its own bound (``stop_timeout_s``; the worker's is
``shutdown_grace_seconds`` plus its release pass), then the pool.

:meth:`JobsApp.health` answers readiness: the database answers a probe within
``probe_timeout_s`` (at most 1 s) and every service is RUNNING.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.errors import StoreError
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.request_consumer import RequestConsumer
from protomolt_jobs.kafka.topics import ensure_topics
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.runs.retention import Bounds
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.service import Startable
from protomolt_jobs.store.migrate import migrate
from protomolt_jobs.store.store import JobStore
from protomolt_jobs.worker.worker import Worker
from protomolt_jobs.workflow.floors import Floor, FloorError, compile_floors

__all__ = ["DatabaseProbe", "JobsApp", "Lanes", "node_floors"]

log = logging.getLogger("protomolt_jobs.app")

#: Longest wait for the database probe of a readiness check, seconds.
PROBE_TIMEOUT_S = 1.0


def node_floors(config: JobsConfig) -> tuple[Floor, ...]:
    """The node's policy floors (``[[jobs.approval_floors]]``), compiled.

    :raises ConfigError: a malformed floor, naming its key (``jobs.approval_floors[0].when``).
    """
    try:
        return compile_floors(config.approval_floors)
    except FloorError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class Lanes:
    """Which duties a process runs besides the worker (the worker always runs).

    :ivar sweeper: the lease sweeper.
    :ivar pruner: retention of PUBLISHED outbox rows and finished runs (``pruner.py``).
    :ivar relay: the outbox relay (only when ``kafka_bootstrap`` is set).
    :ivar request_consumer: the request-topic consumer (only when a broker is set).
    :ivar relay_producer_config: librdkafka overrides for the relay's producer.
    :ivar consumer_config: librdkafka overrides for the request consumer.
    """

    sweeper: bool = True
    pruner: bool = True
    relay: bool = True
    request_consumer: bool = True
    relay_producer_config: dict[str, Any] | None = None
    consumer_config: dict[str, Any] | None = None


class DatabaseProbe:
    """``SELECT 1`` through the store's pool, bounded in time.

    The probe runs in a helper thread so a database that hangs (not refuses) still answers
    within ``timeout_s``; at most one probe is in flight: while one hangs, the next check
    answers DOWN at once instead of piling up threads.

    :param store: the open store (``ping(timeout_s)``).
    :param timeout_s: the bound, seconds.
    """

    def __init__(self, store: JobStore, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self._store = store
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._inflight: threading.Thread | None = None

    def check(self) -> dict[str, Any]:
        """``{"status": "UP"}`` or ``{"status": "DOWN", "error": "..."}``."""
        result: dict[str, Any] = {}

        def ping() -> None:
            try:
                self._store.ping(self.timeout_s)
                result["status"] = "UP"
            except StoreError as exc:
                result.update(status="DOWN", error=str(exc))

        with self._lock:
            if self._inflight is not None and self._inflight.is_alive():
                return {"status": "DOWN", "error": "the previous probe has not answered yet"}
            thread = threading.Thread(target=ping, name="protomolt-jobs-db-probe", daemon=True)
            self._inflight = thread
            thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return {"status": "DOWN", "error": f"no answer within {self.timeout_s:g} s"}
        return result or {"status": "DOWN", "error": "the probe failed"}


class JobsApp:
    """The jobs runtime of one process: store, submitter and services. Build it with
    :meth:`open`; then :meth:`start`, and :meth:`close` (idempotent, safe at any point).

    :ivar config: the configuration it was built from.
    :ivar store: the open store.
    :ivar submitter: the submitter the verbs and the request consumer share.
    :ivar worker: the worker (always present).
    :ivar services: every service in start order (the worker last).
    """

    def __init__(
        self,
        config: JobsConfig,
        *,
        store: JobStore,
        runtime: Any,
        repository: Any = None,
        lanes: Lanes = Lanes(),
        grants: Any = None,
        artifact_store: Any = None,
    ) -> None:
        if not config.dsn:
            raise StoreError("jobs.dsn is required to run jobs")
        self.config = config
        self.store = store
        self.runtime = runtime
        self.submitter = Submitter(
            store,
            repository,
            runtime,
            config.max_attempts,
            fairness_weights=config.fairness_weights,
            floors=node_floors(config),
            retention_bounds=Bounds.of(config),
            run_retention_s=config.run_retention_seconds,
        )
        self.probe = DatabaseProbe(store)
        self._kafka = bool(config.kafka_bootstrap)
        self.sweeper = Sweeper(store, config=config) if lanes.sweeper else None
        self.pruner = (
            Pruner(store, config=config, artifact_store=artifact_store) if lanes.pruner else None
        )
        self.relay = (
            Relay(store, config=config, producer_config=lanes.relay_producer_config)
            if self._kafka and lanes.relay
            else None
        )
        self.request_consumer = (
            RequestConsumer(
                store,
                submitter=self.submitter,
                config=config,
                consumer_config=lanes.consumer_config,
            )
            if self._kafka and lanes.request_consumer and config.effective_request_topic
            else None
        )
        self.worker = Worker(
            store,
            runtime=runtime,
            config=config,
            dsn=config.dsn,
            grants=grants,
            artifact_store=artifact_store,
        )
        self.services: list[Startable] = [
            s
            for s in (self.sweeper, self.pruner, self.relay, self.request_consumer, self.worker)
            if s is not None
        ]
        self._lock = threading.Lock()
        self._started: list[Startable] = []
        self._closed = False

    @classmethod
    def open(
        cls,
        config: JobsConfig,
        *,
        runtime: Any,
        repository: Any = None,
        lanes: Lanes = Lanes(),
        grants: Any = None,
        artifact_store: Any = None,
    ) -> JobsApp:
        """Migrate ``config.dsn``, open the store's pool and build the services (none runs
        yet). The one function that assembles the jobs runtime.

        :param config: the validated jobs configuration (``dsn`` set).
        :param runtime: the engine's ``Runtime`` (type pool, channel factory).
        :param repository: the ``WorkflowRepository`` submit-by-name resolves in (None:
            definitions must be inline).
        :param lanes: which optional duties run (default: all the config allows).
        :param grants: the worker's step grant policy (``worker.grants.GrantPolicy``: the
            host's authorizers and groups); None: ``config.grants`` alone, no groups.
        :param artifact_store: the node's ``ArtifactStore`` (a plugin's, or the role's file
            store): publication steps re-hash through it, the pruner deletes bytes from it.
        :raises StoreError: the database cannot be reached or migrated.
        """
        if not config.dsn:
            raise StoreError("jobs.dsn is required to run jobs")
        migrate(config.dsn)
        store = JobStore.open(
            config.dsn,
            max_size=config.pool_max_size,
            connect_timeout_s=config.connect_timeout_seconds,
            outbox_payloads=config.outbox_payloads,
            group_commit=config.group_commit_on,
        )
        try:
            return cls(
                config,
                store=store,
                runtime=runtime,
                repository=repository,
                lanes=lanes,
                grants=grants,
                artifact_store=artifact_store,
            )
        except BaseException:  # close the pool, re-raised
            store.close()
            raise

    def start(self) -> None:
        """Start the services in order (topics ensured before the Kafka lanes). Idempotent.

        :raises Exception: whatever failed to start; the app is closed first.
        """
        with self._lock:
            if self._started or self._closed:
                return
        try:
            if self.relay is not None or self.request_consumer is not None:
                ensure_topics(self.config)
            elif not self._kafka:
                log.info(
                    "no Kafka configured: the relay and the request consumer are off; outbox "
                    "rows wait as PENDING (set jobs.kafka_bootstrap or "
                    "PROTOMOLT_JOBS_KAFKA_BOOTSTRAP)",
                    extra={"action": "kafka_lanes_off"},
                )
            for service in self.services:
                with self._lock:
                    if self._closed:
                        return
                    # Recorded first, so a service that half-started is still stopped.
                    self._started.append(service)
                service.start()
        except BaseException:  # stop what started, re-raised
            self.close()
            raise
        log.info(
            "jobs runtime started (worker %s, %d claim loops)",
            self.config.worker_id,
            self.config.worker_count,
            extra={
                "action": "jobs_started",
                "worker_id": self.config.worker_id,
                "components": [s.name for s in self.services],
            },
        )

    def close(self) -> bool:
        """Stop the services in reverse start order, each within its own bound, then close
        the pool. Idempotent; failures are logged and the rest still closes.

        :returns: True when every service stopped within its bound.
        """
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            started, self._started = list(self._started), []
        clean = True
        for service in reversed(started):
            try:
                clean = service.stop() and clean
            except Exception:  # one service's failure must not keep the rest running
                clean = False
                log.exception(
                    "jobs component %s failed to stop",
                    service.name,
                    extra={"action": "jobs_component_stop_failed", "component": service.name},
                )
        try:
            self.store.close()
        except Exception:  # closing the pool is the last step; log and carry on
            log.exception("jobs store failed to close", extra={"action": "jobs_store_close_failed"})
        return clean

    def health(self) -> dict[str, dict[str, Any]]:
        """Readiness by component: ``{"database": {...}, "<service>": {...}}``, each with
        ``"status": "UP"|"DOWN"``. A service is UP only while RUNNING (the worker: and every
        loop of it); the database only while it answers the probe within its bound."""
        components: dict[str, dict[str, Any]] = {"database": self.probe.check()}
        for service in self.services:
            components[service.name] = service.health().to_json()
        return components
