"""Bounded loops run by the jobs worker: real PostgreSQL, the test gRPC servers on loopback
(``Steps/Run`` counts each step's calls), worker processes for the crash test."""

from __future__ import annotations

import threading

from protomolt_jobs.workflow import Runtime, parse_workflow
from tests.support.graphs import graph, step
from tests.support.worker_proc import CRASH_EXIT_CODE, WorkerProcess, enqueue, wait_for

_FAST = {
    "lease_seconds": 2,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 1,
    "pool_max_size": 4,
}


def _looping(target: str, on_exhausted: str = "park") -> dict:
    """a -> b -> c -> d, d looping back to b once (max 1): d always succeeds, so the body runs
    twice and the loop exhausts."""
    return graph(
        [
            step("a", target),
            step("b", target, after=["a"]),
            step("c", target, after=["b"]),
            step("d", target, after=["c"], loop={"to": "b", "max": 1, "onExhausted": on_exhausted}),
        ],
        name="looping",
    )


def test_sigkill_in_iteration_1_resumes_in_iteration_1_without_calling_its_finished_steps(
    store, fresh_dsn, services
):
    job = enqueue(store, _looping(services.target), {"text": "crash"})
    first = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:b#1", **_FAST)
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING"
        assert [(c["name"], c.get("iteration", 0)) for c in row.checkpoints] == [
            ("a", 0),
            ("b", 0),
            ("c", 0),
            ("d", 0),
            ("b", 1),
        ]
        assert services.step_calls("b") == 2 and services.step_calls("c") == 1
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "PAUSED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert row.error.startswith("LOOP: loop 'd' exhausted"), row.error
        assert [(c["name"], c.get("iteration", 0)) for c in row.checkpoints] == [
            ("a", 0),
            ("b", 0),
            ("c", 0),
            ("d", 0),
            ("b", 1),
            ("c", 1),
            ("d", 1),
        ]
        # iteration 1 went on from b#1: b was not called again
        assert services.step_calls("a") == 1
        assert services.step_calls("b") == 2
        assert services.step_calls("c") == 2
        assert services.step_calls("d") == 2
    finally:
        first.close()
        second.close()


def _race(store, job_id) -> dict[str, object]:
    """extend-loop and cancel-job of one PAUSED run at the same moment."""
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def extend():
        barrier.wait()
        results["extend"] = store.job_extend_loop(
            job_id, "d", 1, cap=20, declared=1, actor="op-1", reason="race"
        )

    def cancel():
        barrier.wait()
        results["cancel"] = store.job_cancel(job_id, actor="op-2", reason="race")

    threads = [threading.Thread(target=extend), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_extend_loop_and_cancel_race_ends_in_one_state_and_each_answer_says_which(
    store, fresh_dsn, services
):
    for _ in range(3):
        job = enqueue(store, _looping(services.target), {"text": "race"})
        worker = WorkerProcess(fresh_dsn, worker_id="proc-r", **_FAST)
        try:
            worker.start()
            wait_for(lambda j=job: store.job_get(j.job_id).status == "PAUSED", timeout_s=60)
        finally:
            worker.close()
        results = _race(store, job.job_id)
        assert store.job_get(job.job_id).status == "CANCELLED"  # a cancel always lands
        ext, can = results["extend"], results["cancel"]
        assert can.changed and can.status == "CANCELLED"
        if ext.changed:  # extend first: it requeued, then the cancel took the QUEUED run
            assert ext.requeued and ext.status == "QUEUED"
        else:  # cancel first: extend-loop says the run is CANCELLED
            assert ext.status == "CANCELLED" and ext.refusal == "status"


def test_a_workflow_without_loop_keeps_its_entries_and_keys(store, fresh_dsn, services):
    wf = graph([step("a", services.target), step("b", services.target, after=["a"])])
    assert parse_workflow(wf, Runtime()).loops == ()
    job = enqueue(store, wf, {"text": "plain"})
    worker = WorkerProcess(fresh_dsn, worker_id="proc-p", **_FAST)
    try:
        worker.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        worker.close()
    row = store.job_get(job.job_id)
    assert all("iteration" not in c for c in row.checkpoints)
    keys = [m.get("x-protomolt-idempotency-key") for m in services.metadata("jobs.test.Steps/Run")]
    assert sorted(keys) == sorted([f"{job.job_id}:a:0", f"{job.job_id}:b:0"])
