"""Pooled connections the server killed are replaced before use: the next call succeeds.

The pool does not check a connection with a query before handing it out (that check cost a
round trip and a commit per store call); the store looks at the idle connection's socket
instead (the killed backend's goodbye is waiting there), closes it and takes a fresh one. The
tests wait until the killed backends are gone, as they are by the time anyone calls again.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from protomolt_jobs.errors import StoreUnavailable
from protomolt_jobs.store import JobStore
from tests.support.factories import claimed_job, queued_job
from tests.support.node import wait_for


def _kill_pool_connections(dsn: str) -> int:
    """Terminate every other backend of the test's database (only the store's pool uses it);
    returns once they have exited."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        assert rows and all(r[1] for r in rows)
        pids = [r[0] for r in rows]
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                ).fetchone()[0]
                == 0
            ),
            timeout_s=10,
        )
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


def test_a_killed_connection_is_replaced_and_the_next_call_succeeds(one_conn_store, fresh_dsn):
    job = queued_job(one_conn_store)
    assert _kill_pool_connections(fresh_dsn) == 1
    again = one_conn_store.job_get(job.job_id)
    assert again is not None and again.status == "QUEUED"


def test_a_fenced_write_after_a_kill_lands_exactly_once(one_conn_store, fresh_dsn):
    job = claimed_job(one_conn_store)
    _kill_pool_connections(fresh_dsn)
    # The dead connection is replaced before the write is sent: nothing is sent twice.
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
        # No call fails: each dead connection is replaced before use.
        for _ in range(2 * killed):
            assert store.job_get(job.job_id).status == "QUEUED"
    finally:
        store.close()


class TestTheRaceAfterTheLook:
    """The server kills a connection after the store looked at it (here: the look is made
    blind, so every killed connection reaches a statement)."""

    @pytest.fixture(autouse=True)
    def blind(self, monkeypatch):
        import protomolt_jobs.store.db as store_module

        monkeypatch.setattr(store_module, "server_gone", lambda conn: False)

    def test_a_read_runs_once_more_on_a_fresh_connection(self, one_conn_store, fresh_dsn):
        job = queued_job(one_conn_store)
        _kill_pool_connections(fresh_dsn)
        again = one_conn_store.job_get(job.job_id)
        assert again is not None and again.status == "QUEUED"

    def test_a_write_is_not_retried_and_is_unavailable(self, one_conn_store, fresh_dsn):
        job = claimed_job(one_conn_store)
        _kill_pool_connections(fresh_dsn)
        with pytest.raises(StoreUnavailable) as caught:
            one_conn_store.job_checkpoint(job.lease, {"name": "first", "skipped": True})
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        # The failed call wrote nothing and the store did not quietly run it again.
        assert (
            _count(
                fresh_dsn,
                "SELECT jsonb_array_length(checkpoints) FROM workflow_run WHERE job_id=%(id)s",
                {"id": job.job_id},
            )
            == 0
        )
        # The caller's own retry, under the same live lease, lands exactly once.
        one_conn_store.job_checkpoint(job.lease, {"name": "first", "skipped": True})
        assert one_conn_store.job_get(job.job_id).checkpoints == [
            {"name": "first", "skipped": True}
        ]
