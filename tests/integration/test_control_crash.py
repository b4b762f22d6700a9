"""A SIGKILLed worker with a pending operator request (issue 15): the sweeper settles the run
as requested (CANCELLED, or PAUSED) instead of requeueing it, no later step is called, the
history is intact. Real worker processes, real gRPC step servers, real PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import WorkerProcess, enqueue, event_types, wait_for

_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 2,
    "pool_max_size": 4,
}


@pytest.mark.parametrize("verb", ["cancel", "pause"])
def test_sigkill_with_a_pending_request_is_settled_by_the_sweeper(store, fresh_dsn, services, verb):
    release = threading.Event()

    def stuck_embed(request, context):
        release.wait(30)
        return services._do_embed(request, context)

    services.set_handler("Embed", stuck_embed)
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "kill me"})
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        a.start()
        wait_for(lambda: services.calls("Embed") == 1, timeout_s=30)
        control = store.job_cancel if verb == "cancel" else store.job_pause
        answer = control(job.job_id, actor="alice", reason="stop it")
        assert (answer.changed, answer.status) == (True, "RUNNING")
        assert a.kill() == -9
        release.set()
        b.start()  # its sweeper finds the expired lease
        want = "CANCELLED" if verb == "cancel" else "PAUSED"
        wait_for(lambda: store.job_get(job.job_id).status == want or None, timeout_s=30)
        row = store.job_get(job.job_id)
        assert row.lease_owner is None and row.control is None
        assert [c["name"] for c in row.checkpoints] == ["tokenize"]
        assert services.calls("Embed") == 1 and services.calls("Review") == 0
        types = [e for e, _ in event_types(store, job.job_id)]
        assert types.count(want) == 1 and "COMPLETED" not in types, types
        history = store.job_history(job.job_id)
        assert history.first_bad_seq is None
        last = history.transitions[-1]
        assert (last.kind, last.actor, last.prev_status, last.new_status) == (
            verb,
            "alice",
            "RUNNING",
            want,
        )
        assert [t.kind for t in history.transitions].count("claim") == 1
        if verb == "pause":
            assert store.job_resume(job.job_id, actor="alice").status == "QUEUED"
            wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED" or None, 30)
            assert services.calls("Tokenize") == 1
    finally:
        release.set()
        a.close()
        b.close()


def test_pause_racing_completion_then_resume_calls_every_step_once(store, fresh_dsn, services):
    """30 races (temporal#10239): a pause sent as the last step returns. Each job ends PAUSED
    with every checkpoint (then a resume completes it without calling a step) or COMPLETED
    with the pause refused naming COMPLETED; never RUNNING again, never a step twice."""
    import random
    import time

    review_class = services.message_class("jobs.test.Review")
    called = threading.Semaphore(0)

    def review(request, context):
        called.release()
        time.sleep(random.uniform(0, 0.004))
        return review_class(approved=True, note="auto-approved")

    services.set_handler("Review", review)
    jobs = []
    with WorkerProcess(fresh_dsn, worker_id="proc-p", **{**_FAST, "worker_count": 1}):
        for _ in range(30):
            job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "t"})
            assert called.acquire(timeout=20), "the review step was never called"
            answer = store.job_pause(job.job_id, actor="alice", reason="race")
            final = wait_for(
                lambda j=job.job_id: (
                    (s := store.job_get(j).status) in ("COMPLETED", "PAUSED") and s
                ),
                timeout_s=20,
            )
            if final == "COMPLETED":
                assert (answer.changed, answer.status) == (False, "COMPLETED"), answer
            else:
                assert answer.changed and answer.status in ("RUNNING", "PAUSED"), answer
                assert store.job_resume(job.job_id, actor="alice").status == "QUEUED"
            jobs.append((job.job_id, final))
        for job_id, _ in jobs:
            wait_for(lambda j=job_id: store.job_get(j).status == "COMPLETED", timeout_s=20)
    assert services.calls("Review") == 30 and services.calls("Tokenize") == 30
    for job_id, final in jobs:
        types = [e for e, _ in event_types(store, job_id)]
        assert types.count("COMPLETED") == 1, types
        assert types.count("PAUSED") == (1 if final == "PAUSED" else 0), types
        history = store.job_history(job_id)
        assert history.first_bad_seq is None
    print("race outcomes:", {f: sum(1 for _, x in jobs if x == f) for f in ("PAUSED", "COMPLETED")})
