"""The claim on real PostgreSQL: exactly-once under contention, eligibility, order, plans."""

from __future__ import annotations

import collections
import threading
import uuid

import psycopg
import pytest

from protomolt_jobs.store import JobStore
from protomolt_jobs.store.queries import QUERIES
from tests.support.factories import claimed_job, new_job, queued_job


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=16)
    try:
        yield s
    finally:
        s.close()


def q(dsn: str, sql: str, params: dict | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_sixteen_threads_claim_two_thousand_jobs_exactly_once(store, fresh_dsn):
    n_jobs = 2000
    ids = {uuid.uuid4() for _ in range(n_jobs)}

    def insert(chunk: list[uuid.UUID]) -> None:
        for job_id in chunk:
            store.job_insert(new_job(job_id=job_id, workflow_name="bulk"))

    chunks = [list(ids)[i::8] for i in range(8)]
    inserters = [threading.Thread(target=insert, args=(c,)) for c in chunks]
    for t in inserters:
        t.start()
    for t in inserters:
        t.join(timeout=120)
    assert q(fresh_dsn, "SELECT count(*) FROM workflow_run WHERE status='QUEUED'")[0][0] == n_jobs

    claims: dict[int, list] = collections.defaultdict(list)
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def claim_all(worker: int) -> None:
        try:
            barrier.wait(timeout=30)
            while (job := store.job_claim(f"worker-{worker}", 60)) is not None:
                claims[worker].append(job)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert errors == []
    got = [job for jobs in claims.values() for job in jobs]
    assert len(got) == n_jobs
    assert {j.job_id for j in got} == ids
    assert all(j.status == "RUNNING" and j.attempt == 1 <= j.max_attempts for j in got)
    assert all(j.lease_owner == f"worker-{w}" for w, jobs in claims.items() for j in jobs)
    assert len(claims) > 1, "only one thread ever claimed: no contention was exercised"
    rows = q(fresh_dsn, "SELECT status, max(attempt), count(*) FROM workflow_run GROUP BY status")
    assert rows == [("RUNNING", 1, n_jobs)]


def test_claim_stamps_the_lease_with_database_time(store, fresh_dsn):
    job = queued_job(store)
    claimed = store.job_claim("worker-x", 120)
    assert claimed is not None and claimed.job_id == job.job_id
    assert (claimed.status, claimed.attempt, claimed.lease_owner) == ("RUNNING", 1, "worker-x")
    assert claimed.lease.owner == "worker-x" and claimed.lease.attempt == 1
    # lease_until = the claim transaction's now() + 120 s, which is also updated_at
    assert (claimed.lease_until - claimed.updated_at).total_seconds() == pytest.approx(120)
    assert store.job_claim("worker-x", 120) is None


def test_claim_takes_the_oldest_first_and_skips_future_run_after(store, fresh_dsn):
    first = queued_job(store)
    second = queued_job(store)
    third = queued_job(store)
    # first is held back: a retry with backoff leaves it QUEUED but not yet eligible
    c = store.job_claim("w", 60)
    assert c.job_id == first.job_id
    store.job_retry(c.lease, 3600, "GRPC: transient")
    assert store.job_claim("w", 60).job_id == second.job_id
    assert store.job_claim("w", 60).job_id == third.job_id
    assert store.job_claim("w", 60) is None
    # make it eligible again with SQL (never a fake clock)
    q(
        fresh_dsn,
        "UPDATE workflow_run SET run_after = now() - interval '1 s' WHERE job_id=%(id)s",
        {"id": first.job_id},
    )
    again = store.job_claim("w", 60)
    assert again.job_id == first.job_id and again.attempt == 2


def test_claim_refuses_bad_arguments(store):
    with pytest.raises(ValueError, match="worker_id"):
        store.job_claim("  ", 10)
    with pytest.raises(ValueError, match="lease_s"):
        store.job_claim("w", 0)


def test_claim_and_sweep_plans_use_indexes_with_many_terminal_rows(store, fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
            " attempt, completed_at, created_at)"
            " SELECT gen_random_uuid(), 'old', '{}', '{}',"
            "  (ARRAY['COMPLETED','FAILED','DEAD'])[1 + i % 3], 1, now(),"
            "  now() - make_interval(secs => i)"
            " FROM generate_series(1, 200000) AS i"
        )
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status)"
            " SELECT gen_random_uuid(), 'new', '{}', '{}', 'QUEUED' FROM generate_series(1, 100)"
        )
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
            " attempt, lease_owner, lease_until)"
            " SELECT gen_random_uuid(), 'run', '{}', '{}', 'RUNNING', 1, 'w',"
            "  now() + interval '1 hour' FROM generate_series(1, 20)"
        )
        conn.execute("ANALYZE workflow_run")

        def plan(name: str, params: dict) -> str:
            rows = conn.execute("EXPLAIN " + QUERIES[name], params).fetchall()
            return "\n".join(r[0] for r in rows)

        claim = plan("job_claim", {"worker_id": "w", "lease_s": 30.0, "queues": ["default"]})
        one = plan("job_claim_one_queue", {"worker_id": "w", "lease_s": 30.0, "queue": "default"})
        sweep = plan("job_sweep_expired", {"limit": 500})
    for text in (claim, one, sweep):
        assert "Seq Scan on workflow_run" not in text, text
    assert "idx_workflow_run_claim" in claim, claim
    assert "idx_workflow_run_claim" in one, one
    assert "idx_workflow_run_sweep" in sweep, sweep
    # the plans work: the claim finds one of the 100 queued rows
    job = store.job_claim("w", 30)
    assert job is not None and job.workflow_name == "new"


def test_claimed_job_factory_yields_a_lease(store):
    job = claimed_job(store, worker_id="fac")
    assert job.lease.owner == "fac"


def test_a_one_queue_claim_is_planned_once_and_kept(fresh_dsn):
    # PostgreSQL re-planned the list-of-queues claim on every call (its generic plan, with
    # unnest of a parameter estimated at 10 queues, never won); the one-queue form is planned
    # generically after psycopg prepares it and the server's first custom plans.
    one_conn = JobStore.open(fresh_dsn, max_size=1)
    try:
        for i in range(14):
            queued_job(one_conn)
        claimed = [one_conn.job_claim("w", 60) for _ in range(14)]
        assert all(job is not None for job in claimed)
        assert len({job.job_id for job in claimed}) == 14
        with one_conn.pool.connection() as conn:
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'UPDATE workflow_run%%SET status = ''RUNNING''%%'"
            ).fetchall()
    finally:
        one_conn.close()
    assert len(plans) == 1, plans
    generic, custom = plans[0]
    assert generic >= 1 and custom <= 5, plans


def test_a_worker_of_several_queues_claims_from_each(store):
    a = queued_job(store, queue="a")
    b = queued_job(store, queue="b")
    got = {store.job_claim("w", 60, queues=["a", "b"]).job_id for _ in range(2)}
    assert got == {a.job_id, b.job_id}
    assert store.job_claim("w", 60, queues=["a", "b"]) is None
