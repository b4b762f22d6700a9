"""Parity of the ``tests`` fixtures (tests/unit/test_workflow_testing.py) with crash events,
operator actions, retries exhausted and a permanent failure, a false gate, a call slower than
its deadline and a bounded loop in a graph: each is played by
``test-workflow``'s in-process run and as a job on PostgreSQL through real workers (real claim,
lease, fences and the control triggers), against a real gRPC service answering with the case's
mocks, and both end with the same path, calls, final status and error, and the case's own
expectations hold on PostgreSQL too.

How each event is played on PostgreSQL:

- ``crash`` at ``before_checkpoint`` / ``after_checkpoint`` of step S: a worker process armed
  with that crash point (``PROTOMOLT_JOBS_CRASH_AT=<point>:S``, ``os._exit`` there, as a
  SIGKILL), then a second worker whose sweeper requeues the run once its lease expires.
- ``pause`` / ``cancel`` after step S: ``pause-job`` / ``cancel-job`` on the node while S's
  call is in flight (the service's hook), so the request is applied at S's checkpoint, as the
  in-process run applies it.
- ``resume``: ``resume-job`` once the run is PAUSED.
- a park: an external step's next ``response`` mock by ``complete-step``, an approval step's
  ``votes`` by ``approve-step`` as each principal (tokens ``al`` and ``bo``); votes that do not
  decide leave the run WAITING, as in-process.
- ``advanceMs``: nothing: the virtual clock has no counterpart on a real node (the run does not
  wait on it; documented in docs/workflows.md, *Tests in the definition*).
- ``delayMs``: the service sleeps that long for real, so a call past the step's ``deadlineMs``
  is a real ``DEADLINE_EXCEEDED``.

A graph run's report (the loop fixture) is compared key by key with the in-process report.

Stated difference (docs/workflows.md): the in-process run's ``attempts`` counts segments, the
claims a worker makes; on PostgreSQL a finished run's report counts the same (``claims``,
asserted equal), but the row's ``attempt`` is the retry budget's count, which a pause gives
back, as a park's answer does: the resumed fixture ends with ``attempt`` 1 after 2 claims. So
the claims are counted from the run's history (``job-history``, kind ``claim``), and for a
finished run also read from its report. A cancelled run's
``error`` names the cancelling principal on PostgreSQL (``CANCELLED by api``); the in-process
run stores none.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow.testing.cases import parse_cases
from protomolt_jobs.workflow.testing.harness import CaseRun, path_of, run_case
from protomolt_jobs.workflow.testing.verdict import verdict
from tests.support.mock_steps import MockedSteps
from tests.support.node import http, start_node_with_file, wait_for
from tests.support.worker_proc import CRASH_EXIT_CODE, WorkerProcess, enqueue
from tests.unit.test_workflow_testing import (
    ATTEMPTS_BACK,
    ATTEMPTS_STEPS,
    CANCELLED,
    CRASH_AFTER,
    CRASH_BEFORE,
    DEAD,
    DECIDED,
    DELAY_STEPS,
    DELAYED,
    FAILED,
    GATE_SKIPPED,
    GATE_STEPS,
    LOOP_STEPS,
    LOOPED,
    PARK_STEPS,
    PAUSED,
    RESUMED,
    SEQ,
    VOTE_SHORT,
    _wf,
)

#: The approvers of the park fixtures' approval step are principals of the node.
NODE = """[node]
api_token = "root-token"
[node.tokens]
al = "al-token"
bo = "bo-token"
"""
AUTH = {"Authorization": "Bearer root-token"}
TERMINAL = {"COMPLETED", "FAILED", "DEAD", "CANCELLED", "RECOVERY_REQUIRED"}
#: The node's and the worker processes' retry settings, given to the in-process run too.
MAX_ATTEMPTS, BACKOFF_S = 3, 0.2
_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 100,
    "sweep_interval_ms": 100,
    "backoff_base_seconds": BACKOFF_S,
    "worker_count": 1,
    "pool_max_size": 4,
}


def _setup(
    cases: list[dict[str, Any]], steps: list[dict[str, Any]] = SEQ
) -> tuple[MockedSteps, dict[str, Any], Any]:
    """The mocked service, the fixtures' workflow aimed at it, and its compiled form."""
    shop = MockedSteps(parse_workflow(_wf(steps, []), Runtime()))
    wf = copy.deepcopy(_wf(steps, cases))
    for step in wf["steps"]:
        if "target" in step:  # an approval step calls nothing
            step["target"] = shop.target
    return shop, wf, parse_workflow(wf, Runtime())


def _local(compiled: Any, raw: dict[str, Any]) -> CaseRun:
    [case] = parse_cases(compiled, [raw])
    return run_case(compiled, case, max_attempts=MAX_ATTEMPTS, backoff_base_s=BACKOFF_S)


def _assert_same(
    compiled: Any,
    raw: dict[str, Any],
    local: CaseRun,
    *,
    status: str,
    checkpoints: list[dict[str, Any]],
    error: str | None,
    claims: int,
    calls: dict[str, int],
    report: Any = None,
) -> None:
    name = raw["name"]
    assert status == local.status, (name, status, local)
    assert path_of(compiled, checkpoints) == path_of(compiled, local.checkpoints), name
    assert {k: v for k, v in calls.items() if v} == {k: v for k, v in local.calls.items() if v}
    if status == "CANCELLED":
        # stated difference: a real cancel names its actor in the run's error; the
        # in-process run has no caller and stores none
        assert (error, local.error) == ("CANCELLED by api", None), name
    else:
        assert error == local.error, name
    if report is not None:
        # a finished run's report counts its claims: the in-process run's segments
        assert report["claims"] == local.attempts, name
        assert report["status"] == local.status, name
        if local.report is not None:  # a graph run: the in-process report, key by key
            assert {k: report[k] for k in local.report} == local.report, (name, report)
        else:
            ran = [r["name"] for r in report["steps"] if r["status"] in ("succeeded", "failed")]
            failed = [local.failed_step] if local.status in ("FAILED", "DEAD") else []
            assert ran == [p.split("#", 1)[0] for p in path_of(compiled, local.checkpoints)] + (
                failed
            ), (name, report)
    # the claims the run's history records: the in-process run's segments
    assert claims == local.attempts, name
    # the case's own expectations hold for the PostgreSQL run as well
    [case] = parse_cases(compiled, [raw])
    kind, _, _ = (error or "").partition(":") if status != "CANCELLED" else ("", "", "")
    played = CaseRun(
        status=status,
        checkpoints=checkpoints,
        calls=dict(calls),
        error=error,
        error_kind=kind or None,
        # the step a finished run's report says failed
        failed_step=next(
            (r["name"] for r in (report or {}).get("steps", []) if r["status"] == "failed"), None
        ),
    )
    assert verdict(compiled, case, played)["passed"] is True, verdict(compiled, case, played)


# -- crash points: real worker processes --------------------------------------------------------


@pytest.mark.parametrize("fixture", [CRASH_BEFORE, CRASH_AFTER], ids=lambda c: c["name"])
def test_a_crash_fixture_ends_the_same_through_crashing_worker_processes(fresh_dsn, fixture):
    shop, wf, compiled = _setup([fixture])
    store = JobStore.open(fresh_dsn, max_size=2)
    [event] = fixture["events"]
    first = WorkerProcess(
        fresh_dsn, worker_id="crashes", crash_at=f"{event['crash']}:{event['after']}", **_FAST
    )
    second = WorkerProcess(fresh_dsn, worker_id="recovers", **_FAST)
    try:
        local = _local(compiled, fixture)
        shop.reset(fixture)
        job = enqueue(store, wf, fixture["input"], max_attempts=MAX_ATTEMPTS)
        first.start(wait_ready=False)
        assert first.wait_exit(60) == CRASH_EXIT_CODE, first.logs()
        crashed = store.job_get(job.job_id)
        assert crashed.status == "RUNNING"  # the lease is held by a dead worker
        second.start()
        row = wait_for(
            lambda: (r := store.job_get(job.job_id)).status in TERMINAL and r, timeout_s=60
        )
        _assert_same(
            compiled,
            fixture,
            local,
            status=row.status,
            checkpoints=list(row.checkpoints),
            error=row.error,
            claims=row.attempt,  # no pause or park gave an attempt back: attempts = claims
            calls=dict(shop.calls),
        )
    finally:
        first.close()
        second.close()
        store.close()
        shop.stop()


# -- operator actions and failures: a node's workers ----------------------------------------------


#: The fixtures played on a node, with the steps of their workflow.
ON_A_NODE = [
    (SEQ, [PAUSED, RESUMED, CANCELLED, DEAD, FAILED]),
    (GATE_STEPS, [GATE_SKIPPED]),
    (DELAY_STEPS, [DELAYED]),
    (LOOP_STEPS, [LOOPED]),
    (PARK_STEPS, [DECIDED, VOTE_SHORT]),
    (ATTEMPTS_STEPS, [ATTEMPTS_BACK]),
]


@pytest.mark.parametrize(
    ("steps", "fixtures"),
    ON_A_NODE,
    ids=["control-and-failures", "gate", "delay", "loop", "parks", "attempts-back"],
)
def test_operator_action_failure_gate_delay_and_loop_fixtures_end_the_same_on_a_node(
    tmp_path, fresh_dsn, steps, fixtures
):
    shop, wf, compiled = _setup(fixtures, steps)
    node = start_node_with_file(tmp_path, fresh_dsn, NODE)
    url = node.http.url

    def verb(name: str, body: dict[str, Any], auth: dict[str, str] = AUTH) -> dict[str, Any]:
        status, answer, _ = http("POST", f"{url}/protomolt/actions/{name}", body, headers=auth)
        assert status == 200, (name, answer)
        return answer

    def answer_parks(job_id: str, fixture: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
        """Answer each park with the step's next mock, as the in-process run does: an
        external step's ``response`` by complete-step, an approval's ``votes`` by
        approve-step, each as its principal. A park left without a mock, or votes that do
        not decide, leave the run WAITING."""
        left = {k: list(v) if isinstance(v, list) else [v] for k, v in fixture["mocks"].items()}
        while got["status"] == "WAITING":
            step = got["outstandingStep"]
            before = len(got["checkpoints"])
            mocks = [m for m in left.get(step, []) if "votes" in m or "response" in m]
            if not mocks:
                return got
            mock = mocks[0]
            left[step].remove(mock)
            shop.calls[step] += 1  # a parked step's answer counts as one call
            if "votes" in mock:
                for vote in mock["votes"]:
                    token = {"Authorization": f"Bearer {vote['principal']}-token"}
                    body = {"jobId": job_id, "stepName": step, "decision": vote["decision"]}
                    verb("approve-step", body, token)  # a repeated vote changes nothing
            else:
                body = {"jobId": job_id, "stepName": step, "response": mock["response"]}
                assert verb("complete-step", body)["ok"]
            # both verbs store the answer and queue the run before they answer
            got = job(job_id)
            if got["status"] == "WAITING" and len(got["checkpoints"]) == before:
                return got  # the votes did not decide
            got = settled(job_id, TERMINAL | {"PAUSED", "WAITING"})
        return got

    def job(job_id: str) -> dict[str, Any]:
        return verb("get-job", {"jobId": job_id})["job"]

    def settled(job_id: str, states: set[str]) -> dict[str, Any]:
        return wait_for(lambda: (j := job(job_id))["status"] in states and j, timeout_s=60)

    try:
        for fixture in fixtures:
            local = _local(compiled, fixture)
            shop.reset(fixture)
            actions = [e for e in fixture.get("events", []) if e.get("action")]
            for event in actions:
                if event.get("after") and event["action"] in ("pause", "cancel"):
                    # the operator acts while the step's call is in flight: applied at its
                    # checkpoint, as the in-process run applies it
                    def act(job_id: str, index: int, action: str = event["action"]) -> None:
                        if index == 0:
                            verb(f"{action}-job", {"jobId": job_id})

                    shop.on_call[event["after"]] = act
            job_id = str(uuid.uuid4())
            answer = verb(
                "submit-workflow", {"workflow": wf, "input": fixture["input"], "jobId": job_id}
            )
            assert answer["ok"], answer
            got = answer_parks(job_id, fixture, settled(job_id, TERMINAL | {"PAUSED", "WAITING"}))
            if any(e["action"] == "resume" for e in actions):
                assert got["status"] == "PAUSED" and path_of(compiled, got["checkpoints"]) == ["a"]
                assert verb("resume-job", {"jobId": job_id})["ok"]
                got = settled(job_id, TERMINAL)
            _assert_same(
                compiled,
                fixture,
                local,
                status=got["status"],
                checkpoints=got["checkpoints"],
                error=got.get("error"),
                claims=sum(
                    1
                    for t in verb("job-history", {"jobId": job_id})["transitions"]
                    if t["kind"] == "claim"
                ),
                calls=dict(shop.calls),
                report=got.get("report"),
            )
    finally:
        node.close()
        shop.stop()
