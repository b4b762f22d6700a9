"""The request consumer never loses a record it cannot handle: an ``input`` JSON cannot hold
(NaN, an infinity) and any unexpected failure in handling become ``workflow_run_rejects`` rows,
and the next record is processed (real PostgreSQL, a real Tansu broker of the test's own)."""

from __future__ import annotations

import uuid

import pytest

from protomolt_jobs import contract
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.requests import RequestConsumer
from protomolt_jobs.store import JobStore
from protomolt_jobs.submitter import Submitter
from protomolt_jobs.workflow import Runtime
from tests.integration.test_requests import TARGET, committed, drain, request, rows
from tests.support.broker import Broker
from tests.support.grpc_servers import seed_workflow
from tests.support.kafka import create_topic, produce, unique_topic
from tests.support.roles import MemoryRepository


@pytest.fixture
def broker():
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


@pytest.fixture
def topic(broker):
    name = unique_topic("rqb")
    create_topic(broker.bootstrap, name, partitions=1)
    return name


@pytest.fixture
def consumer(fresh_dsn, store, broker, topic):
    repo = MemoryRepository({"seed-review": seed_workflow(TARGET)})
    config = JobsConfig(dsn=fresh_dsn, kafka_bootstrap=broker.bootstrap, request_topic=topic)
    rc = RequestConsumer(store, submitter=Submitter(store, repo, Runtime(), 3), config=config)
    rc.handled = []
    rc.on_handled = lambda outcome, m: rc.handled.append((outcome, m.partition(), m.offset()))
    try:
        yield rc
    finally:
        rc.stop()


def test_non_finite_input_is_rejected_and_the_next_record_is_processed(
    fresh_dsn, store, broker, topic, consumer
):
    bad = [str(uuid.uuid4()) for _ in range(3)]
    for job, number in zip(bad, (float("nan"), float("inf"), float("-inf")), strict=True):
        produce(broker.bootstrap, topic, request(job, input={"n": {"deep": number}}), key="k")
    good = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(good), key="k")
    outcomes = drain(consumer, 4)
    assert [o for o, _, _ in outcomes] == ["rejected", "rejected", "rejected", "submitted"]
    rejects = rows(fresh_dsn, 'SELECT "offset", reason FROM workflow_run_rejects ORDER BY "offset"')
    assert [o for o, _ in rejects] == [0, 1, 2]
    for _, reason in rejects:
        assert reason.startswith("invalid-request: input cannot be read as JSON")
    assert all(store.job_get(job) is None for job in bad)
    assert store.job_get(good).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {0: 4}


def test_an_unexpected_failure_is_stored_as_a_reject_not_lost(
    fresh_dsn, store, broker, topic, consumer, monkeypatch
):
    real = contract.validate_request
    calls = []

    def flaky(req):
        calls.append(req.job_id)
        if len(calls) == 1:
            raise RuntimeError("a defect in the request rules")
        return real(req)

    monkeypatch.setattr(contract, "validate_request", flaky)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(first), key="k")
    produce(broker.bootstrap, topic, request(second), key="k")
    outcomes = drain(consumer, 2)
    assert [o for o, _, _ in outcomes] == ["rejected", "submitted"]
    assert rows(fresh_dsn, 'SELECT "offset", reason FROM workflow_run_rejects') == [
        (0, "internal-error: RuntimeError: a defect in the request rules")
    ]
    assert store.job_get(first) is None
    assert store.job_get(second).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {0: 2}
