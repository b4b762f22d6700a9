"""Every background service under one start/stop stress (tests/support/stress.py), and the
supervision every service inherits: a loop made to raise is restarted and shows it."""

from __future__ import annotations

import threading

import pytest

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.request_consumer import RequestConsumer
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.service import ServiceState
from protomolt_jobs.store import JobStore
from protomolt_jobs.worker import Worker
from protomolt_jobs.worker.claim import ClaimLoop, Doorbell, Listener, Poller
from protomolt_jobs.worker.heartbeat import Heartbeat
from protomolt_jobs.workflow import Runtime
from tests.support.broker import Broker
from tests.support.grpc_servers import seed_workflow
from tests.support.kafka import create_topic, unique_topic
from tests.support.roles import MemoryRepository
from tests.support.stress import stress, wait_until
from tests.support.worker_proc import jobs_config

SERVICES = [
    "sweeper",
    "pruner",
    "pruner",
    "poller",
    "listener",
    "heartbeat",
    "claim_loop",
    "worker",
    "relay",
    "request_consumer",
]


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def own_broker():
    """Consumer-group churn gets a broker of its own (see test_kafka_lifecycle.py)."""
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


def _factory(kind: str, store, dsn: str, request):
    config = jobs_config(dsn)
    if kind == "sweeper":
        return lambda: Sweeper(store, config=config)
    if kind == "pruner":
        return lambda: Pruner(store, config=config)
    if kind == "pruner":
        return lambda: Pruner(store, config=config)
    if kind == "poller":
        return lambda: Poller(doorbell=Doorbell(2), interval_s=0.05, worker_id="w")
    if kind == "listener":
        return lambda: Listener(dsn, doorbell=Doorbell(2), worker_id="w")
    if kind == "heartbeat":
        return lambda: Heartbeat(store, lease_s=1.0, worker_id="w")
    if kind == "claim_loop":
        return lambda: ClaimLoop(
            claim=lambda: store.job_claim("w", 30),
            execute=lambda job: None,
            doorbell=Doorbell(2),
            worker_id="w",
        )
    if kind == "worker":
        return lambda: Worker(store, runtime=Runtime(), config=config, dsn=dsn)
    if kind == "relay":
        broker = request.getfixturevalue("broker")
        topic = unique_topic("ev")
        create_topic(broker.bootstrap, topic)
        kafka = JobsConfig(dsn=dsn, kafka_bootstrap=broker.bootstrap, events_topic=topic)
        return lambda: Relay(store, config=kafka)
    if kind == "request_consumer":
        broker = request.getfixturevalue("own_broker")
        topic = unique_topic("rq")
        create_topic(broker.bootstrap, topic, partitions=1)
        kafka = JobsConfig(dsn=dsn, kafka_bootstrap=broker.bootstrap, request_topic=topic)
        repo = MemoryRepository({"seed-review": seed_workflow("127.0.0.1:1")})
        submitter = Submitter(store, repo, Runtime(), 3)
        return lambda: RequestConsumer(store, submitter=submitter, config=kafka)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", SERVICES)
def test_start_stop_stress(kind, store, fresh_dsn, request):
    stress(_factory(kind, store, fresh_dsn, request))


@pytest.mark.parametrize(
    "kind", ["sweeper", "pruner", "poller", "listener", "heartbeat", "claim_loop"]
)
def test_a_loop_that_raises_is_restarted_with_backoff(kind, store, fresh_dsn, request, caplog):
    service = _factory(kind, store, fresh_dsn, request)()
    service.restart_first_s = 0.3
    caplog.set_level("ERROR", logger=f"protomolt_jobs.{service.name}")
    service.start()
    try:
        wait_until(lambda: service.health().state is ServiceState.RUNNING)
        service.inject_failure()
        wait_until(lambda: service.health().state is ServiceState.BACKING_OFF)
        health = service.health()
        assert health.restarts == 1 and "InjectedFailure" in health.last_error
        assert health.to_json()["status"] == "DOWN"
        wait_until(lambda: service.health().state is ServiceState.RUNNING)
        assert service.health().ok
    finally:
        assert service.stop() is True
    failed = [r for r in caplog.records if getattr(r, "action", "").endswith("_loop_failed")]
    assert len(failed) == 1 and failed[0].exc_info is not None  # logged with its traceback


def test_a_stop_that_times_out_keeps_the_one_thread(store, fresh_dsn):
    entered, release = threading.Event(), threading.Event()

    def stuck_claim():
        entered.set()
        release.wait(10)

    doorbell = Doorbell(1)
    loop = ClaimLoop(claim=stuck_claim, execute=lambda job: None, doorbell=doorbell, worker_id="t")
    loop.start()
    try:
        assert entered.wait(5)
        assert loop.stop(0.05) is False  # stuck in a call
        loop.start()  # tells the stuck thread to carry on: still one thread
        assert sum(t.name == loop.thread_name for t in threading.enumerate()) == 1
    finally:
        release.set()
        doorbell.close()
    assert loop.stop() is True
    assert loop.health().state is ServiceState.STOPPED
