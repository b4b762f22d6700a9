"""Fenced writes, the sweep, events written with their change, and failure atomicity."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, validate_event
from protomolt_jobs.store import JobStore, Lease, ParkedStepCompleted, SweepResult
from tests.support.factories import claimed_job, queued_job


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


def expire(dsn: str, job_id: uuid.UUID) -> None:
    """Age a lease with SQL: the database clock decides, so move the row, not the clock."""
    q(
        dsn,
        "UPDATE workflow_run SET lease_until = now() - interval '1 s' WHERE job_id = %(id)s",
        {"id": job_id},
    )


def snapshot(dsn: str, job_id: uuid.UUID) -> tuple:
    row = q(dsn, "SELECT to_jsonb(w) FROM workflow_run w WHERE job_id = %(id)s", {"id": job_id})
    outbox = q(
        dsn,
        "SELECT event_id, event_type, status FROM workflow_run_events_outbox "
        "WHERE kafka_key = %(k)s ORDER BY seq",
        {"k": str(job_id)},
    )
    return row, outbox


def events(store: JobStore, job_id: uuid.UUID) -> list[WorkflowRunEvent]:
    out = []
    for row in store.outbox_for_job(job_id):
        msg = WorkflowRunEvent()
        msg.ParseFromString(row.payload)
        assert row.event_type == WorkflowRunEvent.Type.Name(msg.type).removeprefix("TYPE_")
        assert msg.event_id == str(row.event_id)
        out.append(msg)
    return out


def old_owner_writes(store: JobStore, lease: Lease):
    return [
        ("job_heartbeat", lambda: store.job_heartbeat(lease, 30)),
        (
            "job_checkpoint",
            lambda: store.job_checkpoint(lease, {"name": "first", "skipped": False}),
        ),
        ("job_park", lambda: store.job_park(lease, "approve")),
        ("job_complete", lambda: store.job_complete(lease, {"x": 1}, "1 steps, output t.v1.O")),
        (
            "job_complete_with_checkpoint",
            lambda: store.job_complete(
                lease, {"x": 1}, "1 steps, output t.v1.O", final_entry={"name": "first"}
            ),
        ),
        ("job_fail", lambda: store.job_fail(lease, "MAPPING: nope", "first")),
        ("job_retry", lambda: store.job_retry(lease, 1, "GRPC: transient")),
        ("job_dead", lambda: store.job_dead(lease, "GRPC: gave up")),
        ("job_release", lambda: store.job_release(lease)),
    ]


def test_after_a_sweep_every_old_owner_write_is_lease_lost_and_changes_nothing(store, fresh_dsn):
    old = claimed_job(store, worker_id="old-owner")
    expire(fresh_dsn, old.job_id)
    assert store.job_sweep_expired().requeued == 1
    new = store.job_claim("new-owner", 60)
    assert new.job_id == old.job_id and new.attempt == 2

    before = snapshot(fresh_dsn, old.job_id)
    for operation, write in old_owner_writes(store, old.lease):
        with pytest.raises(LeaseLost) as info:
            write()
        assert info.value.operation == operation
        assert (info.value.owner, info.value.attempt) == ("old-owner", 1)
        assert snapshot(fresh_dsn, old.job_id) == before, operation

    # the new owner's fence holds
    store.job_heartbeat(new.lease, 60)
    store.job_checkpoint(new.lease, {"name": "first", "skipped": False, "response": {"a": 1}})
    store.job_complete(new.lease, {"out": 1}, "1 steps, output t.v1.O")
    done = store.job_get(new.job_id)
    assert done.status == "COMPLETED" and done.result == {"out": 1}
    assert [e.type for e in events(store, new.job_id)] == [1, 2, 4]


def test_a_requeued_lease_is_lost_even_before_anyone_reclaims(store, fresh_dsn):
    job = claimed_job(store)
    expire(fresh_dsn, job.job_id)
    store.job_sweep_expired()
    with pytest.raises(LeaseLost):
        store.job_checkpoint(job.lease, {"name": "first", "skipped": False})
    assert store.outbox_for_job(job.job_id)[-1].event_type == "ACCEPTED"


def test_same_owner_same_attempt_after_reclaim_by_itself_is_still_fenced(store, fresh_dsn):
    # the same worker id reclaiming bumps the attempt, so its stale lease object is dead
    first = claimed_job(store, worker_id="w")
    expire(fresh_dsn, first.job_id)
    store.job_sweep_expired()
    second = store.job_claim("w", 60)
    assert second.attempt == 2
    with pytest.raises(LeaseLost):
        store.job_heartbeat(first.lease, 60)
    store.job_heartbeat(second.lease, 60)


def sweep_until_requeued(store: JobStore, timeout_s: float = 10.0) -> None:
    """Poll the sweep until a lease has expired by the database clock and was requeued."""
    deadline = time.monotonic() + timeout_s
    while store.job_sweep_expired().requeued == 0:
        assert time.monotonic() < deadline, "the short lease never expired"
        time.sleep(0.05)


def test_a_lease_handed_out_again_with_the_same_attempt_is_still_fenced_by_its_token(
    store, fresh_dsn
):
    # The repro: a completed parked step resets attempt to 0, so A's second claim carries the
    # same (job_id, owner, attempt) as its first; only the token tells them apart.
    job = queued_job(store)
    a1 = store.job_claim("worker-A", 0.3)
    assert a1.job_id == job.job_id and a1.attempt == 1
    sweep_until_requeued(store)
    b = store.job_claim("worker-B", 60)
    assert b.job_id == job.job_id and b.attempt == 2
    store.job_checkpoint(b.lease, {"name": "first", "skipped": False, "response": {}})
    store.job_park(b.lease, "approve")
    done = store.job_complete_parked(job.job_id, "approve", {"name": "approve", "skipped": False})
    assert isinstance(done, ParkedStepCompleted)
    assert store.job_get(job.job_id).attempt == 0
    a2 = store.job_claim("worker-A", 60)
    assert (a2.lease.job_id, a2.lease.owner, a2.lease.attempt) == (job.job_id, "worker-A", 1)
    assert (a1.lease.job_id, a1.lease.owner, a1.lease.attempt) == (job.job_id, "worker-A", 1)
    assert a2.lease != a1.lease and a2.lease.token != a1.lease.token

    before = snapshot(fresh_dsn, job.job_id)
    with pytest.raises(LeaseLost):
        store.job_checkpoint(a1.lease, {"name": "review", "skipped": False, "response": {}})
    with pytest.raises(LeaseLost):
        store.job_complete(a1.lease, {"stale": True}, "stale verdict")
    for operation, write in old_owner_writes(store, a1.lease):
        with pytest.raises(LeaseLost):
            write()
        assert snapshot(fresh_dsn, job.job_id) == before, operation
    assert snapshot(fresh_dsn, job.job_id) == before

    store.job_complete(a2.lease, {"out": 1}, "2 steps, output t.v1.O")
    assert store.job_get(job.job_id).result == {"out": 1}


def test_a_released_lease_is_dead_although_the_next_claim_repeats_its_attempt(store, fresh_dsn):
    first = claimed_job(store, worker_id="w")
    store.job_release(first.lease)
    second = store.job_claim("w", 60)
    assert (second.attempt, second.lease_owner) == (first.attempt, first.lease_owner)
    before = snapshot(fresh_dsn, first.job_id)
    with pytest.raises(LeaseLost):
        store.job_heartbeat(first.lease, 60)
    with pytest.raises(LeaseLost):
        store.job_fail(first.lease, "MAPPING: stale")
    assert snapshot(fresh_dsn, first.job_id) == before
    store.job_heartbeat(second.lease, 60)


def test_the_lease_token_is_stamped_by_the_claim_and_cleared_with_the_lease(store, fresh_dsn):
    job = claimed_job(store)
    assert isinstance(job.lease_token, uuid.UUID) and job.lease.token == job.lease_token
    tokens = q(
        fresh_dsn, "SELECT lease_token FROM workflow_run WHERE job_id = %(id)s", {"id": job.job_id}
    )
    assert tokens == [(job.lease_token,)]
    store.job_park(job.lease, "approve")
    parked = store.job_get(job.job_id)
    assert parked.lease_token is None
    with pytest.raises(ValueError, match="no lease"):
        _ = parked.lease


def test_each_fenced_write_sets_the_row_and_writes_its_event(store, fresh_dsn):
    job = claimed_job(store)
    until = store.job_heartbeat(job.lease, 600)
    assert (until - store.job_get(job.job_id).updated_at).total_seconds() == pytest.approx(600)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": True})
    store.job_park(job.lease, "approve")
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step, row.lease_owner, row.lease_until) == (
        "WAITING",
        "approve",
        None,
        None,
    )
    assert row.checkpoints == [{"name": "first", "skipped": True}]
    evs = events(store, job.job_id)
    assert [(e.type, e.step, e.detail["status"], e.attempt) for e in evs] == [
        (1, "", "QUEUED", 0),
        (2, "first", "RUNNING", 1),
        (3, "approve", "WAITING", 1),
    ]
    # occurred_at is the transaction's now(): the row's updated_at of that change
    assert evs[-1].occurred_at.ToDatetime().replace(tzinfo=row.updated_at.tzinfo) == row.updated_at
    assert all(validate_event(e) == [] for e in evs)


def test_fail_dead_retry_release_shape_the_row(store, fresh_dsn):
    failed = claimed_job(store)
    store.job_fail(failed.lease, "VALIDATION: " + "x" * 5000, step="first")
    row = store.job_get(failed.job_id)
    assert row.status == "FAILED" and row.completed_at is not None
    assert len(row.error) == 5012  # the row keeps the error whole
    ev = events(store, failed.job_id)[-1]
    assert (ev.type, ev.step, len(ev.error), ev.detail["status"]) == (5, "first", 4000, "FAILED")

    dead = claimed_job(store)
    store.job_dead(dead.lease, "GRPC: gRPC UNAVAILABLE from x")
    assert store.job_get(dead.job_id).status == "DEAD"
    assert events(store, dead.job_id)[-1].type == 6

    retried = claimed_job(store)
    run_after = store.job_retry(retried.lease, 30, "GRPC: transient")
    row = store.job_get(retried.job_id)
    assert (row.status, row.attempt, row.error, row.lease_owner) == (
        "QUEUED",
        1,
        "GRPC: transient",
        None,
    )
    assert (run_after - row.updated_at).total_seconds() == pytest.approx(30)
    assert [r.event_type for r in store.outbox_for_job(retried.job_id)] == ["ACCEPTED"]

    released = queued_job(store)
    q(
        fresh_dsn,
        "UPDATE workflow_run SET run_after = now() + interval '1 day' WHERE job_id = %(id)s",
        {"id": retried.job_id},
    )
    lease = store.job_claim("w", 60).lease
    assert lease.job_id == released.job_id
    store.job_release(lease)
    row = store.job_get(released.job_id)
    assert (row.status, row.attempt, row.lease_owner) == ("QUEUED", 0, None)
    assert store.job_claim("w", 60).attempt == 1


def test_sweep_below_the_ceiling_requeues_without_an_event(store, fresh_dsn):
    job = claimed_job(store, max_attempts=3)
    expire(fresh_dsn, job.job_id)
    live = claimed_job(store)  # a live lease is left alone
    result = store.job_sweep_expired()
    assert (result.requeued, result.dead) == (1, 0)
    row = store.job_get(job.job_id)
    assert (row.status, row.attempt, row.lease_owner, row.lease_until) == ("QUEUED", 1, None, None)
    assert [r.event_type for r in store.outbox_for_job(job.job_id)] == ["ACCEPTED"]
    assert store.job_get(live.job_id).status == "RUNNING"
    assert store.job_sweep_expired() == type(result)(0, 0)


def test_a_swept_job_at_its_last_attempt_is_dead_with_a_lease_expired_error(store, fresh_dsn):
    job = claimed_job(store, worker_id="crashy", max_attempts=1)
    expire(fresh_dsn, job.job_id)
    result = store.job_sweep_expired()
    assert (result.requeued, result.dead, result.dead_job_ids) == (0, 1, (job.job_id,))
    row = store.job_get(job.job_id)
    assert row.status == "DEAD" and row.completed_at is not None and row.lease_owner is None
    assert row.error.startswith("lease expired after attempt 1 of 1 (worker crashy stopped")
    ev = events(store, job.job_id)[-1]
    assert (ev.type, ev.error, ev.detail["status"], ev.attempt) == (6, row.error, "DEAD", 1)
    assert validate_event(ev) == []


def test_a_crash_loop_ends_dead_after_max_attempts(store, fresh_dsn):
    job = queued_job(store, max_attempts=3)
    for attempt in (1, 2, 3):
        claimed = store.job_claim(f"w{attempt}", 60)
        assert claimed.attempt == attempt
        expire(fresh_dsn, job.job_id)
        store.job_sweep_expired()
    row = store.job_get(job.job_id)
    assert row.status == "DEAD" and "after attempt 3 of 3 (worker w3" in row.error
    assert store.job_claim("w", 60) is None


def test_sweep_works_in_batches_and_one_call_drains_a_backlog_up_to_max_batches(store, fresh_dsn):
    live = [claimed_job(store) for _ in range(4)]
    doomed = [claimed_job(store, max_attempts=1) for _ in range(3)]
    q(fresh_dsn, "UPDATE workflow_run SET lease_until = now() - interval '1 s'")

    first = store.job_sweep_expired(limit=2, max_batches=1)
    assert first.requeued + first.dead == 2
    # A backlog bigger than one batch: the call keeps going while batches come back full
    # (2, 2, then 1 row), without the caller looping.
    rest = store.job_sweep_expired(limit=2)
    assert rest.requeued + rest.dead == 5
    assert first.requeued + rest.requeued == 4
    assert set(first.dead_job_ids) | set(rest.dead_job_ids) == {j.job_id for j in doomed}
    assert {store.job_get(j.job_id).status for j in live} == {"QUEUED"}
    assert {store.job_get(j.job_id).status for j in doomed} == {"DEAD"}
    for j in doomed:
        assert [e.type for e in events(store, j.job_id)][-1] == EventType.TYPE_DEAD
    assert store.job_sweep_expired(limit=2) == SweepResult()


def test_the_sweep_stops_after_max_batches(store, fresh_dsn):
    jobs = [claimed_job(store) for _ in range(5)]
    q(fresh_dsn, "UPDATE workflow_run SET lease_until = now() - interval '1 s'")
    assert store.job_sweep_expired(limit=1, max_batches=3).requeued == 3
    assert store.job_sweep_expired(limit=1, max_batches=3).requeued == 2
    assert {store.job_get(j.job_id).status for j in jobs} == {"QUEUED"}
    with pytest.raises(ValueError, match="max_batches"):
        store.job_sweep_expired(max_batches=0)


def test_failure_after_the_mutation_leaves_neither_change_nor_event(store, fresh_dsn):
    """Each fenced write and the insert are one statement (the row change and its outbox rows
    in one data-modifying CTE, issue 14): an outbox insert that fails inside it leaves neither
    the change nor an event."""
    job = claimed_job(store)
    before = snapshot(fresh_dsn, job.job_id)
    q(
        fresh_dsn,
        "ALTER TABLE workflow_run_events_outbox ADD CONSTRAINT crash_point CHECK (false) NOT VALID",
    )
    for write in (
        lambda: store.job_checkpoint(job.lease, {"name": "first", "skipped": False}),
        lambda: store.job_park(job.lease, "approve"),
        lambda: store.job_complete(job.lease, {"x": 1}, "done"),
        lambda: store.job_complete(
            job.lease, {"x": 1}, "done", final_entry={"name": "last", "skipped": False}
        ),
        lambda: store.job_fail(job.lease, "boom"),
        lambda: store.job_dead(job.lease, "boom"),
    ):
        with pytest.raises(StoreError) as info:
            write()
        assert isinstance(info.value.__cause__, psycopg.errors.CheckViolation)
        assert snapshot(fresh_dsn, job.job_id) == before

    # an insert rolls back too: no row, no ACCEPTED event
    from tests.support.factories import new_job

    new = new_job()
    with pytest.raises(StoreError):
        store.job_insert(new)
    assert store.job_get(new.job_id) is None
    assert store.outbox_for_job(new.job_id) == []

    q(fresh_dsn, "ALTER TABLE workflow_run_events_outbox DROP CONSTRAINT crash_point")
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False})
    assert [r.event_type for r in store.outbox_for_job(job.job_id)] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
    ]


def test_a_failing_outbox_insert_rolls_the_job_change_back(store, fresh_dsn):
    job = claimed_job(store)
    q(
        fresh_dsn,
        "ALTER TABLE workflow_run_events_outbox ADD CONSTRAINT no_more CHECK (false) NOT VALID",
    )
    with pytest.raises(StoreError, match="job_complete failed") as info:
        store.job_complete(job.lease, {"x": 1}, "done")
    assert isinstance(info.value.__cause__, psycopg.errors.CheckViolation)
    assert store.job_get(job.job_id).status == "RUNNING"


def test_fenced_writes_refuse_bad_arguments(store):
    job = claimed_job(store)
    with pytest.raises(ValueError, match="verdict"):
        store.job_complete(job.lease, {}, "  ")
    with pytest.raises(TypeError, match="result"):
        store.job_complete(job.lease, [1], "v")
    with pytest.raises(ValueError, match="result"):
        store.job_complete(job.lease, {"x": float("nan")}, "v")
    with pytest.raises(ValueError, match="entry.name"):
        store.job_checkpoint(job.lease, {"skipped": False})
    with pytest.raises(ValueError, match="error"):
        store.job_fail(job.lease, "")
    with pytest.raises(ValueError, match="backoff_s"):
        store.job_retry(job.lease, -1, "e")
    with pytest.raises(TypeError, match="lease"):
        store.job_heartbeat(("not", "a", "lease"), 10)
    assert store.job_get(job.job_id).status == "RUNNING"


def test_complete_with_a_final_entry_appends_it_and_writes_checkpoint_then_completed(
    store, fresh_dsn
):
    job = claimed_job(store)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {"a": 1}})
    store.job_complete(
        job.lease,
        {"a": 2},
        "2 steps, output t.v1.O",
        final_entry={"name": "second", "skipped": False, "response": {"a": 2}},
    )
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED" and row.result == {"a": 2}
    assert row.checkpoints == [
        {"name": "first", "skipped": False, "response": {"a": 1}},
        {"name": "second", "skipped": False, "response": {"a": 2}},
    ]
    got = events(store, job.job_id)
    assert [(EventType.Name(e.type), e.step) for e in got] == [
        ("TYPE_ACCEPTED", ""),
        ("TYPE_STEP_CHECKPOINT", "first"),
        ("TYPE_STEP_CHECKPOINT", "second"),
        ("TYPE_COMPLETED", ""),
    ]
    # The folded checkpoint's event is the one job_checkpoint writes: status RUNNING after it.
    assert got[2].detail["status"] == "RUNNING" and got[3].detail["status"] == "COMPLETED"
    assert got[2].attempt == got[1].attempt == job.attempt
    assert got[3].verdict == "2 steps, output t.v1.O"
    assert all(validate_event(e) == [] for e in got)


def test_complete_with_a_final_entry_on_a_lost_lease_changes_nothing(store, fresh_dsn):
    job = claimed_job(store)
    expire(fresh_dsn, job.job_id)
    store.job_sweep_expired()
    before = snapshot(fresh_dsn, job.job_id)
    with pytest.raises(LeaseLost):
        store.job_complete(job.lease, {"a": 1}, "v", final_entry={"name": "s", "skipped": True})
    assert snapshot(fresh_dsn, job.job_id) == before


def test_complete_refuses_a_malformed_final_entry_before_any_sql(store, fresh_dsn):
    job = claimed_job(store)
    before = snapshot(fresh_dsn, job.job_id)
    with pytest.raises(TypeError, match="entry"):
        store.job_complete(job.lease, {"a": 1}, "v", final_entry=["s"])
    with pytest.raises(ValueError, match="entry.name"):
        store.job_complete(job.lease, {"a": 1}, "v", final_entry={"name": " "})
    with pytest.raises(ValueError, match="final_entry"):
        store.job_complete(job.lease, {"a": 1}, "v", final_entry={"name": "s", "x": float("nan")})
    assert snapshot(fresh_dsn, job.job_id) == before
