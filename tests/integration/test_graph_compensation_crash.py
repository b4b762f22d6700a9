"""Compensations of a failed graph run across a worker crash (issue 27, item 6): real
PostgreSQL, the test ``Steps/Run`` service counting calls on loopback, real worker processes
killed at a named crash point or with SIGKILL from the test.

The run: ``p1 -> p2 -> p3 -> boom -> ship -> deliver``, ``boom`` fails for good, so ``ship``
and ``deliver`` never run and the three compensations run in reverse completion order:
``undo_p3`` (the first), ``undo_p2`` (the second), ``undo_p1`` (the third). Each is stored as
soon as it ends; a finished compensation is never called again after a crash.
"""

from __future__ import annotations

import threading

from tests.support.graphs import graph, step
from tests.support.worker_proc import CRASH_EXIT_CODE, WorkerProcess, enqueue, wait_for

_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 1,
    "pool_max_size": 4,
}
MAIN = ["p1", "p2", "p3", "boom"]
UNDO = ["undo_p3", "undo_p2", "undo_p1"]


def three_compensations(t: str) -> dict:
    return graph(
        [
            step("p1", t, compensate="undo_p1"),
            step("p2", t, after=["p1"], compensate="undo_p2"),
            step("p3", t, after=["p2"], compensate="undo_p3"),
            step("boom", t, fail="FAILED_PRECONDITION", after=["p3"]),
            step("ship", t, after=["boom"]),
            step("deliver", t, after=["ship"]),
            step("undo_p1", t, reads=["p1"]),
            step("undo_p2", t, reads=["p2"]),
            step("undo_p3", t, reads=["p3"]),
        ],
        name="three-compensations",
    )


def _names(store, job) -> list[str]:
    return [cp["name"] for cp in store.job_get(job.job_id).checkpoints or []]


def _assert_failed_once_through(store, services, job) -> None:
    row = store.job_get(job.job_id)
    assert row.status == "FAILED", row.error
    assert row.error.startswith("GRPC: gRPC FAILED_PRECONDITION"), row.error
    assert _names(store, job) == MAIN + UNDO, "a checkpoint is missing or stored twice"
    for name in MAIN:
        assert services.step_calls(name) == 1, f"{name} was called again"
    assert services.step_calls("ship") == 0 and services.step_calls("deliver") == 0


def test_sigkill_during_the_second_of_three_compensations_calls_each_once(
    store, fresh_dsn, services
):
    # The worker dies at the commit edge of the second compensation (its answer stored, the
    # third not started): on resume only the third runs, and every compensation has been
    # called exactly once. (Before the fix the second's entry was held back as "the last
    # step's" and stored only after the third had been called: the third ran twice.)
    job = enqueue(store, three_compensations(services.target), {"text": "x"})
    first = WorkerProcess(
        fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:undo_p2", **_FAST
    )
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING"
        assert _names(store, job) == [*MAIN, "undo_p3", "undo_p2"]
        assert services.step_calls("undo_p1") == 0
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "FAILED", timeout_s=60)
        _assert_failed_once_through(store, services, job)
        for name in UNDO:
            assert services.step_calls(name) == 1, (
                f"{name} was called {services.step_calls(name)} times"
            )
    finally:
        first.close()
        second.close()


def test_sigkill_from_outside_after_two_compensations_finished_calls_neither_again(
    store, fresh_dsn, services
):
    # The failure probe of issue 27: the worker is SIGKILLed while the third compensation's
    # call is in flight, the first two having finished before. Both are stored as they ended,
    # so on resume neither is called again; only the one in flight is (at least once, as any
    # step in flight when its worker dies).
    release = threading.Event()

    def third_blocks(request, context):
        if request.step == "undo_p1" and services.step_calls("undo_p1") == 1:
            release.wait(30)
        return services._do_run(request, context)

    services.set_handler("Run", third_blocks)
    job = enqueue(store, three_compensations(services.target), {"text": "x"})
    first = WorkerProcess(fresh_dsn, worker_id="proc-a", **_FAST)
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start()
        wait_for(lambda: services.step_calls("undo_p1") == 1, timeout_s=30)
        # the two finished compensations are already stored, the one in flight is not
        assert _names(store, job) == [*MAIN, "undo_p3", "undo_p2"]
        assert first.kill() == -9
        release.set()
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "FAILED", timeout_s=60)
        _assert_failed_once_through(store, services, job)
        assert services.step_calls("undo_p3") == 1
        assert services.step_calls("undo_p2") == 1
        assert services.step_calls("undo_p1") == 2
    finally:
        release.set()
        first.close()
        second.close()
