"""Parked completions: the gate under the row lock, idempotency, wrong states."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from protomolt_jobs.errors import NotFound
from protomolt_jobs.kafka.wire import WorkflowRunEvent
from protomolt_jobs.store import AlreadyDone, JobStore, ParkedStepCompleted, WrongState
from tests.support.factories import claimed_job, dead_job, parked_job, queued_job


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=6)
    try:
        yield s
    finally:
        s.close()


def entry(step: str = "approve") -> dict:
    return {"name": step, "skipped": False, "response": {"approved": True}}


def lock_waiters(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()[0]


def test_completion_appends_requeues_and_writes_its_event(store):
    job = parked_job(store, max_attempts=2)
    assert job.attempt == 1
    assert store.job_complete_parked(job.job_id, "approve", entry()) == ParkedStepCompleted()
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step, row.attempt) == ("QUEUED", None, 0)
    assert [c["name"] for c in row.checkpoints] == ["first", "approve"]
    assert row.checkpoints[-1] == entry()
    last = store.outbox_for_job(job.job_id)[-1]
    msg = WorkflowRunEvent.FromString(last.payload)
    assert (last.event_type, msg.step, msg.detail["status"]) == (
        "STEP_CHECKPOINT",
        "approve",
        "QUEUED",
    )
    resumed = store.job_claim("w", 60)
    assert resumed.job_id == job.job_id and resumed.attempt == 1 <= resumed.max_attempts


def test_two_concurrent_completions_one_completes_one_is_already_done(store, fresh_dsn):
    job = parked_job(store)
    outcomes: list = []
    errors: list[BaseException] = []

    def complete() -> None:
        try:
            outcomes.append(store.job_complete_parked(job.job_id, "approve", entry()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # hold the row lock so both completions are provably waiting on it at once
    with psycopg.connect(fresh_dsn) as holder:
        holder.execute(
            "SELECT 1 FROM workflow_run WHERE job_id = %(id)s FOR UPDATE", {"id": job.job_id}
        )
        threads = [threading.Thread(target=complete) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while lock_waiters(fresh_dsn) < 2:
            assert time.monotonic() < deadline, "the completions never queued on the row lock"
            time.sleep(0.02)
        holder.rollback()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(type(o).__name__ for o in outcomes) == ["AlreadyDone", "ParkedStepCompleted"]
    assert AlreadyDone("QUEUED") in outcomes
    row = store.job_get(job.job_id)
    assert [c["name"] for c in row.checkpoints] == ["first", "approve"]
    assert [r.event_type for r in store.outbox_for_job(job.job_id)].count("STEP_CHECKPOINT") == 2


def test_redelivery_after_resume_is_already_done(store):
    job = parked_job(store)
    store.job_complete_parked(job.job_id, "approve", entry())
    claimed = store.job_claim("w", 60)
    store.job_complete(claimed.lease, {"ok": True}, "2 steps, output t.v1.O")
    assert store.job_complete_parked(job.job_id, "approve", entry()) == AlreadyDone("COMPLETED")
    # a step checkpointed by the worker is also "already done"
    assert store.job_complete_parked(job.job_id, "first", entry("first")) == AlreadyDone(
        "COMPLETED"
    )


def test_other_step_or_not_waiting_is_wrong_state(store):
    job = parked_job(store)
    assert store.job_complete_parked(job.job_id, "other", entry("other")) == WrongState(
        "WAITING", "approve"
    )
    queued = queued_job(store)
    assert store.job_complete_parked(queued.job_id, "approve", entry()) == WrongState(
        "QUEUED", None
    )
    running = store.job_claim("w", 60)
    assert store.job_fail_parked(running.job_id, "approve", "VALIDATION: x") == WrongState(
        "RUNNING", None
    )
    store.job_dead(running.lease, "GRPC: gone")
    assert store.job_complete_parked(running.job_id, "approve", entry()) == WrongState("DEAD", None)
    # nothing changed for the parked job
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step, len(row.checkpoints)) == ("WAITING", "approve", 1)


def test_unknown_job_is_not_found(store):
    with pytest.raises(NotFound, match="workflow run not found"):
        store.job_complete_parked(uuid.uuid4(), "approve", entry())
    with pytest.raises(NotFound):
        store.job_fail_parked(str(uuid.uuid4()), "approve", "VALIDATION: x")


def test_fail_parked_is_a_verdict(store):
    job = parked_job(store)
    assert (
        store.job_fail_parked(job.job_id, "approve", "VALIDATION: approved: required")
        == ParkedStepCompleted()
    )
    row = store.job_get(job.job_id)
    assert (row.status, row.error, row.outstanding_step) == (
        "FAILED",
        "VALIDATION: approved: required",
        None,
    )
    assert row.completed_at is not None
    msg = WorkflowRunEvent.FromString(store.outbox_for_job(job.job_id)[-1].payload)
    assert (msg.type, msg.step, msg.error, msg.detail["status"]) == (
        5,
        "approve",
        "VALIDATION: approved: required",
        "FAILED",
    )
    assert store.job_complete_parked(job.job_id, "approve", entry()) == WrongState("FAILED", None)


def test_entry_must_name_the_step(store):
    job = parked_job(store)
    with pytest.raises(ValueError, match="entry.name"):
        store.job_complete_parked(job.job_id, "approve", entry("first"))
    with pytest.raises(ValueError, match="job_id"):
        store.job_complete_parked("not-a-uuid", "approve", entry())
    assert store.job_get(job.job_id).status == "WAITING"


def test_factories_reach_their_states(store):
    assert dead_job(store).status == "DEAD"
    assert claimed_job(store).status == "RUNNING"
