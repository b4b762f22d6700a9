"""Breaker: the one-queue claim against the list claim."""

from __future__ import annotations

import threading

import psycopg
import pytest

from protomolt_jobs.store import JobStore
from tests.support.factories import queued_job

ODD = "q'uo\"te é 日本 -- x"


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=12)
    try:
        yield s
    finally:
        s.close()


def test_one_queue_and_list_claim_agree_on_order(store):
    for prio in (5, 1, 3, 1, 4):
        queued_job(store, queue=ODD, priority=prio)
    queued_job(store, queue="other", priority=1)
    one = [store.job_claim("w", 60, queues=[ODD]).priority for _ in range(2)]
    many = [store.job_claim("w", 60, queues=[ODD, "zzz"]).priority for _ in range(3)]
    assert one + many == [1, 1, 3, 4, 5]
    assert store.job_claim("w", 60, queues=[ODD]) is None
    assert store.job_claim("w", 60, queues=[ODD, ODD]) is None
    assert store.job_claim("w", 60, queues=["other"]).queue == "other"


def test_one_queue_limited_and_concurrent(store):
    store.queue_limits_sync({ODD: {"max_running": 3}})
    for _ in range(10):
        queued_job(store, queue=ODD)
    # a worker that does not know of the limit must not claim past it
    got = [store.job_claim("w", 60, queues=[ODD]) for _ in range(2)]
    assert got == [None, None]
    claimed: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def go(i):
        barrier.wait()
        for _ in range(5):
            j = store.job_claim(f"w{i}", 60, queues=[ODD], limited={ODD})
            if j is not None:
                with lock:
                    claimed.append(j.job_id)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert len(claimed) == 3 == len(set(claimed))


def test_many_threads_one_queue_unique(store):
    for _ in range(300):
        queued_job(store, queue=ODD)
    claimed: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(10)

    def go(i):
        barrier.wait()
        qs = [ODD] if i % 2 else [ODD, "x"]
        while (j := store.job_claim(f"w{i}", 60, queues=qs)) is not None:
            with lock:
                claimed.append(j.job_id)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert len(claimed) == 300 == len(set(claimed))


def test_chains_written_before_0011_still_verify_after_it(empty_dsn, tmp_path):
    """A run's chain written by the schema before 0011 (its submit, claim and first checkpoint,
    written here with that schema's own SQL: today's store writes columns later migrations
    add) verifies after 0011 and every later migration, and grows on from there."""
    import shutil
    import uuid as _uuid

    from protomolt_jobs.store.migrate import migrate, migrations_dir
    from protomolt_jobs.store.records import Lease

    old = tmp_path / "m"
    old.mkdir()
    for f in migrations_dir().iterdir():
        if f.name.endswith(".sql") and f.name < "0011":
            shutil.copy(str(f), old / f.name)
    migrate(empty_dsn, directory=old)
    job_id = _uuid.uuid4()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
            " max_attempts, change_actor) VALUES (%s, 'wf', '{}', '{}', 'QUEUED', 3, 'test')",
            (job_id,),
        )
        (token,) = conn.execute(
            "UPDATE workflow_run SET status = 'RUNNING', attempt = attempt + 1,"
            " lease_owner = 'w1', lease_token = gen_random_uuid(),"
            " lease_until = now() + interval '60 seconds', change_kind = 'claim',"
            " change_actor = 'worker:w1' WHERE job_id = %s RETURNING lease_token",
            (job_id,),
        ).fetchone()
        conn.execute(
            "UPDATE workflow_run SET checkpoints = coalesce(checkpoints, '[]'::jsonb)"
            ' || \'[{"name": "first", "skipped": false, "response": {}}]\'::jsonb,'
            " change_kind = 'checkpoint', change_actor = 'worker:w1', change_step = 'first'"
            " WHERE job_id = %s",
            (job_id,),
        )
    assert migrate(empty_dsn)[0] == "0011_transition_hash_stable.sql"  # and any later
    s = JobStore.open(empty_dsn, max_size=2)
    try:
        lease = Lease(job_id, "w1", 1, token)
        s.job_checkpoint(lease, {"name": "second", "skipped": False, "response": {}})
        history = s.job_history(job_id)
        assert [t.kind for t in history.transitions] == [
            "submit",
            "claim",
            "checkpoint",
            "checkpoint",
        ]
        assert history.first_bad_seq is None, history
    finally:
        s.close()
