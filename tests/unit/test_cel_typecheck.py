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
