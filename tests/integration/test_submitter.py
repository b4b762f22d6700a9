"""The submitter against a real store: the reference's order of checks, reasons, idempotency."""

from __future__ import annotations

import uuid

import pytest

from protomolt_jobs.runs.submitter import REASONS, Submitter
from protomolt_jobs.workflow.types import Runtime
from tests.support.grpc_servers import seed_workflow
from tests.support.roles import MemoryRepository

TARGET = "127.0.0.1:1"  # never called: nothing runs here


@pytest.fixture
def submitter(store):
    repo = MemoryRepository({"seed-review": seed_workflow(TARGET)}, corrupt={"broken"})
    return Submitter(store, repo, Runtime(), max_attempts=5)


def test_created_row_snapshots_definition_and_input(submitter, store):
    out = submitter.submit(workflow_name="seed-review", input={"text": "hi", "meta": {"zzz": 1}})
    assert out.ok and out.created and out.status == "QUEUED" and out.reason is None
    job = store.job_get(out.job_id)
    assert job.workflow_definition == seed_workflow(TARGET)
    assert job.input == {"text": "hi", "meta": {"zzz": 1}}  # raw, not canonicalised
    assert job.max_attempts == 5 and job.attempt == 0
    # a later edit of the stored workflow does not shift the live job
    submitter.repository.put("seed-review", {"name": "changed"})
    assert store.job_get(out.job_id).workflow_definition == seed_workflow(TARGET)
    assert out.to_json() == {"ok": True, "jobId": out.job_id, "status": "QUEUED"}


def test_inline_wins_over_the_name(submitter, store):
    inline = seed_workflow(TARGET, name="inline-one")
    out = submitter.submit(workflow=inline, workflow_name="nope", input={})
    assert out.ok
    assert store.job_get(out.job_id).workflow_definition["name"] == "inline-one"
    assert store.job_get(out.job_id).workflow_name == "nope"


def test_resubmit_is_idempotent_and_revalidates_first(submitter, store):
    job_id = str(uuid.uuid4())
    first = submitter.submit(workflow_name="seed-review", input={"text": "1"}, job_id=job_id)
    again = submitter.submit(workflow_name="seed-review", input={"text": "2"}, job_id=job_id)
    assert (first.created, again.created) == (True, False)
    assert again.ok and again.job_id == job_id and again.status == "QUEUED"
    assert store.job_get(job_id).input == {"text": "1"}
    bad = submitter.submit(workflow_name="seed-review", input={"text": {}}, job_id=job_id)
    assert not bad.ok and bad.reason == "invalid-input"


@pytest.mark.parametrize(
    ("kwargs", "reason", "error", "step"),
    [
        (
            {"workflow_name": "nope", "input": {}},
            "unknown-workflow",
            "No stored workflow named 'nope'",
            "",
        ),
        (
            {"workflow_name": "broken", "input": {}},
            "corrupt-workflow",
            "stored workflow 'broken' is not readable: ",
            "",
        ),
        (
            {"input": {}},
            "invalid-definition",
            "'workflow' (or 'workflowName') and 'input' objects are required",
            "",
        ),
        (
            {"workflow_name": "seed-review", "input": None},
            "invalid-input",
            "'workflow' (or 'workflowName') and 'input' objects are required",
            "",
        ),
        (
            {"workflow": [1], "input": {}},
            "invalid-definition",
            "'workflow' (or 'workflowName') and 'input' objects are required",
            "",
        ),
        (
            {"workflow_name": "seed-review", "input": {"text": {}}},
            "invalid-input",
            "'input' is not valid proto3 JSON for jobs.test.Text: ",
            "",
        ),
        (
            {"workflow_name": "seed-review", "input": {}, "job_id": "not-a-uuid"},
            "invalid-job-id",
            "'jobId' must be a uuid; got 'not-a-uuid'",
            "",
        ),
    ],
)
def test_refusals(submitter, store, kwargs, reason, error, step):
    out = submitter.submit(**kwargs)
    assert not out.ok and out.job_id is None and out.status is None and not out.created
    assert out.reason == reason and reason in REASONS
    assert out.error.startswith(error)
    assert out.failed_step == step
    assert store.job_list() == []


def test_no_repository(store):
    out = Submitter(store, None, Runtime(), 3).submit(workflow_name="x", input={})
    assert out.reason == "no-repository"
    assert out.error == (
        "No workflow repository is mounted; submit with an inline 'workflow' or start a "
        "server with a registry"
    )


def test_definition_findings_name_the_step(submitter):
    bad = seed_workflow(TARGET)
    bad["steps"][2]["rules"] = ["text = nowhere.text"]
    out = submitter.submit(workflow=bad, input={})
    assert out.reason == "invalid-definition" and out.failed_step == "review"
    assert out.error.startswith("workflow does not verify (1 finding); first: [")
    assert out.to_json() == {"ok": False, "failedStep": "review", "error": out.error}


def test_job_id_check_comes_after_the_workflow_checks(submitter):
    out = submitter.submit(workflow_name="nope", input={}, job_id="bad")
    assert out.reason == "unknown-workflow"


def test_max_attempts_must_be_positive(store):
    with pytest.raises(ValueError, match="max_attempts"):
        Submitter(store, None, Runtime(), 0)
