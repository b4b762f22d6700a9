"""check-workflow and the verifier: a table of malformed workflows, and random JSON never raises."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.verbs.workflow import CheckWorkflowAction, RunWorkflowAction
from protomolt_jobs.workflow import Runtime, WorkflowParseError, check, parse_workflow, verify
from protomolt_jobs.workflow.types import DEFAULT_DEADLINE_MS
from tests.support.grpc_servers import seed_workflow

TARGET = "127.0.0.1:9"  # never called: nothing here runs a step


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def base() -> dict[str, Any]:
    return seed_workflow(TARGET, review="invoke")


def _with(mutate) -> dict[str, Any]:
    wf = copy.deepcopy(base())
    mutate(wf)
    return wf


def _set(path: list, value: Any):
    def mutate(wf):
        node = wf
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _drop(path: list):
    def mutate(wf):
        node = wf
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


# (id, mutation, expected step, expected kind, expected error substring)
CASES = [
    ("schema-missing", _drop(["schema"]), "", "workflow", "Schema must be an object"),
    (
        "schema-two-forms",
        _set(["schema", "type"], "jobs.test.Text"),
        "",
        "workflow",
        "exactly one of 'type', 'sources', 'descriptorSetBase64' but had 2",
    ),
    (
        "schema-bad-base64",
        _set(["schema", "descriptorSetBase64"], "!!not base64!!"),
        "",
        "workflow",
        "'descriptorSetBase64' is not valid base64",
    ),
    (
        "schema-not-a-set",
        _set(["schema", "descriptorSetBase64"], "AAAA"),
        "",
        "workflow",
        "Not a serialized google.protobuf.FileDescriptorSet",
    ),
    (
        "sources-do-not-compile",
        _set(["schema"], {"sources": {"a.proto": 'syntax = "proto3"; message {'}}),
        "",
        "workflow",
        "Failed to compile proto sources",
    ),
    (
        "sources-root-missing",
        _set(["schema"], {"sources": {"a.proto": 'syntax = "proto3";'}, "root": "b.proto"}),
        "",
        "workflow",
        "'root' must name a file present in 'sources'",
    ),
    (
        "input-type-unknown",
        _set(["inputType"], "jobs.test.Nope"),
        "",
        "workflow",
        "Unknown type 'jobs.test.Nope'",
    ),
    ("input-type-ambiguous", _drop(["inputType"]), "", "workflow", "A message 'type' is required"),
    ("steps-missing", _drop(["steps"]), "", "workflow", "'steps' must be a non-empty array"),
    ("steps-empty", _set(["steps"], []), "", "workflow", "'steps' must be a non-empty array"),
    (
        "step-not-object",
        _set(["steps", 0], "tokenize"),
        "",
        "workflow",
        "each step must be an object",
    ),
    ("step-no-name", _drop(["steps", 0, "name"]), "", "workflow", "each step needs a 'name'"),
    (
        "step-no-target",
        _drop(["steps", 1, "target"]),
        "embed",
        "workflow",
        "a step needs 'target' and 'method'",
    ),
    (
        "method-no-slash",
        _set(["steps", 1, "method"], "jobs.test.Embedder.Embed"),
        "embed",
        "workflow",
        "method must be 'package.Service/Method'; got 'jobs.test.Embedder.Embed'",
    ),
    (
        "method-unknown",
        _set(["steps", 1, "method"], "jobs.test.Embedder/Nope"),
        "embed",
        "workflow",
        "method 'jobs.test.Embedder/Nope' not found in the workflow's schema",
    ),
    (
        "cel-rule-not-object",
        _set(["steps", 1, "celRules"], ["x"]),
        "embed",
        "workflow",
        "each CEL rule must be an object",
    ),
    (
        "cel-rule-no-target",
        _set(["steps", 1, "celRules"], [{"selector": "1"}]),
        "embed",
        "workflow",
        "a CEL rule needs a 'target' path",
    ),
    ("output-no-type", _drop(["output", "type"]), "", "workflow", "'output' needs a 'type'"),
    (
        "output-type-unknown",
        _set(["output", "type"], "jobs.test.Nope"),
        "",
        "workflow",
        "Unknown type 'jobs.test.Nope'",
    ),
    (
        "step-name-not-identifier",
        _set(["steps", 1, "name"], "embed-it"),
        "embed-it",
        "workflow",
        "step name must be an identifier other than 'input'/'target'",
    ),
    (
        "step-name-reserved",
        _set(["steps", 1, "name"], "input"),
        "input",
        "workflow",
        "step name must be an identifier other than 'input'/'target'",
    ),
    (
        "step-name-duplicate",
        _set(["steps", 1, "name"], "tokenize"),
        "tokenize",
        "workflow",
        "duplicate step name",
    ),
    (
        "streaming-method",
        _set(["steps", 0, "method"], "jobs.test.Streamer/Stream"),
        "tokenize",
        "method",
        "jobs.test.Streamer.Stream is not unary",
    ),
    (
        "completion-unknown",
        _set(["steps", 2, "completion"], "later"),
        "review",
        "completion",
        "completion must be '' (invoke) or 'external'; got 'later'",
    ),
    (
        "rule-malformed",
        _set(["steps", 0, "rules"], ["text input.text"]),
        "tokenize",
        "rule",
        "not 'target = source.path', 'target += source.path', or '-target' (text input.text)",
    ),
    (
        "rule-unknown-target-field",
        _set(["steps", 0, "rules"], ["nope = input.text"]),
        "tokenize",
        "rule",
        "target: no field 'nope' on jobs.test.Text (nope = input.text)",
    ),
    (
        "rule-unknown-source",
        _set(["steps", 0, "rules"], ["text = embed.model"]),
        "tokenize",
        "rule",
        "source: unknown source 'embed'; the scope has [input]",
    ),
    (
        "rule-repeated-onto-singular",
        _set(["steps", 1, "rules"], ["text = tokenize.ids"]),
        "embed",
        "rule",
        "repeated source 'tokenize.ids' cannot land on singular 'text'",
    ),
    (
        "rule-message-onto-scalar",
        _set(["steps", 1, "rules"], ["text = tokenize.meta"]),
        "embed",
        "rule",
        "cannot convert between message and scalar ('tokenize.meta' -> 'text')",
    ),
    (
        "rule-append-singular",
        _set(["steps", 1, "rules"], ["text += tokenize.text"]),
        "embed",
        "rule",
        "'text' is singular; += needs a repeated target",
    ),
    (
        "rule-through-repeated",
        _set(["steps", 1, "rules"], ["text = tokenize.ids.x"]),
        "embed",
        "rule",
        "source: cannot traverse through repeated field 'ids'",
    ),
    ("rule-blank-path", _set(["steps", 1, "rules"], ["- "]), "embed", "rule", ""),
    (
        "cel-rule-bad-syntax",
        _set(["steps", 1, "celRules"], [{"selector": "tokenize.text +", "target": "text"}]),
        "embed",
        "celRule",
        "selector: Invalid CEL expression",
    ),
    (
        "cel-rule-filter-not-bool",
        _set(["steps", 1, "celRules"], [{"filter": "'yes'", "selector": "'x'", "target": "text"}]),
        "embed",
        "celRule",
        "filter: a filter must be a boolean expression; this is string (text)",
    ),
    (
        "cel-rule-bad-target",
        _set(["steps", 1, "celRules"], [{"selector": "'x'", "target": "nope"}]),
        "embed",
        "celRule",
        "target: no field 'nope' on jobs.test.Tokens (nope)",
    ),
    (
        "cel-rule-undeclared",
        _set(["steps", 1, "celRules"], [{"selector": "later.text", "target": "text"}]),
        "embed",
        "celRule",
        "selector: undeclared reference to 'later'",
    ),
    (
        "gate-not-bool",
        _set(["steps", 1, "when"], "size(tokenize.ids)"),
        "embed",
        "when",
        "this is int",
    ),
    (
        "gate-bad-syntax",
        _set(["steps", 1, "when"], "tokenize.ids >"),
        "embed",
        "when",
        "Invalid CEL expression",
    ),
    (
        "output-rule-unknown-field",
        _set(["output", "rules"], ["nope = input.text"]),
        "",
        "output",
        "target: no field 'nope' on jobs.test.Summary",
    ),
    (
        "structured-step-with-a-method",
        _set(["steps", 1, "structured"], {"targetType": "x", "model": "m"}),
        "embed",
        "workflow",
        "a structured step must not declare target, method, or tls",
    ),
    (
        "edge-step-with-top-level-rules",
        _set(["steps", 1, "edge"], {"sources": ["input"], "produceType": "jobs.test.Tokens"}),
        "embed",
        "edge",
        "top-level rules and celRules must be empty when an edge is set",
    ),
    (
        "fan-out-step-without-an-edge",
        _set(["steps", 1, "fanOut"], {"items": "ids"}),
        "embed",
        "workflow",
        "fan-out requires an edge; the items resolve against the edge's produced message",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "step", "kind", "error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_workflow_gives_a_finding(runtime, mutate, step, kind, error):
    wf = _with(mutate)
    findings = check(wf, runtime)
    assert findings, "expected a finding"
    matching = [f for f in findings if f.step == step and f.kind == kind and error in f.error]
    assert matching, f"no finding ({step!r}, {kind!r}, ~{error!r}) in {findings}"
    answer = CheckWorkflowAction(runtime).execute({"workflow": wf})
    assert answer["ok"] is False
    assert {"step": step, "kind": kind, "error": matching[0].error} in answer["findings"]


def test_table_has_at_least_fifteen_cases():
    assert len(CASES) >= 15


def test_the_seed_workflow_verifies(runtime):
    for review in ("invoke", "external"):
        assert check(seed_workflow(TARGET, review=review), runtime) == []
    answer = CheckWorkflowAction(runtime).execute({"workflow": base()})
    assert answer == {"ok": True, "findings": []}


def test_verifier_checks_fallback_rules_against_the_built_message(runtime):
    wf = base()
    wf["steps"][1]["celRules"] = [{"target": "text", "fallback": ["text = nope"]}]
    findings = verify(parse_workflow(wf, runtime))
    assert [f.kind for f in findings] == ["celRule"]
    assert (
        "fallback 'text = nope': source: no field 'nope' on jobs.test.Tokens" in findings[0].error
    )


def test_missing_workflow_is_a_finding_not_an_error(runtime):
    answer = CheckWorkflowAction(runtime).execute({})
    assert answer == {
        "ok": False,
        "findings": [{"step": "", "kind": "workflow", "error": "'workflow' object is required"}],
    }


def test_check_by_name_uses_the_repository(runtime):
    class Repo:
        def workflow(self, name):
            return base() if name == "seed" else None

    action = CheckWorkflowAction(runtime, Repo())
    assert action.execute({"workflowName": "seed"}) == {"ok": True, "findings": []}
    missing = action.execute({"workflowName": "other"})
    assert missing["ok"] is False
    assert missing["findings"][0]["error"] == "No stored workflow named 'other'"


def test_check_rejects_a_non_object_input(runtime):
    with pytest.raises(InvalidInput):
        CheckWorkflowAction(runtime).execute(["workflow"])  # type: ignore[arg-type]


def test_parse_is_cached_by_canonical_text(runtime):
    wf = base()
    first = parse_workflow(wf, runtime)
    reordered = json.loads(json.dumps(wf, sort_keys=True))
    assert parse_workflow(reordered, runtime) is first


def _other_descriptor_set(wf: dict[str, Any]) -> dict[str, Any]:
    """``wf`` with one more (unused) file in its descriptor set: same types, other schema."""
    import base64

    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(wf["schema"]["descriptorSetBase64"])
    )
    fds.file.add(name="extra/unused.proto", package="extra.unused", syntax="proto3")
    out = copy.deepcopy(wf)
    out["schema"]["descriptorSetBase64"] = base64.b64encode(fds.SerializeToString()).decode()
    return out


def test_the_parse_cache_key_matches_exactly_when_the_canonical_text_does():
    # The key leaves a descriptor set out of the JSON text (it is compared as the string).
    from protomolt_jobs.workflow.envelope import _cache_key, canonical_text

    wf = base()
    assert set(wf["schema"]) == {"descriptorSetBase64"}
    renamed = _with(lambda w: w.update(name="other"))
    variants = [
        wf,
        json.loads(json.dumps(wf, sort_keys=True)),
        _other_descriptor_set(wf),
        renamed,
        _with(lambda w: w.update(deadlineMs=1000)),
        _with(lambda w: w.update(deadlineMs=1000.0)),
        _with(lambda w: w["schema"].update(sources={})),  # two schema forms: not split
        {k: v for k, v in wf.items() if k != "schema"},
        {**wf, "schema": {"descriptorSetBase64": 5}},
        {**wf, "when": {1, 2}},  # not JSON: never cached
    ]
    for a in variants:
        for b in variants:
            same_text = canonical_text(a) is not None and canonical_text(a) == canonical_text(b)
            assert (_cache_key(a) is not None and _cache_key(a) == _cache_key(b)) == same_text
    assert _cache_key(variants[-1]) is None


def test_definitions_differing_only_in_their_descriptor_set_are_parsed_apart():
    runtime = Runtime()
    first = parse_workflow(base(), runtime)
    other = parse_workflow(_other_descriptor_set(base()), runtime)
    assert other is not first and other.pool is not first.pool
    assert parse_workflow(_other_descriptor_set(base()), runtime) is other
    assert parse_workflow(base(), runtime) is first


# -- deadlineMs is strict ---------------------------------------------------------------------

_DEADLINE_RULE = "must be a whole number of milliseconds from 0 (the default) to 86400000 (24 h)"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (-5, "-5"),
        (True, "bool true"),
        (False, "bool false"),
        ("5000", 'str "5000"'),
        (1.5, "1.5"),
        (float("inf"), "Infinity"),
        (86_400_001, "86400001"),
        (10**400, "1" + "0" * 36 + "..."),  # 1e400 as JSONB hands it back: a 401-digit int
        ([1], "list [1]"),
    ],
    ids=["negative", "true", "false", "string", "fraction", "inf", "over-24h", "1e400", "list"],
)
@pytest.mark.parametrize("where", ["workflow", "step"])
def test_a_deadline_that_is_not_a_sane_whole_number_is_a_parse_error(runtime, where, value, shown):
    wf = base()
    if where == "workflow":
        wf["deadlineMs"] = value
        step, subject = "", "the workflow"
    else:
        wf["steps"][1]["deadlineMs"] = value
        step, subject = "embed", "step 'embed'"
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(wf, runtime)
    assert info.value.step == step
    assert info.value.message == f"'deadlineMs' of {subject} {_DEADLINE_RULE}; got {shown}"
    (finding,) = check(wf, runtime)
    assert (finding.step, finding.kind) == (step, "workflow")
    assert "'deadlineMs'" in finding.error


def test_sane_deadlines_parse(runtime):
    wf = base()
    wf["deadlineMs"] = 86_400_000
    wf["steps"][0]["deadlineMs"] = 2500.0  # a whole number written with a fraction part
    wf["steps"][1]["deadlineMs"] = None
    parsed = parse_workflow(wf, runtime)
    assert parsed.deadline_ms == 86_400_000
    assert [s.deadline_ms for s in parsed.steps] == [2500, 0, 0]
    wf["deadlineMs"] = 0  # the default, as upstream
    assert parse_workflow(wf, runtime).deadline_ms == DEFAULT_DEADLINE_MS
    del wf["deadlineMs"]
    assert parse_workflow(wf, runtime).deadline_ms == DEFAULT_DEADLINE_MS


# -- property: random JSON never makes the checker (or run-workflow's input handling) raise ----

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)
keys = st.sampled_from(
    [
        "name",
        "schema",
        "inputType",
        "steps",
        "output",
        "deadlineMs",
        "target",
        "method",
        "rules",
        "celRules",
        "when",
        "validate",
        "completion",
        "type",
        "sources",
        "descriptorSetBase64",
        "root",
    ]
)
workflowish = st.recursive(
    json_values,
    lambda children: st.dictionaries(keys, children, max_size=6) | st.lists(children, max_size=3),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=workflowish)
def test_random_json_as_workflow_gives_findings_or_ok(value):
    runtime = Runtime()
    findings = check(value, runtime)
    assert isinstance(findings, list)
    answer = CheckWorkflowAction(runtime).execute({"workflow": value})
    assert isinstance(answer["ok"], bool)
    assert answer["ok"] == (answer["findings"] == [])
    json.dumps(answer)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.sampled_from(["schema", "inputType", "steps", "output", "deadlineMs", "name"]),
    step_key=st.sampled_from(
        [
            "name",
            "target",
            "method",
            "rules",
            "celRules",
            "when",
            "validate",
            "completion",
            "deadlineMs",
            "tls",
        ]
    ),
    value=json_values,
    where=st.sampled_from(["top", "step"]),
)
def test_random_json_inside_a_valid_workflow_never_raises(key, step_key, value, where):
    wf = base()
    if where == "top":
        wf[key] = value
    else:
        wf["steps"][1][step_key] = value
    findings = check(wf, Runtime())
    assert all(f.kind for f in findings)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=st.dictionaries(
        st.sampled_from(["workflow", "workflowName", "input", "x"]), workflowish, max_size=4
    )
)
def test_run_workflow_answers_or_rejects_random_input(payload):
    action = RunWorkflowAction(Runtime())
    try:
        answer = action.execute(payload)
    except InvalidInput as exc:
        assert exc.message
        return
    assert answer["ok"] is False  # nothing random reaches a server
    assert isinstance(answer["error"], str) and answer["error"]
