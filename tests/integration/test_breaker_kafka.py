"""Breaker tests for issue 32 (Kafka in production, the mixed fleet).

Each test asserts the behaviour the issue and docs promise. The breaker left 14 of them
failing as bug reports; all 14 findings are fixed (branch kafka-fixes): message.max.bytes
bounded by the largest contract-valid event (protomolt_jobs/limits.py); a job's two events of
one statement ordered under (created_at, event_id) for a Java relay; NaN, NUL, KIP-848-only
consumer settings and unquoted dotted keys refused naming the key; a misplaced property named
as written; illegal topic names and a request topic equal to <events>.extended refused; the
admin client given enable.sasl.*. One test was changed to the documented behaviour (a Java
relay on a shared outbox publishes every event type: docs/interop.md, *Event types with a
Java relay*). Real PostgreSQL, the real Tansu test broker, the stub schema registry.
"""

from __future__ import annotations

import http.server
import json
import threading
import uuid

import psycopg
import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.kafka import framing
from protomolt_jobs.kafka.framing import first_message, unframe
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.topics import ensure_topics
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.events import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_VERDICT_CHARS,
    column_payload,
    event_violations,
)
from tests.support.factories import claimed_job, queued_job
from tests.support.kafka import TopicReader, create_topic, unique_topic
from tests.support.node import wait_for
from tests.support.schema_registry import JOBS_PROTO, OTHER_PROTO, StubRegistry

DSN = "postgresql://x@127.0.0.1/x"


def _jobs(**values):
    return JobsConfig.from_mapping({"dsn": DSN, **values})


def _load(tmp_path, jobs_toml: str, environ: dict | None = None) -> NodeConfig:
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["jobs"]\ndata_dir = "data"\n'
        f'[jobs]\ndsn = "{DSN}"\nkafka_bootstrap = "127.0.0.1:1"\n{jobs_toml}\n'
    )
    return NodeConfig.load(path, environ=environ or {})


# =========================================================================== config doors


@pytest.mark.parametrize(
    ("table", "key", "value", "ok"),
    [
        ("consumer", "session.timeout.ms", 5999, False),
        ("consumer", "session.timeout.ms", 6000, True),
        ("consumer", "session.timeout.ms", 6001, True),
        ("consumer", "session.timeout.ms", 1800001, False),
        ("consumer", "session.timeout.ms", -6000, False),
        ("consumer", "session.timeout.ms", "5999", False),
        ("consumer", "session.timeout.ms", "6000", True),
        ("consumer", "session.timeout.ms", True, False),
        ("consumer", "session.timeout.ms", 6000.5, False),
        ("consumer", "session.timeout.ms", "6e3", False),
        ("producer", "message.timeout.ms", 0, False),
        # 1 is inside the documented bound but not above the default linger.ms (1): a clear
        # ConfigError from librdkafka naming both is the right answer
        ("producer", "message.timeout.ms", 1, False),
        ("producer", "message.timeout.ms", 2, True),
        ("producer", "message.timeout.ms", 3600000, True),
        ("producer", "message.timeout.ms", 3600001, False),
        ("producer", "delivery.timeout.ms", 0, False),
        ("producer", "delivery.timeout.ms", 3600001, False),
        ("producer", "linger.ms", -1, False),
        ("producer", "linger.ms", 900001, False),
        ("producer", "linger.ms", 2**70, False),
        ("producer", "max.in.flight", 6, False),
        ("producer", "retries", 0, False),
        ("producer", "compression.type", "zip", False),
    ],
)
def test_bounds_at_and_around_the_edges(table, key, value, ok):
    if ok:
        _jobs(kafka={table: {key: value}})
        return
    with pytest.raises(ConfigError) as info:
        _jobs(kafka={table: {key: value}})
    text = str(info.value)
    assert f"jobs.kafka.{table}" in text
    # names the property (librdkafka's messages name the canonical one)
    assert (
        key in text
        or key.replace("delivery.timeout", "message.timeout") in text
        or (key == "linger.ms" and "queue.buffering.max.ms" in text)
        or (key == "compression.type" and "compression.codec" in text)
        or (key == "max.in.flight" and "max.in.flight" in text)
    )


def test_session_timeout_at_the_documented_upper_bound_is_accepted_with_its_poll_interval():
    # 1800000 is inside the documented bound; librdkafka requires max.poll.interval.ms >= it,
    # and the refusal (without it) must still be a ConfigError, never a traceback.
    _jobs(kafka={"consumer": {"session.timeout.ms": 1800000, "max.poll.interval.ms": 1800000}})
    with pytest.raises(ConfigError, match="session.timeout.ms"):
        _jobs(kafka={"consumer": {"session.timeout.ms": 1800000}})


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("producer", "request.required.acks", 1),
        ("producer", "acks", "all"),
        ("producer", "metadata.broker.list", "h:1"),
        ("producer", "bootstrap.servers", "h:1"),
        ("producer", "enable.idempotence", True),
        ("producer", "partitioner", "consistent"),
        ("producer", "transactional.id", "t"),
        ("consumer", "auto.commit.enable", False),
        ("consumer", "enable.auto.commit", True),
        ("consumer", "group.id", "mine"),
        ("consumer", "auto.offset.reset", "latest"),
        ("consumer", "group.protocol", "consumer"),
        ("consumer", "metadata.broker.list", "h:1"),
    ],
)
def test_owned_keys_are_refused_under_every_name_and_every_door(tmp_path, table, key, value):
    with pytest.raises(ConfigError, match="cannot be set") as info:
        _jobs(kafka={table: {key: value}})
    assert key in str(info.value)
    # the environment door (a JSON object)
    env = {f"PROTOMOLT_JOBS_KAFKA_{table.upper()}": json.dumps({key: value})}
    with pytest.raises(ConfigError, match="cannot be set"):
        _load(tmp_path, "", env)
    # the TOML door
    with pytest.raises(ConfigError, match="cannot be set"):
        _load(tmp_path, f'[jobs.kafka.{table}]\n"{key}" = {json.dumps(value)}')


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        "5",
        '"linger.ms=5"',
        "null",
        "true",
        "{",
        "",
        '{"linger.ms": {"a": 1}}',
        '{"linger.ms": [5]}',
        '{"linger.ms": null}',
        '{"": 5}',
        '{"Linger.ms": 5}',
    ],
)
def test_environment_json_that_is_not_a_flat_object_is_a_config_error(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "", {"PROTOMOLT_JOBS_KAFKA_PRODUCER": text})
    assert "kafka" in str(info.value) and "producer" in str(info.value)


def test_unknown_keys_under_jobs_kafka_are_refused(tmp_path):
    for toml, name in [
        ('[jobs.kafka]\nbootstrap = "h:1"', "jobs.kafka.bootstrap"),
        ('[jobs.kafka.admin]\n"client.id" = "x"', "jobs.kafka.admin"),
        ('[jobs.kafka]\nproducer = "x"', "jobs.kafka.producer"),
        ('[jobs.kafka.producer]\n"no.such.property" = 1', "no.such.property"),
        ('[jobs.kafka.producer]\n"session.timeout.ms" = 6000', "session.timeout.ms"),
    ]:
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, toml)
        assert name in str(info.value), (toml, str(info.value))


def test_a_producer_property_in_the_consumer_table_is_refused_naming_the_key_written(tmp_path):
    """The user wrote linger.ms; the refusal must name linger.ms, not librdkafka's canonical
    queue.buffering.max.ms (a key that appears nowhere in the user's file)."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, '[jobs.kafka.consumer]\n"linger.ms" = 5')
    assert "linger.ms" in str(info.value).replace("queue.buffering.max.ms", "")


def test_environment_overrides_the_toml_property_by_property_and_is_bounds_checked(tmp_path):
    cfg = _load(
        tmp_path,
        '[jobs.kafka.consumer]\n"session.timeout.ms" = 7000\n"client.id" = "a"',
        {"PROTOMOLT_JOBS_KAFKA_CONSUMER": '{"client.id": "b"}'},
    )
    jobs = JobsConfig.from_mapping(cfg.section("jobs")) if hasattr(cfg, "section") else None
    if jobs is not None:
        assert jobs.consumer_settings()["session.timeout.ms"] == 7000
        assert jobs.consumer_settings()["client.id"] == "b"
    with pytest.raises(ConfigError, match="session.timeout.ms"):
        _load(
            tmp_path,
            '[jobs.kafka.consumer]\n"session.timeout.ms" = 7000',
            {"PROTOMOLT_JOBS_KAFKA_CONSUMER": '{"session.timeout.ms": "1000"}'},
        )


@pytest.mark.parametrize("door", ["toml", "env"])
def test_a_nan_millisecond_value_is_refused(tmp_path, door):
    """NaN is no number of milliseconds: librdkafka's range check (min <= v <= max) lets a
    NaN double through, so the check here must refuse it."""
    with pytest.raises(ConfigError, match="linger.ms"):
        if door == "toml":
            _load(tmp_path, '[jobs.kafka.producer]\n"linger.ms" = nan')
        else:
            _load(tmp_path, "", {"PROTOMOLT_JOBS_KAFKA_PRODUCER": '{"linger.ms": NaN}'})


def test_a_nul_in_a_setting_is_refused_not_truncated():
    """librdkafka takes C strings: 'a\\0b' would silently become 'a'."""
    with pytest.raises(ConfigError, match="client.id"):
        _jobs(kafka={"producer": {"client.id": "relay\x00-b"}})


def test_an_unquoted_dotted_key_names_the_property_it_was_meant_to_be(tmp_path):
    """TOML reads `session.timeout.ms = 1000` (unquoted) as nested tables; the error must
    name session.timeout.ms (the mistake), not `session`."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "[jobs.kafka.consumer]\nsession.timeout.ms = 1000")
    assert "session.timeout.ms" in str(info.value)


def test_a_kip848_only_consumer_setting_is_not_silently_ignored():
    """group.protocol is owned as `classic`; group.remote.assignor only applies under the
    `consumer` protocol, so the consumer would ignore it: refuse it like a misplaced one."""
    with pytest.raises(ConfigError, match="group.remote.assignor"):
        _jobs(kafka={"consumer": {"group.remote.assignor": "uniform"}})


def test_the_relays_producer_config_hook_refuses_a_malformed_value_at_construction(
    fresh_dsn,
):
    store = JobStore.open(fresh_dsn, max_size=1)
    try:
        config = JobsConfig(dsn=fresh_dsn, kafka_bootstrap="127.0.0.1:1")
        with pytest.raises(ConfigError, match="request.required.acks"):
            Relay(store, config=config, producer_config={"request.required.acks": 1})
        # a value librdkafka refuses must not surface later as a KafkaException in a pass
        try:
            relay = Relay(store, config=config, producer_config={"linger.ms": "soon"})
        except ConfigError:
            return
        try:
            relay.run_once()
        except ConfigError:
            return
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"a bad producer_config value surfaced as {type(exc).__name__}: {exc}")
        finally:
            relay.stop()
    finally:
        store.close()


# =========================================================================== registry


class GarbageRegistry:
    """A registry that answers ``(status, body bytes, content type)`` to every GET, or hangs."""

    def __init__(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        state = self
        self.status, self.body, self.ctype = status, body, ctype
        self.calls = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state.calls += 1
                self.send_response(state.status)
                self.send_header("Content-Type", state.ctype)
                self.send_header("Content-Length", str(len(state.body)))
                self.end_headers()
                self.wfile.write(state.body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


GARBAGE = [
    (200, b"<html>hello</html>", "text/html"),
    (200, b"[1, 2, 3]", "application/json"),
    (200, b'{"id": "42", "schemaType": "PROTOBUF"}', "application/json"),
    (200, b'{"id": 42.0, "schemaType": "PROTOBUF"}', "application/json"),
    (200, b'{"id": -1, "schemaType": "PROTOBUF"}', "application/json"),
    (200, b'{"id": 4294967296, "schemaType": "PROTOBUF"}', "application/json"),
    (200, b"", "application/json"),
    (500, b'{"error_code": 50001, "message": "boom"}', "application/json"),
    (404, b'{"error_code": 40401}', "application/json"),
    (200, b"\xff\xfe\x00garbage", "application/octet-stream"),
]


def _outbox_rows(dsn: str) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT event_id::text AS event_id, kafka_key, status, event_type, claimed_until,"
            " payload, seq FROM workflow_run_events_outbox ORDER BY seq"
        )
        names = [d.name for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@pytest.mark.parametrize("answer", GARBAGE, ids=[f"{s}-{b[:12]!r}" for s, b, _c in GARBAGE])
def test_registry_answering_garbage_under_halt_leaves_rows_pending_and_unclaimed(
    fresh_dsn, broker, answer
):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    reg = GarbageRegistry(*answer)
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        for _ in range(2):
            queued_job(store)
        relay = Relay(
            store,
            config=JobsConfig(
                dsn=fresh_dsn,
                kafka_bootstrap=broker.bootstrap,
                events_topic=topic,
                schema_registry_url=reg.url,
            ),
        )
        try:
            relay.start()  # a garbage answer is "cannot say the id", never a crash at start
        except ConfigError:
            pass  # a mismatch refusal is also acceptable: nothing is published
        try:
            for _ in range(2):
                assert relay.run_once() == 0
            rows = _outbox_rows(fresh_dsn)
            assert [r["status"] for r in rows] == ["PENDING"] * 2
            assert all(r["claimed_until"] is None for r in rows)
        finally:
            relay.stop()
    finally:
        store.close()
        reg.stop()


@pytest.mark.parametrize("answer", GARBAGE[:8], ids=[f"{s}-{b[:12]!r}" for s, b, _c in GARBAGE[:8]])
def test_registry_answering_garbage_under_fallback_publishes_with_id_0(fresh_dsn, broker, answer):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    reg = GarbageRegistry(*answer)
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        for _ in range(2):
            queued_job(store)
        relay = Relay(
            store,
            config=JobsConfig(
                dsn=fresh_dsn,
                kafka_bootstrap=broker.bootstrap,
                events_topic=topic,
                schema_registry_url=reg.url,
                registry_failure="fallback-id-0",
            ),
        )
        try:
            relay.start()
        except ConfigError:
            # refused as a schema mismatch (also acceptable): then nothing may be published
            relay.stop()
            assert all(r["status"] == "PENDING" for r in _outbox_rows(fresh_dsn))
            return
        try:
            wait_for(
                lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)),
                timeout_s=30,
            )
        finally:
            relay.stop()
        with TopicReader(broker.bootstrap, topic) as reader:
            recs = reader.read_until(lambda rs: len(rs) >= 2)
        assert {unframe(r.value)[0] for r in recs} == {0}
    finally:
        store.close()
        reg.stop()


def test_registry_flapping_under_fallback_never_loses_a_row_and_keeps_the_id_once_known(
    fresh_dsn, broker, monkeypatch
):
    monkeypatch.setattr(framing, "REGISTRY_RETRY_S", 0.0)
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    reg = StubRegistry()
    port, url = reg.port, reg.url
    reg.stop()
    store = JobStore.open(fresh_dsn, max_size=2)
    relay = Relay(
        store,
        config=JobsConfig(
            dsn=fresh_dsn,
            kafka_bootstrap=broker.bootstrap,
            events_topic=topic,
            schema_registry_url=url,
            registry_failure="fallback-id-0",
        ),
    )
    ids: dict[str, int] = {}
    try:
        relay.start()  # registry down at start
        a = queued_job(store)
        wait_for(lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)))
        ids[str(a.job_id)] = 0
        with StubRegistry(port) as back:
            back.register(f"{topic}-value", 42)
            b = queued_job(store)
            wait_for(lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)))
            ids[str(b.job_id)] = 42
        # down again mid-run: the id is kept
        c = queued_job(store)
        wait_for(lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)))
        ids[str(c.job_id)] = 42
        with StubRegistry(port) as back:  # back with another id: still 42 (kept)
            back.register(f"{topic}-value", 77)
            d = queued_job(store)
            wait_for(lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)))
            ids[str(d.job_id)] = 42
    finally:
        relay.stop()
        store.close()
    with TopicReader(broker.bootstrap, topic) as reader:
        recs = reader.read_until(lambda rs: len({r.key for r in rs}) >= 4)
    got = {}
    for r in recs:
        got.setdefault(r.key, set()).add(unframe(r.value)[0])
    assert got == {k: {v} for k, v in ids.items()}


@pytest.mark.parametrize("policy", ["halt", "fallback-id-0"])
def test_registry_down_at_start_then_a_wrong_schema_never_stamps_its_id(
    fresh_dsn, broker, monkeypatch, policy
):
    monkeypatch.setattr(framing, "REGISTRY_RETRY_S", 0.0)
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    reg = StubRegistry()
    port, url = reg.port, reg.url
    reg.stop()
    store = JobStore.open(fresh_dsn, max_size=2)
    relay = Relay(
        store,
        config=JobsConfig(
            dsn=fresh_dsn,
            kafka_bootstrap=broker.bootstrap,
            events_topic=topic,
            schema_registry_url=url,
            registry_failure=policy,
        ),
    )
    try:
        relay.start()
        queued_job(store)
        if policy == "fallback-id-0":
            wait_for(lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)))
        with StubRegistry(port) as back:
            back.register(f"{topic}-value", 7, OTHER_PROTO)
            queued_job(store)
            # wait until the relay has asked the registry at least twice, then check
            wait_for(lambda: back.calls >= 2, timeout_s=30)
            rows = _outbox_rows(fresh_dsn)
            assert rows[-1]["status"] == "PENDING"
    finally:
        relay.stop()
        store.close()
    if policy == "fallback-id-0":
        with TopicReader(broker.bootstrap, topic) as reader:
            recs = reader.read_until(lambda rs: len(rs) >= 1, timeout_s=20)
        assert {unframe(r.value)[0] for r in recs} == {0}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (JOBS_PROTO, "ai.pipestream.proto.jobs.v1.WorkflowRunEvent"),
        (OTHER_PROTO, "ai.pipestream.proto.jobs.v1.WorkflowRunRequest"),
        (
            (
                'syntax = "proto3";\npackage ai.pipestream.proto.jobs.v1;\n'
                "enum Kind { KIND_UNSPECIFIED = 0; }\nmessage WorkflowRunEvent {}\n"
            ),
            "ai.pipestream.proto.jobs.v1.WorkflowRunEvent",
        ),
        (
            (
                'syntax = "proto3";\npackage ai.pipestream.proto.jobs.v1;\n'
                "/* message Fake {} */ // message Fake2 {}\n"
                'option java_package = "message Fake3";\nmessage WorkflowRunEvent {}\n'
            ),
            "ai.pipestream.proto.jobs.v1.WorkflowRunEvent",
        ),
        (
            (
                'syntax = "proto3";\npackage ai.pipestream.proto.jobs.v1;\n'
                "service S { rpc X(A) returns (B); }\nmessage A {}\nmessage WorkflowRunEvent {}\n"
            ),
            "ai.pipestream.proto.jobs.v1.A",
        ),
        (
            (
                'syntax = "proto3";\npackage ai.pipestream.proto.jobs.v1;\n'
                "extend google.protobuf.FieldOptions { string x = 5000; }\n"
                "message WorkflowRunEvent {}\n"
            ),
            "ai.pipestream.proto.jobs.v1.WorkflowRunEvent",
        ),
        (
            'syntax = "proto3";\npackage other.pkg;\nmessage WorkflowRunEvent {}\n',
            "other.pkg.WorkflowRunEvent",
        ),
    ],
)
def test_first_message_reads_the_message_index_0(schema, expected):
    assert first_message(schema) == expected


# =========================================================================== event types


def claimed(store: JobStore, lease_s: float = 60.0, **kw):
    """A job claimed from a queue of its own (other tests' QUEUED jobs never interfere)."""
    q = f"q{uuid.uuid4().hex[:10]}"
    job = queued_job(store, queue=q, **kw)
    got = store.job_claim("breaker", lease_s, queues=[q])
    assert got is not None and got.job_id == job.job_id
    return got


def reclaim(store: JobStore, job_id):
    job = store.job_get(job_id)
    got = store.job_claim("breaker", 60.0, queues=[job.queue])
    assert got is not None and got.job_id == job.job_id
    return got


def parked(store: JobStore, step: str = "approve", **kw):
    c = claimed(store, **kw)
    store.job_checkpoint(c.lease, {"name": "first", "skipped": False, "response": {}})
    store.job_park(c.lease, step)
    return store.job_get(c.job_id)


def _every_lifecycle_path(store: JobStore) -> list[str]:
    """Drive every lifecycle path through the store's own statements; returns the job ids."""
    ids = []

    # submit -> checkpoints -> complete
    a = claimed(store)
    store.job_checkpoint(a.lease, {"name": "one", "skipped": False, "response": {"x": 1}})
    store.job_checkpoint(a.lease, {"name": "two", "skipped": False, "response": {"x": 2}})
    store.job_complete(a.lease, result={"ok": True}, verdict="done")
    ids.append(str(a.job_id))

    # park -> complete-step -> claimed again -> complete
    b = parked(store, step="approve")
    store.job_complete_parked(
        b.job_id,
        "approve",
        {"name": "approve", "skipped": False, "response": {"ok": True}},
        actor="alice",
    )
    ids.append(str(b.job_id))

    # park -> fail-parked
    c = parked(store, step="approve")
    store.job_fail_parked(c.job_id, "approve", "VALIDATION: rejected", actor="alice")
    ids.append(str(c.job_id))

    # fail -> requeue -> claimed -> dead -> retry-step
    d = claimed(store)
    store.job_checkpoint(d.lease, {"name": "one", "skipped": False, "response": {}})
    store.job_fail(d.lease, "VALIDATION: bad", step="two")
    assert store.job_requeue(d.job_id, actor="bob").changed
    d2 = reclaim(store, d.job_id)
    store.job_dead(d2.lease, "GRPC: unavailable", step="two")
    job = store.job_get(d.job_id)
    out = store.job_retry_step(
        d.job_id,
        step="two",
        checkpoints=[{"name": "one", "skipped": False, "response": {}}],
        expected_status="DEAD",
        expected_history_seq=job.history_seq,
        actor="bob",
    )
    assert out.changed
    assert store.job_cancel(d.job_id, actor="bob", reason="enough").changed
    ids.append(str(d.job_id))

    # pause -> resume -> cancel (queued)
    e = queued_job(store)
    assert store.job_pause(e.job_id, actor="carol").changed
    assert store.job_resume(e.job_id, actor="carol").changed
    assert store.job_cancel(e.job_id, actor="carol").changed
    ids.append(str(e.job_id))

    # running: cancel requested (11), then the worker's stop settles it CANCELLED
    f = claimed(store)
    assert store.job_cancel(f.job_id, actor="dave").status == "RUNNING"
    store.job_stop(f.lease)
    ids.append(str(f.job_id))

    # running: cancel requested, then the worker's checkpoint and complete are settled
    # CANCELLED by the control trigger (the event columns follow the moved row)
    f2 = claimed(store)
    store.job_cancel(f2.job_id, actor="dave")
    try:
        store.job_checkpoint(f2.lease, {"name": "one", "skipped": False, "response": {}})
    except Exception:  # noqa: BLE001, S110  (LeaseLost once the trigger cancelled it)
        pass
    f3 = claimed(store)
    store.job_pause(f3.job_id, actor="dave")
    try:
        store.job_complete(f3.lease, result={}, verdict="v")
    except Exception:  # noqa: BLE001, S110
        pass
    ids += [str(f2.job_id), str(f3.job_id)]

    # running: pause requested, then stop -> PAUSED; resume; cancel
    g = claimed(store)
    store.job_pause(g.job_id, actor="erin")
    store.job_stop(g.lease)
    store.job_resume(g.job_id, actor="erin")
    store.job_cancel(g.job_id, actor="erin")
    ids.append(str(g.job_id))

    # recovery required -> migrate-checkpoint (job_recover) -> cancel
    h = claimed(store)
    store.job_checkpoint(h.lease, {"name": "one", "skipped": False, "response": {}})
    store.job_recovery_required(h.lease, "charge", "no probe could tell")
    job = store.job_get(h.job_id)
    assert store.job_recover(
        h.job_id,
        step="charge",
        checkpoints=[
            {"name": "one", "skipped": False, "response": {}},
            {"name": "charge", "skipped": False, "response": {"id": "c1"}},
        ],
        intents=None,
        expected_history_seq=job.history_seq,
        kind="migrate-checkpoint",
        actor="frank",
    ).changed
    assert store.job_cancel(h.job_id, actor="frank").changed
    ids.append(str(h.job_id))

    # lease expiry at the last attempt: the sweeper's DEAD
    i = claimed(store, lease_s=0.05, max_attempts=1)
    wait_for(
        lambda: store.job_sweep_expired() is not None and store.job_get(i.job_id).status == "DEAD",
        timeout_s=20,
    )
    ids.append(str(i.job_id))
    return ids


def test_upstream_event_types_over_every_lifecycle_path(fresh_dsn, broker):
    events = unique_topic("ev")
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=events,
        request_topic=unique_topic("rq"),
        event_types="upstream",
        topic_partitions=2,
    )
    ensure_topics(config)
    store = JobStore.open(fresh_dsn, max_size=4)
    relay = Relay(store, config=config)
    try:
        ids = _every_lifecycle_path(store)
        wait_for(
            lambda: (
                relay.run_once() >= 0
                and all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn))
            ),
            timeout_s=90,
        )
    finally:
        relay.stop()
        store.close()
    rows = _outbox_rows(fresh_dsn)
    assert {r["kafka_key"] for r in rows} == set(ids)
    order = {r["event_id"]: r["seq"] for r in rows}
    types_seen = {r["event_type"] for r in rows}
    assert {
        "CANCELLED",
        "PAUSED",
        "RESUMED",
        "REQUEUED",
        "CONTROL_REQUESTED",
        "RECOVERY_REQUIRED",
        "WAITING",
        "DEAD",
        "FAILED",
        "COMPLETED",
    } <= types_seen
    want_main = {
        r["event_id"] for r in rows if WorkflowRunEvent.Type.Value("TYPE_" + r["event_type"]) <= 6
    }
    want_ext = set(order) - want_main
    got: dict[str, list] = {}
    for name, topic, n in (
        ("main", events, len(want_main)),
        ("ext", f"{events}.extended", len(want_ext)),
    ):
        with TopicReader(broker.bootstrap, topic) as reader:
            recs = reader.read_until(lambda rs, n=n: len({r.value for r in rs}) >= n)
        got[name] = []
        for rec in recs:
            ev = WorkflowRunEvent.FromString(unframe(rec.value)[2])
            assert rec.key == ev.job_id
            got[name].append((rec.partition, rec.offset, ev))
    assert all(ev.type <= 6 for *_x, ev in got["main"])
    assert all(ev.type > 6 for *_x, ev in got["ext"])
    assert {ev.event_id for *_x, ev in got["main"]} == want_main
    assert {ev.event_id for *_x, ev in got["ext"]} == want_ext
    # per-job order on each topic is the outbox's order
    for name in ("main", "ext"):
        by_job: dict[str, list] = {}
        for part, off, ev in sorted(got[name], key=lambda t: (t[0], t[1])):
            by_job.setdefault(ev.job_id, []).append((part, ev.event_id))
        for job, evs in by_job.items():
            assert len({p for p, _e in evs}) == 1, f"{job} on several partitions of {name}"
            seqs = [order[e] for _p, e in evs]
            assert seqs == sorted(seqs), f"{job} out of order on {name}"


# =========================================================================== outbox payloads

_ROWS = (
    "SELECT event_id, event_type, payload, kafka_key, created_at, workflow_name, attempt,"
    " status_after, step, verdict, error, origin FROM workflow_run_events_outbox ORDER BY seq"
)


def _all_rows(dsn: str) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(_ROWS)
        names = [d.name for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


ASTRAL = "😀"


def test_always_mode_every_write_kind_carries_a_valid_payload_equal_to_the_relays(fresh_dsn):
    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    try:
        _every_lifecycle_path(store)
        # texts at the limits, astral, NUL (scrubbed), huge attempts
        long_step = ASTRAL * (MAX_NAME_CHARS + 3)
        j = claimed(store, workflow_name="w" * 200)
        store.job_checkpoint(j.lease, {"name": long_step, "skipped": False, "response": {}})
        store.job_complete(j.lease, result={}, verdict=ASTRAL * (MAX_VERDICT_CHARS + 1))
        k = claimed(store)
        store.job_fail(k.lease, "E\x00" + ASTRAL * (MAX_ERROR_CHARS + 5), step=long_step)
        m = claimed(store)
        with psycopg.connect(fresh_dsn, autocommit=True) as c:
            c.execute("UPDATE workflow_run SET attempt = 2147483647 WHERE job_id = %s", (m.job_id,))
        import dataclasses

        store.job_dead(
            dataclasses.replace(m.lease, attempt=2147483647),
            "GRPC: \ud800 lone" + ASTRAL * 4100,
            step="s",
        )
    finally:
        store.close()
    rows = _all_rows(fresh_dsn)
    assert rows
    missing = [r["event_type"] for r in rows if r["payload"] is None]
    assert not missing, f"rows without a payload in the always mode: {missing}"
    for r in rows:
        ev = WorkflowRunEvent.FromString(bytes(r["payload"]))
        assert not event_violations(ev), (r["event_type"], event_violations(ev))
        assert ev.job_id == r["kafka_key"]
        if r["workflow_name"] is not None:  # a column row: the SQL encoder's bytes
            assert bytes(r["payload"]) == column_payload(r), r["event_type"]


def test_switching_to_always_with_pending_column_rows_loses_nothing(fresh_dsn, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    cols = JobStore.open(fresh_dsn, max_size=2)
    try:
        a = claimed_job(cols)
        cols.job_checkpoint(a.lease, {"name": "one", "skipped": False, "response": {}})
        cols.job_complete(a.lease, result={}, verdict="ok " + ASTRAL)
    finally:
        cols.close()
    before = _all_rows(fresh_dsn)
    assert all(r["payload"] is None for r in before)
    expected = {str(r["event_id"]): column_payload(r) for r in before}
    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    relay = Relay(
        store,
        config=JobsConfig(
            dsn=fresh_dsn,
            kafka_bootstrap=broker.bootstrap,
            events_topic=topic,
            outbox_payloads="always",
        ),
    )
    try:
        b = claimed_job(store)
        store.job_complete(b.lease, result={}, verdict="ok")
        after = _all_rows(fresh_dsn)
        for r in after[len(before) :]:
            expected[str(r["event_id"])] = bytes(r["payload"])
        wait_for(
            lambda: (
                relay.run_once() >= 0
                and all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn))
            ),
            timeout_s=60,
        )
    finally:
        relay.stop()
        store.close()
    with TopicReader(broker.bootstrap, topic) as reader:
        recs = reader.read_until(lambda rs: len({r.value for r in rs}) >= len(expected))
    got = {}
    for rec in recs:
        body = unframe(rec.value)[2]
        got[WorkflowRunEvent.FromString(body).event_id] = body
    assert got == expected


# =========================================================================== pruner


def _foreign_copy_of_run(dsn: str, job_id) -> uuid.UUID:
    """Insert a run the way a Java node does: a session without protomolt_jobs.session,
    naming every column but origin. Returns the new job id."""
    new = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as c:
        cols = [
            r[0]
            for r in c.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name ="
                " 'workflow_run' AND column_name NOT IN ('origin', 'job_id')"
                " AND is_generated = 'NEVER' ORDER BY ordinal_position"
            )
        ]
        names = ", ".join(cols)
        c.execute(
            f"INSERT INTO workflow_run (job_id, {names}) SELECT %s, {names} FROM workflow_run"
            " WHERE job_id = %s",
            (new, job_id),
        )
        cur = c.execute(
            _ROWS.replace("ORDER BY seq", "WHERE kafka_key = %s ORDER BY seq"), (str(job_id),)
        )
        names = [d.name for d in cur.description]
        row = dict(zip(names, cur.fetchone(), strict=True))
        row.update(event_id=uuid.uuid4(), kafka_key=str(new))
        payload = bytes(row["payload"]) if row["payload"] is not None else column_payload(row)
        c.execute(
            "INSERT INTO workflow_run_events_outbox (event_id, kafka_key, event_type, payload,"
            " status) VALUES (%s, %s, %s, %s, 'PENDING')",
            (row["event_id"], str(new), row["event_type"], payload),
        )
    return new


def _age_everything(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "UPDATE workflow_run SET completed_at = now() - interval '400 days'"
            " WHERE status IN ('COMPLETED','FAILED','DEAD','CANCELLED')"
        )
        c.execute(
            "UPDATE workflow_run SET updated_at = now() - interval '400 days'"
            " WHERE status = 'CANCELLED'"
        )
        c.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED',"
            " published_at = now() - interval '400 days'"
        )


def _exists(dsn: str) -> tuple[set[str], set[str]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        runs = {str(r[0]) for r in c.execute("SELECT job_id FROM workflow_run")}
        keys = {
            r[0] for r in c.execute("SELECT DISTINCT kafka_key FROM workflow_run_events_outbox")
        }
    return runs, keys


def test_the_pruner_keeps_foreign_rows_and_java_submitted_runs_our_workers_ran(fresh_dsn):
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        ours = claimed_job(store)
        store.job_complete(ours.lease, result={}, verdict="ok")
        # a Java-like insert of a QUEUED run, then our worker runs it to COMPLETED
        with psycopg.connect(fresh_dsn, autocommit=True) as c:
            c.execute("SELECT 1")
        template = queued_job(store)
        java_run = _foreign_copy_of_run(fresh_dsn, template.job_id)
        store.job_cancel(template.job_id, actor="t")  # the template: our own, cancelled
        claimed = store.job_claim("w", 60.0)
        assert claimed is not None and claimed.job_id == java_run
        store.job_complete(claimed.lease, result={}, verdict="ran by us")
        # a Java-like completed run with its own Java outbox row
        done = claimed_job(store)
        store.job_complete(done.lease, result={}, verdict="x")
        java_done = _foreign_copy_of_run(fresh_dsn, done.job_id)
        with psycopg.connect(fresh_dsn, autocommit=True) as c:
            origins = dict(c.execute("SELECT job_id::text, origin FROM workflow_run").fetchall())
        assert origins[str(java_run)] is None and origins[str(java_done)] is None
        assert origins[str(ours.job_id)] == "protomolt-jobs"
        _age_everything(fresh_dsn)

        pruner = Pruner(store, config=JobsConfig(dsn=fresh_dsn))
        pruner.run_once()
        runs, keys = _exists(fresh_dsn)
        assert str(ours.job_id) not in runs and str(template.job_id) not in runs
        assert str(done.job_id) not in runs
        assert {str(java_run), str(java_done)} <= runs  # a Java node's runs stay
        assert str(java_done) in keys  # and its outbox rows
        with psycopg.connect(fresh_dsn, autocommit=True) as c:
            left = c.execute(
                "SELECT count(*) FROM workflow_run_events_outbox WHERE origin IS NULL"
            ).fetchone()[0]
        assert left >= 2

        pruner = Pruner(store, config=JobsConfig(dsn=fresh_dsn, prune_foreign_rows=True))
        pruner.run_once()
        runs, keys = _exists(fresh_dsn)
        assert runs == set() and keys == set()
    finally:
        store.close()


# =========================================================================== more doors


def test_a_request_topic_that_is_the_extended_events_topic_is_refused():
    """With event_types = "upstream" the extended events go to <events>.extended; a request
    topic of that name would feed our own events to the request consumer (wanted_topics
    silently de-duplicates the two)."""
    with pytest.raises(ConfigError, match="request_topic"):
        JobsConfig(
            dsn=DSN,
            kafka_bootstrap="127.0.0.1:1",
            events_topic="ev",
            request_topic="ev.extended",
            event_types="upstream",
        )


@pytest.mark.parametrize("topic", ["e" * 241, "bad topic!", "ev/../x"])
def test_an_events_topic_whose_extended_topic_is_no_legal_kafka_name_is_refused(topic):
    """Kafka topic names are [a-zA-Z0-9._-], at most 249 characters: a 241-character events
    topic is legal but its '.extended' sibling is not, and the relay would hold every
    extended event PENDING (the broker's refusal is a lane failure) instead of failing at
    load."""
    with pytest.raises(ConfigError, match="events_topic"):
        JobsConfig(
            dsn=DSN, kafka_bootstrap="127.0.0.1:1", events_topic=topic, event_types="upstream"
        )


def test_the_topic_admin_client_gets_every_connection_setting_of_the_producer():
    from protomolt_jobs.config import ADMIN_SETTING_PREFIXES

    # accepted for the producer (librdkafka knows it) ...
    _jobs(
        kafka={
            "producer": {
                "sasl.mechanisms": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": True,
            }
        }
    )
    # ... so the admin client that creates the topics must get it too
    assert "enable.sasl.oauthbearer.unsecure.jwt".startswith(ADMIN_SETTING_PREFIXES)


def test_a_java_relay_on_the_shared_outbox_publishes_every_type_as_documented(fresh_dsn):
    """The always mode exists so a Java relay can drain our rows. A Java relay publishes
    every PENDING row it parses to its one events topic, so event_types = "upstream" cannot
    keep our types 7+ off it; docs/interop.md (*Event types with a Java relay*) chooses that
    deliberately over NULL payloads for types 7+ (which upstream's relay marks FAILED after 10
    polls, racing ours and losing events). So every row, in the job's order, has a payload the
    Java relay publishes: ACCEPTED, PAUSED, RESUMED, CANCELLED.

    (The breaker's version asserted that no type above 6 is published; item 3 of the fix
    brief chose the documented behaviour instead, and this asserts it.)"""
    from tests.integration.test_outbox_payloads import UPSTREAM_MARK_PUBLISHED, UPSTREAM_POLL

    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    try:
        e = queued_job(store)
        store.job_pause(e.job_id, actor="a")
        store.job_resume(e.job_id, actor="a")
        store.job_cancel(e.job_id, actor="a")
    finally:
        store.close()
    published_types = []
    with psycopg.connect(fresh_dsn) as c:
        for _ in range(10):
            with c.transaction():
                batch = c.execute(UPSTREAM_POLL, (100,)).fetchall()
            if not batch:
                break
            for event_id, _t, payload, _key, *_rest in batch:
                if payload is None:
                    continue
                ev = WorkflowRunEvent.FromString(bytes(payload))
                with c.transaction():
                    c.execute(UPSTREAM_MARK_PUBLISHED, (ev.occurred_at.ToDatetime(), event_id))
                published_types.append(ev.type)
    assert published_types == [
        WorkflowRunEvent.TYPE_ACCEPTED,
        WorkflowRunEvent.TYPE_PAUSED,
        WorkflowRunEvent.TYPE_RESUMED,
        WorkflowRunEvent.TYPE_CANCELLED,
    ], published_types


def test_relay_stop_is_bounded_while_the_registry_hangs(fresh_dsn, broker):
    import socket
    import time

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)  # accepts (backlog) and never answers
    url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        queued_job(store)
        relay = Relay(
            store,
            config=JobsConfig(
                dsn=fresh_dsn,
                kafka_bootstrap=broker.bootstrap,
                events_topic=unique_topic("ev"),
                schema_registry_url=url,
            ),
        )
        t0 = time.monotonic()
        relay.start()
        started = time.monotonic() - t0
        t1 = time.monotonic()
        stopped = relay.stop()
        took = time.monotonic() - t1
        assert stopped, "the relay did not stop"
        assert started < 12 and took < 12, (started, took)
        assert [r["status"] for r in _outbox_rows(fresh_dsn)] == ["PENDING"]
    finally:
        store.close()
        lsock.close()


def test_two_relays_under_upstream_types_keep_per_job_order_on_each_topic(fresh_dsn, broker):
    events = unique_topic("ev")
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=events,
        event_types="upstream",
        topic_partitions=3,
        relay_batch_size=7,
    )
    ensure_topics(config)
    store = JobStore.open(fresh_dsn, max_size=6)
    relays = [Relay(store, config=config) for _ in range(2)]
    try:
        for r in relays:
            r.start()
        for n in range(15):
            j = queued_job(store)
            store.job_pause(j.job_id, actor="a")
            store.job_resume(j.job_id, actor="a")
            if n % 2:
                c = store.job_claim("w", 60.0)
                store.job_checkpoint(c.lease, {"name": "one", "skipped": False, "response": {}})
                store.job_complete(c.lease, result={}, verdict="ok")
            else:
                store.job_cancel(j.job_id, actor="a")
        wait_for(
            lambda: all(r["status"] == "PUBLISHED" for r in _outbox_rows(fresh_dsn)), timeout_s=90
        )
    finally:
        for r in relays:
            r.stop()
        store.close()
    rows = _outbox_rows(fresh_dsn)
    seq = {r["event_id"]: r["seq"] for r in rows}
    main = {
        r["event_id"] for r in rows if WorkflowRunEvent.Type.Value("TYPE_" + r["event_type"]) <= 6
    }
    for topic, want in ((events, main), (f"{events}.extended", set(seq) - main)):
        with TopicReader(broker.bootstrap, topic) as reader:
            recs = reader.read_until(
                lambda rs, w=want: (
                    {WorkflowRunEvent.FromString(unframe(r.value)[2]).event_id for r in rs} >= w
                )
            )
        per_job: dict[str, list[int]] = {}
        seen = set()
        for rec in sorted(recs, key=lambda r: (r.partition, r.offset)):
            ev = WorkflowRunEvent.FromString(unframe(rec.value)[2])
            assert ev.event_id in want, f"{ev.type} on {topic}"
            if ev.event_id in seen:
                continue
            seen.add(ev.event_id)
            per_job.setdefault(ev.job_id, []).append(seq[ev.event_id])
        assert seen == want
        for job, seqs in per_job.items():
            assert seqs == sorted(seqs), (topic, job, seqs)


def test_a_producer_setting_never_dead_letters_a_contract_valid_event(fresh_dsn, broker):
    """librdkafka accepts message.max.bytes down to 1000, but the contract allows events of
    about 21 KB (error 4000 code points, verdict 500, two names of 200, four UTF-8 bytes
    each). Such a setting must be refused at load, or at least never make a valid event the
    event's fault: found MSG_SIZE_TOO_LARGE -> outbox_mark_failed x10 -> FAILED (lost)."""
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    try:
        config = JobsConfig.from_mapping(
            {
                "dsn": fresh_dsn,
                "kafka_bootstrap": broker.bootstrap,
                "events_topic": topic,
                "kafka": {"producer": {"message.max.bytes": 1000}},
            }
        )
    except ConfigError as exc:
        assert "message.max.bytes" in str(exc)
        return
    store = JobStore.open(fresh_dsn, max_size=2)
    relay = Relay(store, config=config)
    try:
        c = claimed(store)
        store.job_fail(c.lease, "E" + ASTRAL * (MAX_ERROR_CHARS - 1), step="s")
        for _ in range(12):
            relay.run_once()
        rows = _outbox_rows(fresh_dsn)
        assert not event_violations(
            WorkflowRunEvent.FromString(column_payload(_all_rows(fresh_dsn)[-1]))
        )  # the event is contract-valid
        assert [r["status"] for r in rows if r["event_type"] == "FAILED"] != ["FAILED"], (
            "a contract-valid event was dead-lettered because of a producer setting"
        )
    finally:
        relay.stop()
        store.close()


# =========================================================================== registry routes

from tests.support.node import http as http_call
from tests.support.node import node_environ, start_node


@pytest.fixture
def reg_node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def test_registry_routes_answer_upstreams_error_code_on_every_refusal(reg_node):
    base = f"{reg_node.http.url}/protomolt/workflows"
    puts = [
        ("/ok-name", b""),
        ("/ok-name", b"null"),
        ("/ok-name", b'"text"'),
        ("/ok-name", b"\xff\xfe{}"),
        ("/ok-name", b'{"name": "a\\u0000b"}'),
        ("/ok-name", b"[" * 5000 + b"]" * 5000),
        ("/ok-name", b'{"a": ' * 3000 + b"1" + b"}" * 3000),
        ("/" + "a" * 201, b"{}"),
        ("/nl%0A", b"{}"),
        ("/.hidden", b"{}"),
        ("/UPPER", b"{}"),
        ("/%2e%2e", b"{}"),
        ("/ok-name", b'{"steps": "not a list"}'),
    ]
    bad = []
    for path, raw in puts:
        status, body, _ = http_call("PUT", base + path, raw=raw)
        if not (
            status == 422 and isinstance(body, dict) and body.get("error_code") in (42201, 42202)
        ):
            bad.append(
                (
                    "PUT",
                    path,
                    raw[:20],
                    status,
                    body
                    if not isinstance(body, dict)
                    else {k: body.get(k) for k in ("error", "error_code")},
                )
            )
    for path in ["/nope", "/UPPER", "/" + "a" * 300, "/%2e%2e", "/nl%0A"]:
        status, body, _ = http_call("GET", base + path)
        if not (status == 404 and isinstance(body, dict) and body.get("error_code") == 40401):
            bad.append(("GET", path, status, body))
    assert not bad, bad


def test_a_java_relay_draining_the_always_mode_publishes_each_jobs_events_in_order(fresh_dsn):
    """The always mode exists for a Java relay on the shared outbox. Upstream's relay claims
    PENDING rows ORDER BY created_at, event_id; our one-statement writes insert two events
    (STEP_CHECKPOINT then COMPLETED, job_complete with final_entry) with the same
    created_at (the transaction's now()) and random event ids, so the Java relay's order
    between them is a coin toss. Per-job state order must survive that relay too."""
    from tests.integration.test_outbox_payloads import UPSTREAM_POLL

    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    try:
        for _ in range(16):
            c = claimed(store)
            store.job_complete(
                c.lease,
                result={},
                verdict="ok",
                final_entry={"name": "last", "skipped": False, "response": {}},
            )
    finally:
        store.close()
    with psycopg.connect(fresh_dsn, autocommit=True) as c:
        seq = dict(c.execute("SELECT event_id, seq FROM workflow_run_events_outbox").fetchall())
        with c.transaction():
            batch = c.execute(UPSTREAM_POLL, (1000,)).fetchall()
    per_job: dict[str, list[int]] = {}
    for event_id, _t, _payload, key, *_rest in batch:
        per_job.setdefault(key, []).append(seq[event_id])
    out_of_order = [k for k, s in per_job.items() if s != sorted(s)]
    assert not out_of_order, f"{len(out_of_order)} of {len(per_job)} jobs out of order"
