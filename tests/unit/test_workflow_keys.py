"""workflow/keys.py: the table of known definition keys and the unknown-key walk.

Each object kind, nested paths, the suggestions (same kind, folded, alias, another kind,
none), the bounds (findings cap, long keys), the fast path agreeing with the walk, and
runs/scheduling.py reading the same table. test_workflow_keys_guide.py holds the table to
docs/workflows.md and to upstream's envelope; test_unknown_key_doors.py the doors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protomolt_jobs.runs import scheduling
from protomolt_jobs.workflow import keys
from tests.support.grpc_servers import seed_workflow

TARGET = "127.0.0.1:9"  # never called


def paths(definition: Any) -> list[str]:
    return [u.path for u in keys.unknown_keys(definition)]


def only(definition: Any) -> keys.UnknownKey:
    (unknown,) = keys.unknown_keys(definition)
    return unknown


def step(**extra: Any) -> dict[str, Any]:
    return {"name": "s", "target": TARGET, "method": "p.S/M", **extra}


# -- the acceptance shape -------------------------------------------------------------------------


def test_maxparalel_at_the_top_and_maxatempts_on_a_step_are_two_findings():
    wf = {"maxParalel": 2, **seed_workflow(TARGET)}
    wf["steps"][1]["maxAtempts"] = 3
    top, on_step = keys.findings(wf)
    assert (top.step, top.kind) == ("", "unknown-key")
    assert top.error == "unknown key 'maxParalel' at maxParalel: did you mean 'maxParallel'?"
    assert (on_step.step, on_step.kind) == ("embed", "unknown-key")
    assert on_step.error.startswith(
        "unknown key 'maxAtempts' at steps[1].maxAtempts: did you mean 'maxAttempts'? It is a "
        "key of steps[i].structured, not of a step; a run's attempts are the node's "
        "jobs.max_attempts"
    )


def test_a_definition_with_only_known_keys_has_no_finding():
    assert keys.findings(seed_workflow(TARGET)) == []
    assert keys.refusal(seed_workflow(TARGET)) is None


# -- every object kind ----------------------------------------------------------------------------

# (id, definition, the unknown key's path, its step, the suggestion)
KIND_CASES = [
    ("workflow", {"stpes": []}, "stpes", "", "steps"),
    ("schema", {"schema": {"descriptorSetBase64": "x", "rot": "a"}}, "schema.rot", "", "root"),
    ("step", {"steps": [step(methd="x")]}, "steps[0].methd", "s", "method"),
    (
        "after",
        {"steps": [step(after=["a", {"step": "a", "onn": "done"}])]},
        "steps[0].after[1].onn",
        "s",
        "on",
    ),
    (
        "edge",
        {"steps": [step(edge={"sources": ["input"], "produceTyp": "T"})]},
        "steps[0].edge.produceTyp",
        "s",
        "produceType",
    ),
    (
        "fanOut",
        {"steps": [step(fanOut={"items": "x", "maxItem": 3})]},
        "steps[0].fanOut.maxItem",
        "s",
        "maxItems",
    ),
    (
        "structured",
        {"steps": [{"name": "g", "structured": {"targetType": "T", "modl": "m"}}]},
        "steps[0].structured.modl",
        "g",
        "model",
    ),
    (
        "verify",
        {"steps": [step(effect="external", verify={"method": "p.S/F", "fond": "true"})]},
        "steps[0].verify.fond",
        "s",
        "found",
    ),
    (
        "celRule-of-a-step",
        {"steps": [step(celRules=[{"target": "t", "selectr": "1"}])]},
        "steps[0].celRules[0].selectr",
        "s",
        "selector",
    ),
    (
        "celRule-of-an-edge",
        {"steps": [step(edge={"celRules": [{"target": "t"}, {"target": "t", "flter": "x"}]})]},
        "steps[0].edge.celRules[1].flter",
        "s",
        "filter",
    ),
    (
        "celRule-of-a-probe",
        {"steps": [step(verify={"celRules": [{"target": "t", "fallbak": []}]})]},
        "steps[0].verify.celRules[0].fallbak",
        "s",
        "fallback",
    ),
    (
        "celRule-of-the-output",
        {"output": {"type": "T", "celRules": [{"targt": "t"}]}},
        "output.celRules[0].targt",
        "",
        "target",
    ),
    ("output", {"output": {"typ": "T"}}, "output.typ", "", "type"),
    ("completion", {"completion": {"requires": ["a"]}}, "completion.requires", "", "require"),
    ("scheduling", {"scheduling": {"priorty": 2}}, "scheduling.priorty", "", "priority"),
    ("budget", {"budget": {"maxCosts": 3}}, "budget.maxCosts", "", "maxCost"),
    ("cancel", {"cancel": {"compensat": False}}, "cancel.compensat", "", "compensate"),
    ("retention", {"retention": {"complete": "P1D"}}, "retention.complete", "", "completed"),
    ("testCase", {"tests": [{"name": "c", "expct": {}}]}, "tests[0].expct", "", "expect"),
    (
        "testEvent",
        {"tests": [{"name": "c", "events": [{"advanceMS": 1}]}]},
        "tests[0].events[0].advanceMS",
        "",
        "advanceMs",
    ),
    (
        "testExpect",
        {"tests": [{"name": "c", "expect": {"errorkind": "GRPC"}}]},
        "tests[0].expect.errorkind",
        "",
        "errorKind",
    ),
    (
        "resumable",
        {"steps": [step(resumable={"state": "state", "dnoe": "response.done"})]},
        "steps[0].resumable.dnoe",
        "s",
        "done",
    ),
    (
        "loop",
        {"steps": [step(loop={"to": "a", "max": 2, "onExhaust": "park"})]},
        "steps[0].loop.onExhaust",
        "s",
        "onExhausted",
    ),
    (
        "approval",
        {"steps": [step(completion="approval", approval={"quorm": 2})]},
        "steps[0].approval.quorm",
        "s",
        "quorum",
    ),
    (
        "approvers",
        {"steps": [step(completion="approval", approval={"approvers": {"rols": ["a"]}})]},
        "steps[0].approval.approvers.rols",
        "s",
        "roles",
    ),
    (
        "escalation",
        {"steps": [step(completion="approval", approval={"escalate": [{"addRole": ["c"]}]})]},
        "steps[0].approval.escalate[0].addRole",
        "s",
        "addRoles",
    ),
]


@pytest.mark.parametrize(
    ("definition", "path", "step_name", "suggestion"),
    [c[1:] for c in KIND_CASES],
    ids=[c[0] for c in KIND_CASES],
)
def test_each_object_kind_names_the_key_its_path_and_the_closest_known_key(
    definition, path, step_name, suggestion
):
    unknown = only(definition)
    assert (unknown.path, unknown.step, unknown.suggestion) == (path, step_name, suggestion)
    assert unknown.suggested_in == ()
    assert unknown.message == (
        f"unknown key '{unknown.key}' at {path}: did you mean '{suggestion}'?"
    )
    (finding,) = keys.findings(definition)
    assert (finding.step, finding.kind, finding.error) == (
        step_name,
        "unknown-key",
        unknown.message,
    )


def test_every_kind_of_the_table_has_a_case():
    covered = {c[0].split("-")[0] for c in KIND_CASES}
    assert covered == set(keys.KINDS)


def test_each_kind_is_reached_from_the_top_through_the_table():
    reached = {"workflow"}
    frontier = ["workflow"]
    while frontier:
        for child in keys.KINDS[frontier.pop()].keys.values():
            if child is not None and child not in reached:
                reached.add(child)
                frontier.append(child)
    assert reached == set(keys.KINDS)


# -- paths ----------------------------------------------------------------------------------------


def test_paths_follow_the_document_and_name_each_step():
    wf = {
        "extra": 1,
        "steps": [
            step(name="a", colour=1, celRules=[{"target": "t"}, {"target": "t", "x": 1}]),
            {"name": "b", "edge": {"celRules": [{"y": 1}]}},
            {"z": 1},  # a step without a name: no step to name
        ],
        "output": {"celRules": [{"w": 1}]},
    }
    got = [(u.path, u.step) for u in keys.unknown_keys(wf)]
    assert got == [
        ("extra", ""),
        ("steps[0].colour", "a"),
        ("steps[0].celRules[1].x", "a"),
        ("steps[1].edge.celRules[0].y", "b"),
        ("steps[2].z", ""),
        ("output.celRules[0].w", ""),
    ]


def test_a_key_that_is_not_an_identifier_is_quoted_in_the_path():
    assert paths({"steps": [step(**{"a b": 1, 'q"': 2, "": 3})]}) == [
        'steps[0]["a b"]',
        'steps[0]["q\\""]',
        'steps[0][""]',
    ]


def test_a_long_key_is_cut_short_in_the_path_and_the_message():
    unknown = only({"k" * 100_000: 1})
    assert unknown.key == "k" * 100_000
    assert unknown.path == '["' + "k" * 77 + '..."]'
    assert len(unknown.message) < 400


def test_an_unknown_keys_value_is_not_walked():
    # Only the outer key is reported: the walk never descends into what it does not know.
    assert paths({"stepz": [{"nme": 1}], "budget": {"x": {"y": 1}}}) == ["stepz", "budget.x"]


@pytest.mark.parametrize(
    "definition",
    [
        None,
        [],
        "text",
        {"steps": "not a list"},
        {"steps": [1, "two", None, ["x"]]},
        {"schema": ["x"], "output": "t", "budget": 3, "completion": None},
        {"steps": [step(after=["a", "b"], edge=[1], fanOut="x", verify=7, celRules={})]},
    ],
)
def test_values_of_the_wrong_type_are_left_to_the_parser(definition):
    assert list(keys.unknown_keys(definition)) == []
    assert keys.findings(definition) == []


def test_schema_sources_are_file_paths_not_keys():
    wf = {"schema": {"sources": {"a/b.proto": "x", "weird key.proto": "y"}, "root": "a/b.proto"}}
    assert paths(wf) == []


# -- suggestions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "suggestion"),
    [
        ({"input_type": "T"}, "inputType"),  # snake_case: upstream ignores it silently
        ({"DEADLINE_MS": 1}, "deadlineMs"),  # case and underscores folded
        ({"MaxParallel": 2}, "maxParallel"),
        ({"steps": [step(fan_out={})]}, "fanOut"),
        ({"steps": [step(gate="x")]}, "when"),  # an alias: another word for the same key
        ({"steps": [step(condition="x")]}, "when"),
        ({"steps": [step(dependsOn=["a"])]}, "after"),
    ],
)
def test_suggestions_fold_case_and_underscores_and_know_aliases(definition, suggestion):
    assert only(definition).suggestion == suggestion


def test_a_key_of_another_object_says_where_it_belongs():
    unknown = only({"priority": 2})
    assert (unknown.suggestion, unknown.suggested_in) == ("priority", ("scheduling",))
    assert unknown.message == (
        "unknown key 'priority' at priority: it is a key of scheduling, not of the workflow"
    )
    several = only({"steps": [step(type="T")]})
    assert several.suggested_in == ("schema", "output")
    assert several.message.endswith("it is a key of schema and output, not of a step")


def test_another_objects_key_must_be_a_near_typo():
    # 'ceiling' is as close to 'scheduling' as difflib's default takes, but a different word.
    unknown = only({"budget": {"ceiling": 5}})
    assert unknown.suggestion is None
    assert unknown.message == (
        "unknown key 'ceiling' at budget.ceiling: the budget has the keys deadline, maxCost, "
        "onExceeded"
    )


@pytest.mark.parametrize("key", ["colour", "xyzzy", "retries"])
def test_a_key_close_to_nothing_gets_no_suggestion_but_the_objects_keys(key):
    unknown = only({"steps": [step(**{key: 1})]})
    assert (unknown.suggestion, unknown.suggested_in) == (None, ())
    assert "did you mean" not in unknown.message
    listed = ", ".join(sorted(keys.known_keys("step"), key=str.lower))
    assert unknown.message == f"unknown key '{key}' at steps[0].{key}: a step has the keys {listed}"


# -- bounds and the door's sentence ---------------------------------------------------------------


def test_findings_stop_at_the_cap_and_count_the_rest():
    wf = {f"k{i}": i for i in range(150)}
    found = keys.findings(wf)
    assert len(found) == keys.MAX_FINDINGS
    assert found[-2].error.startswith("unknown key 'k98' at k98")
    assert found[-1].error == "51 more unknown keys (only the first 99 are listed)"
    assert len(keys.findings(wf, limit=150)) == 150


def test_the_refusal_names_the_first_key_and_up_to_ten():
    first, said = keys.refusal({"maxParalel": 2})
    assert (first.path, first.step) == ("maxParalel", "")
    assert (
        said
        == "an unknown key: unknown key 'maxParalel' at maxParalel: did you mean 'maxParallel'?"
    )
    first, said = keys.refusal({f"k{i}": i for i in range(12)})
    assert first.path == "k0"
    assert said.startswith("unknown keys: unknown key 'k0' at k0")
    assert said.count("unknown key '") == keys.LISTED_KEYS
    assert said.endswith("; and more")


# -- the fast path agrees with the walk -----------------------------------------------------------

_ALL_KEYS = sorted({k for kind in keys.KINDS.values() for k in kind.keys} | {"zz", "x_y"})
_JSON_LEAF = st.none() | st.booleans() | st.integers() | st.text(max_size=3)


def _json(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return _JSON_LEAF
    inner = _json(depth - 1)
    return (
        _JSON_LEAF
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(_ALL_KEYS), inner, max_size=4)
    )


@settings(max_examples=400, deadline=None)
@given(_json(5))
def test_the_fast_path_agrees_with_the_walk(definition):
    walked = list(keys.unknown_keys(definition))
    assert keys._clean(definition, keys.KINDS["workflow"]) == (not walked)
    assert (keys.refusal(definition) is None) == (not walked)
    assert len(keys.findings(definition)) == min(len(walked), keys.MAX_FINDINGS)


# -- runs/scheduling.py reads the same table ------------------------------------------------------


def test_schedulings_own_checks_read_the_same_table():
    with pytest.raises(scheduling.FieldError) as raised:
        scheduling.parse_budget({"budget": {"ceiling": 1}}, pause_supported=True)
    assert raised.value.message.endswith(", ".join(keys.known_keys("budget")))
    with pytest.raises(scheduling.FieldError) as raised:
        scheduling.resolve({"scheduling": {"lane": "x"}}, {})
    assert raised.value.message.endswith(", ".join(keys.known_keys("scheduling")))
