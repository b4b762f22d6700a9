"""docs/approvals.md's *Policy floors* example, as written (blocks marked ``<!-- floor-example:
... -->``, with the proto and workflow of the approvals example): a real node (real
PostgreSQL, the HTTP surface, the doc's tokens) with the doc's floor refuses a workflow that
lowers it at PUT (422, a ``weakens_policy`` finding naming the rule), at submit
(``invalid-input``) and in check-workflow; restarted with the floor raised, it applies the
new floor to a run already waiting and stores the floor's hash with the decision."""

from __future__ import annotations

import copy
import json
import tomllib

import pytest

from protomolt_jobs.workflow.floors import compile_floors, policy_sha256
from tests.integration.test_approvals_guide import GUIDE, PROTO, Desk, _job, _post, _workflow
from tests.support.guides import compile_proto, doc_blocks
from tests.support.node import http, start_node_with_file, wait_for


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = doc_blocks(GUIDE, "(?P<kind>approval|floor)-example")
    assert {k for k in found if k.startswith("floor ")} == {
        "floor node protomolt.toml",
        "floor answer put-refused",
        "floor answer second-vote",
    }
    return found


@pytest.fixture(scope="module")
def descriptor_set(blocks) -> bytes:
    return compile_proto(PROTO, blocks[f"approval proto {PROTO}"])


@pytest.fixture
def desk(descriptor_set):
    d = Desk(descriptor_set)
    yield d
    d.stop()


def _tokens(toml: str) -> dict[str, str]:
    config = tomllib.loads(toml)
    return {"root": config["node"]["api_token"], **config["node"]["tokens"]}


def _guide_blocks(blocks) -> dict[str, str]:
    return {"workflow newsroom": blocks["approval workflow newsroom"]}


def _lowered(workflow: dict) -> dict:
    low = copy.deepcopy(workflow)
    for s in low["steps"]:
        if s["name"] == "review":
            s["approval"]["quorum"] = 1
    return low


def test_a_workflow_lowering_the_floor_is_refused_at_put_submit_and_check(
    tmp_path, fresh_dsn, blocks, descriptor_set, desk
):
    toml = blocks["floor node protomolt.toml"]
    node = start_node_with_file(tmp_path, fresh_dsn, toml)
    try:
        url, tokens = node.http.url, _tokens(toml)
        workflow = _workflow(_guide_blocks(blocks), descriptor_set, desk.target)
        auth = {"Authorization": f"Bearer {tokens['writer-1']}"}
        expected = json.loads(blocks["floor answer put-refused"])

        status, answer, _ = http(
            "PUT", f"{url}/protomolt/workflows/newsroom", _lowered(workflow), headers=auth
        )
        assert status == 422 and answer["error"] == "does-not-verify", answer
        assert answer["findings"] == [expected]
        root = {"Authorization": f"Bearer {tokens['root']}"}
        status, answer, _ = http("GET", f"{url}/protomolt/workflows/newsroom", None, headers=root)
        assert status == 404  # nothing stored

        status, answer, _ = _post(
            url,
            "submit-workflow",
            {"workflow": _lowered(workflow), "input": {"slug": "s", "body": "b"}},
            tokens["writer-1"],
        )
        assert status == 400 and answer["error"] == "invalid-input", answer
        assert answer["message"].startswith("weakens_policy: ")
        assert "policy floor 'newsroom-review'" in answer["message"]
        assert "step 'review'" in answer["message"]

        status, answer, _ = _post(
            url,
            "run-workflow",
            {"workflow": _lowered(workflow), "input": {"slug": "s", "body": "b"}},
            tokens["writer-1"],
        )
        assert status == 400 and answer["message"].startswith("weakens_policy: "), answer
        assert desk.calls == []

        status, answer, _ = _post(
            url, "check-workflow", {"workflow": _lowered(workflow)}, tokens["root"]
        )
        assert status == 200 and answer == {"ok": False, "findings": [expected]}

        # An escalation widening past the floor, a veto on accept, a review that is no gate.
        wider = copy.deepcopy(workflow)
        review = next(s for s in wider["steps"] if s["name"] == "review")
        review["approval"]["escalate"][0]["addRoles"] = ["intern"]
        review["approval"]["veto"] = ["reject", "accept"]
        _, answer, _ = _post(url, "check-workflow", {"workflow": wider}, tokens["root"])
        errors = [f["error"] for f in answer["findings"]]
        assert [f["kind"] for f in answer["findings"]] == ["weakens_policy"] * 2
        assert "role 'intern', outside the floor's approvers" in errors[0]
        assert "approval.veto lets one vote decide accept" in errors[1]

        # The example's own workflow is stored and runs.
        status, answer, _ = http(
            "PUT", f"{url}/protomolt/workflows/newsroom", workflow, headers=auth
        )
        assert status == 200, answer
    finally:
        node.close()


def test_a_raised_floor_applies_to_a_waiting_run_and_its_hash_is_stored(
    tmp_path, fresh_dsn, blocks, descriptor_set, desk
):
    toml = blocks["floor node protomolt.toml"]
    tokens = _tokens(toml)
    workflow = _workflow(_guide_blocks(blocks), descriptor_set, desk.target)
    node = start_node_with_file(tmp_path, fresh_dsn, toml)
    try:
        url = node.http.url
        status, answer, _ = _post(
            url,
            "submit-workflow",
            {"workflow": workflow, "input": {"slug": "budget-2027", "body": "..."}},
            tokens["writer-1"],
        )
        assert status == 200 and answer["ok"], answer
        job_id = answer["jobId"]
        wait_for(lambda: _job(url, job_id, tokens["root"]).get("phase") == "waiting_approval")
    finally:
        node.close()

    raised = toml.replace("quorum = 2", "quorum = 3")
    assert raised != toml
    node = start_node_with_file(tmp_path, fresh_dsn, raised)
    try:
        url = node.http.url
        floors = compile_floors(tomllib.loads(raised)["jobs"]["approval_floors"])
        digest = policy_sha256(floors)

        def vote(who):
            body = {"jobId": job_id, "stepName": "review", "decision": "accept"}
            status, answer, _ = _post(url, "approve-step", body, tokens[who])
            assert status == 200, answer
            return answer

        vote("ed-1")
        second = vote("ed-2")
        assert second == json.loads(blocks["floor answer second-vote"]) | {"policySha256": digest}
        third = vote("ed-3")
        assert third["decided"] is True and third["needed"] == 3
        done = wait_for(
            lambda: (j := _job(url, job_id, tokens["root"]))["status"] == "COMPLETED" and j
        )
        assert desk.calls == ["Draft", "Publish"]
        assert done["result"]["url"] == "https://news.example/budget-2027"
        entry = next(c for c in _checkpoints(url, job_id, tokens) if c.get("name") == "review")
        assert entry["policy"] == ["newsroom-review"]
        assert entry["policySha256"] == digest
        assert [v["principal"] for v in entry["voters"]] == ["ed-1", "ed-2", "ed-3"]
        _, history, _ = _post(url, "job-history", {"jobId": job_id}, tokens["root"])
        assert history["integrity"] == "ok"
        reasons = [t["reason"] for t in history["transitions"] if t["kind"] in ("vote", "decision")]
        assert reasons == [
            f"accept (policy {digest})",
            f"accept (policy {digest})",
            f"accept (policy {digest})",
            f"decided accept (policy {digest})",
        ]
    finally:
        node.close()


def _checkpoints(url, job_id, tokens) -> list[dict]:
    job = _job(url, job_id, tokens["root"])
    return job.get("checkpoints") or []


def test_a_narrowed_floor_refuses_voters_outside_it_and_vetoes_it_no_longer_allows(
    tmp_path, fresh_dsn, blocks, descriptor_set, desk
):
    """Restarted with the floor's approvers narrowed to two principals and no veto allowed:
    a third editor is permission-denied naming the rule (a ``denied`` row of the history),
    one ``reject`` no longer decides, a second one does (the quorum)."""
    toml = blocks["floor node protomolt.toml"]
    tokens = _tokens(toml)
    workflow = _workflow(_guide_blocks(blocks), descriptor_set, desk.target)
    node = start_node_with_file(tmp_path, fresh_dsn, toml)
    try:
        url = node.http.url
        _, answer, _ = _post(
            url,
            "submit-workflow",
            {"workflow": workflow, "input": {"slug": "s", "body": "b"}},
            tokens["writer-1"],
        )
        job_id = answer["jobId"]
        wait_for(lambda: _job(url, job_id, tokens["root"]).get("phase") == "waiting_approval")
    finally:
        node.close()

    narrowed = toml.replace(
        'approvers = {roles = ["editor", "chief-editor"]}\nveto = ["reject"]',
        'approvers = {principals = ["ed-1", "ed-2"]}\nveto = []',
    )
    assert narrowed != toml
    node = start_node_with_file(tmp_path, fresh_dsn, narrowed)
    try:
        url = node.http.url
        body = {"jobId": job_id, "stepName": "review", "decision": "reject"}
        status, answer, _ = _post(url, "approve-step", body, tokens["ed-3"])
        assert status == 403 and answer["error"] == "permission-denied", answer
        assert "not within the approvers of policy floor 'newsroom-review'" in answer["message"]
        _, history, _ = _post(url, "job-history", {"jobId": job_id}, tokens["root"])
        denied = [t for t in history["transitions"] if t["kind"] == "denied"]
        assert [t["actor"] for t in denied] == ["ed-3"]
        assert "policy floor 'newsroom-review'" in denied[0]["reason"]

        status, first, _ = _post(url, "approve-step", body, tokens["ed-1"])
        assert status == 200 and first["decided"] is False and first["needed"] == 2, first
        status, second, _ = _post(url, "approve-step", body, tokens["ed-2"])
        assert second["decided"] is True and second["decision"] == "reject", second
        wait_for(lambda: _job(url, job_id, tokens["root"])["status"] == "FAILED")
        assert desk.calls == ["Draft"]
    finally:
        node.close()
