"""Bounded loops: the verifier's findings (kind ``loop``), the worst case, the unrolled graph,
and the tracker's decisions (no network: definitions over the test schema)."""

from __future__ import annotations

import dataclasses

import pytest

from protomolt_jobs.verbs.workflow import CheckWorkflowAction
from protomolt_jobs.workflow import (
    Runtime,
    WorkflowParseError,
    check,
    loops,
    parse_workflow,
    retry_scope,
    types,
)
from protomolt_jobs.workflow import graph as g
from tests.support.graphs import graph, step

T = "127.0.0.1:1"
RUNTIME = Runtime()


def chain(loop: dict | None = None, **keys) -> dict:
    """a -> b -> c -> d, with ``loop`` on c."""
    c = step("c", T, after=["b"])
    if loop is not None:
        c["loop"] = loop
    return graph([step("a", T), step("b", T, after=["a"]), c, step("d", T, after=["c"])], **keys)


def loop_findings(wf: dict) -> list[tuple[str, str]]:
    return [(f.step, f.error) for f in check(wf, RUNTIME) if f.kind == "loop"]


def test_a_sound_loop_has_no_finding_and_its_body_is_to_through_the_loop_step():
    wf = chain({"to": "b", "max": 2})
    assert check(wf, RUNTIME) == []
    compiled = parse_workflow(wf, RUNTIME)
    (lp,) = loops.plan(compiled).loops.values()
    assert lp.body == {"b", "c"} and lp.waiting == {"d"}
    assert compiled.graph is True


@pytest.mark.parametrize("bound", [0, 21, -1])
def test_max_outside_1_to_20_is_a_finding_naming_the_step(bound):
    assert loop_findings(chain({"to": "b", "max": bound})) == [
        ("c", f"loop.max must be between 1 and 20; got {bound}")
    ]


def test_to_not_an_ancestor_is_a_finding():
    assert loop_findings(chain({"to": "d", "max": 2})) == [
        (
            "c",
            (
                "loop.to 'd' is not an ancestor of 'c': a loop goes back to a step the loop "
                "step runs after"
            ),
        )
    ]
    assert loop_findings(chain({"to": "c", "max": 2}))[0][1].startswith("loop.to 'c' is not")
    assert loop_findings(chain({"to": "zz", "max": 2})) == [("c", "loop.to names no step 'zz'")]


def test_crossing_bodies_are_a_finding():
    wf = graph(
        [
            step("a", T),
            step("b", T, after=["a"]),
            step("c", T, after=["b"], loop={"to": "a", "max": 1}),
            step("d", T, after=["c"], loop={"to": "b", "max": 1}),
        ]
    )
    (finding,) = loop_findings(wf)
    assert finding[0] == "d"
    assert "the bodies of loops 'c' and 'd' cross (they share b, c)" in finding[1]


def test_nested_bodies_are_fine_and_multiply_the_worst_case():
    wf = graph(
        [
            step("a", T),
            step("b", T, after=["a"]),
            step("c", T, after=["b"], loop={"to": "b", "max": 1}),
            step("d", T, after=["c"], loop={"to": "a", "max": 2}),
        ]
    )
    assert check(wf, RUNTIME) == []
    worst = loops.worst_case(parse_workflow(wf, RUNTIME))
    # a, d: 3 times; b, c: 3 x 2 times
    assert (worst["executions"], worst["calls"]) == (18, 18)


def test_an_external_step_in_a_body_needs_allow_effects():
    wf = chain({"to": "b", "max": 2})
    wf["steps"][1]["effect"] = "external"
    assert loop_findings(wf) == [
        (
            "b",
            (
                "step 'b' has effect 'external' inside the body of loop 'c'; the loop must say "
                "allowEffects: true (each iteration makes the effect again)"
            ),
        )
    ]
    wf["steps"][2]["loop"]["allowEffects"] = True
    assert loop_findings(wf) == []


def test_the_worst_case_over_budget_max_cost_is_a_finding():
    wf = chain({"to": "b", "max": 3}, budget={"maxCost": 10})
    for s in wf["steps"]:
        s["cost"] = "1"
    # a, d once; b, c four times: 10 executions costing 1 each: within 10
    assert loop_findings(wf) == []
    wf["budget"]["maxCost"] = 9
    assert loop_findings(wf) == [
        ("c", "worst case: 10 step executions, 10 calls, cost 10, over budget.maxCost 9")
    ]


def test_a_cost_read_from_the_response_leaves_the_cost_unknown():
    wf = chain({"to": "b", "max": 3}, budget={"maxCost": 1})
    wf["steps"][1]["cost"] = "response.seen.size()"
    compiled = parse_workflow(wf, RUNTIME)
    assert loops.worst_case(compiled)["cost"] is None
    assert loop_findings(wf) == []


def test_the_unrolled_graph_copies_the_body_per_iteration():
    compiled = parse_workflow(chain({"to": "b", "max": 2}), RUNTIME)
    unrolled = loops.unroll(compiled)
    deps = {s.name: [(d.step, d.on) for d in s.depends] for s in unrolled.steps}
    assert deps["b@c1"] == [("a", "success"), ("c", "success")]
    assert deps["b@c2"] == [("a", "success"), ("c@c1", "success")]
    assert deps["d"] == [("c@c2", "success")]
    assert g.structure_findings(unrolled, {s.name for s in unrolled.steps}) == []


def test_an_unrolled_graph_over_the_step_cap_is_a_finding():
    steps = [step("s0", T)] + [step(f"s{i}", T, after=[f"s{i - 1}"]) for i in range(1, 60)]
    steps[-1]["loop"] = {"to": "s1", "max": 20}
    findings = loop_findings(graph(steps))
    assert findings == [
        (
            "s59",
            (
                "unrolled {max + 1} times the graph has 1240 step executions, over the cap of "
                "1024 steps"
            ),
        )
    ]


def test_a_body_step_may_read_the_loop_step_and_nothing_outside_may():
    wf = chain({"to": "b", "max": 2})
    wf["steps"][1]["rules"].append("seen += c.seen")
    assert check(wf, RUNTIME) == []
    wf["steps"][0]["rules"].append("seen += c.seen")  # a is outside the body
    assert [(f.step, f.kind) for f in check(wf, RUNTIME)] == [("a", "graph")]


@pytest.mark.parametrize(
    ("loop", "message"),
    [
        ([1], "'loop' must be an object"),
        ({"max": 2}, "'loop.to' must name a step"),
        ({"to": "b", "max": "x"}, "'loop.max' must be a whole number"),
        ({"to": "b", "max": 2, "onExhausted": "retry"}, "'loop.onExhausted' must be 'fail'"),
        ({"to": "b", "max": 2, "allowEffects": "yes"}, "'loop.allowEffects' must be a boolean"),
    ],
)
def test_a_malformed_loop_does_not_parse(loop, message):
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(chain(loop), RUNTIME)
    assert info.value.step == "c" and info.value.message.startswith(message)


def test_check_workflow_prints_the_worst_case():
    action = CheckWorkflowAction(RUNTIME)
    answer = action.execute({"workflow": chain({"to": "b", "max": 2}), "simulate": True})
    assert answer["ok"] is True
    assert answer["worstCase"] == {
        "executions": 8,
        "calls": 8,
        "cost": 0.0,
        "loops": [{"step": "c", "to": "b", "max": 2, "body": ["b", "c"]}],
    }
    assert answer["simulation"]["worstCase"] == answer["worstCase"]
    plain = action.execute({"workflow": chain()})
    assert "worstCase" not in plain


def test_the_loop_edge_is_in_the_graph_model():
    edges = g.graph_edges(parse_workflow(chain({"to": "b", "max": 2}), RUNTIME))
    assert {"from": "c", "to": "b", "on": "success", "kind": "loop"} in edges
    assert {"from": "b", "to": "c", "on": "success", "kind": "after"} in edges


def test_the_tracker_reruns_below_the_bound_then_exhausts():
    compiled = parse_workflow(chain({"to": "b", "max": 1, "onExhausted": "park"}), RUNTIME)
    tracker = loops.LoopTracker(compiled, lambda: {"c": 1})
    assert tracker.blocked() == {"d"}
    assert tracker.ended("c", "succeeded") is None and tracker.pending == ["c"]
    assert tracker.blocked() == {"b", "c", "d"}
    assert tracker.restart("c") == {"b", "c"} and tracker.iteration("b") == 1
    # at the bound: the extension (asked once) allows one more
    assert tracker.ended("c", "succeeded") is None and tracker.pending == ["c"]
    tracker.restart("c")
    assert tracker.ended("c", "succeeded") is None and tracker.parked == "c"
    assert tracker.iteration("b") == 2 and tracker.iteration("a") == 0
    skipped = loops.LoopTracker(compiled)
    assert skipped.ended("c", "skipped") is None and skipped.blocked() == set()


def test_open_iteration_counts_the_loop_steps_successes():
    compiled = parse_workflow(chain({"to": "b", "max": 3}), RUNTIME)
    entries = [
        {"name": "a"},
        {"name": "b"},
        {"name": "c", "skipped": False},
        {"name": "b", "iteration": 1},
        {"name": "c", "iteration": 1},
    ]
    assert loops.open_iteration(compiled, entries, "b") == 2
    assert loops.open_iteration(compiled, entries, "a") == 0
    assert loops.key_suffix(0) == "" and loops.key_suffix(2) == ":2"


def test_more_than_64_loops_is_one_finding():
    steps = [step("s0", T)] + [step(f"s{i}", T, after=[f"s{i - 1}"]) for i in range(1, 1024)]
    for i in range(1, 1024):
        steps[i]["loop"] = {"to": "s0", "max": 1}
    findings = loop_findings(graph(steps))
    assert findings == [("s65", "a workflow declares at most 64 loops; this one 1023")]
    # 64 nested loops: the worst case stops counting, over the cap
    for i in range(65, 1024):
        del steps[i]["loop"]
    (finding,) = loop_findings(graph(steps))
    assert finding[1].startswith("unrolled {max + 1} times the graph has 1000000 step executions")


def test_retry_in_a_body_drops_the_latest_iteration_only_and_requeue_keeps_finished_ones():
    compiled = parse_workflow(chain({"to": "b", "max": 2}), RUNTIME)
    entries = [
        {"name": "a", "skipped": False},
        {"name": "b", "skipped": False},
        {"name": "c", "skipped": False},
        {"name": "b", "skipped": False, "iteration": 1},
        {"name": "c", "skipped": False, "iteration": 1},
        {"name": "d", "failed": {"kind": "GRPC", "message": "down"}},
    ]
    # the failed step's latest entry is the first dropped: both iterations stay
    assert g.requeue_checkpoints(compiled, entries) == entries[:5]
    # a failure in iteration 1 of a body step drops that entry only, not iteration 0's
    failed_in_1 = [*entries[:4], {"name": "c", "iteration": 1, "failed": {"kind": "GRPC"}}]
    assert g.requeue_checkpoints(compiled, failed_in_1) == entries[:4]
    plan = retry_scope.plan_retry(
        compiled, entries[:5], "b", scope="dependants", downstream=["c", "d"]
    )
    assert plan.checkpoints == entries[:3] and plan.dropped == ["b", "c", "d"]
    only = retry_scope.plan_retry(compiled, entries[:5], "b", scope="only", downstream=["c", "d"])
    assert only.checkpoints[:3] == entries[:3]
    assert only.checkpoints[3]["retryOf"] == {
        "step": "b",
        "outputSha256": retry_scope.output_sha256(entries[3]),
        "iteration": 1,
    }
    # before b runs again in iteration 1, its iteration-0 entry does not decide the mark
    resolved = retry_scope.resolve(compiled, only.checkpoints)
    assert resolved is not None and resolved.prior == entries[:3]
    assert "c" in resolved.held.waiting
    # upstream of the body, scope only would keep two iterations of c on a condition
    with pytest.raises(retry_scope.LoopRetryError, match="scope 'dependants'"):
        retry_scope.plan_retry(compiled, entries[:5], "a", scope="only", downstream=["b", "c", "d"])


def _exits_on_done(loop: dict) -> dict:
    """a -> b -> c (loop back to b) -> d, d after c whatever its end (a skip included)."""
    c = step("c", T, after=["b"], loop=loop)
    d = step("d", T, after=[{"step": "c", "on": "done"}])
    return graph([step("a", T), step("b", T, after=["a"]), c, d])


def test_simulate_plays_each_exit_of_a_loop_and_its_exhaustion():
    action = CheckWorkflowAction(RUNTIME)
    answer = action.execute({"workflow": _exits_on_done({"to": "b", "max": 2}), "simulate": True})
    exits = answer["simulation"]["loopExits"]
    assert [(e["loop"], e["iterations"], e["exhausted"], e["status"]) for e in exits] == [
        ("c", 1, False, "COMPLETED"),
        ("c", 2, False, "COMPLETED"),
        ("c", 3, False, "COMPLETED"),
        ("c", 3, True, "FAILED"),
    ]
    assert exits[1]["runs"] == ["a", "b", "c", "b#1", "d"]
    assert exits[1]["skipped"] == [{"step": "c#1", "reason": "the loop exits here (simulated)"}]
    assert exits[3]["notRun"] == ["d"]
    assert exits[3]["runs"] == ["a", "b", "c", "b#1", "c#1", "b#2", "c#2"]
    assert exits[3]["criterion"].startswith("loop 'c' exhausted")
    assert "loopExitsTruncated" not in answer["simulation"]
    parked = action.execute(
        {"workflow": chain({"to": "b", "max": 1, "onExhausted": "park"}), "simulate": True}
    )
    assert parked["simulation"]["loopExits"][-1]["status"] == "PAUSED"
    # d after c on success: leaving the loop (c skipped) skips d, and the run fails: shown
    first = parked["simulation"]["loopExits"][0]
    assert (
        first["status"] == "FAILED"
        and {"step": "d", "reason": "upstream c skipped"} in (first["skipped"])
    )
    assert "loopExits" not in action.execute({"workflow": chain(), "simulate": True})["simulation"]


def _reviewed() -> dict:
    """draft -> review (approval: accept, fix) -> replan on 'fix' loops to draft; publish on
    'accept' after the loop."""
    review = {
        "name": "review",
        "after": ["draft"],
        "completion": "approval",
        "approval": {"approvers": {"roles": ["editor"]}, "decisions": ["accept", "fix"]},
    }
    return graph(
        [
            step("draft", T),
            review,
            step(
                "replan",
                T,
                after=[{"step": "review", "on": "decision:fix"}],
                loop={"to": "draft", "max": 1},
            ),
            step("publish", T, after=[{"step": "review", "on": "decision:accept"}]),
        ]
    )


def test_a_loop_decided_by_an_approval_exits_by_its_other_decision():
    compiled = parse_workflow(_reviewed(), RUNTIME)
    assert check(_reviewed(), RUNTIME) == []
    from protomolt_jobs.workflow.loop_exits import loop_exits

    exits = loop_exits(compiled)["loopExits"]
    # at once: review accepts, publish runs; once round: review says fix, then accepts
    assert exits[0]["runs"] == ["draft", "review", "publish"]
    assert exits[1]["runs"] == ["draft", "review", "replan", "draft#1", "review#1", "publish"]
    assert [e["status"] for e in exits] == ["COMPLETED", "COMPLETED", "FAILED"]
    assert exits[2]["runs"][-1] == "replan#1"


def test_loop_exits_keep_to_the_simulation_caps():
    from protomolt_jobs.workflow.loop_exits import loop_exits

    compiled = parse_workflow(chain({"to": "b", "max": 2}), RUNTIME)
    capped = loop_exits(compiled, played=1022)
    assert len(capped["loopExits"]) == 2
    assert capped["loopExitsTruncated"]["played"] == 2
    assert capped["loopExitsTruncated"]["of"] == 4
    assert "at most 1024 paths" in capped["loopExitsTruncated"]["reason"]
    spent = loop_exits(compiled, cpu_budget_s=-1.0)
    assert spent["loopExits"] == [] and "CPU budget" in spent["loopExitsTruncated"]["reason"]


def test_the_unrolled_reads_name_a_copy_that_reads_a_value_not_produced_before_it():
    wf = chain({"to": "b", "max": 2})
    wf["steps"][1]["rules"].append("seen += c.seen")  # b reads the previous iteration's c
    wf["steps"][3]["rules"].append("seen += b.seen")  # d reads the last iteration's b
    compiled = parse_workflow(wf, RUNTIME)
    assert check(wf, RUNTIME) == []
    unrolled, copies = loops.unroll_with_copies(compiled)
    assert copies["b@c2"] == ("b", {"c": 2}) and copies["b"] == ("b", {"c": 0})
    assert loops.unrolled_read_findings(compiled, unrolled, copies) == []
    # without the back-edge's order (b@c1 no longer after c), b@c1 reads c before it ran
    cut = tuple(
        dataclasses.replace(s, depends=tuple(d for d in s.depends if d.step != "c"))
        if s.name == "b@c1"
        else s
        for s in unrolled.steps
    )
    broken = dataclasses.replace(unrolled, steps=cut)
    (finding,) = loops.unrolled_read_findings(compiled, broken, copies)
    assert finding.step == "b" and finding.kind == "loop"
    assert finding.error.startswith("unrolled: 'b@c1' reads 'c', which is not its ancestor")
    # d reads the last copy of b: without d's edge to the last copies, that is named too
    cut_d = tuple(
        dataclasses.replace(s, depends=(types.Dependency("a"),)) if s.name == "d" else s
        for s in unrolled.steps
    )
    (finding,) = loops.unrolled_read_findings(
        compiled, dataclasses.replace(unrolled, steps=cut_d), copies
    )
    assert finding.error.startswith("unrolled: 'd' reads 'b@c2'")
