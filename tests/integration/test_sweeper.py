"""The Sweeper component against real PostgreSQL: its cadence, requeue and DEAD, live leases
untouched. Rows are aged with SQL (database time), never with a faked clock."""

from __future__ import annotations

import logging

import psycopg

from protomolt_jobs.maintenance.sweeper import Sweeper
from tests.support.factories import queued_job
from tests.support.worker_proc import jobs_config, wait_for


def _expire(dsn, job_id):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' WHERE job_id = %s",
            (job_id,),
        )


def test_sweeper_requeues_expired_and_kills_exhausted_on_its_cadence(store, fresh_dsn, caplog):
    caplog.set_level(logging.INFO, logger="protomolt_jobs.sweeper")
    retry = queued_job(store, max_attempts=3)
    spent = queued_job(store, max_attempts=1)
    live = queued_job(store, max_attempts=3)
    claimed = {store.job_claim("w", 60).job_id for _ in range(3)}
    assert claimed == {retry.job_id, spent.job_id, live.job_id}
    _expire(fresh_dsn, retry.job_id)
    _expire(fresh_dsn, spent.job_id)

    sweeper = Sweeper(store, config=jobs_config(fresh_dsn, sweep_interval_ms=50))
    sweeper.start()
    try:
        wait_for(lambda: store.job_get(retry.job_id).status == "QUEUED", timeout_s=10)
        wait_for(lambda: store.job_get(spent.job_id).status == "DEAD", timeout_s=10)
    finally:
        sweeper.stop()
        sweeper.stop()
    assert store.job_get(live.job_id).status == "RUNNING"
    assert store.job_get(retry.job_id).attempt == 1
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "sweep_requeued" in actions and "sweep_dead" in actions


def test_run_once_reports_counts(store, fresh_dsn):
    job = queued_job(store)
    store.job_claim("w", 60)
    sweeper = Sweeper(store, config=jobs_config(fresh_dsn))
    assert sweeper.run_once().requeued == 0
    _expire(fresh_dsn, job.job_id)
    result = sweeper.run_once()
    assert (result.requeued, result.dead) == (1, 0)
