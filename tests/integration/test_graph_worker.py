"""Graph workflows run by the jobs worker: real PostgreSQL, the test gRPC servers on loopback
(``Steps/Run`` records each call's start and end), worker processes for the crash test."""

from __future__ import annotations

import grpc

from protomolt_jobs.worker import Settlement, Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import diamond, graph, step
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import (
    CRASH_EXIT_CODE,
    WorkerProcess,
    enqueue,
    event_types,
    jobs_config,
    wait_for,
)

#: Store methods that each run one transaction (their docstrings say "Transaction: one").
_WRITES = (
    "job_claim",
    "job_heartbeat",
    "job_checkpoint",
    "job_complete",
    "job_fail",
    "job_park",
    "job_retry",
    "job_dead",
)


def _count_transactions(store) -> list[str]:
    calls: list[str] = []
    for name in _WRITES:
        real = getattr(store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    return calls


def _run_one(store, dsn, **overrides) -> None:
    worker = Worker(store, runtime=Runtime(), config=jobs_config(dsn, **overrides), dsn=dsn)
    try:
        assert worker.run_once() is True
    finally:
        worker.stop()


def _overlap(x, y) -> bool:
    return x[1] < y[2] and y[1] < x[2]


def test_the_diamond_runs_b_and_c_at_once(store, fresh_dsn, services):
    job = enqueue(store, diamond(services.target, sleep_ms=1000), {"text": "diamond"})
    calls = _count_transactions(store)
    # a lease long enough that no heartbeat falls inside the run
    _run_one(store, fresh_dsn, lease_seconds=30)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", row.error
    (a,), (b,), (c,), (d,) = (services.spans(n) for n in "abcd")
    assert _overlap(b, c), f"b and c did not overlap on the server: {b} {c}"
    assert d[2] - a[1] < 1.8, f"step time {d[2] - a[1]:.2f}s"
    names = [cp["name"] for cp in row.checkpoints]
    assert len(names) == 4 and names[0] == "a" and names[-1] == "d"
    assert sorted(names[1:3]) == ["b", "c"]
    # responses are stored with default-valued fields printed (index 0), as upstream does
    assert row.checkpoints[-1]["response"] == {
        "step": "d",
        "seen": ["a", "b", "a", "c", "d"],
        "index": 0,
    }
    # claim, three checkpoints, and the completion carrying d's checkpoint
    assert calls == [
        "job_claim",
        "job_checkpoint",
        "job_checkpoint",
        "job_checkpoint",
        "job_complete",
    ]
    assert len(calls) <= 7
    assert event_types(store, job.job_id) == [
        ("ACCEPTED", ""),
        *[("STEP_CHECKPOINT", n) for n in names],
        ("COMPLETED", ""),
    ]


def _failure_edge(target: str, **keys) -> dict:
    return graph(
        [
            step("a", target),
            step("b", target, fail="FAILED_PRECONDITION", after=["a"]),
            step("c", target, after=["a"]),
            step("d", target, after=["b", "c"]),
            step("fix", target, after=[{"step": "b", "on": "failure"}]),
        ],
        name="failure-edge",
        **keys,
    )


def test_a_failure_edge_runs_the_fix_and_skips_what_needed_b(store, fresh_dsn, services):
    job = enqueue(
        store,
        _failure_edge(services.target, completion={"require": ["c", "fix"]}),
        {"text": "x"},
    )
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", row.error
    by = {cp["name"]: cp for cp in row.checkpoints}
    assert set(by) == {"a", "b", "c", "d", "fix"}
    assert by["d"] == {"name": "d", "skipped": True, "reason": "upstream b failed"}
    assert by["b"]["failed"]["kind"] == "GRPC"
    assert by["b"]["failed"]["code"] == "FAILED_PRECONDITION"
    assert services.step_calls("fix") == 1
    assert services.step_calls("d") == 0
    assert services.step_calls("b") == 1


def test_without_require_the_skipped_sink_fails_the_run(store, fresh_dsn, services):
    job = enqueue(store, _failure_edge(services.target), {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert row.error == (
        "WORKFLOW: completion criterion not met: every sink [d]: required step 'd' skipped "
        "(upstream b failed)"
    )
    assert services.step_calls("fix") == 1
    # The report's criterion says it once (it repeated the row's error, which is the same).
    assert _get_job(store, job.job_id)["report"]["criterion"] == (
        "every sink [d]: required step 'd' skipped (upstream b failed)"
    )


def test_an_unhandled_failure_lets_the_sibling_finish_and_starts_nothing_new(
    store, fresh_dsn, services
):
    wf = graph(
        [
            step("a", services.target),
            step("b", services.target, fail="FAILED_PRECONDITION", after=["a"]),
            step("c", services.target, sleep_ms=400, after=["a"]),
            step("d", services.target, after=["b", "c"]),
            step("e", services.target, after=["c"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert row.error.startswith("GRPC: gRPC FAILED_PRECONDITION from ")
    assert [cp["name"] for cp in row.checkpoints] == ["a", "b", "c"]
    assert services.step_calls("e") == 0, "a step started after the unhandled failure"
    assert services.step_calls("d") == 0


def test_a_failed_run_compensates_once_in_reverse_completion_order(store, fresh_dsn, services):
    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("charge", t, after=["reserve"], compensate="refund"),
            step("ship", t, fail="FAILED_PRECONDITION", after=["charge"]),
            step("release", t, reads=["reserve"]),
            step("refund", t, reads=["charge"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert row.error.startswith("GRPC: gRPC FAILED_PRECONDITION")
    assert [cp["name"] for cp in row.checkpoints] == [
        "reserve",
        "charge",
        "ship",
        "refund",
        "release",
    ]
    assert services.step_calls("refund") == 1
    assert services.step_calls("release") == 1
    refund = next(cp for cp in row.checkpoints if cp["name"] == "refund")
    assert refund["response"]["seen"] == ["charge", "refund"]
    kinds = [k for k, _ in event_types(store, job.job_id)]
    assert kinds == ["ACCEPTED", *["STEP_CHECKPOINT"] * 5, "FAILED"]


def test_a_completed_run_compensates_nothing(store, fresh_dsn, services):
    t = services.target
    wf = graph([step("reserve", t, compensate="release"), step("use", t), step("release", t)])
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", row.error
    assert [cp["name"] for cp in row.checkpoints] == ["reserve", "use"]
    assert services.step_calls("release") == 0


_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 1,
    "pool_max_size": 4,
}


def test_sigkill_after_b_checkpointed_while_c_runs_calls_only_c_again(store, fresh_dsn, services):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, after=["a"]),
            step("c", t, sleep_ms=1500, after=["a"]),
            step("d", t, after=["b", "c"]),
        ]
    )
    job = enqueue(store, wf, {"text": "crash"})
    first = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:b", **_FAST)
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING"
        assert [cp["name"] for cp in row.checkpoints] == ["a", "b"]
        assert services.step_calls("c") == 1, "c was not in flight at the crash"
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert [cp["name"] for cp in row.checkpoints] == ["a", "b", "c", "d"]
        assert services.step_calls("a") == 1
        assert services.step_calls("b") == 1
        assert services.step_calls("c") == 2
        assert services.step_calls("d") == 1
        assert row.attempt == 2
    finally:
        first.close()
        second.close()


def test_a_sequential_workflow_keeps_its_checkpoints_and_events(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b c"})
    calls = _count_transactions(store)
    _run_one(store, fresh_dsn, lease_seconds=30)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED"
    # name, skipped, response as before; the fingerprint fields of issue #17 and the artifact
    # fields of issue 29 (docs/artifacts.md) beside them
    fingerprint = {"definitionSha256", "descriptorSha256", "requestSha256", "attempt", "at"}
    fingerprint |= {"sha256", "sizeBytes", "inputs"}
    assert [set(cp) - fingerprint for cp in row.checkpoints] == [
        {"name", "response", "skipped"}
    ] * 3
    assert [(cp["name"], cp["skipped"]) for cp in row.checkpoints] == [
        ("tokenize", False),
        ("embed", False),
        ("review", False),
    ]
    assert calls == ["job_claim", "job_checkpoint", "job_checkpoint", "job_complete"]
    assert event_types(store, job.job_id) == [
        ("ACCEPTED", ""),
        ("STEP_CHECKPOINT", "tokenize"),
        ("STEP_CHECKPOINT", "embed"),
        ("STEP_CHECKPOINT", "review"),
        ("COMPLETED", ""),
    ]


def test_a_retryable_failure_is_not_checkpointed_and_the_retry_calls_it_again(
    store, fresh_dsn, services
):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, fail="UNAVAILABLE", after=["a"]),
            step("c", t, after=["a"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "QUEUED"
    assert row.error.startswith("GRPC: gRPC UNAVAILABLE")
    assert sorted(cp["name"] for cp in row.checkpoints) == ["a", "c"]


def test_settlements_are_what_the_worker_wrote(store, fresh_dsn, services):
    job = enqueue(store, diamond(services.target, sleep_ms=0), {"text": "x"})
    worker = Worker(store, runtime=Runtime(), config=jobs_config(fresh_dsn), dsn=fresh_dsn)
    try:
        claimed = store.job_claim("test-worker", 5)
        worker.heartbeat.start()
        assert worker.executor.execute(claimed) is Settlement.COMPLETED
    finally:
        worker.stop()
    assert store.job_get(job.job_id).verdict == "4 steps, output jobs.test.StepReply"


def _get_job(store, job_id) -> dict:
    from protomolt_jobs.runs.submitter import Submitter
    from protomolt_jobs.verbs import GetJobAction, JobsBackend

    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, Runtime(), 3))
    answer = GetJobAction(backend).execute({"jobId": str(job_id)})
    assert answer["ok"] is True
    return answer["job"]


def test_get_job_reports_every_step_and_the_criterion(store, fresh_dsn, services):
    job = enqueue(
        store,
        _failure_edge(services.target, completion={"require": ["c", "fix"]}),
        {"text": "x"},
    )
    _run_one(store, fresh_dsn)
    report = _get_job(store, job.job_id)["report"]
    assert report["status"] == "COMPLETED"
    by = {s["name"]: s for s in report["steps"]}
    assert by["a"] == {"name": "a", "status": "succeeded"}
    assert by["b"]["status"] == "failed"
    assert by["b"]["reason"].startswith("gRPC FAILED_PRECONDITION from ")
    assert by["d"] == {"name": "d", "status": "skipped", "reason": "upstream b failed"}
    assert by["fix"] == {"name": "fix", "status": "succeeded"}
    assert report["criterion"] == (
        "completion.require [c, fix]: every required step succeeded (or was gated off by its "
        "condition)"
    )


def test_get_job_reports_the_unhandled_failure_and_what_never_ran(store, fresh_dsn, services):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, fail="INVALID_ARGUMENT", after=["a"]),
            step("c", t, after=["b"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    body = _get_job(store, job.job_id)
    assert body["status"] == "FAILED"
    report = body["report"]
    assert report["status"] == "FAILED"
    assert report["criterion"].startswith("unhandled failure of step 'b': gRPC INVALID_ARGUMENT")
    assert report["steps"][2] == {
        "name": "c",
        "status": "not run",
        "reason": "the run failed at 'b' before it could start",
    }


def test_get_job_of_a_sequential_run_has_no_graph_report(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b"})
    _run_one(store, fresh_dsn)
    # Every finished run has the final report (issue 15); a sequential one has no graph parts.
    report = _get_job(store, job.job_id)["report"]
    assert "criterion" not in report and "completionOrder" not in report
    assert [s["status"] for s in report["steps"]] == ["succeeded"] * 3


def test_an_external_step_in_a_graph_parks_after_its_siblings_and_resumes(
    store, fresh_dsn, services
):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("approve", t, after=["a"], completion="external"),
            step("side", t, sleep_ms=200, after=["a"]),
            step("ship", t, after=["approve", "side"], reads=["approve"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "WAITING"
    assert row.outstanding_step == "approve"
    assert [cp["name"] for cp in row.checkpoints] == ["a", "side"]
    entry = {"name": "approve", "skipped": False, "response": {"step": "approve", "seen": ["ok"]}}
    store.job_complete_parked(job.job_id, "approve", entry)
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", row.error
    assert [cp["name"] for cp in row.checkpoints] == ["a", "side", "approve", "ship"]
    assert row.checkpoints[-1]["response"]["seen"] == ["ok", "ship"]
    assert services.step_calls("a") == 1 and services.step_calls("side") == 1


def test_per_target_permits_bound_a_graphs_parallel_calls(store, fresh_dsn, services):
    job = enqueue(store, diamond(services.target, sleep_ms=300), {"text": "one at a time"})
    _run_one(store, fresh_dsn, max_concurrent_per_target=1)
    assert store.job_get(job.job_id).status == "COMPLETED"
    (b,), (c,) = services.spans("b"), services.spans("c")
    assert not _overlap(b, c), "two calls to one target ran at once under a permit of 1"
    assert services.max_in_flight("Run") == 1


def test_a_cancelled_graph_run_compensates_once(store, fresh_dsn, services):
    import threading

    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("slow", t, sleep_ms=1500, after=["reserve"]),
            step("ship", t, after=["slow"]),
            step("release", t, reads=["reserve"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    worker = Worker(store, runtime=Runtime(), config=jobs_config(fresh_dsn), dsn=fresh_dsn)
    runner = threading.Thread(target=worker.run_once)
    try:
        runner.start()
        wait_for(lambda: services.step_calls("slow") == 1, timeout_s=20)
        assert [cp["name"] for cp in store.job_get(job.job_id).checkpoints] == ["reserve"]
        assert store.job_cancel(job.job_id, actor="test", reason="no longer needed").changed
        runner.join(30)
        assert not runner.is_alive()
    finally:
        worker.stop()
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED"
    # the step in flight is kept (the cancel applies at its checkpoint); nothing after it runs
    assert [cp["name"] for cp in row.checkpoints] == ["reserve", "slow", "release"]
    assert row.checkpoints[-1]["response"]["seen"] == ["reserve", "release"]
    assert services.step_calls("release") == 1
    assert services.step_calls("ship") == 0
    kinds = event_types(store, job.job_id)
    assert kinds.count(("CANCELLED", "slow")) + kinds.count(("CANCELLED", "")) == 1
    assert kinds[-1] == ("STEP_CHECKPOINT", "release")
    report = _get_job(store, job.job_id)["report"]
    by = {s["name"]: s for s in report["steps"]}
    assert by["ship"] == {"name": "ship", "status": "not run", "reason": "cancelled"}
    assert by["release"]["status"] == "succeeded"


def test_requeue_of_a_failed_graph_run_calls_the_failed_step_again(store, fresh_dsn, services):
    from protomolt_jobs.runs.submitter import Submitter
    from protomolt_jobs.verbs import JobsBackend, RequeueJobAction

    t = services.target
    failures = {"b": 1}

    def flaky(request, context):
        if failures.get(request.step, 0) > 0:
            failures[request.step] -= 1
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not yet")
        return services._do_run(request, context)

    services.set_handler("Run", flaky)
    wf = graph(
        [
            step("a", t),
            step("b", t, after=["a"]),
            step("c", t, after=["a"]),
            step("d", t, after=["b", "c"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert "failed" in next(cp for cp in row.checkpoints if cp["name"] == "b")

    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, Runtime(), 3))
    assert RequeueJobAction(backend).execute({"jobId": str(job.job_id)}) == {
        "ok": True,
        "status": "QUEUED",
    }
    assert sorted(cp["name"] for cp in store.job_get(job.job_id).checkpoints) == ["a", "c"]
    _run_one(store, fresh_dsn)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", row.error
    assert [cp["name"] for cp in row.checkpoints][-2:] == ["b", "d"]
    # a, b (failed), c; then b and d only
    assert [services.step_calls(n) for n in "abcd"] == [1, 2, 1, 1]


def test_sigkill_while_compensating_resumes_the_rest_once(store, fresh_dsn, services):
    # The run failed at ship; refund (the later compensation) is checkpointed and the worker
    # dies before release runs: the next claim runs release only, once, and fails the run.
    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("charge", t, after=["reserve"], compensate="refund"),
            step("ship", t, fail="FAILED_PRECONDITION", after=["charge"]),
            step("release", t, reads=["reserve"]),
            step("refund", t, reads=["charge"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    first = WorkerProcess(
        fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:refund", **_FAST
    )
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE
        row = store.job_get(job.job_id)
        assert row.status == "RUNNING"
        assert [cp["name"] for cp in row.checkpoints] == ["reserve", "charge", "ship", "refund"]
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "FAILED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert [cp["name"] for cp in row.checkpoints] == [
            "reserve",
            "charge",
            "ship",
            "refund",
            "release",
        ]
        assert row.error.startswith("GRPC: gRPC FAILED_PRECONDITION"), row.error
        for name, calls in (("reserve", 1), ("charge", 1), ("ship", 1), ("refund", 1)):
            assert services.step_calls(name) == calls, name
        assert services.step_calls("release") == 1
    finally:
        first.close()
        second.close()


def test_sigkill_after_a_handled_failure_runs_the_handler_not_the_step(store, fresh_dsn, services):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, fail="INVALID_ARGUMENT", after=["a"]),
            step("fix", t, after=[{"step": "b", "on": "failure"}]),
            step("d", t, after=["b"]),
        ],
        completion={"require": ["fix"]},
    )
    job = enqueue(store, wf, {"text": "x"})
    first = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="after_checkpoint:b", **_FAST)
    second = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    try:
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE
        second.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        row = store.job_get(job.job_id)
        by_name = {cp["name"]: cp for cp in row.checkpoints}
        assert "failed" in by_name["b"]
        assert by_name["d"]["reason"] == "upstream b failed"
        assert services.step_calls("b") == 1
        assert services.step_calls("fix") == 1
    finally:
        first.close()
        second.close()


def test_get_job_counts_one_attempt_per_step_and_times_parallel_steps_from_their_start(
    store, fresh_dsn, services
):
    # One claim ran the whole diamond: every called step was attempted once (the sequential
    # count gave b and d two), and b, which ran 1 s beside c, did not take the 10 ms
    # between c's checkpoint and its own. A skipped step was never attempted.
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, sleep_ms=1000, after=["a"]),
            step("c", t, sleep_ms=1000, after=["a"]),
            step("g", t, after=["a"], when="input.text == 'no'"),
            step("d", t, after=["b", "c", {"step": "g", "on": "done"}]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    _run_one(store, fresh_dsn)
    report = _get_job(store, job.job_id)["report"]
    assert report["status"] == "COMPLETED"
    assert report["claims"] == 1
    assert report["attempts"] == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert report["durationsMs"]["b"] >= 900 and report["durationsMs"]["c"] >= 900
    assert report["durationsMs"]["d"] < 900
