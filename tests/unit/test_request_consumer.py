"""Request-consumer logic without services: decoding, routing on the submitter's reason,
store failures holding the record. Fakes stand in for the consumer, store and submitter."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from confluent_kafka import Message
from google.protobuf import struct_pb2

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.crashpoints import arm
from protomolt_jobs.errors import StoreError
from protomolt_jobs.kafka.request_consumer import RequestConsumer, decode_request
from protomolt_jobs.kafka.wire import WorkflowRunRequest


def _request(job_id: str | None = None, name: str = "wf", input: dict | None = None) -> bytes:
    s = struct_pb2.Struct()
    s.update(input if input is not None else {"text": "hi", "n": 1})
    return WorkflowRunRequest(
        job_id=job_id or str(uuid.uuid4()), workflow_name=name, input=s
    ).SerializeToString()


def _framed(payload: bytes, path: bytes = b"\x02\x02") -> bytes:
    return b"\x00\x00\x00\x00\x00" + path + payload


def test_decode_raw_and_confluent_framed():
    raw = _request()
    req, problem = decode_request(raw)
    assert problem is None and req.workflow_name == "wf"
    req2, problem = decode_request(_framed(raw))
    assert problem is None and req2 == req
    _, problem = decode_request(_framed(raw, path=b"\x00"))  # index [0] is the event
    assert problem.startswith("undecodable") and "[0]" in problem
    _, problem = decode_request(None)
    assert problem.startswith("undecodable") and "tombstone" in problem
    _, problem = decode_request(b"\xff\xff\xff\xff")
    assert problem.startswith("undecodable")


@dataclasses.dataclass
class Outcome:
    ok: bool
    job_id: str | None = None
    status: str | None = None
    created: bool = False
    failed_step: str = ""
    error: str = ""
    reason: str | None = None


class FakeSubmitter:
    def __init__(self, outcome: Outcome | Exception):
        self.outcome = outcome
        self.calls: list[dict] = []

    def submit(self, **kw):
        self.calls.append(kw)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class FakeStore:
    def __init__(self):
        self.rejects: list[tuple] = []
        self.inserts: list = []
        self.fail_next = 0

    def reject_insert(self, raw, topic, partition, offset, reason):
        if self.fail_next:
            self.fail_next -= 1
            raise StoreError("database down")
        self.rejects.append((raw, topic, partition, offset, reason))
        return len(self.rejects)

    def job_insert(self, new):
        self.inserts.append(new)
        return type("Inserted", (), {"created": True})()


class FakeConsumer:
    def __init__(self, messages):
        self.messages = list(messages)
        self.commits: list[tuple[int, int]] = []

    def poll(self, _timeout):
        return self.messages.pop(0) if self.messages else None

    def commit(self, message, asynchronous):
        assert asynchronous is False
        self.commits.append((message.partition(), message.offset()))


def _consumer(store, submitter, messages):
    config = JobsConfig(
        dsn="postgresql://unused", kafka_bootstrap="127.0.0.1:1", request_topic="rq", max_attempts=4
    )
    rc = RequestConsumer(store, submitter=submitter, config=config)
    fake = FakeConsumer(messages)
    rc._consumer = fake
    return rc, fake


def _msg(value, offset=0):
    return Message(topic="rq", partition=0, offset=offset, value=value)


def test_ok_submits_with_the_records_job_id_and_input_then_commits():
    job = str(uuid.uuid4())
    sub = FakeSubmitter(Outcome(ok=True, job_id=job, status="QUEUED", created=True))
    rc, fake = _consumer(FakeStore(), sub, [_msg(_request(job), 7)])
    assert rc.run_once(0) == 1
    assert sub.calls == [
        {
            "workflow_name": "wf",
            "input": {"text": "hi", "n": 1.0},
            "job_id": job,
            "actor": "kafka:rq",
        }
    ]
    assert fake.commits == [(0, 7)]


@pytest.mark.parametrize("reason", ["unknown-workflow", "no-repository", "corrupt-workflow"])
def test_unrunnable_name_fails_at_birth(reason):
    job = str(uuid.uuid4())
    store = FakeStore()
    sub = FakeSubmitter(Outcome(ok=False, error="No stored workflow named 'wf'", reason=reason))
    rc, fake = _consumer(store, sub, [_msg(_request(job))])
    assert rc.run_once(0) == 1
    (new,) = store.inserts
    assert (str(new.job_id), new.status, new.error, new.max_attempts) == (
        job,
        "FAILED",
        "No stored workflow named 'wf'",
        4,
    )
    assert store.rejects == [] and fake.commits == [(0, 0)]


@pytest.mark.parametrize("reason", ["invalid-input", "invalid-job-id", "invalid-definition"])
def test_invalid_submission_is_rejected(reason):
    store = FakeStore()
    sub = FakeSubmitter(Outcome(ok=False, error="text: bad", reason=reason))
    raw = _request()
    rc, fake = _consumer(store, sub, [_msg(raw, 3)])
    assert rc.run_once(0) == 1
    assert store.rejects == [(raw, "rq", 0, 3, f"{reason}: text: bad")]
    assert store.inserts == [] and fake.commits == [(0, 3)]


def test_rule_violations_reject_without_calling_the_submitter():
    store, sub = FakeStore(), FakeSubmitter(Outcome(ok=True))
    bad_id = WorkflowRunRequest(job_id="not-a-uuid", workflow_name="wf", input=struct_pb2.Struct())
    no_input = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="wf")
    rc, fake = _consumer(
        store,
        sub,
        [
            _msg(bad_id.SerializeToString(), 0),
            _msg(no_input.SerializeToString(), 1),
            _msg(b"\xff", 2),
        ],
    )
    assert [rc.run_once(0) for _ in range(3)] == [1, 1, 1]
    reasons = [r[4] for r in store.rejects]
    assert reasons[0].startswith("invalid-request") and "job_id" in reasons[0]
    assert reasons[1].startswith("invalid-request") and "input" in reasons[1]
    assert reasons[2].startswith("undecodable")
    assert sub.calls == [] and fake.commits == [(0, 0), (0, 1), (0, 2)]


def test_store_failure_holds_the_record_and_commits_nothing_until_it_is_written():
    store = FakeStore()
    store.fail_next = 2
    rc, fake = _consumer(
        store, FakeSubmitter(Outcome(ok=True)), [_msg(b"\xff", 5), _msg(b"\xff", 6)]
    )
    assert rc.run_once(0) == 0 and rc._backoff_s > 0
    assert rc.run_once(0) == 0
    assert fake.commits == [] and len(fake.messages) == 1  # the next record was not read
    assert rc.run_once(0) == 1
    assert fake.commits == [(0, 5)] and [r[3] for r in store.rejects] == [5]
    assert rc.run_once(0) == 1 and fake.commits == [(0, 5), (0, 6)]


def test_a_crashing_submitter_rejects_instead_of_stalling():
    store = FakeStore()
    rc, _fake = _consumer(store, FakeSubmitter(RuntimeError("boom")), [_msg(_request())])
    assert rc.run_once(0) == 1
    assert store.rejects[0][4].startswith("internal-error: RuntimeError: boom")


def test_config_errors():
    with pytest.raises(ConfigError, match="kafka_bootstrap"):
        RequestConsumer(FakeStore(), submitter=None, config=JobsConfig(dsn="postgresql://x"))
    config = JobsConfig(dsn="postgresql://x", kafka_bootstrap="127.0.0.1:1")
    with pytest.raises(ConfigError, match="group.id"):
        RequestConsumer(
            FakeStore(), submitter=None, config=config, consumer_config={"group.id": "x"}
        )
    rc = RequestConsumer(FakeStore(), submitter=None, config=config)
    assert rc.topic == "workflow-run-requests"
    rc.stop()
    rc.stop()
    with pytest.raises(ValueError, match="after_row_commit"):
        arm("elsewhere")


def test_scheduling_headers_reach_the_submitter():
    job = str(uuid.uuid4())
    sub = FakeSubmitter(Outcome(ok=True, job_id=job, status="QUEUED", created=True))
    headers = [
        ("priority", b"1"),
        ("queue", b"gpu"),
        ("fairnessKey", b"team-a"),
        ("dedupKey", b"nightly"),
        ("other", b"ignored"),
    ]
    message = Message(topic="rq", partition=0, offset=3, value=_request(job), headers=headers)
    rc, fake = _consumer(FakeStore(), sub, [message])
    assert rc.run_once(0) == 1
    (call,) = sub.calls
    assert (call["priority"], call["queue"], call["fairness_key"], call["dedup_key"]) == (
        1,
        "gpu",
        "team-a",
        "nightly",
    )
    assert fake.commits == [(0, 3)]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("priority", b"9"),
        ("queue", b" "),
        ("dedupKey", b"\xff"),
        # Unicode digits that str.isdigit() accepts but int() does not, or should not, read.
        ("priority", "\u00b2".encode()),
        ("priority", "\u0661".encode()),
        ("priority", b"9" * 5000),
        ("fairnessKey", b"a\x7fb"),
        ("queue", "a\u0085b".encode()),
        ("dedupKey", b"x" * 201),
    ],
)
def test_a_bad_scheduling_header_is_rejected_naming_it(header, value):
    store, sub = FakeStore(), FakeSubmitter(Outcome(ok=True))
    message = Message(
        topic="rq", partition=0, offset=4, value=_request(), headers=[(header, value)]
    )
    rc, fake = _consumer(store, sub, [message])
    assert rc.run_once(0) == 1
    assert sub.calls == []
    (reject,) = store.rejects
    assert reject[4].startswith("invalid-input: header") and header in reject[4]
    assert fake.commits == [(0, 4)]
