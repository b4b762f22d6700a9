"""A misspelt field is ``invalid-input`` naming it on both surfaces of a real node (uvicorn on
loopback, the gRPC server): ``submit-workflow``'s ``input``, ``complete-step``'s ``response``
and ``run-workflow``'s ``input``. Nothing is written and a parked job stays parked."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from google.protobuf import json_format

from protomolt_jobs.host.grpc_service import RPCS, SERVICE_NAME
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for


@pytest.fixture
def services():
    with TestServices(max_workers=8) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


@pytest.fixture
def channel(node):
    ch = grpc.insecure_channel(node.grpc.target)
    yield ch
    ch.close()


def _grpc(channel, rpc: str, envelope: dict):
    _, req_cls, resp_cls = RPCS[rpc]
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    return stub(json_format.ParseDict(envelope, req_cls()), timeout=10)


def _refused_on_grpc(channel, rpc: str, envelope: dict) -> tuple[str, dict]:
    with pytest.raises(grpc.RpcError) as caught:
        _grpc(channel, rpc, envelope)
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    trailers = dict(err.trailing_metadata())
    assert trailers["protomolt-error"] == "invalid-input"
    return err.details(), json.loads(trailers["protomolt-error-details-bin"])


def _refused_on_http(node, verb: str, envelope: dict) -> tuple[str, dict]:
    status, body, _ = http("POST", f"{node.actions_url}/{verb}", envelope)
    assert (status, body["error"]) == (400, "invalid-input"), body
    return body["message"], body["details"]


def _jobs(node) -> list[dict]:
    status, body, _ = http("POST", f"{node.actions_url}/list-jobs", {})
    assert status == 200
    return body["jobs"]


def test_submit_with_a_misspelt_input_field_is_refused_on_both_doors(node, services, channel):
    envelope = {
        "workflow": seed_workflow(services.target),
        "input": {"txt": "x"},
        "jobId": str(uuid.uuid4()),
    }
    message, details = _refused_on_http(node, "submit-workflow", envelope)
    assert '"txt"' in message and details == {"field": "input", "path": "txt"}
    message, details = _refused_on_grpc(channel, "SubmitWorkflow", envelope)
    assert '"txt"' in message and details == {"field": "input", "path": "txt"}
    # A value of the wrong type names its field.
    envelope["input"] = {"text": "x", "fail": "yes"}
    message, details = _refused_on_http(node, "submit-workflow", envelope)
    assert details == {"field": "input", "path": "fail"}, message
    assert _jobs(node) == []


def test_complete_step_with_a_misspelt_response_field_is_refused_on_both_doors(
    node, services, channel
):
    job_id = str(uuid.uuid4())
    envelope = {
        "workflow": seed_workflow(services.target),
        "input": {"text": "hello world"},
        "jobId": job_id,
    }
    status, body, _ = http("POST", f"{node.actions_url}/submit-workflow", envelope)
    assert (status, body["ok"]) == (200, True), body

    def parked():
        _, got, _ = http("POST", f"{node.actions_url}/get-job", {"jobId": job_id})
        return got["job"]["status"] == "WAITING" and got["job"]

    wait_for(parked, timeout_s=30)
    answer = {"jobId": job_id, "stepName": "review", "response": {"aproved": True}}
    message, details = _refused_on_http(node, "complete-step", answer)
    assert '"aproved"' in message and details == {"field": "response", "path": "aproved"}
    message, details = _refused_on_grpc(channel, "CompleteStep", answer)
    assert '"aproved"' in message and details == {"field": "response", "path": "aproved"}
    job = parked()
    assert job and job["outstandingStep"] == "review"
    # The right spelling completes it.
    answer["response"] = {"approved": True}
    status, body, _ = http("POST", f"{node.actions_url}/complete-step", answer)
    assert (status, body) == (200, {"ok": True, "status": "QUEUED"})


def test_run_workflow_with_a_misspelt_input_field_is_refused_on_both_doors(node, services, channel):
    envelope = {"workflow": seed_workflow(services.target, review="invoke"), "input": {"txt": "x"}}
    message, details = _refused_on_http(node, "run-workflow", envelope)
    assert '"txt"' in message and details == {"field": "input", "path": "txt"}
    message, details = _refused_on_grpc(channel, "RunWorkflow", envelope)
    assert '"txt"' in message and details == {"field": "input", "path": "txt"}
    assert services.calls("Tokenize") == 0
    # An unknown top-level field (only JSON can carry one).
    envelope["input"], envelope["inptu"] = {"text": "x"}, {}
    message, details = _refused_on_http(node, "run-workflow", envelope)
    assert details == {"field": "inptu"}, message
