"""A whole node (registry, parse, jobs) on loopback: the seed lifecycle over gRPC driven only by
reflection, and over the HTTP route with curl; tokens on both surfaces."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from protomolt_jobs.host.grpc_service import SERVICE_NAME
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import node_environ, start_node, wait_for


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata (the token) to every call, reflection included."""

    def __init__(self, metadata):
        self.metadata = tuple(metadata)

    def _details(self, details):
        return details._replace(metadata=tuple(details.metadata or ()) + self.metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class ReflectedClient:
    """Calls ProtoMoltService knowing nothing but what server reflection says."""

    def __init__(self, target: str, metadata=()):
        self._raw = grpc.insecure_channel(target)
        self.channel = grpc.intercept_channel(self._raw, _Metadata(metadata))
        self.pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(self.channel))

    def call(self, rpc: str, envelope: dict) -> dict:
        service = self.pool.FindServiceByName(SERVICE_NAME)
        method = service.methods_by_name[rpc]
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        stub = self.channel.unary_unary(
            f"/{SERVICE_NAME}/{rpc}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        request = json_format.ParseDict(envelope, req_cls())
        response = stub(request, timeout=15)
        return json_format.MessageToDict(response)

    def close(self):
        self._raw.close()


def test_seed_lifecycle_over_grpc_with_a_reflection_only_client(node, services):
    client = ReflectedClient(node.grpc.target)
    try:
        wf = seed_workflow(services.target)
        submitted = client.call(
            "SubmitWorkflow", {"workflow": wf, "input": {"text": "hello world"}}
        )
        assert submitted["ok"] is True and submitted["status"] == "QUEUED"
        job_id = submitted["jobId"]

        parked = wait_for(
            lambda: (
                (j := client.call("GetJob", {"jobId": job_id})["job"])["status"] == "WAITING" and j
            )
        )
        assert parked["outstandingStep"] == "review"
        assert [c["name"] for c in parked["checkpoints"]] == ["tokenize", "embed"]

        listed = client.call("ListJobs", {"status": "WAITING"})
        assert [j["jobId"] for j in listed["jobs"]] == [job_id]
        assert "checkpoints" not in listed["jobs"][0]

        wrong = client.call(
            "CompleteStep", {"jobId": job_id, "stepName": "other", "response": {"approved": True}}
        )
        # ok:false is an answer (gRPC OK); proto3 JSON leaves the false bool out
        assert "ok" not in wrong and wrong["outstandingStep"] == "review"
        assert wrong["status"] == "WAITING"

        done = client.call(
            "CompleteStep",
            {"jobId": job_id, "stepName": "review", "response": {"approved": True, "note": "ok"}},
        )
        assert done == {"ok": True, "status": "QUEUED"}
        final = wait_for(
            lambda: (
                (j := client.call("GetJob", {"jobId": job_id})["job"])["status"] == "COMPLETED"
                and j
            )
        )
        assert [c["name"] for c in final["checkpoints"]] == ["tokenize", "embed", "review"]
        assert final["result"]
        assert services.calls("Tokenize") == 1
        assert services.calls("Review") == 0

        with pytest.raises(grpc.RpcError) as info:
            client.call("GetJob", {"jobId": "not-a-uuid"})
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("invalid-input: ")
    finally:
        client.close()


def test_check_and_run_workflow_over_grpc(node, services):
    client = ReflectedClient(node.grpc.target)
    try:
        wf = seed_workflow(services.target, review="invoke")
        assert client.call("CheckWorkflow", {"workflow": wf}) == {"ok": True}
        ran = client.call("RunWorkflow", {"workflow": wf, "input": {"text": "a b c"}})
        assert ran["ok"] is True
        assert [s["name"] for s in ran["steps"]] == ["tokenize", "embed", "review"]
        wf["steps"][0]["rules"].append("nosuch = input.text")
        checked = client.call("CheckWorkflow", {"workflow": wf})
        assert checked.get("ok") is not True
        assert checked["findings"][0]["step"] == "tokenize"
    finally:
        client.close()


def _curl(url: str, body: dict | None = None, *headers: str) -> tuple[int, dict]:
    cmd = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "15"]
    for h in headers:
        cmd += ["-H", h]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    text, _, code = out.rpartition("\n")
    return int(code), json.loads(text)


def test_seed_lifecycle_with_curl_on_the_actions_route(node, services):
    base = f"{node.http.url}/protomolt/actions"
    code, sub = _curl(
        f"{base}/submit-workflow",
        {"workflow": seed_workflow(services.target), "input": {"text": "from curl"}},
    )
    assert code == 200 and sub["ok"] is True
    job_id = sub["jobId"]
    wait_for(lambda: _curl(f"{base}/get-job", {"jobId": job_id})[1]["job"]["status"] == "WAITING")
    code, listed = _curl(f"{base}/list-jobs", {"status": "WAITING"})
    assert [j["jobId"] for j in listed["jobs"]] == [job_id]
    code, done = _curl(
        f"{base}/complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True}},
    )
    assert (code, done) == (200, {"ok": True, "status": "QUEUED"})
    wait_for(lambda: _curl(f"{base}/get-job", {"jobId": job_id})[1]["job"]["status"] == "COMPLETED")
    code, err = _curl(f"{base}/get-job", {"jobId": 7})
    assert (code, err["error"]) == (400, "invalid-input")


def test_submit_with_both_or_neither_source_is_invalid_input_on_both_surfaces(node, services):
    wf = seed_workflow(services.target)
    code, body = _curl(
        f"{node.http.url}/protomolt/actions/submit-workflow",
        {"workflow": wf, "workflowName": "x", "input": {"text": "t"}},
    )
    assert (code, body["error"]) == (400, "invalid-input")
    client = ReflectedClient(node.grpc.target)
    try:
        with pytest.raises(grpc.RpcError) as info:
            client.call("SubmitWorkflow", {"input": {"text": "t"}})
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        client.close()


def test_jobs_unconfigured_answers_unavailable_on_both_surfaces(tmp_path):
    surfaces = start_node(node_environ(tmp_path / "data", None))
    # no dsn through start_node: the role mounts and its verbs answer unavailable
    try:
        code, body = _curl(f"{surfaces.http.url}/protomolt/actions/list-jobs", {})
        assert (code, body["error"]) == (503, "unavailable")
        client = ReflectedClient(surfaces.grpc.target)
        try:
            with pytest.raises(grpc.RpcError) as info:
                client.call("ListJobs", {})
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            client.close()
    finally:
        surfaces.close()


def test_token_guards_both_surfaces(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn, token="tok3n"))
    try:
        base = f"{surfaces.http.url}/protomolt/actions"
        assert _curl(f"{base}/list-jobs", {})[0] == 401
        assert _curl(f"{base}/list-jobs", {}, "Authorization: Bearer tok3n")[0] == 200
        assert _curl(f"{base}/list-jobs", {}, "api_token: tok3n")[0] == 200
        bare = ReflectedClient(surfaces.grpc.target)
        try:
            with pytest.raises(grpc.RpcError) as info:
                bare.call("ListJobs", {})
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            bare.close()
        good = ReflectedClient(surfaces.grpc.target, [("authorization", "Bearer tok3n")])
        try:
            assert good.call("ListJobs", {})["ok"] is True
        finally:
            good.close()
    finally:
        surfaces.close()


def test_both_surfaces_bind_loopback_by_default(node):
    assert node.http.bound_host == "127.0.0.1"
    assert node.grpc.target.startswith("127.0.0.1:")
