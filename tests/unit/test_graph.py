"""Graph workflows without services: the decision table, the verifier's graph findings,
``simulate`` and the envelope's new keys. Nothing here calls a step."""

from __future__ import annotations

import itertools

import pytest

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.verbs.workflow import CheckWorkflowAction
from protomolt_jobs.workflow import Runtime, WorkflowParseError, check, parse_workflow
from protomolt_jobs.workflow import graph as g
from protomolt_jobs.workflow.envelope import MAX_GRAPH_DEPENDENCIES, MAX_GRAPH_STEPS
from protomolt_jobs.workflow.types import Dependency
from tests.support.graphs import diamond, graph, step
from tests.support.grpc_servers import seed_workflow

T = "127.0.0.1:9"  # never called


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def _findings(wf, runtime):
    return [(f.step, f.kind, f.error) for f in check(wf, runtime)]


# -- the decision table, exhaustively -------------------------------------------------------------


class _S:
    """A stand-in step for :func:`graph.decide` (it reads ``depends`` and ``join`` only)."""

    def __init__(self, deps, join="all"):
        self.depends = tuple(Dependency(n, on) for n, on in deps)
        self.join = join


OUTCOMES = (None, g.SUCCEEDED, g.FAILED, g.SKIPPED)
ONS = ("success", "failure", "done")


def _expected(deps, outcomes, join):
    """The table of graph.py's docstring, written out independently."""

    def match(on, o):
        return {"success": o == g.SUCCEEDED, "failure": o == g.FAILED, "done": True}[on]

    if join == "all":
        for (name, on), o in zip(deps, outcomes, strict=True):
            if o is not None and not match(on, o):
                return ("skip", f"upstream {name} {o}")
        return ("run", "") if all(o is not None for o in outcomes) else None
    if any(o is None for o in outcomes):
        return None
    if any(match(on, o) for (_, on), o in zip(deps, outcomes, strict=True)):
        return ("run", "")
    return "skip-any"


@pytest.mark.parametrize("join", ["all", "any"])
def test_decision_table_for_every_combination_of_two_edges(join):
    n = 0
    for on1, on2 in itertools.product(ONS, repeat=2):
        deps = [("x", on1), ("y", on2)]
        for o1, o2 in itertools.product(OUTCOMES, repeat=2):
            outcomes = {k: v for k, v in (("x", o1), ("y", o2)) if v is not None}
            got = g.decide(_S(deps, join), outcomes)
            want = _expected(deps, (o1, o2), join)
            if want == "skip-any":
                assert got is not None and got[0] == "skip"
                assert got[1].startswith("no upstream edge matched (x ")
            else:
                assert got == want, (deps, outcomes, join)
            n += 1
    assert n == 9 * 16


def test_a_step_without_dependencies_runs_at_once():
    assert g.decide(_S([]), {}) == ("run", "")


def test_a_skip_propagates_only_through_edges_that_do_not_match_it():
    assert g.decide(_S([("a", "success")]), {"a": g.SKIPPED}) == ("skip", "upstream a skipped")
    assert g.decide(_S([("a", "done")]), {"a": g.SKIPPED}) == ("run", "")
    assert g.decide(_S([("a", "failure")]), {"a": g.SUCCEEDED}) == (
        "skip",
        "upstream a succeeded",
    )


# -- the envelope -------------------------------------------------------------------------------


def test_a_workflow_without_graph_keys_stays_sequential(runtime):
    wf = parse_workflow(seed_workflow(T, review="invoke"), runtime)
    assert wf.graph is False
    assert all(s.depends == () for s in wf.steps)
    assert wf.checkpoints_to_complete == 3


def test_dependencies_come_from_after_then_edge_sources_then_the_previous_step(runtime):
    wf = parse_workflow(
        graph(
            [
                step("a", T),
                step("b", T),  # the step before it
                step("c", T, after=["a", {"step": "b", "on": "failure"}]),
                step("undo", T),
                step("e", T),  # the step before it that is not a compensation: c
            ],
            maxParallel=2,
            completion={"require": ["e"]},
        ),
        runtime,
    )
    by = {s.name: s for s in wf.steps}
    assert by["a"].depends == ()
    assert by["b"].depends == (Dependency("a"),)
    assert by["c"].depends == (Dependency("a"), Dependency("b", "failure"))
    assert by["e"].depends == (Dependency("undo"),)
    assert wf.max_parallel == 2
    assert wf.require == ("e",)


def test_compensation_steps_depend_on_nothing_and_are_skipped_as_previous(runtime):
    wf = parse_workflow(
        graph([step("a", T, compensate="undo"), step("undo", T), step("b", T)]), runtime
    )
    by = {s.name: s for s in wf.steps}
    assert by["undo"].depends == ()
    assert by["b"].depends == (Dependency("a"),)
    assert wf.checkpoints_to_complete == 2


@pytest.mark.parametrize(
    ("mutate", "step_name", "text"),
    [
        (lambda s: s.update(after="a"), "b", "'after' must be an array"),
        (lambda s: s.update(after=[{"step": "a", "on": "sometimes"}]), "b", "'on' must be"),
        (lambda s: s.update(after=[3]), "b", "'after' must be an array"),
        (lambda s: s.update(join="most"), "b", "'join' must be 'all' or 'any'"),
        (lambda s: s.update(compensate=""), "b", "'compensate' must name a step"),
        # A gate that is not text was silently dropped: "when": false ran the step.
        (lambda s: s.update(when=False), "b", "'when' must be a CEL expression (a string)"),
        (lambda s: s.update(when=0), "b", "'when' must be a CEL expression (a string); got 0"),
        (lambda s: s.update(when=["x"]), "b", "'when' must be a CEL expression"),
    ],
)
def test_malformed_graph_keys_are_parse_errors_naming_the_step(runtime, mutate, step_name, text):
    b = step("b", T)
    mutate(b)
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(graph([step("a", T), b]), runtime)
    assert info.value.step == step_name
    assert text in info.value.message


@pytest.mark.parametrize(
    ("keys", "text"),
    [
        ({"maxParallel": "four"}, "'maxParallel' must be a whole number"),
        ({"completion": "all"}, "'completion' must be an object"),
        ({"completion": {"require": "a"}}, "'completion.require' must be an array"),
    ],
)
def test_malformed_workflow_graph_keys_are_parse_errors(runtime, keys, text):
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(graph([step("a", T)], **keys), runtime)
    assert text in info.value.message


# -- verification ---------------------------------------------------------------------------------


def test_the_diamond_verifies(runtime):
    assert check(diamond(T), runtime) == []


def test_a_cycle_is_refused_with_its_path(runtime):
    wf = graph([step("a", T, after=["c"]), step("b", T, after=["a"]), step("c", T, after=["b"])])
    assert _findings(wf, runtime) == [("a", "graph", "cycle: a -> b -> c -> a")]


def test_a_step_after_itself_is_a_cycle(runtime):
    assert _findings(graph([step("a", T, after=["a"])]), runtime) == [
        ("a", "graph", "cycle: a -> a")
    ]


def test_an_unknown_dependency_is_refused_naming_the_step(runtime):
    wf = graph([step("a", T), step("b", T, after=["a", "nope"])])
    assert _findings(wf, runtime) == [("b", "graph", "unknown dependency 'nope'")]


def test_an_unreachable_step_is_refused_naming_it(runtime):
    wf = graph(
        [
            step("a", T, compensate="undo"),
            step("undo", T),
            step("x", T, after=["undo"]),
            step("y", T, after=["x"]),
        ]
    )
    found = _findings(wf, runtime)
    assert (
        "x",
        "graph",
        "unreachable: it depends on 'undo', a compensation step that runs only to undo 'a'",
    ) in found
    assert ("y", "graph", "unreachable: it waits on 'x', which can never run") in found


def test_steps_after_a_cycle_are_unreachable(runtime):
    wf = graph([step("a", T, after=["b"]), step("b", T, after=["a"]), step("c", T, after=["b"])])
    assert _findings(wf, runtime) == [
        ("a", "graph", "cycle: a -> b -> a"),
        ("c", "graph", "unreachable: it waits on 'b', which can never run"),
    ]


def test_a_step_needing_success_and_failure_of_one_step_is_refused_naming_it(runtime):
    # issue 27 item 5: join all over 'left' on success and 'left' on failure never runs.
    wf = graph(
        [
            step("left", T),
            step(
                "both",
                T,
                after=[{"step": "left", "on": "success"}, {"step": "left", "on": "failure"}],
            ),
        ]
    )
    assert _findings(wf, runtime) == [
        (
            "both",
            "graph",
            (
                "can never run: its dependency conditions contradict each other (join 'all'): "
                "'left' would have to succeed (left on success) and fail (left on failure)"
            ),
        )
    ]


def test_conditions_that_cannot_all_hold_through_other_steps_are_refused(runtime):
    # 'fix' runs only when 'a' failed; 'late' needs 'a' to succeed and 'fix' to succeed.
    wf = graph(
        [
            step("a", T),
            step("fix", T, after=[{"step": "a", "on": "failure"}]),
            step("late", T, after=["a", "fix"]),
            step("later", T, after=["late"]),
            step("any_of", T, after=["late", {"step": "a", "on": "done"}], join="any"),
        ]
    )
    assert _findings(wf, runtime) == [
        (
            "late",
            "graph",
            (
                "can never run: its dependency conditions contradict each other (join 'all'): "
                "'a' would have to succeed (a on success) and fail (through 'fix')"
            ),
        ),
        ("later", "graph", "can never run: it needs 'late' to succeed, and 'late' can never run"),
    ]


def test_join_any_contradicts_only_when_every_edge_does(runtime):
    both = [{"step": "b", "on": "success"}, {"step": "b", "on": "failure"}]
    wf = graph(
        [
            step("a", T),
            step("b", T, after=["a"]),
            # either edge may match: fine
            step("either", T, after=both, join="any"),
            # every edge needs 'a' to succeed and one of them also to fail
            step("c", T, after=[{"step": "a", "on": "failure"}]),
            step("d", T, after=[{"step": "a", "on": "failure"}]),
            step("never", T, after=["b", "c"]),
            step("never2", T, after=["b", "d"]),
            step("no_way", T, after=["never", "never2"], join="any"),
        ],
        completion={"require": ["either"]},
    )
    found = _findings(wf, runtime)
    assert [f[0] for f in found] == ["never", "never2", "no_way"]
    assert found[2][2] == "can never run: it needs 'never' to succeed, and 'never' can never run"


def test_success_with_done_or_failure_with_done_is_fine(runtime):
    wf = graph(
        [
            step("left", T),
            step("s", T, after=["left", {"step": "left", "on": "done"}]),
            step("f", T, after=[{"step": "left", "on": "failure"}, {"step": "left", "on": "done"}]),
        ],
        completion={"require": ["s"]},
    )
    assert _findings(wf, runtime) == []


def test_reading_a_sibling_is_refused_as_a_race(runtime):
    wf = graph(
        [
            step("a", T),
            step("b", T, after=["a"], reads=["a"]),
            step("c", T, after=["a"], reads=["b"]),
        ]
    )
    assert _findings(wf, runtime) == [
        (
            "c",
            "graph",
            (
                "reads 'b', which is not an ancestor of 'c' (a sibling's output is a race); "
                "add it to 'after'"
            ),
        )
    ]


def test_a_gate_reading_a_sibling_is_refused_too(runtime):
    wf = graph(
        [step("a", T), step("b", T, after=["a"]), step("c", T, after=["a"], when="b.step == 'b'")]
    )
    assert [f[0] for f in _findings(wf, runtime)] == ["c"]


def test_reading_an_ancestor_through_a_chain_is_fine(runtime):
    wf = graph([step("a", T), step("b", T), step("c", T, reads=["a"])])
    assert check(wf, runtime) == []


@pytest.mark.parametrize(
    ("keys", "finding"),
    [
        ({"maxParallel": 0}, ("", "graph", "maxParallel must be between 1 and 64; got 0")),
        ({"maxParallel": 65}, ("", "graph", "maxParallel must be between 1 and 64; got 65")),
        (
            {"completion": {"require": ["a", "zz"]}},
            ("", "completion", "completion.require names no step 'zz'"),
        ),
    ],
)
def test_workflow_bounds_and_require(runtime, keys, finding):
    assert _findings(graph([step("a", T)], **keys), runtime) == [finding]


def test_a_compensation_naming_no_step_is_refused(runtime):
    wf = graph([step("a", T, compensate="undo_a")])
    assert _findings(wf, runtime) == [("a", "graph", "compensate names no step 'undo_a'")]


def test_a_compensation_step_reads_the_step_it_undoes(runtime):
    wf = graph([step("a", T, compensate="undo"), step("b", T), step("undo", T, reads=["a"])])
    assert check(wf, runtime) == []
    wf = graph([step("a", T, compensate="undo"), step("b", T), step("undo", T, reads=["b"])])
    assert [f[0] for f in _findings(wf, runtime)] == ["undo"]


# -- simulate -----------------------------------------------------------------------------------


def test_simulate_on_the_diamond_says_what_each_failure_does(runtime):
    answer = CheckWorkflowAction(runtime).execute({"workflow": diamond(T), "simulate": True})
    assert answer["ok"] is True
    sim = answer["simulation"]
    assert sim["allSucceed"]["status"] == "COMPLETED"
    assert sim["allSucceed"]["runs"] == ["a", "b", "c", "d"]
    by = {s["step"]: s for s in sim["ifFails"]}
    assert list(by) == ["a", "b", "c", "d"]
    assert by["a"]["runs"] == ["a"]
    assert by["a"]["notRun"] == ["b", "c", "d"]
    assert by["a"]["status"] == "FAILED"
    # b fails: c was started beside it and finishes; d never starts
    assert by["b"]["runs"] == ["a", "b", "c"]
    assert by["b"]["notRun"] == ["d"]
    assert by["b"]["criterion"] == "unhandled failure of step 'b': simulated failure"
    assert by["d"]["runs"] == ["a", "b", "c", "d"]
    assert all(s["status"] == "FAILED" for s in by.values())


def test_simulate_with_a_failure_edge_and_a_compensation(runtime):
    wf = graph(
        [
            step("a", T, compensate="undo_a"),
            step("b", T, after=["a"]),
            step("fix", T, after=[{"step": "b", "on": "failure"}]),
            step("d", T, after=["b"]),
            step("undo_a", T),
        ]
    )
    answer = CheckWorkflowAction(runtime).execute({"workflow": wf, "simulate": True})
    by = {s["step"]: s for s in answer["simulation"]["ifFails"]}
    assert by["b"]["runs"] == ["a", "b", "fix"]
    assert by["b"]["skipped"] == [{"step": "d", "reason": "upstream b failed"}]
    assert by["b"]["status"] == "FAILED"
    assert by["b"]["compensates"] == ["undo_a"]
    assert answer["simulation"]["allSucceed"]["skipped"] == [
        {"step": "fix", "reason": "upstream b succeeded"}
    ]
    assert answer["simulation"]["allSucceed"]["status"] == "COMPLETED"


def test_simulate_must_be_a_boolean(runtime):
    from protomolt_jobs.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        CheckWorkflowAction(runtime).execute({"workflow": diamond(T), "simulate": "yes"})
    assert "simulate" in str(info.value)


def test_simulate_on_a_sequential_workflow_is_its_chain(runtime):
    answer = CheckWorkflowAction(runtime).execute(
        {"workflow": seed_workflow(T, review="invoke"), "simulate": True}
    )
    by = {s["step"]: s for s in answer["simulation"]["ifFails"]}
    assert by["embed"]["runs"] == ["tokenize", "embed"]
    assert by["embed"]["notRun"] == ["review"]


@pytest.mark.parametrize(
    ("wf", "finding"),
    [
        (
            graph([step("a", T, after=["b"]), step("b", T, after=["a"])]),
            {"step": "a", "kind": "graph", "error": "cycle: a -> b -> a"},
        ),
        (
            graph([step("a", T), step("b", T, after=["zz"])]),
            {"step": "b", "kind": "graph", "error": "unknown dependency 'zz'"},
        ),
        (
            graph([step("a", T, compensate="u"), step("u", T), step("x", T, after=["u"])]),
            {
                "step": "x",
                "kind": "graph",
                "error": "unreachable: it depends on 'u', a compensation step that runs only "
                "to undo 'a'",
            },
        ),
        (
            graph(
                [step("a", T), step("b", T, after=["a"]), step("c", T, after=["a"], reads=["b"])]
            ),
            {
                "step": "c",
                "kind": "graph",
                "error": "reads 'b', which is not an ancestor of 'c' (a sibling's output is a "
                "race); add it to 'after'",
            },
        ),
        (
            graph(
                [
                    step("left", T),
                    step(
                        "x",
                        T,
                        after=[{"step": "left"}, {"step": "left", "on": "failure"}],
                        join="all",
                    ),
                ]
            ),
            {
                "step": "x",
                "kind": "graph",
                "error": "can never run: its dependency conditions contradict each other "
                "(join 'all'): 'left' would have to succeed (left on success) and fail (left on "
                "failure)",
            },
        ),
    ],
    ids=["cycle", "unknown-dependency", "unreachable", "sibling-read", "contradiction"],
)
def test_check_workflow_refuses_each_naming_the_step(runtime, wf, finding):
    answer = CheckWorkflowAction(runtime).execute({"workflow": wf, "simulate": True})
    assert answer["ok"] is False
    assert answer["findings"] == [finding]
    assert "simulation" not in answer


def test_a_chain_as_long_as_allowed_verifies_without_hitting_the_recursion_limit(runtime):
    # A chain deeper than Python's recursion limit reached submit-workflow as a 500
    # (RecursionError in the cycle search and in the ancestors walk).
    n = MAX_GRAPH_STEPS
    chain = [step("s0", T, after=[])] + [
        step(f"s{i}", T, after=[f"s{i - 1}"], reads=[f"s{i - 1}"]) for i in range(1, n)
    ]
    assert _findings(graph(chain), runtime) == []
    ring = [step(f"s{i}", T, after=[f"s{(i - 1) % n}"]) for i in range(n)]
    found = _findings(graph(ring), runtime)
    assert len(found) == 1 and found[0][:2] == ("s0", "graph")
    assert found[0][2].startswith("cycle: s0 -> s1 -> s2 -> ") and found[0][2].endswith(
        f"s{n - 1} -> s0"
    )


def test_verifying_the_longest_chain_takes_a_second_and_a_longer_graph_is_refused(runtime):
    # The reachability pass was a fixpoint over every step per pass: 30 s of CPU for 4000
    # steps (a request thread pinned, the node's workers starved under the GIL), and the
    # ancestors of a chain of n steps take n^2/2 entries: a 16 MiB body holds 250 000 steps.
    import time

    chain = [step(f"s{i}", T) for i in range(MAX_GRAPH_STEPS)]
    started = time.monotonic()
    assert _findings(graph(chain, maxParallel=4), runtime) == []
    assert time.monotonic() - started < 10
    longer = graph([*chain, step("one_more", T)], maxParallel=4)
    assert _findings(longer, runtime) == [
        ("", "workflow", f"a graph workflow has at most 1024 steps; got {MAX_GRAPH_STEPS + 1}")
    ]
    # A sequential workflow has no such bound (its checks are linear), but simulate has.
    assert _findings(graph([*chain, step("one_more", T)]), runtime) == []
    with pytest.raises(InvalidInput, match="'simulate' plays workflows of at most 1024 steps"):
        CheckWorkflowAction(runtime).execute(
            {"workflow": graph([*chain, step("one_more", T)]), "simulate": True}
        )


def test_simulating_a_chain_of_500_steps_takes_seconds(runtime):
    # simulate plays one run per step; each play re-decided every step after each ending
    # (and looked steps up by a linear scan): 29 s for 400 steps; now 0.5 s.
    import time

    wf = parse_workflow(graph([step(f"s{i}", T) for i in range(500)], maxParallel=4), runtime)
    started = time.monotonic()
    sim = g.simulate(wf)
    assert time.monotonic() - started < 10
    assert len(sim["ifFails"]) == 500 and sim["allSucceed"]["status"] == "COMPLETED"
    assert sim["ifFails"][150]["runs"][-1] == "s150" and len(sim["ifFails"][150]["notRun"]) == 349


def _largest_graph(on: str) -> dict:
    """MAX_GRAPH_STEPS steps, exactly MAX_GRAPH_DEPENDENCIES dependencies: each step after the
    four before it (``on`` each), the last ones after a fifth; each reads its parent."""
    steps = []
    extra = MAX_GRAPH_DEPENDENCIES - sum(min(i, 4) for i in range(MAX_GRAPH_STEPS))
    for i in range(MAX_GRAPH_STEPS):
        width = min(i, 4) + (1 if i >= MAX_GRAPH_STEPS - extra else 0)
        after = [{"step": f"s{j}", "on": on} for j in range(i - width, i)]
        steps.append(step(f"s{i}", T, after=after, reads=[f"s{i - 1}"] if i else []))
    wf = graph(steps, maxParallel=64)
    assert sum(len(x["after"]) for x in wf["steps"]) == MAX_GRAPH_DEPENDENCIES
    return wf


@pytest.mark.parametrize("on", ["success", "done"])
def test_simulating_the_largest_graph_the_caps_allow_takes_under_5_s_of_cpu(runtime, on):
    # issue 27 item 6b: 1024 steps with 64 dependencies each held a CPU for 200 s. The caps
    # (steps, dependencies, simulated paths, simulate's CPU budget) bound the request. With
    # success edges every failure is unhandled (each path is cut from the all-succeed play);
    # with done edges every failure is handled (each path is a full play), and the CPU budget
    # may leave paths out, saying so.
    import time

    wf = _largest_graph(on)
    started = time.process_time()
    answer = CheckWorkflowAction(Runtime()).execute({"workflow": wf, "simulate": True})
    spent = time.process_time() - started
    assert answer["ok"] is True, answer["findings"][:3]
    assert spent < 5.0, f"check-workflow with simulate took {spent:.1f} s of CPU"
    sim = answer["simulation"]
    assert sim["allSucceed"]["status"] == "COMPLETED"
    assert len(sim["allSucceed"]["runs"]) == MAX_GRAPH_STEPS
    played = len(sim["ifFails"])
    if on == "success":
        assert played == MAX_GRAPH_STEPS and "truncated" not in sim
        assert sim["ifFails"][500]["runs"][-1] == "s500"
        assert len(sim["ifFails"][500]["notRun"]) == MAX_GRAPH_STEPS - 501
    else:
        assert played > 0
        if played < MAX_GRAPH_STEPS:
            assert sim["truncated"]["played"] == played
            assert sim["truncated"]["of"] == MAX_GRAPH_STEPS
            assert "CPU budget" in sim["truncated"]["reason"]


def test_a_graph_over_the_dependency_cap_is_refused_at_once(runtime):
    import time

    # the issue's body: 1024 steps with 64 dependencies each (0.7 MB)
    steps = [
        step(f"s{i}", T, after=[f"s{j}" for j in range(max(0, i - 64), i)])
        for i in range(MAX_GRAPH_STEPS)
    ]
    n = sum(len(x["after"]) for x in steps)
    started = time.process_time()
    answer = CheckWorkflowAction(Runtime()).execute({"workflow": graph(steps), "simulate": True})
    assert time.process_time() - started < 5.0
    assert answer == {
        "ok": False,
        "findings": [
            {
                "step": "",
                "kind": "workflow",
                "error": f"a graph workflow has at most {MAX_GRAPH_DEPENDENCIES} dependencies; "
                f"got {n}",
            }
        ],
    }
    # one over the cap is refused too; the cap itself is fine (the test above)
    wf = _largest_graph("success")
    wf["steps"][-1]["after"].append({"step": "s0"})
    assert _findings(wf, runtime) == [
        (
            "",
            "workflow",
            (
                f"a graph workflow has at most {MAX_GRAPH_DEPENDENCIES} dependencies; "
                f"got {MAX_GRAPH_DEPENDENCIES + 1}"
            ),
        )
    ]


def test_simulate_bounds_its_paths_and_its_cpu(runtime):
    wf = parse_workflow(graph([step(f"s{i}", T) for i in range(10)], maxParallel=4), runtime)
    sim = g.simulate(wf, max_paths=3)
    assert [p["step"] for p in sim["ifFails"]] == ["s0", "s1", "s2"]
    assert sim["truncated"] == {
        "played": 3,
        "of": 10,
        "reason": "simulate plays at most 3 failure paths; the failures of 's3' and the steps "
        "after it were not played",
    }
    sim = g.simulate(wf, cpu_budget_s=0.0)
    assert sim["ifFails"] == [] and sim["truncated"]["played"] == 0
    assert sim["truncated"]["reason"].startswith("simulate spent its CPU budget of 0 s")
    assert sim["allSucceed"]["status"] == "COMPLETED"
