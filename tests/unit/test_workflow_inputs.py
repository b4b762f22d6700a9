"""workflow/inputs.py: the declarations' findings (each naming the path or the step), the
input paths a step reads, proto3 absence, and the runner's check (park, MAPPING, or nothing
for a workflow without ``inputs``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protomolt_jobs.workflow import Runtime, check, parse_workflow
from protomolt_jobs.workflow import inputs as wi
from protomolt_jobs.workflow.envelope import parse_input
from protomolt_jobs.workflow.types import FailureKind, WorkflowExecutionError
from tests.support.graphs import METHOD
from tests.support.grpc_servers import schema_for

TARGET = "127.0.0.1:9"  # never called


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def workflow(**top: Any) -> dict[str, Any]:
    return {
        "name": "w",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "steps": [
            {"name": "load", "target": TARGET, "method": METHOD, "rules": ["seen += input.text"]},
            {
                "name": "analyse",
                "target": TARGET,
                "method": METHOD,
                "rules": ['step = "analyse"', "seen += input.lang"],
                "celRules": [{"selector": "input.meta.source", "target": "fail"}],
            },
        ],
        **top,
    }


def findings_of(runtime: Runtime, wf: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f.step, f.kind, f.error) for f in check(wf, runtime)]


def test_a_workflow_without_the_keys_has_no_findings_and_nothing_to_check(runtime):
    wf = workflow()
    assert findings_of(runtime, wf) == []
    compiled = parse_workflow(wf, runtime)
    assert wi.findings(compiled) == []
    step = compiled.step("analyse")
    assert step is not None
    wi.check_step(compiled, step, {"input": parse_input(compiled, {})})  # returns: no inputs


@pytest.mark.parametrize(
    ("mutate", "step", "error"),
    [
        (
            lambda wf: wf.update(inputs={"language": {"owner": "team:data"}}),
            "",
            "inputs['language']: not a path of jobs.test.Text: no field 'language' on jobs.test.Text",
        ),
        (
            lambda wf: wf.update(inputs={"lang": {"owner": "team:data", "ownr": 1}}),
            "",
            "inputs['lang']: unknown key 'ownr'; an input declares owner, required, description",
        ),
        (
            lambda wf: wf.update(inputs={"lang": {"owner": " "}}),
            "",
            "inputs['lang'].owner must be a non-blank string",
        ),
        (
            lambda wf: wf.update(inputs={"lang": {"owner": "x", "required": "yes"}}),
            "",
            "inputs['lang'].required must be true or false",
        ),
        (lambda wf: wf.update(inputs=["lang"]), "", "'inputs' must be an object"),
        (
            lambda wf: wf["steps"][1].update(onMissingInput="park"),
            "analyse",
            "'onMissingInput' must be 'fail' or 'wait'; got 'park'",
        ),
        (
            lambda wf: wf["steps"][1].update(onMissingInput="wait"),
            "analyse",
            "'onMissingInput: wait' waits for declared inputs, and the workflow declares none",
        ),
        (
            lambda wf: wf["steps"][0].update(owner=""),
            "load",
            "'owner' must be a non-blank string",
        ),
    ],
)
def test_each_malformed_declaration_is_a_finding_naming_the_path_or_the_step(
    runtime, mutate, step, error
):
    wf = copy.deepcopy(workflow())
    mutate(wf)
    found = [f for f in findings_of(runtime, wf) if f[1] == "inputs"]
    assert len(found) == 1, found
    assert found[0][0] == step and error in found[0][2], found


def test_a_misspelt_step_key_is_an_unknown_key_with_its_suggestion(runtime):
    wf = workflow()
    wf["steps"][1]["onMissingInputs"] = "wait"
    (finding,) = check(wf, runtime)
    assert finding.kind == "unknown-key" and "'onMissingInput'" in finding.error


def test_read_paths_absence_and_owners(runtime):
    compiled = parse_workflow(workflow(), runtime)
    step = compiled.step("analyse")
    assert step is not None
    assert wi.read_paths(step) == ("lang", "meta.source")
    msg = parse_input(compiled, {"text": "t", "meta": {"other": 1}})
    assert not wi.absent(msg, "text")
    assert wi.absent(msg, "lang")  # an implicit string at ""
    assert wi.absent(msg, "meta.source")  # a missing Struct key
    assert not wi.absent(msg, "meta")
    declared = {"meta": wi.Declared("meta", "team:ops")}
    assert wi.owner_of(declared, "meta.source") == "team:ops"  # the nearest declared ancestor
    assert wi.owner_of(declared, "lang") == ""


def test_the_runners_check_parks_a_waiting_step_and_fails_any_other(runtime):
    wf = workflow(
        inputs={"lang": {"owner": "team:data"}, "text": {"owner": "user:ana", "required": False}}
    )
    wf["steps"][1]["onMissingInput"] = "wait"
    compiled = parse_workflow(wf, runtime)
    assert wi.findings(compiled) == []
    analyse, load = compiled.step("analyse"), compiled.step("load")
    assert analyse is not None and load is not None
    empty = {"input": parse_input(compiled, {})}
    wi.check_step(compiled, load, empty)  # 'text' is optional: load runs without it
    with pytest.raises(wi.InputWait) as parked:
        wi.check_step(compiled, analyse, empty)
    assert parked.value.parked.step == "analyse" and parked.value.parked.wait_kind == "input"
    assert parked.value.parked.detail == "waiting for input: 'lang' (owner team:data)"
    wi.check_step(compiled, analyse, {"input": parse_input(compiled, {"lang": "en"})})

    failing = copy.deepcopy(wf)
    del failing["steps"][1]["onMissingInput"]
    compiled = parse_workflow(failing, runtime)
    analyse = compiled.step("analyse")
    assert analyse is not None
    with pytest.raises(WorkflowExecutionError) as failed:
        wi.check_step(compiled, analyse, empty)
    assert failed.value.kind == FailureKind.MAPPING and failed.value.step == "analyse"
    assert str(failed.value) == "mapping failed: missing required input 'lang' (owner team:data)"


def _waiting_first() -> dict[str, Any]:
    wf = workflow(inputs={"lang": {"owner": "team:data"}})
    analyse = {k: v for k, v in wf["steps"][1].items() if k != "celRules"}
    wf["steps"] = [{**analyse, "onMissingInput": "wait"}]
    return wf


def test_run_workflow_cannot_wait_and_says_so_naming_the_path_and_its_owner(runtime):
    from protomolt_jobs.workflow import run

    compiled = parse_workflow(_waiting_first(), runtime)
    with pytest.raises(WorkflowExecutionError) as refused:
        run(compiled, {}, runtime=runtime)
    assert refused.value.kind == FailureKind.MAPPING and refused.value.step == "analyse"
    assert str(refused.value).startswith(
        "mapping failed: waiting for input: 'lang' (owner team:data); synchronous run-workflow "
        "cannot wait"
    )


def test_a_test_case_whose_run_waits_for_an_input_ends_waiting(runtime):
    from protomolt_jobs.verbs.workflow_tests import TestWorkflowAction

    wf = _waiting_first()
    wf["tests"] = [
        {"name": "no lang", "input": {"text": "t"}, "expect": {"status": "WAITING"}},
        {
            "name": "lang",
            "input": {"text": "t", "lang": "en"},
            "mocks": {"analyse": {"response": {"step": "analyse"}}},
            "expect": {"status": "COMPLETED"},
        },
    ]
    answer = TestWorkflowAction(runtime, max_attempts=3, backoff_base_s=1.0).execute(
        {"workflow": wf}
    )
    assert answer["ok"] is True, answer
    assert [(c["name"], c["actual"]["status"]) for c in answer["cases"]] == [
        ("no lang", "WAITING"),
        ("lang", "COMPLETED"),
    ]
