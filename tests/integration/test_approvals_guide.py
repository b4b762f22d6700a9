"""docs/approvals.md's worked example, as written: the proto, the node's configuration and the
workflow come from the doc (blocks marked ``<!-- approval-example: ... -->``); the proto is
compiled with ``grpc_tools.protoc`` and its ``Desk`` served on loopback; a real node (real
PostgreSQL, the HTTP surface, the doc's tokens) runs the workflow; the votes get the answers
the doc shows, and the ``fix`` and ``reject`` decisions do what the doc says."""

from __future__ import annotations

import base64
import json
import tomllib

import pytest

from tests.support.guides import DOCS, LoopbackService, compile_proto, doc_blocks
from tests.support.node import http, start_node_with_file, wait_for

GUIDE = DOCS / "approvals.md"
PROTO = "newsroom/v1/newsroom.proto"


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = doc_blocks(GUIDE, "approval-example")
    assert set(found) == {
        f"proto {PROTO}",
        "node protomolt.toml",
        "workflow newsroom",
        "answer first-vote",
        "answer second-vote",
    }
    return found


@pytest.fixture(scope="module")
def descriptor_set(blocks) -> bytes:
    return compile_proto(PROTO, blocks[f"proto {PROTO}"])


class Desk:
    """``newsroom.v1.Desk`` on loopback: Draft echoes, Publish gives a URL, Rework marks the
    body; ``calls`` lists the methods called."""

    def __init__(self, fds: bytes) -> None:
        self.calls: list[str] = []
        self._service = LoopbackService(fds, "newsroom.v1.Desk", self._answer)
        self.target = self._service.target

    def _answer(self, name, r, context) -> dict:
        self.calls.append(name)
        if name == "Draft":
            return {"slug": r.slug, "body": r.body}
        if name == "Publish":
            return {"slug": r.slug, "url": f"https://news.example/{r.slug}"}
        return {"slug": r.slug, "body": f"[rework] {r.body}"}  # Rework

    def stop(self) -> None:
        self._service.stop()


@pytest.fixture
def desk(descriptor_set):
    d = Desk(descriptor_set)
    yield d
    d.stop()


@pytest.fixture
def node(tmp_path, fresh_dsn, blocks):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, blocks["node protomolt.toml"])
    try:
        yield surfaces
    finally:
        surfaces.close()


def _tokens(blocks) -> dict[str, str]:
    config = tomllib.loads(blocks["node protomolt.toml"])
    return {"root": config["node"]["api_token"], **config["node"]["tokens"]}


def _workflow(blocks, fds: bytes, target: str) -> dict:
    wf = json.loads(blocks["workflow newsroom"])
    wf["schema"]["descriptorSetBase64"] = base64.b64encode(fds).decode()
    for s in wf["steps"]:
        if "target" in s:
            s["target"] = target
    return wf


def _post(url, verb, body, token):
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def _job(url, job_id, token):
    status, answer, _ = _post(url, "get-job", {"jobId": job_id}, token)
    assert status == 200, answer
    return answer["job"]


def _submit_and_park(url, blocks, fds, desk, tokens) -> str:
    status, answer, _ = _post(
        url,
        "submit-workflow",
        {
            "workflow": _workflow(blocks, fds, desk.target),
            "input": {"slug": "budget-2027", "body": "..."},
        },
        tokens["writer-1"],
    )
    assert status == 200 and answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: _job(url, job_id, tokens["root"]).get("phase") == "waiting_approval")
    return job_id


def _vote(url, job_id, token, decision):
    body = {"jobId": job_id, "stepName": "review", "decision": decision}
    status, answer, _ = _post(url, "approve-step", body, token)
    assert status == 200, answer
    return answer


def test_the_example_accepts_with_two_editors_as_the_doc_shows(node, desk, blocks, descriptor_set):
    url, tokens = node.http.url, _tokens(blocks)
    job_id = _submit_and_park(url, blocks, descriptor_set, desk, tokens)
    assert desk.calls == ["Draft"]

    assert _vote(url, job_id, tokens["ed-1"], "accept") == json.loads(blocks["answer first-vote"])
    again = _vote(url, job_id, tokens["ed-1"], "accept")
    assert again["tally"] == {"accept": 1} and again["decided"] is False
    # The writer holds no job-approve: refused by scope; the doc's rule on submitters is the
    # self-approval answer (tests/integration/test_approvals.py plays it with an editor).
    status, answer, _ = _post(
        url,
        "approve-step",
        {"jobId": job_id, "stepName": "review", "decision": "accept"},
        tokens["writer-1"],
    )
    assert status == 403 and answer["error"] == "permission-denied"

    assert _vote(url, job_id, tokens["ed-2"], "accept") == json.loads(blocks["answer second-vote"])
    done = wait_for(lambda: (j := _job(url, job_id, tokens["root"]))["status"] == "COMPLETED" and j)
    assert desk.calls == ["Draft", "Publish"]
    assert done["result"]["url"] == "https://news.example/budget-2027"
    steps = {s["name"]: s for s in done["report"]["steps"]}
    assert steps["rework"]["reason"] == "branch not taken: review decided accept"


def test_two_fix_votes_send_the_draft_to_rework(node, desk, blocks, descriptor_set):
    url, tokens = node.http.url, _tokens(blocks)
    job_id = _submit_and_park(url, blocks, descriptor_set, desk, tokens)
    _vote(url, job_id, tokens["ed-1"], "fix")
    assert _vote(url, job_id, tokens["ed-3"], "fix")["decision"] == "fix"
    wait_for(lambda: _job(url, job_id, tokens["root"])["status"] == "COMPLETED")
    assert desk.calls == ["Draft", "Rework"]


def test_one_reject_fails_the_run_at_once(node, desk, blocks, descriptor_set):
    url, tokens = node.http.url, _tokens(blocks)
    job_id = _submit_and_park(url, blocks, descriptor_set, desk, tokens)
    answer = _vote(url, job_id, tokens["ed-2"], "reject")
    assert answer["decided"] is True and answer["tally"] == {"reject": 1}
    failed = wait_for(lambda: (j := _job(url, job_id, tokens["root"]))["status"] == "FAILED" and j)
    assert "APPROVAL: approval step 'review' decided 'reject'" in failed["error"]
    assert desk.calls == ["Draft"]
