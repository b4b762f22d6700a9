"""Wire interop: our bytes decode with a descriptor built from the upstream field layout, and back.

The upstream layout is written out here by hand with descriptor_pb2 (numbers, types, enum
values from reference/upstream-jobs.md section 1), not derived from our .proto file, so a
renumbered or retyped field in jobs.proto fails these tests.
"""

from __future__ import annotations

import uuid

import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,
    unknown_fields,
)

from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, WorkflowRunRequest
from tests.support.upstream import (
    UPSTREAM_EVENT,
    UPSTREAM_REQUEST,
    UPSTREAM_TYPES,
    F,
    message_proto,
    upstream_classes,
)


@pytest.fixture(scope="module")
def upstream():
    """Message classes for the hand-built upstream layout, in their own pool."""
    return upstream_classes()


def _full_event(type_: int) -> WorkflowRunEvent:
    e = WorkflowRunEvent(
        event_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        workflow_name="parse-document",
        type=type_,
        step="fetch ü",
        attempt=7,
        verdict="3 steps, output acme.v1.Ticket",
        error="gRPC UNAVAILABLE from inprocess:parse: down",
        occurred_at=timestamp_pb2.Timestamp(seconds=1_767_225_600, nanos=123_456_789),
    )
    e.detail.update({"status": "COMPLETED", "n": 2, "nested": {"ok": True}})
    return e


def _field_values(msg) -> dict:
    out = {}
    for name, *_ in (
        UPSTREAM_EVENT if "event_id" in msg.DESCRIPTOR.fields_by_name else UPSTREAM_REQUEST
    ):
        value = getattr(msg, name)
        out[name] = (
            value.SerializeToString(deterministic=True)
            if hasattr(value, "SerializeToString")
            else value
        )
    return out


def test_our_field_layout_matches_upstream():
    for ours, spec in ((WorkflowRunEvent, UPSTREAM_EVENT), (WorkflowRunRequest, UPSTREAM_REQUEST)):
        proto = descriptor_pb2.DescriptorProto()
        ours.DESCRIPTOR.CopyToProto(proto)
        got = [
            (
                f.name,
                f.number,
                f.type,
                f.type_name.replace(".ai.pipestream.proto.jobs.v1.", ".up.jobs.v1.") or None,
            )
            for f in proto.field
        ]
        assert got == spec
        assert all(f.label == F.LABEL_OPTIONAL and not f.proto3_optional for f in proto.field)


@pytest.mark.parametrize("type_", [n for _, n in UPSTREAM_TYPES])
def test_event_bytes_decode_with_the_upstream_layout(upstream, type_):
    up_event, _ = upstream
    ours = _full_event(type_)
    theirs = up_event.FromString(ours.SerializeToString())
    assert _field_values(theirs) == _field_values(ours)
    assert up_event.DESCRIPTOR.enum_types_by_name["Type"].values_by_number[theirs.type].name == (
        EventType.Name(type_)
    )
    assert len(unknown_fields.UnknownFieldSet(theirs)) == 0
    # Nothing was left unknown: re-serializing gives the same bytes.
    assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(
        deterministic=True
    )


def test_upstream_event_bytes_decode_with_ours(upstream):
    up_event, _ = upstream
    theirs = up_event(
        event_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        workflow_name="wf",
        type=5,
        step="s",
        attempt=3,
        error="boom",
    )
    # The upstream pool has its own Timestamp class: set it field by field.
    theirs.occurred_at.seconds = 42
    theirs.occurred_at.nanos = 1
    theirs.detail.update({"status": "FAILED"})
    ours = WorkflowRunEvent.FromString(theirs.SerializeToString())
    assert _field_values(ours) == _field_values(theirs)
    assert ours.type == EventType.TYPE_FAILED
    assert ours.occurred_at.ToNanoseconds() == 42_000_000_001
    assert dict(ours.detail) == {"status": "FAILED"}


def test_request_bytes_round_trip_both_ways(upstream):
    _, up_request = upstream
    ours = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="parse-document")
    ours.input.update({"text": "hello", "pages": [1, 2], "meta": {"lang": "en"}})
    theirs = up_request.FromString(ours.SerializeToString())
    assert _field_values(theirs) == _field_values(ours)
    back = WorkflowRunRequest.FromString(theirs.SerializeToString())
    assert back == ours
    assert back.input["meta"]["lang"] == "en"


def test_a_renumbered_field_would_be_caught(upstream):
    # Guard that the comparison can fail: a message with job_id at another number
    # decodes into an unknown field, not into job_id.
    up_event, _ = upstream
    proto = descriptor_pb2.FileDescriptorProto(name="skew.proto", package="skew", syntax="proto3")
    proto.message_type.append(message_proto("E", [("job_id", 12, F.TYPE_STRING, None)]))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    skewed = message_factory.GetMessageClass(pool.FindMessageTypeByName("skew.E"))(job_id="abc")
    decoded = up_event.FromString(skewed.SerializeToString())
    assert decoded.job_id == ""
    assert len(unknown_fields.UnknownFieldSet(decoded)) == 1
