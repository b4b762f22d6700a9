"""Random graphs through the decision table (graph.GraphState): whatever the shape, edges,
joins and failing steps, a step starts only after every dependency ended, every step ends
exactly once, a skip names an upstream that really ended that way, nothing starts after an
unhandled failure, and the verdict agrees with the criterion."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow import graph as g
from tests.support.graphs import graph, step

T = "127.0.0.1:9"
RUNTIME = Runtime()


@st.composite
def graphs(draw):
    n = draw(st.integers(min_value=1, max_value=7))
    steps = []
    for i in range(n):
        deps = (
            draw(
                st.lists(st.integers(min_value=0, max_value=max(0, i - 1)), max_size=3, unique=True)
            )
            if i
            else []
        )
        after = [
            {"step": f"s{d}", "on": draw(st.sampled_from(["success", "failure", "done"]))}
            for d in deps
        ]
        keys = {"after": after, "join": draw(st.sampled_from(["all", "any"]))}
        steps.append(step(f"s{i}", T, **keys))
    failing = draw(st.sets(st.sampled_from([f"s{i}" for i in range(n)])))
    return graph(steps), failing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_keep_the_tables_promises(case):
    definition, failing = case
    wf = parse_workflow(definition, RUNTIME)
    by = {s.name: s for s in wf.steps}
    state = g.GraphState(wf)
    started: list[str] = []
    while True:
        start, skip = state.next()
        if not start and not skip:
            break
        # next() gives nothing once a failure went unhandled (a batch started together may
        # still hold the failing step's siblings: they were started before it failed)
        for s, reason in skip:
            if reason.startswith("upstream "):
                _, name, outcome = reason.split(" ")
                assert state.outcomes[name] == outcome
                assert any(d.step == name and not g.matches(d.on, outcome) for d in s.depends)
            else:
                assert s.join == "any" and all(d.step in state.outcomes for d in s.depends)
            state.ended(s.name, g.SKIPPED, reason)
        for s in start:
            assert all(d.step in state.outcomes for d in s.depends), s.name
            if s.join == "all":
                assert all(g.matches(d.on, state.outcomes[d.step]) for d in s.depends)
            else:
                assert not s.depends or any(
                    g.matches(d.on, state.outcomes[d.step]) for d in s.depends
                )
            started.append(s.name)
            state.ended(s.name, g.FAILED if s.name in failing else g.SUCCEEDED, "x")
    assert len(started) == len(set(started))
    # every step ended once, unless an unhandled failure stopped the run
    assert len(state.order) == len(set(state.order))
    if state.unhandled is None:
        assert set(state.outcomes) == set(by)
    completed, sentence = state.verdict()
    if state.unhandled is not None:
        assert not completed and sentence.startswith("unhandled failure")
        assert state.unhandled in failing
    else:
        holds, _ = g.criterion(wf, state.outcomes, state.reasons)
        assert completed == holds
    # the simulation of "this step fails" is the same machine
    if len(failing) == 1:
        (only,) = failing
        sim = {s["step"]: s for s in g.simulate(wf)["ifFails"]}[only]
        assert sim["status"] == ("COMPLETED" if completed else "FAILED")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_a_step_found_never_to_run_never_starts(case):
    # The contradiction finding (issue 27 item 5) is sound: whatever fails, a step it names
    # is never started by the decision table.
    definition, failing = case
    wf = parse_workflow(definition, RUNTIME)
    names = {s.name for s in wf.steps}
    never = {f.step for f in g.structure_findings(wf, names) if f.error.startswith("can never run")}
    state = g.GraphState(wf)
    while True:
        start, skip = state.next()
        if not start and not skip:
            break
        for s, reason in skip:
            state.ended(s.name, g.SKIPPED, reason)
        for s in start:
            assert s.name not in never, (s.name, definition["steps"], failing)
            state.ended(s.name, g.FAILED if s.name in failing else g.SUCCEEDED, "x")


@st.composite
def graphs_with_compensations(draw):
    definition, _ = draw(graphs())
    steps = definition["steps"]
    for i, s in enumerate(list(steps)):
        if draw(st.booleans()):
            s["compensate"] = f"u{i}"
            steps.append(step(f"u{i}", T))
    return definition


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs_with_compensations())
def test_simulate_cuts_unhandled_failures_from_the_all_succeed_play_exactly(definition):
    # simulate answers a path whose failure no edge handles from the all-succeed play's
    # waves (issue 27 item 6: linear, not a play per step); it must be exactly the full play.
    wf = parse_workflow(definition, RUNTIME)
    sim = g.simulate(wf)
    assert sim["allSucceed"] == g._play(wf, None)
    assert "truncated" not in sim
    assert [p["step"] for p in sim["ifFails"]] == [s.name for s in g.main_steps(wf)]
    for path in sim["ifFails"]:
        assert {k: v for k, v in path.items() if k != "step"} == g._play(wf, path["step"])
