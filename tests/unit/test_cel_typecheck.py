"""check-workflow type-checks CEL against the descriptors (issue #20): gates, CEL mapping rules
(filters and selectors, steps and output) and declared validation rules, with upstream's
finding shapes: ``(step, kind, "<compiler error> (<rule>)")``."""

from __future__ import annotations

import copy

import pytest

from protomolt_jobs.workflow import Runtime, cel_check, check
from tests.support.grpc_servers import seed_workflow

pytestmark = pytest.mark.skipif(not cel_check.available(), reason="no CEL type checker")


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def _seed() -> dict:
    return copy.deepcopy(seed_workflow("127.0.0.1:1", review="invoke"))


def test_a_gate_reading_a_missing_field_is_a_finding(runtime):
    wf = _seed()
    wf["steps"][1]["when"] = "input.missing == 1"
    (f,) = check(wf, runtime)
    assert (f.step, f.kind) == ("embed", "when")
    assert f.error == (
        "ERROR: <input>:1:6: undefined field 'missing'\n"
        " | input.missing == 1\n"
        " | .....^ (input.missing == 1)"
    )


def test_a_selector_on_a_missing_field_or_an_unknown_name_is_a_finding(runtime):
    wf = _seed()
    wf["steps"][1]["celRules"] = [{"selector": "tokenize.nope", "target": "text"}]
    (f,) = check(wf, runtime)
    assert (f.step, f.kind) == ("embed", "celRule")
    assert f.error.startswith("selector: ERROR: <input>:1:9: undefined field 'nope'\n")
    assert f.error.endswith(" (text)")

    wf["steps"][1]["celRules"] = [{"selector": "customer.nope", "target": "text"}]
    (f,) = check(wf, runtime)
    assert (f.step, f.kind, f.error) == (
        "embed",
        "celRule",
        "selector: undeclared reference to 'customer' (text)",
    )


def test_type_errors_and_non_boolean_gates(runtime):
    wf = _seed()
    wf["steps"][1]["when"] = "tokenize.count > 'x'"
    (f,) = check(wf, runtime)
    assert f.kind == "when"
    assert f.error.startswith(
        "ERROR: <input>:1:16: found no matching overload for '_>_' applied to '(int, string)'"
    )
    wf["steps"][1]["when"] = "size(input.text)"
    (f,) = check(wf, runtime)
    assert f.error == "a filter must be a boolean expression; this is int (size(input.text))"
    # A filter of a CEL rule, typed against the step's request as `target` too.
    wf = _seed()
    wf["steps"][1]["celRules"] = [
        {
            "filter": "target.ids.size() + input.nothing > 0",
            "selector": "input.text",
            "target": "text",
        }
    ]
    (f,) = check(wf, runtime)
    assert f.error.startswith("filter: ERROR: <input>:1:26: undefined field 'nothing'")


def test_output_rules_are_type_checked_against_the_whole_scope(runtime):
    wf = _seed()
    wf["output"]["celRules"] = [{"selector": "review.nope", "target": "note"}]
    (f,) = check(wf, runtime)
    assert (f.step, f.kind) == ("", "output")
    assert f.error.startswith("selector: ERROR: <input>:1:7: undefined field 'nope'")


def test_valid_expressions_check_clean(runtime):
    wf = _seed()
    wf["steps"][1]["when"] = (
        "size(tokenize.ids) > 0 && input.text.lowerAscii() != '' && has(input.meta)"
    )
    wf["steps"][1]["celRules"] = [
        {"filter": "input.lang == 'en'", "selector": "input.text.upperAscii()", "target": "text"}
    ]
    assert check(wf, runtime) == []


PROTO = """syntax = "proto3";
package typed.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message In { string text = 1; }
message Out {
  option (ai.pipestream.proto.validate.v1.message) = {cel: [
    {id: "ok", expression: "size(this.text) > 0 && this.text.isEmail()"},
    {id: "broken", expression: "this.nope > 1"}
  ]};
  string text = 1;
}
service S { rpc Call(In) returns (Out); }
"""


def test_declared_validation_rules_are_type_checked(runtime):
    wf = {
        "schema": {"sources": {"typed/v1/typed.proto": PROTO}},
        "inputType": "typed.v1.In",
        "steps": [
            {
                "name": "call",
                "target": "127.0.0.1:1",
                "method": "typed.v1.S/Call",
                "rules": ["text = input.text"],
                "validate": True,
            }
        ],
    }
    (f,) = check(wf, runtime)
    assert (f.step, f.kind) == ("call", "validate")
    assert f.error.startswith("ERROR: <input>:1:5: undefined field 'nope'")
    assert f.error.endswith(" (typed.v1.Out: broken)")
    wf["steps"][0]["validate"] = False
    assert check(wf, runtime) == []


FIELD_PROTO = """syntax = "proto3";
package fielded.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message In { string text = 1; }
message Out {
  string text = 1 [(ai.pipestream.proto.validate.v1.field) = {cel: [
    {id: "ok", expression: "this.isEmail() || size(this) > 3"},
    {id: "undeclared", expression: "that > 1"},
    {id: "a-number", expression: "size(this)"}
  ]}];
  repeated string tags = 2 [(ai.pipestream.proto.validate.v1.field) = {repeated: {items: {cel: [
    {expression: "this.startsWith(rule) && now > timestamp('2020-01-01T00:00:00Z')"},
    {id: "item-undeclared", expression: "tag != ''"}
  ]}}}];
  option (ai.pipestream.proto.validate.v1.message) = {cel: [
    {id: "an-int", expression: "size(this.tags)"}
  ]};
}
service S { rpc Call(In) returns (Out); }
"""


def test_field_level_validation_rules_are_type_checked_as_upstream_compiles_them(runtime):
    """Field rules compile with ``this`` dynamic (upstream's field environment): undeclared
    names and results that are neither bool nor string are findings; message rules get the
    result check too."""
    wf = {
        "schema": {"sources": {"fielded/v1/fielded.proto": FIELD_PROTO}},
        "inputType": "fielded.v1.In",
        "steps": [
            {
                "name": "call",
                "target": "127.0.0.1:1",
                "method": "fielded.v1.S/Call",
                "rules": ["text = input.text"],
                "validate": True,
            }
        ],
    }
    findings = check(wf, runtime)
    assert {(f.step, f.kind) for f in findings} == {("call", "validate")}
    errors = sorted(f.error for f in findings)
    assert errors == sorted(
        [
            "CEL rule must return bool or string, got int (fielded.v1.Out: an-int)",
            "CEL rule must return bool or string, got int (fielded.v1.Out.text: a-number)",
            (
                "ERROR: <input>:1:1: undeclared reference to 'that' (in container '')\n"
                " | that > 1\n | ^ (fielded.v1.Out.text: undeclared)"
            ),
            (
                "ERROR: <input>:1:1: undeclared reference to 'tag' (in container '')\n"
                " | tag != ''\n | ^ (fielded.v1.Out.tags: item-undeclared)"
            ),
        ]
    )
