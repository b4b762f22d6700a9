"""Bounded loops in the graph executor without the jobs worker: ``run_segment`` against the
test gRPC servers on loopback (iterations, exhaustion, entries, replay)."""

from __future__ import annotations

import pytest

from protomolt_jobs.workflow import (
    FailureKind,
    Parked,
    Runtime,
    WorkflowExecutionError,
    check,
    parse_workflow,
    run_segment,
)
from protomolt_jobs.workflow.effects import EffectContext
from tests.support.graphs import METHOD, graph, step


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def _always_loops(target: str, on_exhausted: str = "fail", max_: int = 2) -> dict:
    return graph(
        [
            step("a", target),
            step("b", target, after=["a"]),
            step(
                "c", target, after=["b"], loop={"to": "b", "max": max_, "onExhausted": on_exhausted}
            ),
            step("d", target, after=["c"]),
        ]
    )


def test_a_loop_step_that_always_succeeds_exhausts_after_max_reruns(services, runtime):
    wf = _always_loops(services.target)
    assert check(wf, runtime) == []
    entries: list[dict] = []
    with pytest.raises(WorkflowExecutionError) as info:
        run_segment(parse_workflow(wf, runtime), {"text": "x"}, [], entries.append, runtime=runtime)
    assert info.value.kind is FailureKind.LOOP
    assert info.value.step == "c"
    assert services.step_calls("a") == 1
    assert services.step_calls("b") == 3
    assert services.step_calls("c") == 3
    assert services.step_calls("d") == 0
    assert [(e["name"], e.get("iteration", 0)) for e in entries] == [
        ("a", 0),
        ("b", 0),
        ("c", 0),
        ("b", 1),
        ("c", 1),
        ("b", 2),
        ("c", 2),
    ]
    assert all("iteration" not in e for e in entries[:3])


def test_park_exhaustion_parks_with_wait_kind_loop_and_replays(services, runtime):
    wf = _always_loops(services.target, "park", 1)
    compiled = parse_workflow(wf, runtime)
    entries: list[dict] = []
    result = run_segment(compiled, {"text": "x"}, [], entries.append, runtime=runtime)
    assert isinstance(result, Parked) and result.wait_kind == "loop" and result.step == "c"
    assert services.step_calls("b") == 2
    again: list[dict] = []
    result = run_segment(compiled, {"text": "x"}, list(entries), again.append, runtime=runtime)
    assert isinstance(result, Parked) and again == []
    assert services.step_calls("b") == 2


def test_an_external_step_in_a_body_records_one_intent_per_iteration_with_its_key(
    services, runtime
):
    wf = graph(
        [
            step("a", services.target),
            step("send", services.target, after=["a"], effect="external"),
            step(
                "c",
                services.target,
                after=["send"],
                loop={"to": "send", "max": 1, "onExhausted": "park", "allowEffects": True},
            ),
        ]
    )
    assert check(wf, runtime) == []
    compiled = parse_workflow(wf, runtime)
    intents: list[tuple[str, str]] = []  # what the worker's on_intent would store

    def on_intent(step_name: str, key: str) -> None:
        intents.append((step_name, key))

    # the row's intents as read at the claim: none
    effects = EffectContext(job_id="job-1", intents={}, on_intent=on_intent)
    entries: list[dict] = []
    result = run_segment(
        compiled, {"text": "x"}, [], entries.append, runtime=runtime, effects=effects
    )
    assert isinstance(result, Parked) and result.wait_kind == "loop"
    keys = [m.get("x-protomolt-idempotency-key") for m in services.metadata(METHOD)]
    assert keys == ["job-1:a:0", "job-1:send:0", "job-1:c:0", "job-1:send:0:1", "job-1:c:0:1"]
    assert intents == [("send", "job-1:send:0"), ("send", "job-1:send:0:1")]
    receipts = [e.get("receipt") for e in entries if e["name"] == "send"]
    assert receipts == [{"idempotencyKey": "job-1:send:0"}, {"idempotencyKey": "job-1:send:0:1"}]


def test_an_iteration_0_intent_is_not_taken_for_iteration_1s(services, runtime):
    wf = graph(
        [
            step("a", services.target),
            step("send", services.target, after=["a"], effect="external"),
            step(
                "c",
                services.target,
                after=["send"],
                loop={"to": "send", "max": 1, "onExhausted": "park", "allowEffects": True},
            ),
        ]
    )
    compiled = parse_workflow(wf, runtime)
    first: list[dict] = []
    run_segment(compiled, {"text": "x"}, [], first.append, runtime=runtime)
    # a crash after c#0: the row still holds send's iteration-0 intent
    prior = first[:3]
    assert [e["name"] for e in prior] == ["a", "send", "c"]
    services.reset()
    recorded: list[str] = []
    effects = EffectContext(
        job_id="job-1",
        intents={"send": {"key": "job-1:send:0"}},
        on_intent=lambda s, k: recorded.append(k),
    )
    result = run_segment(
        compiled, {"text": "x"}, prior, lambda e: None, runtime=runtime, effects=effects
    )
    assert isinstance(result, Parked)
    assert recorded == ["job-1:send:0:1"]  # a new intent, then the call: never a recovery stop
    assert services.step_calls("send") == 1
