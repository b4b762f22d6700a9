"""The transition log (issue 15): written by migration 0002's trigger in the statement that
changes the row, hash-chained per job, with actors from the store's queries, ``sql:<role>``
for hand-written SQL, and pending control requests honoured at the worker's boundary writes.
Real PostgreSQL."""

from __future__ import annotations

import hashlib
import json

import psycopg
import pytest

from protomolt_jobs.errors import ControlApplied
from tests.support.factories import claimed_job, queued_job
from tests.support.worker_proc import event_types


def _sql(dsn, query, *params):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).rowcount


def _kinds(history):
    return [(t.kind, t.actor, t.prev_status, t.new_status) for t in history.transitions]


def test_claim_retry_sweep_claim_are_recorded_with_their_actors(store, fresh_dsn):
    job = queued_job(store)
    first = store.job_claim("w1", 60)
    store.job_retry(first.lease, 0, "GRPC: gRPC UNAVAILABLE from x: down")
    second = store.job_claim("w2", 60)
    _sql(fresh_dsn, "UPDATE workflow_run SET lease_until = now() - interval '1 s'")
    assert store.job_sweep_expired().requeued == 1
    store.job_claim("w3", 60)
    history = store.job_history(job.job_id)
    assert history.first_bad_seq is None
    assert _kinds(history) == [
        ("submit", "api", None, "QUEUED"),
        ("claim", "worker:w1", "QUEUED", "RUNNING"),
        ("retry", "worker:w1", "RUNNING", "QUEUED"),
        ("claim", "worker:w2", "QUEUED", "RUNNING"),
        ("sweep", "sweeper", "RUNNING", "QUEUED"),
        ("claim", "worker:w3", "QUEUED", "RUNNING"),
    ]
    assert [t.seq for t in history.transitions] == [1, 2, 3, 4, 5, 6]
    assert history.transitions[2].reason.startswith("backoff 0")
    assert "GRPC: gRPC UNAVAILABLE" in history.transitions[2].reason
    assert history.transitions[4].reason == "lease of worker w2 expired"
    assert second.attempt == 2


def test_checkpoints_are_recorded_and_heartbeats_are_not(store):
    job = claimed_job(store)
    store.job_heartbeat(job.lease, 60)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    store.job_heartbeat(job.lease, 60)
    store.job_complete(
        job.lease, {"ok": True}, "2 steps", final_entry={"name": "second", "skipped": False}
    )
    history = store.job_history(job.job_id)
    assert [(t.kind, t.step, t.new_status) for t in history.transitions] == [
        ("submit", None, "QUEUED"),
        ("claim", None, "RUNNING"),
        ("checkpoint", "first", "RUNNING"),
        ("complete", "second", "COMPLETED"),
    ]
    assert history.first_bad_seq is None


def test_a_hand_written_status_change_is_recorded_as_sql(store, fresh_dsn):
    job = queued_job(store)
    claimed = store.job_claim("w1", 60)
    store.job_dead(claimed.lease, "GRPC: gave up", "embed")
    _sql(fresh_dsn, "UPDATE workflow_run SET status = 'QUEUED' WHERE job_id = %s", job.job_id)
    last = store.job_history(job.job_id).transitions[-1]
    assert (last.kind, last.actor, last.prev_status, last.new_status) == (
        "sql",
        "sql:postgres",
        "DEAD",
        "QUEUED",
    )
    dead = store.job_history(job.job_id).transitions[-2]
    assert (dead.kind, dead.step, dead.reason) == ("dead", "embed", "GRPC: gave up")
    # and the DEAD event names its step
    dead_events = [e for e in event_types(store, job.job_id) if e[0] == "DEAD"]
    assert dead_events == [("DEAD", "embed")]


def test_editing_a_history_row_makes_integrity_name_it(store, fresh_dsn):
    job = claimed_job(store)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False})
    store.job_fail(job.lease, "VALIDATION: bad", "second")
    assert store.job_history(job.job_id).first_bad_seq is None
    _sql(
        fresh_dsn,
        "UPDATE workflow_run_transition SET actor = 'someone-else' WHERE job_id = %s AND seq = 3",
        job.job_id,
    )
    assert store.job_history(job.job_id).first_bad_seq == 3


def test_deleting_history_rows_is_detected(store, fresh_dsn):
    job = claimed_job(store)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False})
    store.job_fail(job.lease, "VALIDATION: bad", "second")
    _sql(fresh_dsn, "DELETE FROM workflow_run_transition WHERE job_id = %s AND seq = 2", job.job_id)
    assert store.job_history(job.job_id).first_bad_seq == 3
    other = claimed_job(store)
    store.job_checkpoint(other.lease, {"name": "first", "skipped": False})
    _sql(
        fresh_dsn, "DELETE FROM workflow_run_transition WHERE job_id = %s AND seq = 3", other.job_id
    )
    assert store.job_history(other.job_id).first_bad_seq == 3


def test_a_resubmission_writes_no_transition(store):
    from tests.support.factories import new_job

    new = new_job()
    assert store.job_insert(new).created
    assert not store.job_insert(new).created
    history = store.job_history(new.job_id)
    assert [t.kind for t in history.transitions] == ["submit"]
    assert history.first_bad_seq is None


def test_unknown_job_has_no_history(store):
    import uuid

    assert store.job_history(uuid.uuid4()) is None


def test_a_cancel_request_is_applied_by_the_next_checkpoint(store):
    job = claimed_job(store)
    outcome = store.job_cancel(job.job_id, actor="alice", reason="not needed")
    assert (outcome.changed, outcome.status) == (True, "RUNNING")
    store.job_heartbeat(job.lease, 60)  # a heartbeat is no boundary
    assert store.job_get(job.job_id).status == "RUNNING"
    with pytest.raises(ControlApplied) as raised:
        store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    assert raised.value.status == "CANCELLED"
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED" and row.lease_owner is None and row.control is None
    assert [c["name"] for c in row.checkpoints] == ["first"]
    assert row.error == "CANCELLED by alice: not needed"
    assert event_types(store, job.job_id)[-3:] == [
        ("CONTROL_REQUESTED", ""),
        ("STEP_CHECKPOINT", "first"),
        ("CANCELLED", "first"),
    ]
    last = store.job_history(job.job_id).transitions[-1]
    assert (last.kind, last.actor, last.reason, last.step) == (
        "cancel",
        "alice",
        "not needed",
        "first",
    )


def test_a_pause_request_turns_a_retry_into_paused(store):
    job = claimed_job(store)
    store.job_pause(job.job_id, actor="bob")
    store.job_retry(job.lease, 5, "GRPC: transient")
    row = store.job_get(job.job_id)
    assert (row.status, row.paused_from, row.lease_owner) == ("PAUSED", "QUEUED", None)
    resumed = store.job_resume(job.job_id, actor="bob")
    assert (resumed.changed, resumed.status) == (True, "QUEUED")
    assert store.job_get(job.job_id).attempt == 0


def test_the_sweeper_settles_a_dead_workers_pending_cancel(store, fresh_dsn):
    job = claimed_job(store, worker_id="gone")
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    assert store.job_cancel(job.job_id, actor="alice").status == "RUNNING"
    _sql(fresh_dsn, "UPDATE workflow_run SET lease_until = now() - interval '1 s'")
    result = store.job_sweep_expired()
    assert (result.requeued, result.dead) == (0, 0)
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED" and [c["name"] for c in row.checkpoints] == ["first"]
    assert event_types(store, job.job_id)[-1] == ("CANCELLED", "")
    last = store.job_history(job.job_id).transitions[-1]
    assert (last.kind, last.actor, last.prev_status) == ("cancel", "alice", "RUNNING")


def test_the_hash_is_inlinable_and_still_the_documented_chain(store, fresh_dsn):
    # Migration 0011: declared STABLE (its body's volatility) so the trigger inlines it instead
    # of re-planning it through the SQL-function executor on every change. What it computes is
    # unchanged: sha256(previous hash || the canonical JSON array of the fields), recomputed
    # here in Python from the stored rows.
    job = claimed_job(store)
    store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        volatility = conn.execute(
            "SELECT provolatile FROM pg_proc WHERE proname = 'workflow_run_transition_hash'"
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT job_id::text, seq, prev_status, new_status, kind, actor, reason, attempt,"
            " step, (extract(epoch FROM at) * 1000000)::bigint, hash"
            " FROM workflow_run_transition WHERE job_id = %s ORDER BY seq",
            (job.job_id,),
        ).fetchall()
        head = conn.execute(
            "SELECT history_head FROM workflow_run WHERE job_id = %s", (job.job_id,)
        ).fetchone()[0]
    assert volatility == "s"
    assert [r[4] for r in rows] == ["submit", "claim", "checkpoint"]
    prev = b""
    for *fields, stored in rows:
        canonical = json.dumps(fields, ensure_ascii=False).encode()
        prev = hashlib.sha256(prev + canonical).digest()
        assert bytes(stored) == prev
    assert bytes(head) == prev


def _history_rows(dsn, job_id) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM workflow_run_transition WHERE job_id = %s", (job_id,)
        ).fetchone()
    return int(row[0])


def test_a_deleted_run_takes_its_history_with_it_and_no_other(store, fresh_dsn):
    """Migration 0018 replaced the history's foreign key (ON DELETE CASCADE) by statement-level
    delete triggers: deleting runs deletes exactly their history, in the same statement."""
    gone, kept = queued_job(store), queued_job(store)
    lease = store.job_claim("w1", 60).lease
    assert lease.job_id in (gone.job_id, kept.job_id)
    assert _history_rows(fresh_dsn, gone.job_id) >= 1
    assert _sql(fresh_dsn, "DELETE FROM workflow_run WHERE job_id = %s", gone.job_id) == 1
    assert _history_rows(fresh_dsn, gone.job_id) == 0
    history = store.job_history(kept.job_id)
    assert history.first_bad_seq is None and len(history.transitions) >= 1


def test_a_truncate_of_the_runs_empties_the_history(store, fresh_dsn):
    job = queued_job(store)
    _sql(fresh_dsn, "TRUNCATE workflow_run CASCADE")
    assert _history_rows(fresh_dsn, job.job_id) == 0


def test_a_chain_written_before_0029_still_verifies_after_it(empty_dsn, tmp_path):
    # Migration 0029 rewrote the trigger (fewer expressions) and the hash (json_build_array
    # instead of jsonb_build_array, the same text for these argument types): a chain written
    # by 0028's functions goes on under 0029's and verifies whole, and the two hash bodies
    # agree on awkward text (escapes, control characters, non-ASCII, NULLs, negatives).
    from protomolt_jobs.store import JobStore
    from protomolt_jobs.store.migrate import migrate, migrations_dir

    for f in migrations_dir().iterdir():
        if f.name.endswith(".sql") and f.name < "0029":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    migrate(empty_dsn, directory=tmp_path)
    store = JobStore.open(empty_dsn, max_size=2)
    try:
        job = claimed_job(store)
        store.job_checkpoint(job.lease, {"name": "before", "skipped": False})
        migrate(empty_dsn)
        store.job_checkpoint(job.lease, {"name": "after", "skipped": False})
        _sql(
            empty_dsn,
            "UPDATE workflow_run SET status = 'QUEUED', lease_owner = NULL WHERE job_id = %s",
            job.job_id,
        )
        history = store.job_history(job.job_id)
    finally:
        store.close()
    assert history.first_bad_seq is None
    assert [t.kind for t in history.transitions] == [
        "submit",
        "claim",
        "checkpoint",
        "checkpoint",
        "sql",
    ]
    awkward = [
        'a"b\\c/d',
        "tab\there\nnew\rline\b\f\x01\x1f\x7f",
        "é€😀 ünï",
        "\\u0041",
        "",
        None,
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for text in awkward:
            for number in (0, -7, 2**40):
                same = conn.execute(
                    "SELECT workflow_run_transition_hash('\\x01'::bytea,"
                    " '00000000-0000-0000-0000-000000000001'::uuid, %(n)s::bigint, NULL, %(t)s,"
                    " 'k', %(t)s, NULL, (%(n)s::bigint %% 1000)::int4, %(t)s, %(at)s)"
                    " = sha256('\\x01'::bytea || convert_to(jsonb_build_array("
                    " '00000000-0000-0000-0000-000000000001', %(n)s::bigint, NULL::text,"
                    " %(t)s::text, 'k', %(t)s::text, NULL::text, (%(n)s::bigint %% 1000)::int4,"
                    " %(t)s::text, (extract(epoch FROM %(at)s::timestamptz) * 1000000)::bigint"
                    ")::text, 'UTF8'))",
                    {"t": text, "n": number, "at": "2026-12-07 09:00:00.123456+00"},
                ).fetchone()[0]
                assert same, (text, number)
