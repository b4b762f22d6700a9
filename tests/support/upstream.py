"""Upstream (Java ProtoMolt) facts for interop tests, written here independently of our code.

- :func:`upstream_classes`: message classes for ``WorkflowRunEvent`` / ``WorkflowRunRequest``
  built by hand from upstream's field layout (reference/upstream-jobs.md section 1) in a pool
  of their own, so our generated classes are not what decodes our bytes.
- :func:`confluent_deserialize`: what a Confluent-framed protobuf deserializer does with a
  record value (magic byte 0, 4-byte big-endian schema id, zigzag-varint message-index array,
  protobuf), written from the documented wire format, not from ``protomolt_jobs.kafka.framing``.
"""

from __future__ import annotations

import functools

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    struct_pb2,
    timestamp_pb2,
)

F = descriptor_pb2.FieldDescriptorProto

# (name, number, type, type_name) exactly as upstream declares them.
UPSTREAM_EVENT = [
    ("event_id", 1, F.TYPE_STRING, None),
    ("job_id", 2, F.TYPE_STRING, None),
    ("workflow_name", 3, F.TYPE_STRING, None),
    ("type", 4, F.TYPE_ENUM, ".up.jobs.v1.WorkflowRunEvent.Type"),
    ("step", 5, F.TYPE_STRING, None),
    ("attempt", 6, F.TYPE_INT32, None),
    ("verdict", 7, F.TYPE_STRING, None),
    ("error", 8, F.TYPE_STRING, None),
    ("detail", 9, F.TYPE_MESSAGE, ".google.protobuf.Struct"),
    ("occurred_at", 10, F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
]
UPSTREAM_TYPES = [
    ("TYPE_UNSPECIFIED", 0),
    ("TYPE_ACCEPTED", 1),
    ("TYPE_STEP_CHECKPOINT", 2),
    ("TYPE_WAITING", 3),
    ("TYPE_COMPLETED", 4),
    ("TYPE_FAILED", 5),
    ("TYPE_DEAD", 6),
]
UPSTREAM_REQUEST = [
    ("job_id", 1, F.TYPE_STRING, None),
    ("workflow_name", 2, F.TYPE_STRING, None),
    ("input", 3, F.TYPE_MESSAGE, ".google.protobuf.Struct"),
]


def message_proto(name: str, fields) -> descriptor_pb2.DescriptorProto:
    m = descriptor_pb2.DescriptorProto(name=name)
    for fname, number, ftype, type_name in fields:
        f = m.field.add(name=fname, number=number, type=ftype, label=F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
    return m


@functools.cache
def upstream_classes() -> tuple[type, type]:
    """``(WorkflowRunEvent, WorkflowRunRequest)`` of the hand-built upstream layout.

    A different package name (``up.jobs.v1``) keeps it apart from ours: only numbers, types and
    the message order in the file (event 0, request 1) must agree.
    """
    file = descriptor_pb2.FileDescriptorProto(
        name="up/jobs/v1/jobs.proto",
        package="up.jobs.v1",
        syntax="proto3",
        dependency=["google/protobuf/struct.proto", "google/protobuf/timestamp.proto"],
    )
    event = message_proto("WorkflowRunEvent", UPSTREAM_EVENT)
    enum = event.enum_type.add(name="Type")
    for name, number in UPSTREAM_TYPES:
        enum.value.add(name=name, number=number)
    file.message_type.append(event)
    file.message_type.append(message_proto("WorkflowRunRequest", UPSTREAM_REQUEST))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("up.jobs.v1.WorkflowRunEvent")),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("up.jobs.v1.WorkflowRunRequest")
        ),
    )


class NotConfluentWireFormat(ValueError):
    """What upstream's deserializer says about a value without the framing."""


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def confluent_deserialize(value: bytes) -> tuple[int, list[int], object]:
    """Decode a framed value the way a Confluent protobuf deserializer does, with upstream's
    descriptors: the index path picks the message in the file (``[0]`` event, ``[1]`` request).

    :returns: ``(schema_id, index_path, message)``.
    :raises NotConfluentWireFormat: when the magic byte is missing.
    """
    if len(value) < 5 or value[0] != 0:
        raise NotConfluentWireFormat("Not Confluent wire format")
    schema_id = int.from_bytes(value[1:5], "big", signed=False)
    raw, pos = _uvarint(value, 5)
    count = (raw >> 1) ^ -(raw & 1)
    if count == 0:
        path = [0]
    else:
        path = []
        for _ in range(count):
            raw, pos = _uvarint(value, pos)
            path.append((raw >> 1) ^ -(raw & 1))
    event_cls, request_cls = upstream_classes()
    cls = {(0,): event_cls, (1,): request_cls}[tuple(path)]
    return schema_id, path, cls.FromString(value[pos:])


def confluent_serialize(message, *, schema_id: int = 0, index: int) -> bytes:
    """Frame ``message`` as upstream's serializer does for top-level message ``index`` of its
    file: ``[0]`` is the single byte 00, ``[n]`` is ``02 <zigzag n>`` (one-byte varints)."""
    path = b"\x00" if index == 0 else bytes([2, index << 1])
    return b"\x00" + schema_id.to_bytes(4, "big") + path + message.SerializeToString()


#: Upstream's ProtoMoltService package and the messages a jobs client uses, from
#: reference/upstream-host.md section 3.7 (names, numbers, types), built by hand.
UPSTREAM_SERVICE_PACKAGE = "ai.pipestream.proto.grpc.service.v1"
_S = ".google.protobuf.Struct"
_P = f".{UPSTREAM_SERVICE_PACKAGE}"
UPSTREAM_SERVICE_MESSAGES = {
    # The typed inline workflow, as much of it as the tests send.
    "SchemaSource": [("descriptor_set_base64", 4, F.TYPE_STRING, None)],
    "WorkflowStep": [
        ("name", 1, F.TYPE_STRING, None),
        ("target", 2, F.TYPE_STRING, None),
        ("method", 4, F.TYPE_STRING, None),
        ("rules", 6, F.TYPE_STRING, None),
        ("completion", 10, F.TYPE_STRING, None),
    ],
    "WorkflowOutput": [("type", 1, F.TYPE_STRING, None), ("rules", 2, F.TYPE_STRING, None)],
    "CompiledWorkflow": [
        ("name", 1, F.TYPE_STRING, None),
        ("schema", 2, F.TYPE_MESSAGE, f"{_P}.SchemaSource"),
        ("input_type", 3, F.TYPE_STRING, None),
        ("steps", 5, F.TYPE_MESSAGE, f"{_P}.WorkflowStep"),
        ("output", 6, F.TYPE_MESSAGE, f"{_P}.WorkflowOutput"),
    ],
    "CheckWorkflowRequest": [("workflow", 1, F.TYPE_MESSAGE, f"{_P}.CompiledWorkflow")],
    "WorkflowFinding": [
        ("step", 1, F.TYPE_STRING, None),
        ("kind", 2, F.TYPE_STRING, None),
        ("error", 3, F.TYPE_STRING, None),
    ],
    "CheckWorkflowResponse": [
        ("ok", 1, F.TYPE_BOOL, None),
        ("findings", 2, F.TYPE_MESSAGE, f"{_P}.WorkflowFinding"),
    ],
    "SubmitWorkflowRequest": [
        ("workflow", 1, F.TYPE_MESSAGE, f"{_P}.CompiledWorkflow"),
        ("workflow_name", 2, F.TYPE_STRING, None),
        ("input", 3, F.TYPE_MESSAGE, _S),
        ("job_id", 4, F.TYPE_STRING, None),
    ],
    "SubmitWorkflowResponse": [
        ("ok", 1, F.TYPE_BOOL, None),
        ("job_id", 2, F.TYPE_STRING, None),
        ("status", 3, F.TYPE_STRING, None),
        ("error", 4, F.TYPE_STRING, None),
    ],
    "WorkflowRunCheckpoint": [
        ("name", 1, F.TYPE_STRING, None),
        ("skipped", 2, F.TYPE_BOOL, None),
        ("response", 3, F.TYPE_MESSAGE, _S),
    ],
    "WorkflowRun": [
        ("job_id", 1, F.TYPE_STRING, None),
        ("workflow_name", 2, F.TYPE_STRING, None),
        ("status", 3, F.TYPE_STRING, None),
        ("attempt", 4, F.TYPE_INT32, None),
        ("outstanding_step", 5, F.TYPE_STRING, None),
        ("input", 6, F.TYPE_MESSAGE, _S),
        ("checkpoints", 7, F.TYPE_MESSAGE, f"{_P}.WorkflowRunCheckpoint"),
        ("result", 8, F.TYPE_MESSAGE, _S),
        ("error", 9, F.TYPE_STRING, None),
        ("created_at", 10, F.TYPE_STRING, None),
        ("updated_at", 11, F.TYPE_STRING, None),
        ("completed_at", 12, F.TYPE_STRING, None),
    ],
    "GetJobRequest": [("job_id", 1, F.TYPE_STRING, None)],
    "GetJobResponse": [
        ("ok", 1, F.TYPE_BOOL, None),
        ("job", 2, F.TYPE_MESSAGE, f"{_P}.WorkflowRun"),
        ("error", 3, F.TYPE_STRING, None),
    ],
}


_REPEATED = {
    ("WorkflowRun", "checkpoints"),
    ("CompiledWorkflow", "steps"),
    ("WorkflowStep", "rules"),
    ("WorkflowOutput", "rules"),
    ("CheckWorkflowResponse", "findings"),
}


@functools.cache
def upstream_service_classes() -> dict[str, type]:
    """Message classes of upstream's service package (see :data:`UPSTREAM_SERVICE_MESSAGES`),
    in a pool of their own; ``checkpoints`` is repeated."""
    file = descriptor_pb2.FileDescriptorProto(
        name="upstream/protomolt_service.proto",
        package=UPSTREAM_SERVICE_PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/struct.proto"],
    )
    for name, fields in UPSTREAM_SERVICE_MESSAGES.items():
        m = message_proto(name, fields)
        for f in m.field:
            if (name, f.name) in _REPEATED:
                f.label = F.LABEL_REPEATED
        file.message_type.append(m)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{UPSTREAM_SERVICE_PACKAGE}.{name}")
        )
        for name in UPSTREAM_SERVICE_MESSAGES
    }
