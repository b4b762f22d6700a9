"""Pooled connections the server killed: each fails one call as StoreError, then the pool heals.

The pool does not check a connection before handing it out (that check cost a round trip and
a commit per store call), so these tests pin what replaces it: a killed connection fails the
one call it is handed to, cleanly (StoreError, nothing written, nothing retried behind the
caller's back), and the next call gets a fresh connection.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from protomolt_jobs.errors import StoreError
from protomolt_jobs.store import JobStore
from tests.support.factories import claimed_job, queued_job


def _kill_pool_connections(dsn: str) -> int:
    """Terminate every other backend of the test's database (only the store's pool uses it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert rows and all(r[0] for r in rows)
    return len(rows)


def _count(dsn: str, sql: str, params: dict) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute(sql, params).fetchone()[0])


@pytest.fixture
def one_conn_store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=1)
    try:
        yield s
    finally:
        s.close()


def test_a_killed_connection_fails_one_call_and_the_next_succeeds(one_conn_store, fresh_dsn):
    job = queued_job(one_conn_store)
    assert _kill_pool_connections(fresh_dsn) == 1
    with pytest.raises(StoreError) as caught:
        one_conn_store.job_get(job.job_id)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    again = one_conn_store.job_get(job.job_id)
    assert again is not None and again.status == "QUEUED"


def test_a_fenced_write_on_a_killed_connection_is_not_retried_blindly(one_conn_store, fresh_dsn):
    job = claimed_job(one_conn_store)
    _kill_pool_connections(fresh_dsn)
    with pytest.raises(StoreError):
        one_conn_store.job_checkpoint(job.lease, {"name": "first", "skipped": True})
    # The failed call wrote nothing and the store did not quietly run it again.
    params = {"id": job.job_id, "key": str(job.job_id)}
    assert (
        _count(
            fresh_dsn,
            "SELECT jsonb_array_length(checkpoints) FROM workflow_run WHERE job_id=%(id)s",
            params,
        )
        == 0
    )
    assert (
        _count(
            fresh_dsn,
            "SELECT count(*) FROM workflow_run_events_outbox WHERE kafka_key=%(key)s "
            "AND event_type='STEP_CHECKPOINT'",
            params,
        )
        == 0
    )
    # The caller's own retry, under the same live lease, lands exactly once.
    one_conn_store.job_checkpoint(job.lease, {"name": "first", "skipped": True})
    row = one_conn_store.job_get(job.job_id)
    assert row.checkpoints == [{"name": "first", "skipped": True}]
    assert [r.event_type for r in one_conn_store.outbox_for_job(job.job_id)].count(
        "STEP_CHECKPOINT"
    ) == 1


def test_every_killed_connection_of_a_larger_pool_fails_at_most_once(fresh_dsn):
    store = JobStore.open(fresh_dsn, max_size=4)
    try:
        job = queued_job(store)
        # Fill the pool: four callers hold a connection at once.
        barrier = threading.Barrier(4)

        def hold() -> None:
            with store.pool.connection() as conn:
                barrier.wait(timeout=10)
                conn.execute("SELECT 1")

        threads = [threading.Thread(target=hold) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        killed = _kill_pool_connections(fresh_dsn)
        assert killed == 4
        failures = 0
        for _ in range(killed + 1):
            try:
                store.job_get(job.job_id)
            except StoreError:
                failures += 1
            else:
                break
        assert failures <= killed
        # Healed: every later call works.
        for _ in range(2 * killed):
            assert store.job_get(job.job_id).status == "QUEUED"
    finally:
        store.close()
