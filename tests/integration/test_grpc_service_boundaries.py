"""ProtoMoltService at its input boundary: bytes that are not the request message, Struct values
JSON cannot hold, answers that do not fit the response, and callers without the token.
Nothing answers UNKNOWN or ``Exception deserializing request!``."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import json_format

from protomolt_jobs.host.grpc_service import RPCS, SERVICE_NAME, ProtoMoltGrpcServer
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.node import stub_catalog


def _raw_call(channel, rpc: str, payload: bytes, **kw):
    _, _, resp_cls = RPCS[rpc]
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=lambda b: b,
        response_deserializer=resp_cls.FromString,
    )
    return stub(payload, timeout=10, **kw)


def _error(channel, rpc: str, payload: bytes, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _raw_call(channel, rpc, payload, **kw)
    return info.value


@pytest.fixture
def served():
    catalog, actions = stub_catalog()
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=4).start()
    channel = grpc.insecure_channel(srv.target)
    yield srv, channel, actions
    channel.close()
    srv.close()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _nested_struct(depth: int) -> bytes:
    """A ``Struct`` ``{"a": {"a": ...}}`` ``depth`` levels deep, encoded by hand (the Python
    runtime refuses to build one past its recursion limit)."""
    struct = b""
    for _ in range(depth):
        value = _field(5, struct)  # Value.struct_value
        struct = _field(1, _field(1, b"a") + _field(2, value))  # Struct.fields entry
    return struct


MALFORMED = {
    "garbage": b"\xff\xff\xff",
    "truncated field": b"\x0a\x10abc",
    "invalid utf-8 in a string": b"\x0a\x02\xed\xa0",
    "struct past the nesting limit": _field(3, _nested_struct(150)),
}


@pytest.mark.parametrize("payload", list(MALFORMED.values()), ids=list(MALFORMED))
def test_bytes_that_are_not_the_request_are_invalid_argument(served, payload):
    _, channel, actions = served
    err = _error(channel, "SubmitWorkflow", payload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(
        "invalid-input: the request is not a valid ai.pipestream.proto.service.v1."
        "SubmitWorkflowRequest message"
    )
    assert dict(err.trailing_metadata())["protomolt-error"] == "invalid-input"
    assert actions["submit-workflow"].calls == []


def test_the_field_numbers_of_the_hand_built_struct_are_right(served):
    _, channel, actions = served
    _raw_call(channel, "SubmitWorkflow", _field(3, _nested_struct(3)))
    assert actions["submit-workflow"].calls == [{"input": {"a": {"a": {"a": {}}}}}]


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_in_a_struct_is_invalid_argument_naming_the_field(served, number):
    _, channel, actions = served
    request = pb.SubmitWorkflowRequest(workflow_name="wf")
    request.input.update({"ok": 1, "deep": {"n": number}})
    err = _error(channel, "SubmitWorkflow", request.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("invalid-input: field 'input' cannot be read as JSON")
    trailers = dict(err.trailing_metadata())
    assert trailers["protomolt-error"] == "invalid-input"
    assert json.loads(trailers["protomolt-error-details-bin"]) == {"field": "input"}
    assert actions["submit-workflow"].calls == []


def test_an_answer_that_cannot_convert_is_a_clean_internal(served):
    _, channel, actions = served
    actions["get-job"].execute = lambda _input: {
        "ok": True,
        "job": {"jobId": "j", "status": "COMPLETED", "input": {"n": 10**400}},
    }
    err = _error(channel, "GetJob", pb.GetJobRequest(job_id="j").SerializeToString())
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == (
        "internal-error: Result of 'get-job' does not parse as "
        "ai.pipestream.proto.service.v1.GetJobResponse"
    )
    assert dict(err.trailing_metadata())["protomolt-error"] == "internal-error"


def test_a_failure_outside_the_verb_is_internal_never_unknown(served, monkeypatch):
    _, channel, _ = served

    def explode(*_args, **_kwargs):
        raise RuntimeError("secret stack detail")

    monkeypatch.setattr(json_format, "MessageToDict", explode)
    err = _error(channel, "GetJob", pb.GetJobRequest(job_id="j").SerializeToString())
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == "internal-error: GetJob failed"


class TestToken:
    @pytest.fixture
    def guarded(self):
        catalog, actions = stub_catalog()
        srv = ProtoMoltGrpcServer(catalog, port=0, api_token="s3cret", max_workers=4).start()
        channel = grpc.insecure_channel(srv.target)
        yield channel, actions
        channel.close()
        srv.close()

    @pytest.mark.parametrize("payload", list(MALFORMED.values()), ids=list(MALFORMED))
    def test_malformed_bytes_without_the_token_are_unauthenticated(self, guarded, payload):
        channel, actions = guarded
        err = _error(channel, "GetJob", payload)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        err = _error(channel, "GetJob", payload, metadata=(("api_token", "wrong"),))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert actions["get-job"].calls == []

    def test_malformed_bytes_with_the_token_are_invalid_argument(self, guarded):
        channel, _ = guarded
        err = _error(channel, "GetJob", b"\xff\xff\xff", metadata=(("api_token", "s3cret"),))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
