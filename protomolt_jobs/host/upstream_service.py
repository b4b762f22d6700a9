"""ProtoMoltService under upstream's name: the alias file and its message classes.

Upstream's ``protomolt_service.proto`` (package ``ai.pipestream.proto.grpc.service.v1``)
declares the inline workflow of ``SubmitWorkflowRequest``, ``RunWorkflowRequest`` and
``CheckWorkflowRequest`` (field 1, ``workflow``) as a typed ``CompiledWorkflow`` message, whose
canonical proto3 JSON is the workflow envelope; ours carries the same JSON as a
``google.protobuf.Struct``. Same JSON, different bytes. So the alias is our service file
re-packaged, with every request field ``workflow`` of type ``Struct`` retyped to
``CompiledWorkflow`` and the typed workflow messages declared (names, fields and numbers from
upstream's proto, reference/upstream-host.md section 4.2). A call under the alias parses its
bytes with these classes; printing the request as proto3 JSON gives the envelope our verbs take,
exactly as for our own name.
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb

__all__ = [
    "ALIAS_FILE_NAME",
    "UPSTREAM_PACKAGE",
    "UPSTREAM_SERVICE_NAME",
    "alias_classes",
    "alias_file",
]

UPSTREAM_PACKAGE = "ai.pipestream.proto.grpc.service.v1"
UPSTREAM_SERVICE_NAME = f"{UPSTREAM_PACKAGE}.ProtoMoltService"
#: The file that describes the alias (upstream's file path).
ALIAS_FILE_NAME = "ai/pipestream/proto/grpc/service/v1/protomolt_service.proto"

_F = descriptor_pb2.FieldDescriptorProto
_STRUCT = ".google.protobuf.Struct"
_S, _I, _B = _F.TYPE_STRING, _F.TYPE_INT32, _F.TYPE_BOOL
_MSG = _F.TYPE_MESSAGE
_REP = "repeated"
_MAP = "map"

#: Upstream's typed workflow messages: (name, [(field, number, type, type_name, label)]).
_WORKFLOW_MESSAGES: list[tuple[str, list[tuple[str, int, int, str | None, str | None]]]] = [
    (
        "SchemaSource",
        [
            ("type", 1, _S, None, None),
            ("sources", 2, _MSG, "SchemaSource.SourcesEntry", _MAP),
            ("root", 3, _S, None, None),
            ("descriptor_set_base64", 4, _S, None, None),
        ],
    ),
    (
        "CelRule",
        [
            ("filter", 1, _S, None, None),
            ("selector", 2, _S, None, None),
            ("target", 3, _S, None, None),
            ("fallback", 4, _S, None, _REP),
        ],
    ),
    (
        "StructuredStep",
        [
            ("target_type", 1, _S, None, None),
            ("model", 2, _S, None, None),
            ("max_attempts", 3, _I, None, None),
        ],
    ),
    (
        "WorkflowEdge",
        [
            ("sources", 1, _S, None, _REP),
            ("produce_type", 2, _S, None, None),
            ("rules", 3, _S, None, _REP),
            ("cel_rules", 4, _MSG, "CelRule", _REP),
            ("project_to", 5, _S, None, None),
            ("validate", 6, _B, None, None),
        ],
    ),
    (
        "WorkflowFanOut",
        [
            ("items", 1, _S, None, None),
            ("max_items", 2, _I, None, None),
            ("max_concurrency", 3, _I, None, None),
            ("failure_policy", 4, _S, None, None),
            ("collect_type", 5, _S, None, None),
            ("collect_into", 6, _S, None, None),
        ],
    ),
    (
        "WorkflowStep",
        [
            ("name", 1, _S, None, None),
            ("target", 2, _S, None, None),
            ("tls", 3, _B, None, None),
            ("method", 4, _S, None, None),
            ("when", 5, _S, None, None),
            ("rules", 6, _S, None, _REP),
            ("cel_rules", 7, _MSG, "CelRule", _REP),
            ("validate", 8, _B, None, None),
            ("deadline_ms", 9, _I, None, None),
            ("completion", 10, _S, None, None),
            ("structured", 11, _MSG, "StructuredStep", None),
            ("edge", 12, _MSG, "WorkflowEdge", None),
            ("fan_out", 13, _MSG, "WorkflowFanOut", None),
        ],
    ),
    (
        "WorkflowOutput",
        [
            ("type", 1, _S, None, None),
            ("rules", 2, _S, None, _REP),
            ("cel_rules", 3, _MSG, "CelRule", _REP),
        ],
    ),
    (
        "CompiledWorkflow",
        [
            ("name", 1, _S, None, None),
            ("schema", 2, _MSG, "SchemaSource", None),
            ("input_type", 3, _S, None, None),
            ("deadline_ms", 4, _I, None, None),
            ("steps", 5, _MSG, "WorkflowStep", _REP),
            ("output", 6, _MSG, "WorkflowOutput", None),
        ],
    ),
]


def _typed_workflow_messages() -> list[descriptor_pb2.DescriptorProto]:
    out = []
    for name, fields in _WORKFLOW_MESSAGES:
        m = descriptor_pb2.DescriptorProto(name=name)
        for fname, number, ftype, type_name, label in fields:
            f = m.field.add(name=fname, number=number, type=ftype)
            f.label = _F.LABEL_REPEATED if label in (_REP, _MAP) else _F.LABEL_OPTIONAL
            if type_name:
                f.type_name = f".{UPSTREAM_PACKAGE}.{type_name}"
        if name == "SchemaSource":  # map<string, string> sources = 2
            entry = m.nested_type.add(name="SourcesEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_S, label=_F.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=_S, label=_F.LABEL_OPTIONAL)
        out.append(m)
    return out


def alias_file() -> descriptor_pb2.FileDescriptorProto:
    """Our service file re-packaged under upstream's package, with request ``workflow``
    fields typed ``CompiledWorkflow`` as upstream declares them (see the module doc)."""
    fdp = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fdp)
    ours = f".{fdp.package}."
    fdp.name = ALIAS_FILE_NAME
    fdp.package = UPSTREAM_PACKAGE

    def retarget(name: str) -> str:
        return f".{UPSTREAM_PACKAGE}.{name[len(ours) :]}" if name.startswith(ours) else name

    def visit(message: descriptor_pb2.DescriptorProto) -> None:
        for f in message.field:
            if f.type_name:
                f.type_name = retarget(f.type_name)
            if message.name.endswith("Request") and f.name == "workflow" and f.type_name == _STRUCT:
                f.type_name = f".{UPSTREAM_PACKAGE}.CompiledWorkflow"
        for nested in message.nested_type:
            visit(nested)

    for message in fdp.message_type:
        visit(message)
    for service in fdp.service:
        for method in service.method:
            method.input_type = retarget(method.input_type)
            method.output_type = retarget(method.output_type)
    declared = {m.name for m in fdp.message_type}
    fdp.message_type.extend(m for m in _typed_workflow_messages() if m.name not in declared)
    return fdp


@functools.cache
def alias_classes() -> dict[str, type]:
    """Message classes of the alias file by simple name, from a pool of their own."""
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import struct_pb2

    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    fdp = alias_file()
    pool.Add(fdp)
    return {
        m.name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{UPSTREAM_PACKAGE}.{m.name}")
        )
        for m in fdp.message_type
    }
