"""The request consumer against real PostgreSQL, the real Tansu broker and the real submitter."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from google.protobuf import struct_pb2

from protomolt_jobs.config import CONSUMER_GROUP, JobsConfig
from protomolt_jobs.crashpoints import CRASH_EXIT_CODE
from protomolt_jobs.kafka import request_consumer
from protomolt_jobs.kafka import wire as contract
from protomolt_jobs.kafka.request_consumer import RequestConsumer
from protomolt_jobs.kafka.wire import WorkflowRunRequest
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.support.broker import Broker
from tests.support.grpc_servers import seed_workflow
from tests.support.kafka import create_topic, partitions_of, produce, unique_topic, wait_for
from tests.support.roles import MemoryRepository

ROOT = Path(__file__).resolve().parents[2]
#: The steps' target is never dialled: the consumer only submits.
TARGET = "127.0.0.1:1"


def request(job_id: str, name: str = "seed-review", input: dict | None = None) -> bytes:
    s = struct_pb2.Struct()
    s.update({"text": "hello brave new world"} if input is None else input)
    return WorkflowRunRequest(job_id=job_id, workflow_name=name, input=s).SerializeToString()


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


@pytest.fixture
def topic(broker):
    name = unique_topic("rq")
    create_topic(broker.bootstrap, name, partitions=2)
    return name


@pytest.fixture
def consumer(fresh_dsn, store, broker, topic):
    repo = MemoryRepository({"seed-review": seed_workflow(TARGET)})
    submitter = Submitter(store, repo, Runtime(), 3)
    config = JobsConfig(dsn=fresh_dsn, kafka_bootstrap=broker.bootstrap, request_topic=topic)
    rc = RequestConsumer(store, submitter=submitter, config=config)
    rc.handled = []
    rc.on_handled = lambda outcome, m: rc.handled.append((outcome, m.partition(), m.offset()))
    try:
        yield rc
    finally:
        rc.stop()


def drain(rc: RequestConsumer, n: int, timeout_s: float = 60.0) -> list[tuple[str, int, int]]:
    """Call run_once until ``n`` records have been handled and committed."""
    deadline = time.monotonic() + timeout_s
    while len(rc.handled) < n:
        assert time.monotonic() < deadline, f"only {len(rc.handled)} of {n} records handled"
        rc.run_once(0.5)
    return rc.handled


def committed(bootstrap: str, topic: str) -> dict[int, int]:
    """The group's committed offsets per partition (read without joining the group)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": CONSUMER_GROUP})
    try:
        parts = partitions_of(bootstrap, topic)
        tps = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        c.close()


def rows(dsn: str, sql: str, *args) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()


def test_record_submits_the_job_once(fresh_dsn, store, broker, topic, consumer):
    job = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(job), key=job)
    assert drain(consumer, 1)[0][0] == "submitted"
    row = store.job_get(job)
    assert (row.status, row.workflow_name, row.input) == (
        "QUEUED",
        "seed-review",
        {"text": "hello brave new world"},
    )
    produce(broker.bootstrap, topic, request(job), key=job)
    assert [h[0] for h in drain(consumer, 2)] == ["submitted", "duplicate"]
    assert rows(fresh_dsn, "SELECT count(*) FROM workflow_run") == [(1,)]
    partition = consumer.handled[1][1]
    assert committed(broker.bootstrap, topic) == {partition: 2}


def test_unknown_workflow_name_leaves_a_failed_row(fresh_dsn, store, broker, topic, consumer):
    job = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(job, name="no-such-workflow"), key=job)
    assert drain(consumer, 1)[0][0] == "failed_at_birth"
    row = store.job_get(job)
    assert row.status == "FAILED"
    assert row.error == "No stored workflow named 'no-such-workflow'"
    assert [(r.event_type, r.status) for r in store.outbox_for_job(job)] == [("FAILED", "PENDING")]
    assert rows(fresh_dsn, "SELECT count(*) FROM workflow_run_rejects") == [(0,)]


def test_bad_records_are_rejected_and_the_next_valid_one_is_processed(
    fresh_dsn, store, broker, topic, consumer
):
    key = "same-partition"  # one partition, so "next" is well defined
    garbage = random.Random(7).randbytes(64)
    produce(broker.bootstrap, topic, garbage, key=key)
    produce(broker.bootstrap, topic, request("not-a-uuid"), key=key)
    produce(
        broker.bootstrap,
        topic,
        request(str(uuid.uuid4()), input={"text": ["not", "a", "string"]}),
        key=key,
    )
    good = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(good), key=key)
    outcomes = drain(consumer, 4)
    assert [o for o, _, _ in outcomes] == ["rejected", "rejected", "rejected", "submitted"]
    assert store.job_get(good).status == "QUEUED"
    rejects = rows(
        fresh_dsn, 'SELECT topic, "offset", raw, reason FROM workflow_run_rejects ORDER BY "offset"'
    )
    assert [(t, o) for t, o, _, _ in rejects] == [(topic, 0), (topic, 1), (topic, 2)]
    assert bytes(rejects[0][2]) == garbage
    assert rejects[0][3].startswith(("undecodable", "invalid-request"))
    assert rejects[1][3].startswith("invalid-request") and "job_id" in rejects[1][3]
    assert rejects[2][3].startswith("invalid-input")
    assert rows(fresh_dsn, "SELECT count(*) FROM workflow_run") == [(1,)]
    assert committed(broker.bootstrap, topic) == {outcomes[0][1]: 4}


_CRASHING_CONSUMER = """
import sys, time
from protomolt_jobs import crashpoints
from protomolt_jobs.kafka import request_consumer as requests
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.store import JobStore
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import seed_workflow
from tests.support.roles import MemoryRepository
from tests.support.broker import Broker
dsn, bootstrap, topic, target = sys.argv[1:5]
store = JobStore.open(dsn, max_size=2)
sub = Submitter(store, MemoryRepository({"seed-review": seed_workflow(target)}), Runtime(), 3)
rc = requests.RequestConsumer(
    store, submitter=sub,
    config=JobsConfig(dsn=dsn, kafka_bootstrap=bootstrap, request_topic=topic))
crashpoints.arm("after_row_commit")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    rc.run_once(0.5)
sys.exit(3)  # not reached: the crash point ends the process after the row commits
"""


def test_consumer_killed_between_row_commit_and_offset_commit(
    fresh_dsn, store, broker, topic, consumer
):
    job = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(job), key=job)
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_CONSUMER, fresh_dsn, broker.bootstrap, topic, TARGET],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.decode()[-2000:]
    assert store.job_get(job).status == "QUEUED"  # the row committed
    assert committed(broker.bootstrap, topic) == {}  # the offset did not
    # the restarted consumer reads the record again; the insert is idempotent
    assert drain(consumer, 1)[0][0] == "duplicate"
    assert rows(fresh_dsn, "SELECT count(*) FROM workflow_run") == [(1,)]
    assert committed(broker.bootstrap, topic) == {consumer.handled[0][1]: 1}


def test_database_outage_holds_the_record_until_the_row_commits(
    fresh_dsn, store, broker, topic, consumer, monkeypatch
):
    from protomolt_jobs.errors import StoreError

    real_insert = store.job_insert
    failures = {"left": 3}

    def flaky_insert(new):
        if failures["left"]:
            failures["left"] -= 1
            raise StoreError("connection to the database lost")
        return real_insert(new)

    monkeypatch.setattr(store, "job_insert", flaky_insert)
    job = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(job), key=job)
    outcomes = drain(consumer, 1)
    assert failures["left"] == 0 and outcomes[0][0] == "submitted"
    assert store.job_get(job).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {outcomes[0][1]: 1}


def test_broker_outage_makes_the_loop_wait_not_die(fresh_dsn, store, broker, topic, consumer):
    consumer.start()
    first = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(first), key=first)
    wait_for(lambda: store.job_get(first) is not None, timeout_s=60)
    broker.pause()
    try:
        # frozen until the consumer notices: its session times out and it loses the partition
        wait_for(lambda: not consumer._assigned, timeout_s=60)
    finally:
        broker.resume()
    assert consumer.health().state.value == "RUNNING"  # waiting, not dead
    second = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(second), key=second)
    # handled is appended after the offset commit: wait for that, not for the row
    wait_for(lambda: len(consumer.handled) == 2, timeout_s=60)
    assert store.job_get(second) is not None
    assert [h[0] for h in consumer.handled] == ["submitted", "submitted"]


# ------------------------------------------------------------------- records it cannot handle
# An input JSON cannot hold (NaN, an infinity) and any unexpected failure in handling become
# workflow_run_rejects rows, and the next record is processed: nothing is lost.


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
    partition = outcomes[0][1]  # one key, one partition
    rejects = rows(fresh_dsn, 'SELECT "offset", reason FROM workflow_run_rejects ORDER BY "offset"')
    assert [o for o, _ in rejects] == [0, 1, 2]
    for _, reason in rejects:
        assert reason.startswith("invalid-request: input cannot be read as JSON")
    assert all(store.job_get(job) is None for job in bad)
    assert store.job_get(good).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {partition: 4}


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

    monkeypatch.setattr(request_consumer, "validate_request", flaky)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(first), key="k")
    produce(broker.bootstrap, topic, request(second), key="k")
    outcomes = drain(consumer, 2)
    assert [o for o, _, _ in outcomes] == ["rejected", "submitted"]
    partition = outcomes[0][1]
    assert rows(fresh_dsn, 'SELECT "offset", reason FROM workflow_run_rejects') == [
        (0, "internal-error: RuntimeError: a defect in the request rules")
    ]
    assert store.job_get(first) is None
    assert store.job_get(second).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {partition: 2}


# ------------------------------------------------------------------ one input rule, both doors
# A record the verb would refuse is refused on the topic too, with the verb's reason.


@pytest.mark.parametrize(
    "bad_input",
    [{"text": "a\x00b"}, {"text": "ok", "k\x00ey": 1}, {"n": {"deep": ["x\x00"]}}],
    ids=["value", "key", "deep"],
)
def test_a_nul_in_input_is_an_invalid_input_reject_and_no_job(
    fresh_dsn, store, broker, topic, consumer, bad_input
):
    bad, good = str(uuid.uuid4()), str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(bad, input=bad_input), key="k")
    produce(broker.bootstrap, topic, request(good), key="k")
    outcomes = drain(consumer, 2)
    assert [o for o, _, _ in outcomes] == ["rejected", "submitted"]
    (reason,) = [r for (r,) in rows(fresh_dsn, "SELECT reason FROM workflow_run_rejects")]
    assert reason == "invalid-input: Field 'input' must not contain NUL characters"
    assert store.job_get(bad) is None
    assert store.job_get(good).status == "QUEUED"
    assert rows(fresh_dsn, "SELECT count(*) FROM workflow_run") == [(1,)]


def test_a_misspelt_input_field_is_an_invalid_input_reject_naming_it(
    fresh_dsn, store, broker, topic, consumer
):
    bad = str(uuid.uuid4())
    produce(broker.bootstrap, topic, request(bad, input={"txt": "x"}), key="k")
    assert [o for o, _, _ in drain(consumer, 1)] == ["rejected"]
    (reason,) = [r for (r,) in rows(fresh_dsn, "SELECT reason FROM workflow_run_rejects")]
    assert reason.startswith("invalid-input: 'input' is not valid proto3 JSON for ")
    assert '"txt"' in reason
    assert store.job_get(bad) is None


# ---------------------------------------------------------------- Confluent framing, malformed
# Every wrongly framed record is a reject row naming what is wrong, its offset is committed,
# and the next record (framed with a schema id of a registry, or raw) is still processed.


def test_wrongly_framed_records_are_rejects_and_the_next_records_run(
    fresh_dsn, store, broker, topic, consumer
):
    from protomolt_jobs.kafka.framing import frame

    body = request(str(uuid.uuid4()))
    bad = [
        (b"\x00", "a Confluent frame needs at least 6 bytes; got 1"),
        (b"\x00\x00\x00\x00\x01", "a Confluent frame needs at least 6 bytes; got 5"),
        (b"\x00\x00\x00\x00\x01\x80", "truncated varint"),
        (frame(body, index_path=[0]), "names message index path [0]"),
        (frame(body, index_path=[2]), "names message index path [2]"),
        (frame(body, index_path=[1, 0]), "names message index path [1, 0]"),
        (b"\x00\x00\x00\x00\x00\x7f" + body, "not plausible"),
        (b"\x01\x00\x00\x00\x07\x02\x02" + body, "undecodable: not a WorkflowRunRequest"),
        (frame(body[:-3], index_path=[1]), "undecodable: not a WorkflowRunRequest"),
        (b"", "invalid-request"),
    ]
    for value, _ in bad:
        produce(broker.bootstrap, topic, value, key="k")
    framed, raw = str(uuid.uuid4()), str(uuid.uuid4())
    produce(broker.bootstrap, topic, frame(request(framed), schema_id=77, index_path=[1]), key="k")
    produce(broker.bootstrap, topic, request(raw), key="k")
    outcomes = drain(consumer, len(bad) + 2)
    assert [o for o, _, _ in outcomes] == ["rejected"] * len(bad) + ["submitted", "submitted"]
    rejects = rows(
        fresh_dsn, 'SELECT "offset", raw, reason FROM workflow_run_rejects ORDER BY "offset"'
    )
    assert [o for o, _, _ in rejects] == list(range(len(bad)))
    for (_, stored, reason), (value, expected) in zip(rejects, bad, strict=True):
        assert bytes(stored or b"") == value
        assert expected in reason, reason
    assert store.job_get(framed).status == "QUEUED"
    assert store.job_get(raw).status == "QUEUED"
    assert committed(broker.bootstrap, topic) == {outcomes[0][1]: len(bad) + 2}
