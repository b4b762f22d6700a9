"""Relay logic without services: payload checks, failure classification, per-job holding.

The store and the producer are fakes here; tests/integration/test_relay*.py use the real ones.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaError

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.crashpoints import arm
from protomolt_jobs.kafka.relay import Relay, check_payload, is_lane_failure
from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent
from protomolt_jobs.store.events import build_event
from protomolt_jobs.store.records import OutboxRow

NOW = datetime(2026, 1, 1, tzinfo=UTC)
#: A delivery report that never arrives. (Never compare a KafkaError with a str: its C
#: comparison leaves an exception set and a later call fails with SystemError.)
NEVER = object()


def _config(**kw) -> JobsConfig:
    return JobsConfig(dsn="postgresql://unused", kafka_bootstrap="127.0.0.1:1", **kw)


def forged(job_id: str, type: str, **kw) -> bytes:
    """A payload ``build_event`` refuses to make (it breaks a rule): another writer's row."""
    msg = WorkflowRunEvent(
        event_id=str(uuid.uuid4()),
        job_id=job_id,
        workflow_name="wf",
        type=EventType.Value(f"TYPE_{type}"),
        **kw,
    )
    msg.occurred_at.FromDatetime(NOW)
    return msg.SerializeToString()


def _row(seq: int, job_id: str | None = None, *, type="ACCEPTED", payload=None, **kw) -> OutboxRow:
    job_id = job_id or str(uuid.uuid4())
    try:
        ev = build_event(
            job_id=job_id,
            workflow_name="wf",
            type=type,
            attempt=0,
            status_after="QUEUED",
            occurred_at=NOW,
            **kw,
        )
        event_id, event_type, body = ev.event_id, ev.event_type, ev.payload
    except ValueError:  # an event that breaks the contract: forge it as another writer would
        body = forged(job_id, type, **kw)
        event_id, event_type = uuid.UUID(WorkflowRunEvent.FromString(body).event_id), type
    return OutboxRow(
        event_id=event_id,
        seq=seq,
        event_type=event_type,
        payload=body if payload is None else payload,
        kafka_key=job_id,
        attempts=0,
        status="PENDING",
        created_at=NOW,
        published_at=None,
        last_error=None,
    )


class FakeStore:
    def __init__(self, rows):
        self.rows = list(rows)
        self.claims: list[tuple[int, float]] = []
        self.published: list = []
        self.failed: list[tuple] = []

    def outbox_claim(self, limit, *, claim_s):
        self.claims.append((limit, claim_s))
        rows, self.rows = self.rows[:limit], self.rows[limit:]
        return rows

    def outbox_mark_published(self, event_ids):
        self.published.extend(event_ids)
        return len(event_ids)

    def outbox_mark_failed(self, event_id, error):
        self.failed.append((event_id, error))


class FakeProducer:
    """Calls each delivery report on the next poll; ``outcome(key, value)`` gives the error."""

    def __init__(self, outcome=lambda key, value: None):
        self.outcome = outcome
        self.sent: list[tuple[str, str, bytes]] = []
        self._queue: list = []
        self.purged = False

    def produce(self, topic, value, key, on_delivery):
        self.sent.append((topic, key, value))
        self._queue.append((on_delivery, self.outcome(key, value)))

    def poll(self, _timeout):
        queue, self._queue = self._queue, []
        for cb, err in queue:
            if err is not NEVER:
                cb(err, None)
        return len(queue)

    def purge(self, **_kw):
        self.purged = True

    def flush(self, _timeout=0):
        return 0


def _relay(store, producer, **kw) -> Relay:
    relay = Relay(store, config=_config(**kw), producer_config={"message.timeout.ms": 200})
    relay._ensure_producer = lambda: producer  # the fake stands in for librdkafka
    relay._rebuilds = 0

    def rebuild():
        relay._rebuilds += 1

    relay._rebuild_producer = rebuild
    return relay


def test_check_payload_accepts_a_valid_event_and_names_broken_rules():
    ok = _row(1, type="COMPLETED", verdict="done")
    assert check_payload(ok.payload, ok.kafka_key) is None
    bad = _row(2, type="COMPLETED")  # no verdict
    assert check_payload(bad.payload, bad.kafka_key).startswith("completed-carries-verdict")
    dead = _row(3, type="DEAD")  # no error
    assert check_payload(dead.payload, dead.kafka_key).startswith("terminal-carries-error")
    assert check_payload(b"\xff\xff\xff", ok.kafka_key).startswith("undecodable")
    assert check_payload(ok.payload, str(uuid.uuid4())).startswith("key-mismatch")
    unset = WorkflowRunEvent(event_id=str(uuid.uuid4()), job_id=ok.kafka_key, workflow_name="w")
    unset.occurred_at.FromDatetime(NOW)
    assert "type" in check_payload(unset.SerializeToString(), ok.kafka_key)
    assert EventType.TYPE_UNSPECIFIED == 0


def test_lane_failures_are_not_the_events_fault():
    assert is_lane_failure(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert is_lane_failure(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    assert is_lane_failure(KafkaError(KafkaError._PURGE_INFLIGHT))
    assert not is_lane_failure(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert not is_lane_failure(KafkaError(KafkaError.INVALID_RECORD))
    # Errors the relay has no rule for (idempotence-state errors librdkafka raises under
    # load, for one) blame the lane: a broker outage must never dead-letter a good event.
    assert is_lane_failure(KafkaError(KafkaError._INCONSISTENT))
    assert is_lane_failure(KafkaError(KafkaError._GAPLESS_GUARANTEE))
    assert is_lane_failure(KafkaError(KafkaError.UNKNOWN))


def test_publishes_the_batch_keyed_by_job_and_marks_acked_rows():
    rows = [_row(i) for i in range(5)]
    store, producer = FakeStore(rows), FakeProducer()
    relay = _relay(store, producer, relay_batch_size=3, events_topic="ev")
    assert relay.run_once() == 3
    assert relay.run_once() == 2
    assert relay.run_once() == 0
    assert store.published == [r.event_id for r in rows]
    # Confluent-framed by default: magic 0, schema id 0, message index [0], the payload.
    assert [(t, k, v) for t, k, v in producer.sent] == [
        ("ev", r.kafka_key, b"\x00\x00\x00\x00\x00\x00" + r.payload) for r in rows
    ]
    assert store.claims[0] == (3, relay.claim_s) and relay.claim_s > relay.report_wait_s


def test_broken_event_is_a_recorded_failure_and_holds_only_its_own_job():
    job = str(uuid.uuid4())
    first_bad = _row(1, job, type="DEAD")  # breaks terminal-carries-error
    later_same_job = _row(2, job, type="ACCEPTED")
    other = _row(3)
    store, producer = FakeStore([first_bad, later_same_job, other]), FakeProducer()
    relay = _relay(store, producer)
    assert relay.run_once() == 1
    assert store.published == [other.event_id]
    assert [(e, m.split(":")[0]) for e, m in store.failed] == [
        (first_bad.event_id, "terminal-carries-error")
    ]
    # the same job's later event waited (neither sent nor marked)
    assert [k for _, k, _ in producer.sent] == [other.kafka_key]


def test_lane_failure_writes_nothing_and_rebuilds_the_producer():
    rows = [_row(1), _row(2)]
    store = FakeStore(rows)
    producer = FakeProducer(lambda k, v: KafkaError(KafkaError._MSG_TIMED_OUT))
    relay = _relay(store, producer)
    assert relay.run_once() == 0
    assert store.published == [] and store.failed == []
    assert relay.lane_trouble and relay._rebuilds == 1


def test_refused_delivery_is_recorded_against_the_event():
    rows = [_row(1), _row(2)]
    refused = rows[0].kafka_key
    store = FakeStore(rows)
    producer = FakeProducer(
        lambda k, v: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if k == refused else None
    )
    relay = _relay(store, producer)
    assert relay.run_once() == 1
    assert store.published == [rows[1].event_id]
    assert len(store.failed) == 1 and store.failed[0][0] == rows[0].event_id
    assert "MSG_SIZE_TOO_LARGE" in store.failed[0][1]
    assert not relay.lane_trouble


def test_missing_reports_time_out_as_a_lane_failure():
    rows = [_row(1)]
    store = FakeStore(rows)
    producer = FakeProducer(lambda k, v: NEVER)
    relay = _relay(store, producer)
    relay.report_wait_s = 0.3
    assert relay.run_once() == 0
    assert producer.purged and store.published == [] and store.failed == []
    assert relay.lane_trouble and relay._rebuilds == 1


def test_config_errors_name_the_setting():
    with pytest.raises(ConfigError, match="kafka_bootstrap"):
        Relay(FakeStore([]), config=JobsConfig(dsn="postgresql://x"))
    with pytest.raises(ConfigError, match="partitioner"):
        Relay(FakeStore([]), config=_config(), producer_config={"partitioner": "random"})


def test_stop_before_start_and_twice_is_fine():
    relay = Relay(FakeStore([]), config=_config())
    relay.stop()
    relay.stop(timeout_s=1)


def test_unknown_crash_point_is_refused():
    with pytest.raises(ValueError, match="after_publish"):
        arm("nowhere")


def test_row_dataclass_shape_is_what_the_relay_reads():
    names = {f.name for f in dataclasses.fields(OutboxRow)}
    assert {"event_id", "seq", "payload", "kafka_key", "attempts", "event_type"} <= names


def test_raw_wire_publishes_the_stored_payload():
    rows = [_row(1)]
    store, producer = FakeStore(rows), FakeProducer()
    relay = _relay(store, producer, events_wire="raw")
    assert relay.run_once() == 1
    assert producer.sent == [("workflow-run-events", rows[0].kafka_key, rows[0].payload)]


def test_an_unreachable_schema_registry_is_the_lanes_fault():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows = [_row(1), _row(2)]
    store, producer = FakeStore(rows), FakeProducer()
    relay = _relay(store, producer, schema_registry_url=f"http://127.0.0.1:{port}")
    assert relay.run_once() == 0
    # Nothing published, nothing recorded against the events: they are claimed again later.
    assert producer.sent == [] and store.published == [] and store.failed == []
    assert relay.lane_trouble


def test_the_loop_lingers_after_a_part_batch_goes_on_after_a_full_one_and_idles_on_none():
    # 3 + 3 + 2 rows with batches of 3: full, full, part, then empty passes.
    store, producer = FakeStore([_row(i) for i in range(8)]), FakeProducer()
    relay = _relay(
        store, producer, relay_batch_size=3, relay_linger_seconds=0.04, relay_poll_interval_ms=700
    )
    waits: list[float] = []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 3:
            relay._stop.set()
        return relay._stop.is_set()

    relay._sleep = sleep
    relay._run(relay._stop)
    assert len(store.published) == 8
    # no wait after the two full passes; the linger after the part batch; then idle polls
    assert waits == [0.04, 0.7, 0.7]
    assert len(store.claims) == 5


def test_a_zero_linger_goes_straight_on_after_a_part_batch():
    store, producer = FakeStore([_row(i) for i in range(2)]), FakeProducer()
    relay = _relay(store, producer, relay_batch_size=3, relay_linger_seconds=0.0)
    waits: list[float] = []

    def sleep(seconds):
        waits.append(seconds)
        relay._stop.set()
        return True

    relay._sleep = sleep
    relay._run(relay._stop)
    assert len(store.published) == 2
    assert waits == [0.5]  # the part pass did not wait; the empty pass after it idled
    assert len(store.claims) == 2


def test_the_linger_is_bounded_like_every_seconds_key():
    with pytest.raises(ConfigError, match="relay_linger_seconds"):
        JobsConfig.from_mapping({"relay_linger_seconds": -1})
    assert JobsConfig.from_mapping({"relay_linger_seconds": 0}).relay_linger_seconds == 0.0
    assert JobsConfig().relay_linger_seconds == 0.025


def test_upstream_event_types_keep_types_above_6_off_the_events_topic():
    job = str(uuid.uuid4())
    rows = [
        _row(1, job, type="ACCEPTED"),
        _row(2, job, type="PAUSED"),
        _row(3, job, type="RESUMED"),
        _row(4, job, type="CANCELLED", error="CANCELLED by alice"),
        _row(5, type="RECOVERY_REQUIRED", step="s", error="why"),
        _row(6, type="DEAD", error="boom"),
    ]
    store, producer = FakeStore(rows), FakeProducer()
    relay = _relay(store, producer, events_topic="ev", event_types="upstream")
    assert relay.run_once() == 6
    topics = {WorkflowRunEvent.FromString(v[6:]).type: t for t, _k, v in producer.sent}
    assert {n: t for n, t in topics.items() if n <= 6} == {1: "ev", 6: "ev"}
    assert {n: t for n, t in topics.items() if n > 6} == dict.fromkeys([7, 8, 9, 12], "ev.extended")
    # Same key, same framing on both topics; the outbox order is the produce order.
    assert [k for _t, k, _v in producer.sent] == [r.kafka_key for r in rows]
    assert [v for _t, _k, v in producer.sent] == [b"\x00" * 6 + r.payload for r in rows]


def test_extended_event_types_keep_every_type_on_the_events_topic():
    rows = [_row(1, type="PAUSED"), _row(2, type="CANCELLED", error="CANCELLED by bob")]
    store, producer = FakeStore(rows), FakeProducer()
    relay = _relay(store, producer, events_topic="ev")
    assert relay.run_once() == 2
    assert {t for t, _k, _v in producer.sent} == {"ev"}


def test_halt_claims_nothing_while_the_registry_is_down():
    from tests.support.schema_registry import StubRegistry

    with StubRegistry() as registry:
        url = registry.url
    store, producer = FakeStore([_row(1)]), FakeProducer()
    relay = _relay(store, producer, schema_registry_url=url)
    relay._frame.timeout_s = 2
    assert relay.run_once() == 0
    assert store.claims == [] and producer.sent == []  # every row stays PENDING, unclaimed
    assert relay.lane_trouble

    fallback = _relay(
        FakeStore([_row(2)]),
        FakeProducer(),
        schema_registry_url=url,
        registry_failure="fallback-id-0",
    )
    fallback._frame.timeout_s = 2
    assert fallback.run_once() == 1
