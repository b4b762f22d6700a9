"""Breaker: a 3 s lease stays held through an 8 s step (the heartbeat is not woken by track)."""

from __future__ import annotations

import time

import pytest

from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.store import JobStore
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
from tests.support.grpc_servers import TestServices
from tests.support.worker_proc import enqueue, jobs_config, wait_for


@pytest.fixture
def services():
    with TestServices() as s:
        yield s


def test_a_short_lease_survives_a_long_step(fresh_dsn, services):
    store = JobStore.open(fresh_dsn, max_size=6)
    config = jobs_config(fresh_dsn, lease_seconds=3.0, sweep_interval_ms=100)
    worker = Worker(store, runtime=Runtime(), config=config, dsn=fresh_dsn)
    sweeper = Sweeper(store, config=config)
    try:
        worker.start()
        sweeper.start()
        time.sleep(2.5)  # let the heartbeat loop idle into a wait first
        wf = graph([step("slow", services.target, sleep_ms=8000, deadlineMs=15000)], name="slow")
        job = enqueue(store, wf, {"text": "x"}, max_attempts=1)
        wait_for(
            lambda: store.job_get(job.job_id).status in ("COMPLETED", "FAILED", "DEAD"),
            timeout_s=40,
            interval_s=0.2,
            what="the job to settle",
        )
        final = store.job_get(job.job_id)
        kinds = [t.kind for t in store.job_history(job.job_id).transitions]
        assert (final.status, final.attempt) == ("COMPLETED", 1), (final.status, final.error, kinds)
        assert "sweep" not in kinds, kinds
    finally:
        sweeper.stop()
        worker.stop()
        store.close()
