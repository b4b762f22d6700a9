"""The doors refuse unknown definition keys and the worker does not, without services:
``verifier.check`` against ``verify`` (what the worker's claim re-runs), the submitter (and
through it the request topic), run-workflow and check-workflow. Fakes stand in for the store and the
Kafka consumer; tests/integration/test_unknown_keys.py holds the same over PostgreSQL and HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs.workflow import CheckWorkflowAction, RunWorkflowAction
from protomolt_jobs.workflow import Runtime, check, parse_workflow, verify
from tests.support.grpc_servers import seed_workflow
from tests.support.roles import MemoryRepository
from tests.unit.test_request_consumer import FakeStore, _consumer, _msg, _request

TARGET = "127.0.0.1:9"  # never called: every definition here is refused before a call


def misspelt() -> dict[str, Any]:
    """The issue's definition: ``maxParalel`` at the top, ``maxAtempts`` on a step."""
    wf = {"maxParalel": 2, **seed_workflow(TARGET, review="invoke")}
    wf["steps"][1]["maxAtempts"] = 3
    return wf


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


@pytest.fixture
def submitter(runtime) -> Submitter:
    repo = MemoryRepository({"misspelt": misspelt(), "sound": seed_workflow(TARGET)})
    return Submitter(FakeStore(), repo, runtime, max_attempts=3)


def test_submit_of_an_inline_definition_is_invalid_input_naming_the_keys(submitter):
    out = submitter.submit(workflow=misspelt(), input={"text": "hi"})
    assert (out.ok, out.reason, out.field, out.path) == (
        False,
        "invalid-input",
        "workflow",
        "maxParalel",
    )
    assert out.error.startswith(
        "the workflow has unknown keys: unknown key 'maxParalel' at maxParalel: did you mean "
        "'maxParallel'?; unknown key 'maxAtempts' at steps[1].maxAtempts: did you mean "
        "'maxAttempts'?"
    )
    assert submitter.store.inserts == []


def test_submit_by_name_names_the_stored_workflow(submitter):
    out = submitter.submit(workflow_name="misspelt", input={"text": "hi"})
    assert (out.reason, out.field, out.path) == ("invalid-input", "workflowName", "maxParalel")
    assert out.error.startswith("stored workflow 'misspelt' has unknown keys: ")


def test_the_unknown_key_check_comes_before_parsing(submitter):
    # A misspelt 'steps' is the cause; the parse failure it leads to is not the answer.
    wf = seed_workflow(TARGET)
    wf["stpes"] = wf.pop("steps")
    out = submitter.submit(workflow=wf, input={"text": "hi"})
    assert (out.reason, out.path) == ("invalid-input", "stpes")
    assert (
        out.error
        == "the workflow has an unknown key: unknown key 'stpes' at stpes: did you mean 'steps'?"
    )


def test_the_request_topic_rejects_the_record_as_other_unsubmittable_definitions(submitter):
    store = submitter.store
    raw = _request(name="misspelt", input={"text": "hi"})
    rc, fake = _consumer(store, submitter, [_msg(raw, 4)])
    assert rc.run_once(0) == 1
    ((value, topic, partition, offset, reason),) = store.rejects
    assert (value, topic, partition, offset) == (raw, "rq", 0, 4)
    assert reason.startswith(
        "invalid-input: stored workflow 'misspelt' has unknown keys: unknown key "
        "'maxParalel' at maxParalel"
    )
    assert store.inserts == [] and fake.commits == [(0, 4)]


def test_run_workflow_refuses_as_submit_does(runtime):
    verb = RunWorkflowAction(runtime, MemoryRepository({"misspelt": misspelt()}))
    with pytest.raises(InvalidInput) as inline:
        verb.execute({"workflow": misspelt(), "input": {"text": "hi"}})
    assert inline.value.details == {"field": "workflow", "path": "maxParalel"}
    assert inline.value.message.startswith("the workflow has unknown keys: unknown key")
    with pytest.raises(InvalidInput) as stored:
        verb.execute({"workflowName": "misspelt", "input": {"text": "hi"}})
    assert stored.value.details == {"field": "workflowName", "path": "maxParalel"}
    assert stored.value.message.startswith("stored workflow 'misspelt' has unknown keys: ")


def test_check_workflow_answers_a_finding_per_key(runtime):
    answer = CheckWorkflowAction(runtime).execute({"workflow": misspelt(), "simulate": True})
    assert answer["ok"] is False
    assert "simulation" not in answer
    assert [(f["step"], f["kind"]) for f in answer["findings"]] == [
        ("", "unknown-key"),
        ("embed", "unknown-key"),
    ]
    assert answer["findings"][0]["error"] == (
        "unknown key 'maxParalel' at maxParalel: did you mean 'maxParallel'?"
    )
    assert "at steps[1].maxAtempts: did you mean 'maxAttempts'?" in answer["findings"][1]["error"]


def test_check_workflow_by_name_lists_a_stored_workflows_keys(runtime):
    verb = CheckWorkflowAction(runtime, MemoryRepository({"misspelt": misspelt()}))
    answer = verb.execute({"workflowName": "misspelt"})
    assert answer["ok"] is False
    assert [f["kind"] for f in answer["findings"]] == ["unknown-key", "unknown-key"]


# -- check (the doors' check) and verify (the worker's) -------------------------------------------


def test_check_reports_unknown_keys_besides_the_parse_failure(runtime):
    wf = seed_workflow(TARGET)
    wf["stpes"] = wf.pop("steps")
    found = check(wf, runtime)
    assert [(f.kind, f.error) for f in found] == [
        ("unknown-key", "unknown key 'stpes' at stpes: did you mean 'steps'?"),
        ("workflow", "'steps' must be a non-empty array"),
    ]


def test_check_reports_unknown_keys_first_then_the_verifiers(runtime):
    wf = seed_workflow(TARGET)
    wf["steps"][2]["rules"] = ["text = nowhere.text"]
    wf["steps"][2]["whn"] = "true"
    found = check(wf, runtime)
    assert [(f.step, f.kind) for f in found] == [("review", "unknown-key"), ("review", "rule")]


def test_the_workers_verification_does_not_look_at_keys(runtime):
    # A run stored before a key became unknown is re-verified on every claim: it must load.
    wf = seed_workflow(TARGET)
    wf["maxParalel"] = 2
    wf["steps"][0]["maxAtempts"] = 3
    assert verify(parse_workflow(wf, runtime)) == []

    class Row:
        workflow_definition = wf

    stored = StoredRun.load(Row(), runtime, verified=True)
    assert stored.step_names() == ["tokenize", "embed", "review"]
