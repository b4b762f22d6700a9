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
from tests.support.graphs import graph, step


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
