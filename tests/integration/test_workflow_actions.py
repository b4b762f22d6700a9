"""run-workflow and check-workflow as actions, against real gRPC servers on loopback."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pool

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.verbs.workflow import (
    NO_REPOSITORY,
    CheckWorkflowAction,
    RunWorkflowAction,
)
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import TestServices, descriptor_set, seed_workflow


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def svc(services):
    services.reset()
    return services


class Repo:
    def __init__(self, **stored):
        self.stored = stored

    def workflow(self, name):
        if name == "corrupt":
            raise ValueError("stored definition is not JSON")
        return self.stored.get(name)


def test_action_shape():
    run_action, check_action = RunWorkflowAction(Runtime()), CheckWorkflowAction(Runtime())
    assert (run_action.name, run_action.scope) == ("run-workflow", "workflow-run")
    assert (check_action.name, check_action.scope) == ("check-workflow", "schema-read")
    assert run_action.input_schema["required"] == ["input"]
    assert set(run_action.input_schema["properties"]) == {"workflow", "workflowName", "input"}
    assert run_action.description and check_action.description


def test_run_inline_workflow(svc):
    action = RunWorkflowAction(Runtime())
    answer = action.execute(
        {"workflow": seed_workflow(svc.target, review="invoke"), "input": {"text": "a b c"}}
    )
    assert answer["ok"] is True
    assert answer["outputType"] == "jobs.test.Summary"
    assert answer["output"]["tier"] == "long"
    assert answer["output"]["approved"] is True
    assert answer["steps"] == [
        {"name": "tokenize", "skipped": False},
        {"name": "embed", "skipped": False},
        {"name": "review", "skipped": False},
    ]
    assert "failedStep" not in answer


def test_run_stored_workflow_by_name(svc):
    action = RunWorkflowAction(Runtime(), Repo(seed=seed_workflow(svc.target, review="invoke")))
    answer = action.execute({"workflowName": "seed", "input": {"text": "x"}})
    assert answer["ok"] is True and answer["output"]["count"] == 1
    assert action.execute({"workflowName": "nope", "input": {}}) == {
        "ok": False,
        "error": "No stored workflow named 'nope'",
    }
    corrupt = action.execute({"workflowName": "corrupt", "input": {}})
    assert corrupt["ok"] is False and "cannot be read" in corrupt["error"]


def test_run_by_name_without_a_repository():
    answer = RunWorkflowAction(Runtime()).execute({"workflowName": "seed", "input": {}})
    assert answer == {"ok": False, "error": NO_REPOSITORY}


def test_inline_workflow_wins_over_the_name(svc):
    action = RunWorkflowAction(Runtime(), Repo())
    answer = action.execute(
        {
            "workflow": seed_workflow(svc.target, review="invoke"),
            "workflowName": "nope",
            "input": {"text": "q"},
        }
    )
    assert answer["ok"] is True


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"workflow": {}}, "input"),
        ({"workflow": {}, "input": [1]}, "input"),
        ({"input": {}}, "workflow"),
        ({"workflow": "text", "input": {}}, "workflow"),
        ({"workflowName": 7, "input": {}}, "workflowName"),
    ],
)
def test_bad_input_is_invalid_input_naming_the_field(payload, field):
    with pytest.raises(InvalidInput) as info:
        RunWorkflowAction(Runtime(), Repo()).execute(payload)
    assert f"'{field}'" in info.value.message
    assert info.value.details == {"field": field}


def test_parse_failure_answers_with_the_step(svc):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["method"] = "jobs.test.Embedder/Nope"
    answer = RunWorkflowAction(Runtime()).execute({"workflow": wf, "input": {}})
    assert answer == {
        "ok": False,
        "failedStep": "embed",
        "error": "method 'jobs.test.Embedder/Nope' not found in the workflow's schema",
    }


def test_verify_failure_answers_with_the_first_finding(svc):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["rules"] = ["nope = tokenize.ids"]
    answer = RunWorkflowAction(Runtime()).execute({"workflow": wf, "input": {}})
    assert answer == {
        "ok": False,
        "failedStep": "embed",
        "error": "workflow does not verify (1 finding); first: [rule] target: no field 'nope' on "
        "jobs.test.Tokens (nope = tokenize.ids)",
    }
    wf["steps"][0]["rules"] = ["bad rule"]
    answer = RunWorkflowAction(Runtime()).execute({"workflow": wf, "input": {}})
    assert answer["error"].startswith("workflow does not verify (2 findings); first: [rule]")
    assert answer["failedStep"] == "tokenize"
    assert svc.calls("Tokenize") == 0


def test_input_that_is_not_proto3_json_is_invalid_input_naming_the_field(svc):
    with pytest.raises(InvalidInput) as info:
        RunWorkflowAction(Runtime()).execute(
            {"workflow": seed_workflow(svc.target, review="invoke"), "input": {"fail": "sometimes"}}
        )
    assert info.value.message.startswith("'input' is not valid proto3 JSON for jobs.test.Text: ")
    assert info.value.details == {"field": "input", "path": "fail"}
    assert svc.calls("Tokenize") == 0


def test_a_misspelt_input_field_is_refused_naming_it(svc):
    with pytest.raises(InvalidInput) as info:
        RunWorkflowAction(Runtime()).execute(
            {"workflow": seed_workflow(svc.target, review="invoke"), "input": {"txt": "x"}}
        )
    assert '"txt"' in info.value.message
    assert info.value.details == {"field": "input", "path": "txt"}
    assert svc.calls("Tokenize") == 0


def test_unknown_top_level_fields_are_refused_naming_them(svc):
    wf = seed_workflow(svc.target, review="invoke")
    with pytest.raises(InvalidInput) as info:
        RunWorkflowAction(Runtime()).execute({"workflow": wf, "input": {}, "inptu": {}})
    assert info.value.details == {"field": "inptu"}
    with pytest.raises(InvalidInput) as info:
        CheckWorkflowAction(Runtime()).execute({"workflow": wf, "simlate": True})
    assert info.value.details == {"field": "simlate"}


def test_run_failure_answers_with_failed_step(svc):
    svc.fail_next("Review", 1, grpc.StatusCode.PERMISSION_DENIED, "not yours")
    answer = RunWorkflowAction(Runtime()).execute(
        {"workflow": seed_workflow(svc.target, review="invoke"), "input": {"text": "hi"}}
    )
    assert answer == {
        "ok": False,
        "failedStep": "review",
        "error": f"gRPC PERMISSION_DENIED from {svc.target}: not yours",
    }


def test_run_refuses_an_external_step(svc):
    answer = RunWorkflowAction(Runtime()).execute(
        {"workflow": seed_workflow(svc.target), "input": {"text": "hi"}}
    )
    assert answer["ok"] is False
    assert answer["failedStep"] == "review"
    assert answer["error"] == (
        "step declares completion='external'; synchronous run-workflow cannot park - submit the "
        "workflow as a job (submit-workflow) so complete-step can supply the response"
    )


def test_type_schema_form_resolves_from_the_host_pool(svc):
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_set().file:
        pool.Add(f)
    runtime = Runtime(pool=pool)
    wf = seed_workflow(svc.target, schema="type", review="invoke")
    assert CheckWorkflowAction(runtime).execute({"workflow": wf}) == {"ok": True, "findings": []}
    answer = RunWorkflowAction(runtime).execute(
        {"workflow": wf, "input": {"text": "one two three"}}
    )
    assert answer["ok"] is True and answer["output"]["tier"] == "long"
    # the default input type is the type the schema names
    del wf["inputType"]
    assert (
        RunWorkflowAction(runtime).execute({"workflow": wf, "input": {"text": "x"}})["ok"] is True
    )
    # without a pool the type is unknown
    missing = CheckWorkflowAction(Runtime()).execute({"workflow": wf})
    assert (
        missing["ok"] is False
        and "Unknown type 'jobs.test.Text'" in missing["findings"][0]["error"]
    )
