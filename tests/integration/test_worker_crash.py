"""Crash tests with real worker processes (``python -m protomolt_jobs.worker``): SIGKILL in the
middle of a step, a named crash point after a checkpoint, and a job that crashes its worker on
every attempt."""

from __future__ import annotations

import threading

import pytest

from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import (
    CRASH_EXIT_CODE,
    WorkerProcess,
    enqueue,
    event_types,
    wait_for,
)

_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 2,
    "pool_max_size": 4,
}


def test_sigkill_mid_step_resumes_at_the_first_missing_checkpoint(store, fresh_dsn, services):
    release = threading.Event()

    def slow_first_embed(request, context):
        # the first embed call blocks until the test has killed its worker
        if services.calls("Embed") == 1:
            release.wait(30)
        return services._do_embed(request, context)

    services.set_handler("Embed", slow_first_embed)
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "kill me now"})
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        a.start()
        wait_for(lambda: services.calls("Embed") == 1, timeout_s=30)
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING" and row.lease_owner == "proc-a"
        assert [c["name"] for c in row.checkpoints] == ["tokenize"]
        assert a.kill() == -9
        release.set()

        b.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert row.attempt == 2
        assert row.lease_owner is None
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
        assert services.calls("Tokenize") == 1, "an earlier step was called again"
        assert services.calls("Embed") == 2
        assert services.calls("Review") == 1
        kinds = [t for t, _ in event_types(store, job.job_id)]
        assert kinds.count("COMPLETED") == 1
        assert kinds == [
            "ACCEPTED",
            "STEP_CHECKPOINT",
            "STEP_CHECKPOINT",
            "STEP_CHECKPOINT",
            "COMPLETED",
        ]
    finally:
        release.set()
        a.close()
        b.close()


def test_crash_right_after_a_checkpoint_does_not_repeat_the_step(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "crash point"})
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:embed", **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING"
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed"]
        b.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        assert services.calls("Tokenize") == 1
        assert services.calls("Embed") == 1
        assert services.calls("Review") == 1
        assert store.job_get(job.job_id).attempt == 2
    finally:
        a.close()
        b.close()


def test_a_job_that_crashes_its_worker_every_attempt_ends_dead(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target), {"text": "poison"}, max_attempts=3)
    procs: list[WorkerProcess] = []
    try:
        for i in range(3):
            p = WorkerProcess(fresh_dsn, worker_id=f"crash-{i}", crash_at="after_claim", **_FAST)
            procs.append(p)
            p.start(wait_ready=False)
            # each process waits for the previous lease to expire, sweeps, claims, crashes
            assert p.wait_exit(60) == CRASH_EXIT_CODE, p.logs()
            assert store.job_get(job.job_id).attempt == i + 1
        # a fourth process, armed the same way, sweeps the job DEAD and never claims it
        last = WorkerProcess(fresh_dsn, worker_id="crash-3", crash_at="after_claim", **_FAST)
        procs.append(last)
        last.start()
        wait_for(lambda: store.job_get(job.job_id).status == "DEAD", timeout_s=30)
        row = store.job_get(job.job_id)
        assert row.attempt == 3, "claims beyond max_attempts"
        assert row.error
        assert last.alive(), "the DEAD job was claimed again"
        assert last.terminate() == 0
        kinds = [t for t, _ in event_types(store, job.job_id)]
        assert kinds == ["ACCEPTED", "DEAD"]
        assert services.calls("Tokenize") == 0
    finally:
        for p in procs:
            p.close()


def test_a_worker_process_is_never_started_twice(fresh_dsn):
    # `with WorkerProcess(...) as w: w.start()` used to start a second process and lose the
    # first, which then ran orphaned for the rest of the suite (retrying a dropped database).
    with WorkerProcess(fresh_dsn, worker_id="twice", **_FAST) as w:
        first = w.proc
        with pytest.raises(RuntimeError, match="already running"):
            w.start()
        assert w.proc is first and w.alive()
    assert first is not None and first.poll() is not None
