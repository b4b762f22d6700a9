"""docs/workflows.md's seed flowchart with its loop (Example 3), as written: the proto and the
workflow come from the doc (blocks marked ``<!-- loop-example: ... -->``); the proto is
compiled with ``grpc_tools.protoc`` and its ``Assets`` service served on loopback, counting
calls and recording each call's idempotency key; a real node (real PostgreSQL, the HTTP
surface) runs the workflow; the review is answered ``fix``, then ``accept``. The same workflow
with a smaller bound, whose review always answers ``fix``, ends as ``onExhausted`` says."""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter

import grpc
import pytest

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.guides import DOCS, LoopbackService, compile_proto, doc_blocks
from tests.support.node import http, start_node_with_file, wait_for

GUIDE = DOCS / "workflows.md"
PROTO = "assets/v1/assets.proto"
NODE = """
[node]
api_token = "root-token"

[node.tokens]
ed-1 = "ed-1-token"

[node.groups]
editor = ["ed-1"]
"""
ROOT, EDITOR = "root-token", "ed-1-token"


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = doc_blocks(GUIDE, "loop-example")
    assert set(found) == {f"proto {PROTO}", "workflow asset-variants", "worst-case asset-variants"}
    return found


@pytest.fixture(scope="module")
def descriptor_set(blocks) -> bytes:
    return compile_proto(PROTO, blocks[f"proto {PROTO}"])


class Assets:
    """``assets.v1.Assets`` on loopback: ``calls`` counts each method, ``keys`` lists each
    call's idempotency key per method; BuildVariants numbers its drafts."""

    def __init__(self, fds: bytes) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: dict[str, list[str]] = {}
        self.hints: list[str] = []
        #: the first Decide calls that fail (the flowchart's "both OK?" answered no)
        self.failing_decides = 0
        self._behaviour = {
            "Validate": lambda r: {"title": r.title, "body": r.body},
            "BuildVariants": self._build,
            "TechnicalCheck": lambda r: {"ok": True},
            "DomainCheck": lambda r: {"ok": True},
            "Decide": lambda r: {"ok": r.technical and r.domain},
            "RenderPreview": lambda r: {"url": f"https://preview.example/{r.uri[6:]}"},
            "Replan": lambda r: {"hint": f"rework {r.uri}"},
            "Publish": lambda r: {"publication_id": f"pub-{r.uri[6:]}"},
        }
        self._service = LoopbackService(fds, "assets.v1.Assets", self._answer)
        self.target = self._service.target

    def _build(self, request):
        self.hints.append(request.hint)
        return {"title": request.title, "uri": f"mem://v{self.calls['BuildVariants']}"}

    def _answer(self, name, request, context):
        self.calls[name] += 1
        key = dict(context.invocation_metadata()).get("x-protomolt-idempotency-key", "")
        self.keys.setdefault(name, []).append(key)
        if name == "Decide" and self.calls[name] <= self.failing_decides:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the variants are not OK")
        return self._behaviour[name](request)

    def stop(self) -> None:
        self._service.stop()


@pytest.fixture
def assets(descriptor_set):
    a = Assets(descriptor_set)
    yield a
    a.stop()


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        yield surfaces
    finally:
        surfaces.close()


def _workflow(blocks, fds: bytes, target: str) -> dict:
    wf = json.loads(blocks["workflow asset-variants"])
    wf["schema"]["descriptorSetBase64"] = base64.b64encode(fds).decode()
    for s in wf["steps"]:
        if "target" in s:
            s["target"] = target
    return wf


def _cli(argv: list[str]) -> int:
    """The CLI's ``main`` with the root logger given back as it was (``main`` configures
    logging for the process; the node's threads must not log into a test's closed capture)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return main(argv)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _post(url, verb, body, token=ROOT):
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def _job(url, job_id):
    status, answer, _ = _post(url, "get-job", {"jobId": job_id})
    assert status == 200, answer
    return answer["job"]


def _submit(url, wf) -> str:
    status, answer, _ = _post(url, "submit-workflow", {"workflow": wf, "input": {"title": "t"}})
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def _reviews_open(url, job_id, n) -> bool:
    """The run waits on the review with ``n`` preview entries stored."""
    job = _job(url, job_id)
    opened = [c for c in job.get("checkpoints", []) if c["name"] == "preview"]
    return job.get("phase") == "waiting_approval" and len(opened) == n


def _review(url, job_id, decision, n):
    wait_for(lambda: _reviews_open(url, job_id, n), timeout_s=60)
    body = {"jobId": job_id, "stepName": "review", "decision": decision}
    status, answer, _ = _post(url, "approve-step", body, EDITOR)
    assert status == 200 and answer["decided"] is True, answer
    # each iteration opens the review afresh: no earlier vote counts
    assert answer["tally"] == {decision: 1}, answer


def test_the_flowchart_runs_as_written_fix_then_accept(
    node, assets, blocks, descriptor_set, tmp_path, capsys
):
    url = node.http.url
    wf = _workflow(blocks, descriptor_set, assets.target)
    status, answer, _ = _post(url, "check-workflow", {"workflow": wf})
    assert status == 200 and answer["ok"] is True, answer
    assert answer["worstCase"] == json.loads(blocks["worst-case asset-variants"])
    path = tmp_path / "asset-variants.json"
    path.write_text(json.dumps(wf))
    assert _cli(["workflow", "check", str(path), "--url", url, "--token", ROOT]) == 0
    out = capsys.readouterr().out
    assert "worst case 30 step executions, 26 calls, cost 0" in out, out

    job_id = _submit(url, wf)
    _review(url, job_id, "fix", 1)
    _review(url, job_id, "accept", 2)
    wait_for(lambda: _job(url, job_id)["status"] == "COMPLETED", timeout_s=60)

    assert assets.calls == {
        "Validate": 1,
        "BuildVariants": 2,
        "TechnicalCheck": 2,
        "DomainCheck": 2,
        "Decide": 2,
        "RenderPreview": 2,
        "Replan": 1,
        "Publish": 1,
    }
    assert assets.hints == ["", "rework mem://v1"]  # iteration 1 read replan's answer
    # iteration 0 keeps today's keys; iteration 1 adds ":1"
    assert assets.keys["BuildVariants"] == [
        f"{job_id}:build_variants:0",
        f"{job_id}:build_variants:0:1",
    ]
    assert assets.keys["Validate"] == [f"{job_id}:validate:0"]
    assert assets.keys["Publish"] == [f"{job_id}:publish:0"]

    job = _job(url, job_id)
    entries = [(c["name"], c.get("iteration", 0)) for c in job["checkpoints"]]
    assert entries.count(("build_variants", 0)) == 1 and ("build_variants", 1) in entries
    assert ("review", 1) in entries and entries[-1] == ("publish", 0)
    assert all("iteration" not in c for c in job["checkpoints"][:3])
    rows = [(r["name"], r.get("iteration", 0), r["status"]) for r in job["report"]["steps"]]
    assert ("build_variants", 0, "succeeded") in rows
    assert ("build_variants", 1, "succeeded") in rows
    assert ("replan", 0, "succeeded") in rows and ("replan", 1, "skipped") in rows
    assert ("publish", 0, "succeeded") in rows


def _small(blocks, fds, target, on_exhausted: str) -> dict:
    wf = _workflow(blocks, fds, target)
    replan = next(s for s in wf["steps"] if s["name"] == "replan")
    replan["loop"] = {"to": "build_variants", "max": 2, "onExhausted": on_exhausted}
    return wf


def test_max_two_always_fix_fails_after_exactly_two_extra_iterations(
    node, assets, blocks, descriptor_set
):
    url = node.http.url
    job_id = _submit(url, _small(blocks, descriptor_set, assets.target, "fail"))
    for n in (1, 2, 3):
        _review(url, job_id, "fix", n)
    wait_for(lambda: _job(url, job_id)["status"] == "FAILED", timeout_s=60)
    job = _job(url, job_id)
    assert job["error"].startswith("LOOP: loop 'replan' exhausted"), job["error"]
    assert assets.calls["BuildVariants"] == 3 and assets.calls["Replan"] == 3
    assert assets.calls["Validate"] == 1 and assets.calls["Publish"] == 0


def test_max_two_always_fix_parks_and_extend_loop_lets_it_go_on(
    node, assets, blocks, descriptor_set, capsys
):
    url = node.http.url
    job_id = _submit(url, _small(blocks, descriptor_set, assets.target, "park"))
    for n in (1, 2, 3):
        _review(url, job_id, "fix", n)
    wait_for(lambda: _job(url, job_id)["status"] == "PAUSED", timeout_s=60)
    job = _job(url, job_id)
    assert job["error"].startswith("LOOP: loop 'replan' exhausted"), job["error"]
    assert assets.calls["BuildVariants"] == 3 and assets.calls["Replan"] == 3

    # bad input names the field
    for body, field in (
        ({"jobId": job_id, "step": "replan", "by": 0}, "by"),
        ({"jobId": job_id, "step": "review", "by": 1}, "step"),
        ({"jobId": job_id, "by": 1}, "step"),
        ({"jobId": job_id, "step": "replan", "by": 1, "bogus": 1}, "bogus"),
    ):
        status, answer, _ = _post(url, "extend-loop", body)
        assert status == 400 and answer["error"] == "invalid-input", answer
        assert answer["details"]["field"] == field, answer
    # the cap (jobs.loop_extend_cap, 20 by default): max 2 + 19 > 20
    status, answer, _ = _post(url, "extend-loop", {"jobId": job_id, "step": "replan", "by": 19})
    assert status == 200 and answer["ok"] is False and "loop_extend_cap" in answer["error"]

    # the CLI and gRPC doors refuse bad input naming the field too
    door = ["--url", url, "--token", ROOT]
    code = _cli(["jobs", "extend-loop", job_id, "--step", "replan", "--by", "0", *door])
    captured = capsys.readouterr()
    # (stderr may also hold other tests' log lines: the CLI's own answer is its last line)
    assert code != 0 and "Traceback" not in captured.out, captured
    assert captured.err.strip().splitlines()[-1] == (
        "invalid-input: Field 'by' must be a whole number from 1 to 1000"
    ), captured.err
    with grpc.insecure_channel(node.grpc.target) as channel:
        extend = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/ExtendLoop",
            request_serializer=pb.ExtendLoopRequest.SerializeToString,
            response_deserializer=pb.ExtendLoopResponse.FromString,
        )
        auth = (("authorization", f"Bearer {ROOT}"),)
        for request, field in (
            (pb.ExtendLoopRequest(job_id=job_id, step="replan"), "by"),
            (pb.ExtendLoopRequest(job_id=job_id, step="review", by=1), "step"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                extend(request, metadata=auth)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in refused.value.details(), refused.value.details()
        answer = extend(
            pb.ExtendLoopRequest(job_id=job_id, step="replan", by=1, reason="one more"),
            metadata=auth,
        )
    assert answer.ok is True and answer.status == "QUEUED", answer
    assert answer.requeued is True and answer.max == 3 and answer.extended_by == 1
    _review(url, job_id, "accept", 4)
    wait_for(lambda: _job(url, job_id)["status"] == "COMPLETED", timeout_s=60)
    assert assets.calls["BuildVariants"] == 4 and assets.calls["Publish"] == 1
    assert assets.keys["BuildVariants"][3] == f"{job_id}:build_variants:0:3"
    status, history, _ = _post(url, "job-history", {"jobId": job_id})
    extend = [t for t in history["transitions"] if t["kind"] == "extend-loop"]
    assert len(extend) == 1 and extend[0]["actor"] != "" and extend[0]["reason"] == "by 1: one more"
    assert extend[0]["prevStatus"] == "PAUSED" and extend[0]["newStatus"] == "QUEUED"


def test_a_failed_decision_replans_without_a_review(node, assets, blocks, descriptor_set):
    url = node.http.url
    assets.failing_decides = 1
    job_id = _submit(url, _workflow(blocks, descriptor_set, assets.target))
    # iteration 0: decide fails, preview and review are skipped, replan runs (its failure
    # edge); iteration 1: decide succeeds and the review opens once
    _review(url, job_id, "accept", 2)  # preview: skipped in iteration 0, run in iteration 1
    wait_for(lambda: _job(url, job_id)["status"] == "COMPLETED", timeout_s=60)
    assert assets.calls["Decide"] == 2 and assets.calls["BuildVariants"] == 2
    assert assets.calls["Replan"] == 1 and assets.calls["RenderPreview"] == 1
    assert assets.calls["Publish"] == 1
    entries = [(c["name"], c.get("iteration", 0)) for c in _job(url, job_id)["checkpoints"]]
    assert ("review", 0) in entries and ("review", 1) in entries  # skipped, then decided
