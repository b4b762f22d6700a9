"""The relay against real PostgreSQL and the real Tansu broker.

Event histories are made by driving the store directly (insert, claim, checkpoint, complete):
each job yields ACCEPTED, STEP_CHECKPOINT(a), STEP_CHECKPOINT(b), COMPLETED.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import psycopg
import pytest

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.crashpoints import CRASH_EXIT_CODE
from protomolt_jobs.kafka.framing import unframe
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, validate_event
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.events import OutboxEvent, build_event
from tests.support.factories import new_job
from tests.support.kafka import TopicReader, create_topic, unique_topic, wait_for

HISTORY = ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "COMPLETED"]


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def _config(dsn, broker, topic, **kw) -> JobsConfig:
    return JobsConfig(dsn=dsn, kafka_bootstrap=broker.bootstrap, events_topic=topic, **kw)


def insert_jobs(store: JobStore, n: int) -> list[str]:
    return [str(store.job_insert(new_job()).job.job_id) for _ in range(n)]


def run_queued_jobs(store: JobStore, limit: int | None = None) -> int:
    """Claim and complete queued jobs through the store: two checkpoints, then COMPLETED."""
    done = 0
    while limit is None or done < limit:
        job = store.job_claim("relay-test", 60.0)
        if job is None:
            break
        store.job_checkpoint(job.lease, {"name": "a", "skipped": False, "response": {}})
        store.job_checkpoint(job.lease, {"name": "b", "skipped": False, "response": {}})
        store.job_complete(job.lease, {"ok": True}, "all good")
        done += 1
    return done


def topic_event(value: bytes) -> WorkflowRunEvent:
    """A record value on the events topic (Confluent-framed by default) as an event."""
    _schema_id, path, body = unframe(value)
    assert path == [0]
    return WorkflowRunEvent.FromString(body)


def outbox_counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
        ).fetchall()
    return {status: n for status, n in rows}


def outbox_ids(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {str(r[0]) for r in conn.execute("SELECT event_id FROM workflow_run_events_outbox")}


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Java's DefaultPartitioner picks for a keyed record."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    n4 = len(key) // 4
    for i in range(n4):
        k = int.from_bytes(key[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail, extra = key[n4 * 4 :], len(key) % 4
    if extra == 3:
        h ^= tail[2] << 16
    if extra >= 2:
        h ^= tail[1] << 8
    if extra >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def check_topic(records, expected_ids: set[str], partitions: int = 4) -> dict[str, list]:
    """Dedupe by event_id; every record decodes, passes its rules, sits on its key's murmur2
    partition; each job's first-seen events follow state order. Returns events per job."""
    seen: set[str] = set()
    per_job: dict[str, list[WorkflowRunEvent]] = defaultdict(list)
    job_partition: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        event = topic_event(rec.value)
        assert validate_event(event) == [], event
        assert rec.key == event.job_id
        assert job_partition.setdefault(event.job_id, rec.partition) == rec.partition
        assert rec.partition == murmur2_partition(rec.key.encode(), partitions)
        if event.event_id in seen:
            continue
        seen.add(event.event_id)
        per_job[event.job_id].append(event)
    assert seen == expected_ids, (
        f"missing {len(expected_ids - seen)}, extra {len(seen - expected_ids)}"
    )
    for job_id, events in per_job.items():
        names = [EventType.Name(e.type).removeprefix("TYPE_") for e in events]
        assert names == HISTORY[: len(names)], (job_id, names)
        stamps = [e.occurred_at.ToDatetime() for e in events]
        assert stamps == sorted(stamps), job_id
    return per_job


def test_500_jobs_every_event_published_in_state_order(fresh_dsn, store, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    jobs = insert_jobs(store, 500)
    relay = Relay(store, config=_config(fresh_dsn, broker, topic, relay_poll_interval_ms=50))
    relay.start()
    try:
        assert run_queued_jobs(store) == 500
        wait_for(lambda: outbox_counts(fresh_dsn) == {"PUBLISHED": 2000}, timeout_s=120)
    finally:
        relay.stop(timeout_s=30)
    ids = outbox_ids(fresh_dsn)
    with TopicReader(broker.bootstrap, topic) as reader:
        records = reader.read_until(lambda rs: {topic_event(r.value).event_id for r in rs} >= ids)
    per_job = check_topic(records, ids)
    assert sorted(per_job) == sorted(jobs)
    assert all(len(events) == 4 for events in per_job.values())


def test_two_relays_never_publish_the_same_row(fresh_dsn, store, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    insert_jobs(store, 150)
    run_queued_jobs(store)
    config = _config(fresh_dsn, broker, topic, relay_batch_size=20, relay_poll_interval_ms=20)
    second = JobStore.open(fresh_dsn, max_size=2)
    relays = [Relay(store, config=config), Relay(second, config=config)]
    try:
        for r in relays:
            r.start()
        wait_for(lambda: outbox_counts(fresh_dsn) == {"PUBLISHED": 600}, timeout_s=120)
    finally:
        for r in relays:
            r.stop(timeout_s=30)
        second.close()
    ids = outbox_ids(fresh_dsn)
    with TopicReader(broker.bootstrap, topic) as reader:
        records = reader.read_until(lambda rs: len(rs) >= 600)
    check_topic(records, ids)
    assert len(records) == 600  # each row exactly once: no row was published by both


_CRASHING_RELAY = """
import sys
from protomolt_jobs import crashpoints
from protomolt_jobs.kafka import relay
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.store import JobStore
dsn, bootstrap, topic = sys.argv[1:4]
store = JobStore.open(dsn, max_size=2)
crashpoints.arm("after_publish")
relay.Relay(store, config=JobsConfig(dsn=dsn, kafka_bootstrap=bootstrap, events_topic=topic)).run_once()
sys.exit(3)  # not reached: the crash point ends the process between publish and mark
"""


def test_relay_killed_between_publish_and_mark_republishes(fresh_dsn, store, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    insert_jobs(store, 30)
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_RELAY, fresh_dsn, broker.bootstrap, topic],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.decode()[-2000:]
    # published but never marked
    assert outbox_counts(fresh_dsn) == {"PENDING": 30}
    ids = outbox_ids(fresh_dsn)
    with TopicReader(broker.bootstrap, topic) as reader:
        reader.read_until(lambda rs: len(rs) >= 30)
        # The dead relay's claim lease holds the rows; let it lapse (database time, aged in SQL).
        with psycopg.connect(fresh_dsn) as conn:
            conn.execute(
                "UPDATE workflow_run_events_outbox SET claimed_until = now() - interval '1 second'"
            )
        relay = Relay(store, config=_config(fresh_dsn, broker, topic))
        assert relay.run_once() == 30
        relay.stop()
        assert outbox_counts(fresh_dsn) == {"PUBLISHED": 30}
        records = reader.read_until(lambda rs: len(rs) >= 60)
    assert len(records) == 60  # every event twice: at least once, deduped by event_id
    check_topic(records, ids)


def test_event_breaking_its_rules_is_dead_lettered_after_10_attempts(fresh_dsn, store, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    bad_job = str(uuid.uuid4())
    # A DEAD event without its error breaks terminal-carries-error (build_event refuses to
    # make one, so it is forged as another writer would); a later event of the same job waits
    # behind it; other jobs' events are not held up.
    with pytest.raises(ValueError, match="terminal-carries-error"):
        build_event(
            job_id=bad_job,
            workflow_name="wf",
            type="DEAD",
            attempt=1,
            status_after="DEAD",
            occurred_at=datetime.now(UTC),
        )
    forged = WorkflowRunEvent(
        event_id=str(uuid.uuid4()), job_id=bad_job, workflow_name="wf", type=EventType.TYPE_DEAD
    )
    forged.occurred_at.FromDatetime(datetime.now(UTC))
    bad = OutboxEvent(uuid.UUID(forged.event_id), "DEAD", forged.SerializeToString(), bad_job)
    later = build_event(
        job_id=bad_job,
        workflow_name="wf",
        type="ACCEPTED",
        attempt=0,
        status_after="QUEUED",
        occurred_at=datetime.now(UTC),
    )
    with psycopg.connect(fresh_dsn) as conn:
        for ev in (bad, later):
            conn.execute(
                "INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key)"
                " VALUES (%s, %s, %s, %s)",
                (ev.event_id, ev.event_type, ev.payload, ev.kafka_key),
            )
    others = insert_jobs(store, 5)
    relay = Relay(store, config=_config(fresh_dsn, broker, topic))
    published = relay.run_once()
    assert published == 5  # the other jobs' ACCEPTED events, in the very first pass
    for _ in range(9):
        relay.run_once()
    (row,) = [r for r in store.outbox_for_job(bad_job) if r.event_id == bad.event_id]
    assert (row.status, row.attempts) == ("FAILED", 10)
    assert row.last_error.startswith("terminal-carries-error")
    # once the bad event is dead-lettered, the job's next event flows
    assert relay.run_once() == 1
    relay.stop()
    assert {r.status for r in store.outbox_for_job(bad_job) if r.event_id == later.event_id} == {
        "PUBLISHED"
    }
    with TopicReader(broker.bootstrap, topic) as reader:
        records = reader.read_until(lambda rs: len(rs) >= 6)
    keys = {r.key for r in records}
    assert keys == set(others) | {bad_job}
    assert str(bad.event_id) not in {topic_event(r.value).event_id for r in records}


def test_a_column_row_breaking_its_rules_is_dead_lettered(fresh_dsn, store, broker):
    """A row stored as columns (migration 0005) is encoded when read and checked like any
    payload: a COMPLETED row without its verdict becomes FAILED after 10 attempts."""
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    bad_job = str(uuid.uuid4())
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(
            "INSERT INTO workflow_run_events_outbox (event_id, event_type, kafka_key,"
            " workflow_name, attempt, status_after)"
            " VALUES (gen_random_uuid(), 'COMPLETED', %s, 'wf', 1, 'COMPLETED')",
            (bad_job,),
        )
    relay = Relay(store, config=_config(fresh_dsn, broker, topic))
    for _ in range(10):
        assert relay.run_once() == 0
    relay.stop()
    (row,) = store.outbox_for_job(bad_job)
    assert (row.status, row.attempts) == ("FAILED", 10)
    assert row.last_error.startswith("completed-carries-verdict")


@pytest.mark.slow
def test_broker_paused_30s_backlog_drains_in_order(fresh_dsn, store, broker, caplog):
    caplog.set_level(logging.INFO, logger="protomolt_jobs.relay")
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    relay = Relay(
        store,
        config=_config(fresh_dsn, broker, topic, relay_poll_interval_ms=50),
        producer_config={"message.timeout.ms": 5000},
    )
    relay.start()
    stop_driving = threading.Event()
    try:
        insert_jobs(store, 20)
        wait_for(lambda: outbox_counts(fresh_dsn) == {"PUBLISHED": 20}, timeout_s=60)
        broker.pause()
        try:
            # Jobs keep changing state while the broker is away: the outbox grows.
            for _ in range(30):
                insert_jobs(store, 4)
                run_queued_jobs(store, limit=3)
                stop_driving.wait(1.0)  # pacing the scenario over ~30 s, not waiting for state
            pending = outbox_counts(fresh_dsn).get("PENDING", 0)
            assert pending >= 100, pending
        finally:
            broker.resume()
        run_queued_jobs(store)
        total = 20 * 1 + 120 * 1 + 140 * 3  # ACCEPTED for all, then 3 more for every job run
        wait_for(lambda: outbox_counts(fresh_dsn) == {"PUBLISHED": total}, timeout_s=180)
    finally:
        relay.stop(timeout_s=30)
    ids = outbox_ids(fresh_dsn)
    with TopicReader(broker.bootstrap, topic) as reader:
        records = reader.read_until(
            lambda rs: {topic_event(r.value).event_id for r in rs} >= ids,
            timeout_s=60,
        )
    per_job = check_topic(records, ids)
    assert all(len(events) == 4 for events in per_job.values())
    # the outage was seen as the lane's fault: nothing was counted against the events
    actions = {getattr(r, "action", None) for r in caplog.records}
    assert {"relay_lane_failed", "relay_producer_rebuilt"} <= actions
    with psycopg.connect(fresh_dsn) as conn:
        assert conn.execute("SELECT max(attempts) FROM workflow_run_events_outbox").fetchone() == (
            0,
        )
