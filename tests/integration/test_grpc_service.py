"""ProtoMoltService on loopback: transcoding, error mapping, token, reflection v1/v1alpha, health."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from protomolt_jobs.host.grpc_service import (
    REFLECTION_V1,
    REFLECTION_V1ALPHA,
    RPCS,
    SERVICE_NAME,
    SERVICE_NAMES,
    ProtoMoltGrpcServer,
    verb_of,
)
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.node import ERROR_TABLE, stub_catalog


@pytest.fixture
def served():
    catalog, actions = stub_catalog()  # no check-workflow: it answers UNIMPLEMENTED
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=8).start()
    channel = grpc.insecure_channel(srv.target)
    yield srv, channel, actions
    channel.close()
    srv.close()


def _call(channel, rpc, request, **kw):
    _, req_cls, resp_cls = RPCS[rpc]
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    return stub(request, timeout=10, **kw)


def test_verb_names():
    assert {verb_of(n) for n in RPCS} == {
        "submit-workflow",
        "get-job",
        "list-jobs",
        "complete-step",
        "run-workflow",
        "check-workflow",
        "cancel-job",
        "pause-job",
        "resume-job",
        "retry-step",
        "reconcile-step",
        "migrate-checkpoint",
        "requeue-job",
        "job-history",
        "approve-step",
        "extend-loop",
        "replay-check",
        "test-workflow",
        "report-progress",
        "explain-job",
        "supply-input",
        "get-workflow",
        "list-artifacts",
        "get-artifact",
        "lineage",
        "retract-artifact",
        "promote-artifact",
    }


def test_binds_loopback_by_default(served):
    srv, _, _ = served
    assert srv.host == "127.0.0.1"
    assert srv.target.startswith("127.0.0.1:")
    assert srv.port != 0


def test_request_becomes_the_camel_case_envelope_and_answer_parses_back(served):
    _, channel, actions = served
    req = pb.SubmitWorkflowRequest(workflow_name="wf", job_id="abc")
    req.input.update({"text": "hi", "n": 2})
    resp = _call(channel, "SubmitWorkflow", req)
    assert actions["submit-workflow"].calls == [
        {"workflowName": "wf", "jobId": "abc", "input": {"text": "hi", "n": 2.0}}
    ]
    assert (resp.ok, resp.job_id, resp.status) == (True, "j-1", "QUEUED")


def test_envelope_fields_upstream_dropped_survive():
    job = {
        "ok": True,
        "job": {
            "jobId": "j",
            "status": "COMPLETED",
            "verdict": "all good",
            "checkpoints": [{"name": "a", "skipped": False, "response": {"ids": [1, 2]}}],
            "result": {"x": "y"},
            "attempt": 1,
            "unknownKey": 7,
        },
    }
    catalog, actions = stub_catalog("get-job", "submit-workflow")
    actions["get-job"].execute = lambda _input: job
    actions["submit-workflow"].execute = lambda _input: {
        "ok": False,
        "failedStep": "embed",
        "error": "does not verify",
    }
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=4).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            got = _call(ch, "GetJob", pb.GetJobRequest(job_id="j"))
            refused = _call(ch, "SubmitWorkflow", pb.SubmitWorkflowRequest(workflow_name="w"))
        assert got.job.verdict == "all good"
        assert got.job.checkpoints[0].response["ids"] == [1.0, 2.0]
        assert got.job.result["x"] == "y"
        assert (refused.ok, refused.failed_step) == (False, "embed")
    finally:
        srv.close()


@pytest.mark.parametrize("code", sorted(ERROR_TABLE))
def test_every_action_error_maps_to_its_status(served, code):
    _, channel, _ = served
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "SubmitWorkflow", pb.SubmitWorkflowRequest(workflow_name=code))
    err = info.value
    assert err.code() == grpc.StatusCode[ERROR_TABLE[code][0]]
    assert err.details() == f"{code}: stub {code}"
    trailers = dict(err.trailing_metadata())
    assert trailers["protomolt-error"] == code
    assert json.loads(trailers["protomolt-error-details-bin"]) == {"field": "x"}


def test_a_verb_missing_from_the_catalog_is_unimplemented(served):
    _, channel, _ = served
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "CheckWorkflow", pb.CheckWorkflowRequest())
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details().startswith("unknown-action: ")


def test_unexpected_exception_is_internal_without_detail(served):
    _, channel, _ = served
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "SubmitWorkflow", pb.SubmitWorkflowRequest(workflow_name="boom"))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret stack detail" not in info.value.details()


def test_an_answer_that_does_not_fit_the_response_is_internal(served):
    _, channel, _ = served
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "SubmitWorkflow", pb.SubmitWorkflowRequest(workflow_name="bad-answer"))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "does not parse as" in info.value.details()


def test_ok_false_is_ok(served):
    srv_catalog, actions = stub_catalog("complete-step")
    actions["complete-step"].execute = lambda _i: {
        "ok": False,
        "status": "RUNNING",
        "outstandingStep": "review",
        "error": "job x is RUNNING",
    }
    srv = ProtoMoltGrpcServer(srv_catalog, port=0, max_workers=4).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            got = _call(ch, "CompleteStep", pb.CompleteStepRequest(job_id="x", step_name="s"))
        assert (got.ok, got.status, got.outstanding_step) == (False, "RUNNING", "review")
    finally:
        srv.close()


def _list_services(channel, service, metadata=()):
    info = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    out = list(
        info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata)
    )
    return sorted(s.name for s in out[0].list_services_response.service)


@pytest.mark.parametrize("service", [REFLECTION_V1, REFLECTION_V1ALPHA])
def test_reflection_lists_services_under_v1_and_v1alpha(served, service):
    _, channel, _ = served
    assert _list_services(channel, service) == sorted(
        [*SERVICE_NAMES, "grpc.health.v1.Health", REFLECTION_V1, REFLECTION_V1ALPHA]
    )


def test_a_client_driven_only_by_reflection_can_call_a_verb(served):
    _, channel, actions = served
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName(SERVICE_NAME)
    method = service.methods_by_name["ListJobs"]
    req_cls = message_factory.GetMessageClass(method.input_type)
    resp_cls = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict({"status": "WAITING", "limit": 5}, req_cls())
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/ListJobs",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    answer = json_format.MessageToDict(stub(request, timeout=10))
    assert answer == {"ok": True}
    assert actions["list-jobs"].calls == [{"status": "WAITING", "limit": 5}]
    # The reflection service describes itself under v1 too.
    assert pool.FindServiceByName(REFLECTION_V1).full_name == REFLECTION_V1


def test_health_serves(served):
    _, channel, _ = served
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


class TestToken:
    @pytest.fixture
    def guarded(self):
        catalog, actions = stub_catalog()
        srv = ProtoMoltGrpcServer(catalog, port=0, api_token="s3cret", max_workers=8).start()
        channel = grpc.insecure_channel(srv.target)
        yield channel, actions
        channel.close()
        srv.close()

    @pytest.mark.parametrize(
        "metadata",
        [(), (("api_token", "wrong"),), (("authorization", "Bearer wrong"),)],
    )
    def test_missing_or_wrong_token_is_unauthenticated(self, guarded, metadata):
        channel, actions = guarded
        with pytest.raises(grpc.RpcError) as info:
            _call(channel, "GetJob", pb.GetJobRequest(job_id="x"), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            _list_services(channel, REFLECTION_V1, metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert actions["get-job"].calls == []

    @pytest.mark.parametrize(
        "metadata", [(("api_token", "s3cret"),), (("authorization", "Bearer s3cret"),)]
    )
    def test_either_metadata_key_carries_the_token(self, guarded, metadata):
        channel, _ = guarded
        assert _call(channel, "GetJob", pb.GetJobRequest(job_id="x"), metadata=metadata).ok
        assert SERVICE_NAME in _list_services(channel, REFLECTION_V1ALPHA, metadata)

    def test_health_stays_open(self, guarded):
        channel, _ = guarded
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_close_is_idempotent():
    catalog, _ = stub_catalog()
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=2).start()
    srv.close()
    srv.close()


class _Echoing:
    """A verb whose refusal echoes its whole input, as a verb naming a bad value does."""

    scope = "job-control"
    name = "resume-job"
    description = "echoes"
    input_schema: dict = {"type": "object"}  # noqa: RUF012 - a test double

    def execute(self, input):
        from protomolt_jobs.errors import InvalidInput

        raise InvalidInput(
            f"Field 'at' is not a time; got {input.get('at')!r}",
            {"field": "at", "got": input.get("at")},
        )


def test_a_refusal_echoing_a_huge_value_still_reaches_the_client_as_invalid_argument():
    """gRPC carries the status message and trailers as metadata (a client refuses more than
    16 KiB): a refusal naming a 100 000-character value must still arrive as INVALID_ARGUMENT
    naming the field, not as the client's RESOURCE_EXHAUSTED."""
    catalog, _ = stub_catalog("get-job")
    catalog.register(_Echoing())
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=2).start()
    channel = grpc.insecure_channel(srv.target)
    try:
        with pytest.raises(grpc.RpcError) as info:
            _call(channel, "ResumeJob", pb.ResumeJobRequest(job_id="j", at="x" * 100_000))
        err = info.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details()[:200])
        assert err.details().startswith("invalid-input: Field 'at' is not a time; got 'xxx")
        assert len(err.details()) < 8192
        trailers = dict(err.trailing_metadata())
        assert trailers["protomolt-error"] == "invalid-input"
        assert json.loads(trailers["protomolt-error-details-bin"])["field"] == "at"
    finally:
        channel.close()
        srv.close()
