"""External effects inside graphs (issue 27 item 2): a graph workflow whose ``external`` step
runs in a parallel branch, real worker processes killed at a named crash point between the
step's intent and its result, real PostgreSQL, gRPC servers on loopback counting calls.

A killed worker's run is never re-run silently: the next claim finds the intent without a
checkpoint and (no ``verify`` probe) stops the run RECOVERY_REQUIRED, which blocks its
completion until ``reconcile-step`` says what happened."""

from __future__ import annotations

from typing import Any

import pytest

from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs import JobsBackend, ReconcileStepAction
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
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
    "worker_count": 1,
    "pool_max_size": 4,
}


def _flow(target: str) -> dict[str, Any]:
    """prepare -> (send [external] || other) -> finish."""
    return graph(
        [
            step("prepare", target),
            step("send", target, after=["prepare"], effect="external"),
            step("other", target, sleep_ms=300, after=["prepare"]),
            step("finish", target, reads=["send", "other"], after=["send", "other"]),
        ],
        name="graph-send",
    )


def _reconcile(store, job_id, **fields: Any) -> dict[str, Any]:
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, Runtime(), 3))
    action = ReconcileStepAction(backend, Runtime())
    return action.execute({"jobId": str(job_id), "stepName": "send", **fields})


@pytest.mark.parametrize(
    ("point", "outcome", "send_calls"),
    [
        # the send answered, its checkpoint never written: reconcile says it happened
        ("before_checkpoint:send", "done", 1),
        # the intent committed, the call never made: reconcile says it did not happen
        ("after_intent:send", "not-done", 1),
    ],
)
def test_a_killed_worker_leaves_the_graphs_external_step_recovery_required(
    store, fresh_dsn, services, point, outcome, send_calls
):
    job = enqueue(store, _flow(services.target), {"text": "pay"})
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at=point, **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
    finally:
        a.close()
    row = store.job_get(job.job_id)
    assert row.status == "RUNNING"
    assert row.effect_intents and row.effect_intents["send"]["key"] == f"{job.job_id}:send:0"
    assert "send" not in [c["name"] for c in row.checkpoints]
    calls_at_crash = services.step_calls("send")
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    b.start()
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "RECOVERY_REQUIRED", timeout_s=60)
        row = store.job_get(job.job_id)
        # never a silent re-run; the sibling branch is checkpointed; nothing after them ran
        assert services.step_calls("send") == calls_at_crash
        assert row.outstanding_step == "send"
        assert "no 'verify' probe" in row.error
        names = [c["name"] for c in row.checkpoints]
        assert "other" in names and "send" not in names and "finish" not in names
        assert services.step_calls("finish") == 0
        assert event_types(store, job.job_id).count(("RECOVERY_REQUIRED", "send")) == 1
        fields: dict[str, Any] = {"outcome": outcome}
        if outcome == "done":
            fields["response"] = {"step": "sent-by-hand"}
        assert _reconcile(store, job.job_id, **fields) == {"ok": True, "status": "QUEUED"}
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.step_calls("send") == send_calls
    assert services.step_calls("finish") == 1
    row = store.job_get(job.job_id)
    by = {c["name"]: c for c in row.checkpoints}
    if outcome == "done":
        assert by["send"]["response"]["step"] == "sent-by-hand"
        assert "reconciledBy" in by["send"]["receipt"]
    else:
        assert by["send"]["receipt"] == {"idempotencyKey": f"{job.job_id}:send:0"}


def test_a_verify_probe_that_finds_the_effect_completes_the_graph_without_a_second_call(
    store, fresh_dsn, services
):
    from tests.support.grpc_servers import message_class

    def review(request, context):
        out = message_class("jobs.test.Review")()
        out.approved = True
        out.note = "ledger 42"
        return out

    services.set_handler("Review", review)
    wf = _flow(services.target)
    wf["steps"][1]["verify"] = {
        "method": "jobs.test.ReviewDesk/Review",
        "rules": ["text = input.text"],
        "found": "response.approved",
        "receipt": "{'note': response.note}",
    }
    job = enqueue(store, wf, {"text": "pay"})
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="before_checkpoint:send", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
    finally:
        a.close()
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    b.start()
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.step_calls("send") == 1
    assert services.calls("Review") == 1
    by = {c["name"]: c for c in store.job_get(job.job_id).checkpoints}
    assert by["send"]["receipt"] == {"note": "ledger 42"}
