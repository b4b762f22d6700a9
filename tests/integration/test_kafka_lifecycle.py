"""Start/stop stress of the two Kafka lanes (idempotent start, stop before start, double stop),
and a started lane actually works afterwards."""

from __future__ import annotations

import threading
import uuid

import pytest
from google.protobuf import struct_pb2

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.request_consumer import RequestConsumer
from protomolt_jobs.kafka.wire import WorkflowRunRequest
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.support.broker import Broker
from tests.support.factories import new_job
from tests.support.grpc_servers import seed_workflow
from tests.support.kafka import create_topic, produce, unique_topic, wait_for
from tests.support.roles import MemoryRepository


@pytest.fixture
def broker():
    """A broker of this test's own. Consumer-group tests do not share the session broker:
    Tansu never completes another join for a group whose member left mid-join (seen stuck
    for over 320 s), so one aborted join would stall every later test's consumer."""
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def _threads(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(name) and t.is_alive())


def test_relay_start_stop_stress(fresh_dsn, store, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=topic,
        relay_poll_interval_ms=20,
    )
    relay = Relay(store, config=config)
    relay.stop()  # never started
    for _ in range(5):
        relay.start()
        relay.start()  # idempotent
        assert _threads("protomolt-jobs-relay") == 1
        relay.stop(timeout_s=30)
        relay.stop(timeout_s=30)
        assert _threads("protomolt-jobs-relay") == 0
    relay.start()
    try:
        job = store.job_insert(new_job()).job
        wait_for(lambda: [r.status for r in store.outbox_for_job(job.job_id)] == ["PUBLISHED"])
    finally:
        relay.stop(timeout_s=30)


def test_request_consumer_start_stop_stress(fresh_dsn, store, broker):
    topic = unique_topic("rq")
    create_topic(broker.bootstrap, topic, partitions=1)
    submitter = Submitter(
        store, MemoryRepository({"seed-review": seed_workflow("127.0.0.1:1")}), Runtime(), 3
    )
    config = JobsConfig(dsn=fresh_dsn, kafka_bootstrap=broker.bootstrap, request_topic=topic)
    rc = RequestConsumer(store, submitter=submitter, config=config)
    rc.stop()
    for _ in range(3):
        rc.start()
        rc.start()
        assert _threads("protomolt-jobs-request-consumer") == 1
        rc.stop(timeout_s=30)
        rc.stop(timeout_s=30)
        assert _threads("protomolt-jobs-request-consumer") == 0
    rc.start()
    try:
        job = str(uuid.uuid4())
        s = struct_pb2.Struct()
        s.update({"text": "one two three"})
        produce(
            broker.bootstrap,
            topic,
            WorkflowRunRequest(
                job_id=job, workflow_name="seed-review", input=s
            ).SerializeToString(),
            key=job,
        )
        wait_for(lambda: store.job_get(job) is not None, timeout_s=60)
    finally:
        rc.stop(timeout_s=30)
