"""Cancel that keeps what the user asked to keep (issue 27 item 4): real PostgreSQL, the test
gRPC servers on loopback (``Steps/Run`` sleeps in slices while its call is active), a worker
in this process.

- a cancel during a 12 s pure step stops its call (the service sees its context cancelled) and
  the job is CANCELLED within 2 s;
- a cancel during an external step lets the call finish; its checkpoint is kept and the report
  lists it as completed after the request;
- ``cancel-job {"compensate": false}`` runs no compensation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs import CancelJobAction, GetJobAction, JobsBackend
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
from tests.support.worker_proc import enqueue, event_types, jobs_config, wait_for


def _backend(store) -> JobsBackend:
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, Runtime(), 3))
    return backend


def _cancel(store, job_id, **fields: Any) -> dict[str, Any]:
    return CancelJobAction(_backend(store)).execute({"jobId": str(job_id), **fields})


def _report(store, job_id) -> dict[str, Any]:
    answer = GetJobAction(_backend(store)).execute({"jobId": str(job_id)})
    assert answer["ok"] is True
    return answer["job"]["report"]


class _Seen:
    """Wraps ``Steps/Run``: per step, whether its call was still active when the handler
    returned (False: the client cancelled it) and how long the handler ran."""

    def __init__(self, services) -> None:
        self.services = services
        self.ends: dict[str, tuple[bool, float]] = {}
        services.set_handler("Run", self._run)

    def _run(self, request, context):
        started = time.monotonic()
        try:
            return self.services._do_run(request, context)
        finally:
            self.ends[request.step] = (context.is_active(), time.monotonic() - started)


def _start(store, dsn, **overrides: Any):
    worker = Worker(store, runtime=Runtime(), config=jobs_config(dsn, **overrides), dsn=dsn)
    runner = threading.Thread(target=worker.run_once)
    runner.start()
    return worker, runner


@pytest.mark.parametrize("lease_s", [2.0, 30.0])
def test_a_cancel_stops_a_12s_pure_call_and_the_job_is_cancelled_within_2s(
    store, fresh_dsn, services, lease_s
):
    # 30 s is the default lease: its beat comes every 10 s, so the cancel poll (CANCEL_POLL_S)
    # is what stops the call within 2 s.
    seen = _Seen(services)
    t = services.target
    wf = graph(
        [step("a", t), step("slow", t, sleep_ms=12_000)],
        name="pure",
        deadlineMs=30_000,
        cancel={"interruptCalls": True},
    )
    job = enqueue(store, wf, {"text": "x"})
    worker, runner = _start(store, fresh_dsn, lease_seconds=lease_s)
    try:
        wait_for(lambda: services.step_calls("slow") == 1, timeout_s=20)
        asked = time.monotonic()
        answer = _cancel(store, job.job_id, reason="stop it")
        assert answer["ok"] is True and answer["requested"] == "cancel", answer
        wait_for(lambda: store.job_get(job.job_id).status == "CANCELLED", timeout_s=2.0)
        took = time.monotonic() - asked
        runner.join(10)
        assert not runner.is_alive()
    finally:
        worker.stop()
    assert took < 2.0, took
    wait_for(lambda: "slow" in seen.ends, timeout_s=5)
    active, ran_s = seen.ends["slow"]
    assert active is False, "the service did not see its call cancelled"
    assert ran_s < 4.0, ran_s
    row = store.job_get(job.job_id)
    assert row.error == "CANCELLED by operator: stop it"
    assert [cp["name"] for cp in row.checkpoints] == ["a"]
    assert services.step_calls("slow") == 1
    assert event_types(store, job.job_id)[-1][0] == "CANCELLED"
    report = _report(store, job.job_id)
    assert report["cancel"]["effectsAfterRequest"] == []
    assert report["cancel"]["compensate"] is True


def test_a_cancel_lets_an_external_send_finish_and_the_report_says_so(store, fresh_dsn, services):
    seen = _Seen(services)
    t = services.target
    wf = graph(
        [step("draft", t), step("send", t, sleep_ms=1500, effect="external"), step("after", t)],
        name="send",
    )
    job = enqueue(store, wf, {"text": "x"})
    worker, runner = _start(store, fresh_dsn)
    try:
        wait_for(lambda: services.step_calls("send") == 1, timeout_s=20)
        answer = _cancel(store, job.job_id, compensate=False)
        assert answer["ok"] is True and answer["requested"] == "cancel", answer
        runner.join(30)
        assert not runner.is_alive()
    finally:
        worker.stop()
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED"
    assert seen.ends["send"][0] is True, "the external call was cancelled"
    assert [cp["name"] for cp in row.checkpoints] == ["draft", "send"]
    assert row.checkpoints[-1]["response"]["step"] == "send"
    assert services.step_calls("after") == 0
    assert row.cancel_request["compensate"] is False
    report = _report(store, job.job_id)
    assert report["cancel"]["effectsAfterRequest"] == ["send"]
    assert report["cancel"]["compensate"] is False
    assert report["cancel"]["compensations"] == []
    assert ("CANCELLED", "send") in event_types(store, job.job_id)


def test_compensate_false_runs_no_compensation_of_a_cancelled_graph(store, fresh_dsn, services):
    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("slow", t, sleep_ms=12_000, after=["reserve"]),
            step("release", t, reads=["reserve"]),
        ],
        cancel={"interruptCalls": True},
    )
    job = enqueue(store, wf, {"text": "x"})
    worker, runner = _start(store, fresh_dsn)
    try:
        wait_for(lambda: services.step_calls("slow") == 1, timeout_s=20)
        assert _cancel(store, job.job_id, compensate=False)["ok"] is True
        runner.join(10)
        assert not runner.is_alive()
    finally:
        worker.stop()
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED"
    # the graph's pure step in flight was cancelled, not checkpointed as a failure
    assert [cp["name"] for cp in row.checkpoints] == ["reserve"]
    assert services.step_calls("release") == 0
    report = _report(store, job.job_id)
    assert report["cancel"]["compensate"] is False
    assert report["cancel"]["compensations"] == []


def test_the_workflows_cancel_default_and_the_requests_word(store, fresh_dsn, services):
    t = services.target
    steps = [
        step("reserve", t, compensate="release"),
        step("slow", t, sleep_ms=12_000, after=["reserve"]),
        step("release", t, reads=["reserve"]),
    ]
    for default, requested, expected in ((False, None, 0), (False, True, 1)):
        services.reset()
        job = enqueue(
            store,
            graph(steps, cancel={"compensate": default, "interruptCalls": True}),
            {"text": "x"},
        )
        worker, runner = _start(store, fresh_dsn)
        try:
            wait_for(lambda: services.step_calls("slow") == 1, timeout_s=20)
            fields = {} if requested is None else {"compensate": requested}
            assert _cancel(store, job.job_id, **fields)["ok"] is True
            runner.join(10)
            assert not runner.is_alive()
        finally:
            worker.stop()
        assert store.job_get(job.job_id).status == "CANCELLED"
        assert services.step_calls("release") == expected, (default, requested)


def test_compensate_must_be_a_boolean(store):
    import pytest

    from protomolt_jobs.errors import InvalidInput

    job = enqueue(store, graph([step("a", "127.0.0.1:9")]), {"text": "x"})
    with pytest.raises(InvalidInput) as raised:
        _cancel(store, job.job_id, compensate="no")
    assert raised.value.details == {"field": "compensate"}


def _draft_and_send(target: str) -> dict[str, Any]:
    """draft (compensated by delete_draft) -> send (external, 1.5 s) -> archive."""
    return graph(
        [
            step("draft", target, compensate="delete_draft"),
            step("send", target, sleep_ms=1500, effect="external", after=["draft"]),
            step("archive", target, after=["send"]),
            step("delete_draft", target, reads=["draft"]),
        ],
        name="draft-send",
    )


def test_cancel_during_a_graphs_external_send_keeps_the_draft_with_compensate_false(
    store, fresh_dsn, services
):
    seen = _Seen(services)
    job = enqueue(store, _draft_and_send(services.target), {"text": "x"})
    worker, runner = _start(store, fresh_dsn)
    try:
        wait_for(lambda: services.step_calls("send") == 1, timeout_s=20)
        answer = _cancel(store, job.job_id, compensate=False, reason="keep the draft")
        assert answer["ok"] is True and answer["requested"] == "cancel", answer
        runner.join(30)
        assert not runner.is_alive()
    finally:
        worker.stop()
    row = store.job_get(job.job_id)
    assert row.status == "CANCELLED"
    assert seen.ends["send"][0] is True, "the external send was cancelled"
    assert [cp["name"] for cp in row.checkpoints] == ["draft", "send"]
    assert services.step_calls("archive") == 0
    assert services.step_calls("delete_draft") == 0, "compensate: false ran a compensation"
    report = _report(store, job.job_id)
    assert report["cancel"]["effectsAfterRequest"] == ["send"]
    assert report["cancel"]["compensate"] is False
    assert report["cancel"]["compensations"] == []
    assert ("CANCELLED", "send") in event_types(store, job.job_id)


def test_cancel_during_a_graphs_external_send_compensates_by_default(store, fresh_dsn, services):
    job = enqueue(store, _draft_and_send(services.target), {"text": "x"})
    worker, runner = _start(store, fresh_dsn)
    try:
        wait_for(lambda: services.step_calls("send") == 1, timeout_s=20)
        assert _cancel(store, job.job_id)["ok"] is True
        runner.join(30)
        assert not runner.is_alive()
    finally:
        worker.stop()
    assert services.step_calls("delete_draft") == 1
    report = _report(store, job.job_id)
    assert report["cancel"]["effectsAfterRequest"] == ["send"]
    assert report["cancel"]["compensate"] is True
    assert report["cancel"]["compensations"] == ["delete_draft"]
