"""Issue 30 item 7 on a node: unknown keys anywhere in a definition are findings naming the
key, its path and the closest known key; check-workflow answers ok: false, submit refuses with
invalid-input, PUT refuses with 422; a run stored before the check keeps running.

Real PostgreSQL, the node's HTTP surface, real gRPC test servers on loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protomolt_jobs.store import JobStore
from tests.support.grpc_servers import seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for
from tests.support.worker_proc import enqueue


def misspelt(target: str, **kw: Any) -> dict[str, Any]:
    """The issue's definition: ``"maxParalel": 2`` at the top, ``"maxAtempts": 3`` on a step."""
    wf = {"maxParalel": 2, **seed_workflow(target, **kw)}
    wf["steps"][1]["maxAtempts"] = 3
    return wf


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def call(node, verb: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, answer, _ = http("POST", f"{node.http.url}/protomolt/actions/{verb}", body)
    return status, answer


def test_check_workflow_answers_a_finding_per_unknown_key(node, services):
    status, answer = call(node, "check-workflow", {"workflow": misspelt(services.target)})
    assert status == 200
    assert answer["ok"] is False
    top, on_step = answer["findings"]
    assert top == {
        "step": "",
        "kind": "unknown-key",
        "error": "unknown key 'maxParalel' at maxParalel: did you mean 'maxParallel'?",
    }
    assert (on_step["step"], on_step["kind"]) == ("embed", "unknown-key")
    assert on_step["error"].startswith(
        "unknown key 'maxAtempts' at steps[1].maxAtempts: did you mean 'maxAttempts'?"
    )


def test_submit_is_refused_with_invalid_input_naming_the_keys(node, services):
    status, body = call(
        node, "submit-workflow", {"workflow": misspelt(services.target), "input": {"text": "a"}}
    )
    assert status == 400
    assert body["error"] == "invalid-input"
    assert body["details"] == {"field": "workflow", "path": "maxParalel"}
    assert "unknown key 'maxParalel' at maxParalel: did you mean 'maxParallel'?" in body["message"]
    assert "unknown key 'maxAtempts' at steps[1].maxAtempts" in body["message"]
    status, listed = call(node, "list-jobs", {})
    assert (status, listed["jobs"]) == (200, [])


def test_put_is_refused_with_422_and_the_findings(node, services):
    url = f"{node.http.url}/protomolt/workflows/misspelt"
    status, body, _ = http("PUT", url, misspelt(services.target))
    assert status == 422
    assert body["error"] == "does-not-verify"
    assert body["message"] == (
        "Workflow 'misspelt' does not verify (2 findings); first: [unknown-key] unknown key "
        "'maxParalel' at maxParalel: did you mean 'maxParallel'?"
    )
    assert [(f["step"], f["kind"]) for f in body["findings"]] == [
        ("", "unknown-key"),
        ("embed", "unknown-key"),
    ]
    assert http("GET", url)[0] == 404


def test_a_workflow_stored_before_the_check_is_refused_at_submit_and_listed_by_check(
    node, services
):
    # As an older node stored it (PUT checked no keys then): the file is there, verbatim.
    path = node.node.config.data_dir / "workflows" / "older.json"
    path.write_text(json.dumps(misspelt(services.target)))
    status, body = call(node, "submit-workflow", {"workflowName": "older", "input": {"text": "a"}})
    assert (status, body["error"]) == (400, "invalid-input")
    assert body["details"] == {"field": "workflowName", "path": "maxParalel"}
    assert body["message"].startswith("stored workflow 'older' has unknown keys: ")
    status, answer = call(node, "check-workflow", {"workflowName": "older"})
    assert (status, answer["ok"]) == (200, False)
    assert [f["kind"] for f in answer["findings"]] == ["unknown-key", "unknown-key"]


def test_run_workflow_is_refused_as_submit_is(node, services):
    status, body = call(
        node, "run-workflow", {"workflow": misspelt(services.target), "input": {"text": "a"}}
    )
    assert (status, body["error"], body["details"]) == (
        400,
        "invalid-input",
        {"field": "workflow", "path": "maxParalel"},
    )
    assert services.calls("Tokenize") == 0


def _job(node, job_id: str) -> dict[str, Any]:
    return call(node, "get-job", {"jobId": job_id})[1]["job"]


def test_a_run_submitted_before_the_check_is_not_failed_mid_flight(node, services, fresh_dsn):
    """The worker re-verifies the snapshot at every claim; that check does not look at keys.
    The run parks, is completed through complete-step (which reads the snapshot too), and
    is claimed again to its end."""
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        job = enqueue(store, misspelt(services.target, review="external"), {"text": "a b"})
    finally:
        store.close()
    job_id = str(job.job_id)
    wait_for(lambda: _job(node, job_id)["status"] == "WAITING", timeout_s=30)
    status, answer = call(
        node,
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True}},
    )
    assert (status, answer) == (200, {"ok": True, "status": "QUEUED"})
    done = wait_for(lambda: (j := _job(node, job_id))["status"] == "COMPLETED" and j, timeout_s=30)
    assert [c["name"] for c in done["checkpoints"]] == ["tokenize", "embed", "review"]


def test_a_graph_run_submitted_before_the_check_runs_to_its_end(node, services, fresh_dsn):
    wf = misspelt(services.target, review="invoke")
    wf["steps"][2]["after"] = [{"step": "embed", "on": "success", "note": "unknown"}]
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        job = enqueue(store, wf, {"text": "a b"})
    finally:
        store.close()
    done = wait_for(
        lambda: (j := _job(node, str(job.job_id)))["status"] in ("COMPLETED", "FAILED") and j,
        timeout_s=30,
    )
    assert (done["status"], done.get("error")) == ("COMPLETED", None)
    assert [s["name"] for s in done["report"]["steps"]] == ["tokenize", "embed", "review"]
