"""Kafka in production (issue #32) against real PostgreSQL and the real Tansu broker:

- the node consumes requests with a consumer session timeout a stock Apache Kafka broker
  accepts (6000 ms and more), and a shorter one is refused before anything starts;
- ``event_types = "upstream"``: the events topic carries upstream's six types only, every
  other event is on ``<events topic>.extended`` (created at start), nothing lost;
- the Schema Registry failure policy: ``halt`` leaves rows PENDING (and unclaimed) while the
  registry is down and publishes with its id once it is back; ``fallback-id-0`` publishes
  with schema id 0; a registered schema whose first message is not ``WorkflowRunEvent``
  refuses the start.
"""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest

from protomolt_jobs.app import JobsApp, Lanes
from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.kafka.framing import unframe
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.topics import ensure_topics
from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, WorkflowRunRequest
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.integration.test_role import boot, wait_for
from tests.support.broker import Broker
from tests.support.factories import new_job
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.kafka import TopicReader, create_topic, partitions_of, produce, unique_topic
from tests.support.roles import MemoryRepository
from tests.support.schema_registry import OTHER_PROTO, StubRegistry

#: Jobs of this queue are driven by the test through the store; no worker serves it.
HELD = "held"


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


@pytest.fixture
def own_broker():
    """A broker of this test's own: a consumer group must not share the session broker
    (Tansu wedges a group whose member leaves mid-join, LIBRARIES.md section 1)."""
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


def node_config(tmp_path, dsn: str, jobs: str, tables: str = "") -> NodeConfig:
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["registry", "jobs"]\ndata_dir = "data"\n'
        f'[jobs]\ndsn = "{dsn}"\nworker_count = 2\nlease_seconds = 10\npoll_interval_ms = 200\n'
        "sweep_interval_ms = 500\nshutdown_grace_seconds = 2\npool_max_size = 4\n"
        f"{jobs}\n{tables}"
    )
    return NodeConfig.load(path, environ={})


def request(job_id: str) -> bytes:
    msg = WorkflowRunRequest(job_id=job_id, workflow_name="seed-review")
    msg.input.update({"text": "hello brave new world"})
    return msg.SerializeToString()


def outbox(dsn: str) -> list[tuple[str, str, str, int]]:
    """``(event_id, kafka_key, status, type number)`` of every outbox row, in order (the type
    from ``event_type``: rows written as columns have no payload until the relay reads them)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT event_id::text, kafka_key, status, event_type FROM workflow_run_events_outbox "
            "ORDER BY seq"
        ).fetchall()
    return [(e, k, s, EventType.Value(f"TYPE_{t}")) for e, k, s, t in rows]


def drain(relay: Relay, dsn: str) -> None:
    """Run relay passes until no row is PENDING."""
    wait_for(
        lambda: relay.run_once() >= 0 and all(s != "PENDING" for _e, _k, s, _t in outbox(dsn)),
        60,
        "the relay to publish every outbox row",
    )


# --------------------------------------------------------------------------- item 2


def test_the_node_consumes_requests_with_a_stock_brokers_session_timeout(
    tmp_path, fresh_dsn, own_broker, services
):
    events, requests = unique_topic("events"), unique_topic("requests")
    jobs = (
        f'kafka_bootstrap = "{own_broker.bootstrap}"\n'
        f'events_topic = "{events}"\nrequest_topic = "{requests}"'
    )
    # A session timeout under group.min.session.timeout.ms is refused at load, naming the bound.
    with pytest.raises(ConfigError, match=r"session\.timeout\.ms must be an integer from 6000"):
        node_config(tmp_path, fresh_dsn, jobs, '[jobs.kafka.consumer]\n"session.timeout.ms" = 1000')

    config = node_config(
        tmp_path,
        fresh_dsn,
        jobs,
        '[jobs.kafka.consumer]\n"session.timeout.ms" = 6000\n"heartbeat.interval.ms" = 1000\n'
        '[jobs.kafka.producer]\n"compression.type" = "lz4"',
    )
    repo = MemoryRepository({"seed-review": seed_workflow(services.target, review="invoke")})
    node = boot(config, repo)
    node.start()
    try:
        app = node.mount("jobs").app
        assert app.request_consumer.settings["session.timeout.ms"] == 6000
        assert app.relay.settings["compression.type"] == "lz4"
        store = app.store
        job_id = str(uuid.uuid4())
        produce(own_broker.bootstrap, requests, request(job_id), key=job_id)
        job = wait_for(
            lambda: (j := store.job_get(job_id)) is not None and j.status == "COMPLETED" and j,
            90,
            "the request's job to complete",
        )
        assert job.workflow_name == "seed-review"
        wait_for(
            lambda: {r.status for r in store.outbox_for_job(job_id)} == {"PUBLISHED"},
            30,
            "the job's events to be published",
        )
    finally:
        node.close()


# --------------------------------------------------------------------------- item 3


def _extended_histories(store: JobStore) -> dict[str, list[str]]:
    """Cancel, pause, resume, requeue and recovery runs, written by the store's own verbs'
    statements; returns job id -> what was done."""
    done: dict[str, list[str]] = {}

    # pause, resume, cancel a queued run: PAUSED (8), RESUMED (9), CANCELLED (7)
    paused = store.job_insert(new_job(queue=HELD)).job
    assert store.job_pause(paused.job_id, actor="alice").changed
    assert store.job_resume(paused.job_id, actor="alice", reason="go on").changed
    assert store.job_cancel(paused.job_id, actor="alice", reason="not needed").changed
    done[str(paused.job_id)] = ["pause", "resume", "cancel"]

    # a recovery run: a checkpoint (2), RECOVERY_REQUIRED (12), then cancelled (7)
    recovery = store.job_insert(new_job(queue=HELD)).job
    claimed = store.job_claim("kafka-test", 60.0, queues=[HELD])
    assert claimed is not None and claimed.job_id == recovery.job_id
    store.job_checkpoint(claimed.lease, {"name": "a", "skipped": False, "response": {}})
    store.job_recovery_required(claimed.lease, "charge", "no probe could tell")
    assert store.job_cancel(recovery.job_id, actor="bob").changed
    done[str(recovery.job_id)] = ["checkpoint", "recovery-required", "cancel"]

    # a cancel asked of a RUNNING run: CONTROL_REQUESTED (11)
    running = store.job_insert(new_job(queue=HELD)).job
    claimed = store.job_claim("kafka-test", 60.0, queues=[HELD])
    assert claimed is not None and claimed.job_id == running.job_id
    assert store.job_cancel(running.job_id, actor="carol").status == "RUNNING"
    done[str(running.job_id)] = ["cancel-requested"]

    # a failed run requeued: FAILED (5), REQUEUED (10), then cancelled (7)
    failed = store.job_insert(new_job(queue=HELD)).job
    claimed = store.job_claim("kafka-test", 60.0, queues=[HELD])
    assert claimed is not None and claimed.job_id == failed.job_id
    store.job_fail(claimed.lease, "GRPC: gRPC INTERNAL from t: boom", "a")
    assert store.job_requeue(failed.job_id, actor="dave").changed
    assert store.job_cancel(failed.job_id, actor="dave").changed
    done[str(failed.job_id)] = ["fail", "requeue", "cancel"]
    return done


def test_upstream_event_types_keep_the_events_topic_to_upstreams_six_types(
    fresh_dsn, broker, store
):
    events = unique_topic("ev")
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=events,
        request_topic=unique_topic("rq"),
        event_types="upstream",
        topic_partitions=3,
    )
    # Created at start like the others (3 partitions: the broker's auto-creation gives 4).
    ensure_topics(config)
    assert partitions_of(broker.bootstrap, f"{events}.extended") == [0, 1, 2]

    histories = _extended_histories(store)
    drain(Relay(store, config=config), fresh_dsn)
    rows = outbox(fresh_dsn)
    assert {t for *_r, t in rows} == set(range(1, 13)) - {3, 4, 6}  # every extended type
    assert {k for _e, k, _s, _t in rows} == set(histories)
    expected = {
        "main": {e for e, _k, _s, t in rows if t <= 6},
        "extended": {e for e, _k, _s, t in rows if t > 6},
    }
    assert all(s == "PUBLISHED" for _e, _k, s, _t in rows)

    got: dict[str, dict[str, tuple[int, str]]] = {}
    for name, topic in (("main", events), ("extended", f"{events}.extended")):
        wanted = len(expected[name])
        with TopicReader(broker.bootstrap, topic) as reader:
            records = reader.read_until(lambda rs, n=wanted: len({r.value for r in rs}) >= n)
        got[name] = {}
        for rec in records:
            schema_id, path, body = unframe(rec.value)
            assert (schema_id, path) == (0, [0])  # same framing on both topics
            event = WorkflowRunEvent.FromString(body)
            assert rec.key == event.job_id  # same key
            got[name][event.event_id] = (event.type, rec.key)
    # No record on the events topic has a type above 6, and each extended event is on the
    # second topic: together they are exactly the outbox, nothing lost, nothing twice.
    assert max(t for t, _k in got["main"].values()) <= 6
    assert min(t for t, _k in got["extended"].values()) > 6
    assert set(got["main"]) == expected["main"]
    assert set(got["extended"]) == expected["extended"]


# --------------------------------------------------------------------------- item 4


def _claimed_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM workflow_run_events_outbox WHERE claimed_until IS NOT NULL"
        ).fetchone()[0]


def _schema_ids(bootstrap: str, topic: str, n: int) -> set[int]:
    with TopicReader(bootstrap, topic) as reader:
        records = reader.read_until(lambda rs: len({r.value for r in rs}) >= n)
    return {unframe(r.value)[0] for r in records}


def test_registry_down_under_halt_rows_stay_pending_and_publish_once_it_is_back(
    fresh_dsn, broker, store, caplog
):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    registry = StubRegistry()
    port, url = registry.port, registry.url
    registry.stop()  # the registry is down
    for _ in range(3):
        store.job_insert(new_job())
    relay = Relay(
        store,
        config=JobsConfig(
            dsn=fresh_dsn,
            kafka_bootstrap=broker.bootstrap,
            events_topic=topic,
            schema_registry_url=url,
        ),
    )
    caplog.set_level(logging.WARNING, logger="protomolt_jobs.relay")
    for _ in range(3):
        assert relay.run_once() == 0
        assert relay.lane_trouble
    assert [s for _e, _k, s, _t in outbox(fresh_dsn)] == ["PENDING"] * 3
    assert _claimed_rows(fresh_dsn) == 0  # not even claimed: publishable the moment it is back
    assert [getattr(r, "action", None) for r in caplog.records].count("relay_registry_failed") == 3

    with StubRegistry(port) as back:
        back.register(f"{topic}-value", 42)
        assert relay.run_once() == 3
    assert _schema_ids(broker.bootstrap, topic, 3) == {42}
    relay.stop()


def test_registry_down_under_fallback_id_0_publishes_with_schema_id_0(fresh_dsn, broker, store):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    with StubRegistry() as registry:
        url = registry.url
    for _ in range(3):
        store.job_insert(new_job())
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
    assert relay.run_once() == 3
    assert [s for _e, _k, s, _t in outbox(fresh_dsn)] == ["PUBLISHED"] * 3
    assert _schema_ids(broker.bootstrap, topic, 3) == {0}
    relay.stop()


@pytest.mark.parametrize("policy", ["halt", "fallback-id-0"])
def test_a_registered_schema_whose_first_message_is_another_refuses_the_start(
    fresh_dsn, broker, policy
):
    topic = unique_topic("ev")
    with StubRegistry() as registry:
        registry.register(f"{topic}-value", 7, OTHER_PROTO)
        config = JobsConfig(
            dsn=fresh_dsn,
            kafka_bootstrap=broker.bootstrap,
            events_topic=topic,
            request_topic=unique_topic("rq"),
            schema_registry_url=registry.url,
            registry_failure=policy,
        )
        app = JobsApp.open(
            config, runtime=Runtime(), lanes=Lanes(request_consumer=False, pruner=False)
        )
        with pytest.raises(ConfigError, match="first message of schema id 7") as info:
            app.start()
    assert "WorkflowRunRequest, not ai.pipestream.proto.jobs.v1.WorkflowRunEvent" in str(info.value)
    assert app.close()  # already closed by the failed start; nothing left running
