"""Insert, reads, listing, NOTIFY, rejects and error translation."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from protomolt_jobs.errors import StoreError
from protomolt_jobs.kafka.wire import WorkflowRunEvent, validate_event
from protomolt_jobs.store import JobStore, NewJob
from tests.support.factories import new_job, queued_job


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def q(dsn: str, sql: str, params: dict | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_insert_is_idempotent_on_job_id(store):
    new = new_job(input={"text": "one"})
    first = store.job_insert(new)
    assert first.created and first.job.status == "QUEUED" and first.job.attempt == 0
    assert first.job.input == {"text": "one"}
    assert first.job.workflow_definition == new.workflow_definition
    again = store.job_insert(NewJob(new.job_id, "other", {"name": "other"}, {"text": "two"}))
    assert not again.created
    assert again.job == store.job_get(new.job_id)
    assert again.job.input == {"text": "one"} and again.job.workflow_name == new.workflow_name
    rows = store.outbox_for_job(new.job_id)
    assert [r.event_type for r in rows] == ["ACCEPTED"]
    msg = WorkflowRunEvent.FromString(rows[0].payload)
    assert (msg.attempt, msg.detail["status"], msg.workflow_name) == (
        0,
        "QUEUED",
        new.workflow_name,
    )
    assert validate_event(msg) == []


def test_fail_at_birth_inserts_a_failed_row_with_a_failed_event(store):
    new = new_job(status="FAILED", error="No stored workflow named 'nope'", workflow_name="nope")
    out = store.job_insert(new)
    assert out.created and out.job.status == "FAILED" and out.job.completed_at is not None
    msg = WorkflowRunEvent.FromString(store.outbox_for_job(new.job_id)[0].payload)
    assert (msg.type, msg.error, msg.detail["status"]) == (
        5,
        "No stored workflow named 'nope'",
        "FAILED",
    )
    assert store.job_claim("w", 60) is None


def test_insert_refuses_bad_jobs(store):
    with pytest.raises(ValueError, match="status"):
        store.job_insert(new_job(status="RUNNING"))
    with pytest.raises(ValueError, match="error"):
        store.job_insert(new_job(status="FAILED"))
    with pytest.raises(ValueError, match="job_id"):
        store.job_insert(new_job(job_id="nope"))
    with pytest.raises(ValueError, match="max_attempts"):
        store.job_insert(new_job(max_attempts=0))
    with pytest.raises(TypeError, match="input"):
        store.job_insert(new_job(input=[1, 2]))
    with pytest.raises(ValueError, match="workflow_definition"):
        store.job_insert(new_job(workflow_definition={"x": object()}))


def test_get_of_an_unknown_id_is_none(store):
    assert store.job_get(uuid.uuid4()) is None
    assert store.job_get(str(uuid.uuid4())) is None
    with pytest.raises(ValueError, match="job_id"):
        store.job_get("not-a-uuid")


def test_list_is_newest_first_filtered_and_clamped(store, fresh_dsn):
    q(
        fresh_dsn,
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
        " created_at) SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END,"
        " '{}', '{}', CASE WHEN i % 3 = 0 THEN 'COMPLETED' ELSE 'QUEUED' END,"
        " now() - make_interval(secs => i) FROM generate_series(1, 600) AS i",
    )
    page = store.job_list()
    assert len(page) == 50
    assert [j.created_at for j in page] == sorted((j.created_at for j in page), reverse=True)
    assert len(store.job_list(limit=0)) == 50
    assert len(store.job_list(limit=1000)) == 500
    assert len(store.job_list(limit=7)) == 7
    everything = store.job_list(limit=500) + store.job_list(limit=500, offset=500)
    assert len({j.job_id for j in everything}) == 600
    assert store.job_list(limit=10, offset=5) == store.job_list(limit=15)[5:]
    completed = store.job_list(status="COMPLETED", limit=500)
    assert len(completed) == 200 and {j.status for j in completed} == {"COMPLETED"}
    even_queued = store.job_list(status="QUEUED", workflow_name="even", limit=500)
    assert len(even_queued) == 200
    assert {(j.status, j.workflow_name) for j in even_queued} == {("QUEUED", "even")}
    assert store.job_list(workflow_name="nobody") == []
    with pytest.raises(ValueError, match="offset"):
        store.job_list(offset=-1)
    with pytest.raises(ValueError, match="limit"):
        store.job_list(limit=-5)
    with pytest.raises(ValueError, match="status"):
        store.job_list(status="SLEEPING")


def test_insert_retry_release_and_requeue_notify_listeners(store, fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as listener:
        listener.execute("LISTEN protomolt_jobs")

        def notified() -> int:
            return sum(1 for _ in listener.notifies(timeout=0.5, stop_after=None))

        job = queued_job(store)
        assert notified() == 1
        lease = store.job_claim("w", 60).lease
        assert notified() == 0  # a claim wakes nobody
        store.job_retry(lease, 0, "GRPC: transient")
        assert notified() == 1
        lease = store.job_claim("w", 60).lease
        store.job_release(lease)
        assert notified() == 1
        lease = store.job_claim("w", 60).lease
        store.job_park(lease, "approve")
        assert notified() == 0
        store.job_complete_parked(job.job_id, "approve", {"name": "approve", "skipped": False})
        assert notified() == 1
        store.job_claim("w", 60)
        q(fresh_dsn, "UPDATE workflow_run SET lease_until = now() - interval '1 s'")
        store.job_sweep_expired()
        assert notified() == 1
        # a rolled-back insert notifies nobody
        with pytest.raises(ValueError):
            store.job_insert(new_job(status="RUNNING"))
        assert notified() == 0


def test_reject_insert_keeps_the_record(store, fresh_dsn):
    rid = store.reject_insert(b"\x00\xffgarbage", "workflow-run-requests", 3, 42, "undecodable")
    tomb = store.reject_insert(None, "workflow-run-requests", 0, 43, "tombstone")
    rows = q(
        fresh_dsn,
        'SELECT id, topic, "partition", "offset", raw, reason, received_at IS NOT NULL'
        " FROM workflow_run_rejects ORDER BY id",
    )
    assert rows == [
        (rid, "workflow-run-requests", 3, 42, b"\x00\xffgarbage", "undecodable", True),
        (tomb, "workflow-run-requests", 0, 43, None, "tombstone", True),
    ]
    with pytest.raises(ValueError, match="reason"):
        store.reject_insert(b"", "t", 0, 0, "")


def test_driver_errors_become_store_errors_with_the_cause(store, fresh_dsn):
    q(fresh_dsn, "DROP TABLE workflow_run_events_outbox")
    new = new_job()
    with pytest.raises(StoreError, match="job_insert failed") as info:
        store.job_insert(new)
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    assert store.job_get(new.job_id) is None  # rolled back with the failed event insert


def test_open_against_an_unreachable_database_is_a_store_error():
    with pytest.raises(StoreError, match="cannot reach the jobs database"):
        JobStore.open("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1", timeout_s=1)


def test_close_is_idempotent(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=1)
    s.close()
    s.close()
    with pytest.raises(StoreError):
        s.job_get(uuid.uuid4())


def test_a_created_records_documents_equal_a_read_of_them(store):
    # job_insert does not read them back: it hands over what it stored.
    new = new_job(
        input={"text": "x", "t": (1, 2), "big": 1e16, "k\x00": "v\ud800"},
        workflow_definition={"name": "wf", "keys": {1: "one"}, "f": 0.5, "steps": []},
    )
    created = store.job_insert(new).job
    read = store.job_get(new.job_id)
    assert created.input == read.input
    assert created.workflow_definition == read.workflow_definition
    assert created.input == {"text": "x", "t": [1, 2], "big": 10**16, "k\ufffd": "v\ufffd"}
    assert created.workflow_definition["keys"] == {"1": "one"}


@pytest.mark.parametrize(
    "value",
    [-0.0, 1e16, 1.5e-07, 1.2345678901234568e17, [-0.0, {"n": 1e16}]],
    ids=["negative-zero", "1e16", "small-exponent", "big-exponent", "nested"],
)
@pytest.mark.parametrize("scrubbed", [False, True], ids=["as-is", "scrubbed"])
def test_a_created_records_numbers_are_what_a_read_gives_in_type_and_sign(store, value, scrubbed):
    # jsonb stores numbers as numeric: -0.0 reads back 0.0 and 1e+16 an integer. The record
    # job_insert hands back (the caller's object, or its sent text decoded after a scrub)
    # must print as a read of the row prints, not only compare equal to it.
    extra = {"k\x00": "v"} if scrubbed else {}
    new = new_job(input={"v": value, **extra}, workflow_definition={"name": "wf", "d": value})
    created = store.job_insert(new).job
    read = store.job_get(new.job_id)
    assert json.dumps(created.input) == json.dumps(read.input)
    assert json.dumps(created.workflow_definition["d"]) == json.dumps(read.workflow_definition["d"])
