"""The wire contract: ``WorkflowRunEvent`` (events topic, outbox payload) and
``WorkflowRunRequest`` (request topic), their descriptor set, and their declared rules.

The messages are generated from ``proto/ai/pipestream/proto/jobs/v1/jobs.proto`` with the
upstream field numbers, types and enum values, so the bytes interchange with the Java ProtoMolt.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1 import jobs_pb2
from protomolt_jobs.workflow.validation import Violation, validate_message

__all__ = [
    "EventType",
    "Violation",
    "WorkflowRunEvent",
    "WorkflowRunRequest",
    "descriptor_set",
    "validate_event",
    "validate_request",
]

WorkflowRunEvent = jobs_pb2.WorkflowRunEvent
WorkflowRunRequest = jobs_pb2.WorkflowRunRequest

#: ``WorkflowRunEvent.Type``: ``TYPE_UNSPECIFIED``=0, ``TYPE_ACCEPTED``=1,
#: ``TYPE_STEP_CHECKPOINT``=2, ``TYPE_WAITING``=3, ``TYPE_COMPLETED``=4, ``TYPE_FAILED``=5,
#: ``TYPE_DEAD``=6 (``EventType.TYPE_DEAD``, ``EventType.Name(6)``, ``EventType.Value(...)``).
EventType = jobs_pb2.WorkflowRunEvent.Type

#: The file that declares both messages.
JOBS_FILE = jobs_pb2.DESCRIPTOR


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Return jobs.proto and every file it imports, transitively, dependencies first.

    :returns: a fresh ``FileDescriptorSet`` (safe to mutate); the last file is
        ``ai/pipestream/proto/jobs/v1/jobs.proto``.
    """
    ordered: list[FileDescriptor] = []
    seen: set[str] = set()

    def visit(f: FileDescriptor) -> None:
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependencies:
            visit(dep)
        ordered.append(f)

    visit(JOBS_FILE)
    fds = descriptor_pb2.FileDescriptorSet()
    for f in ordered:
        f.CopyToProto(fds.file.add())
    return fds


def validate_event(msg: WorkflowRunEvent) -> list[Violation]:
    """Check a ``WorkflowRunEvent`` against its declared rules.

    :returns: the violations (empty when valid), e.g.
        ``Violation("", "completed-carries-verdict", "a COMPLETED event must carry ...")``.
    :raises TypeError: when ``msg`` is not a ``WorkflowRunEvent``.
    """
    _expect(msg, WorkflowRunEvent)
    return validate_message(msg)


def validate_request(msg: WorkflowRunRequest) -> list[Violation]:
    """Check a ``WorkflowRunRequest`` against its declared rules.

    :returns: the violations (empty when valid).
    :raises TypeError: when ``msg`` is not a ``WorkflowRunRequest``.
    """
    _expect(msg, WorkflowRunRequest)
    return validate_message(msg)


def _expect(msg: object, cls: Any) -> None:
    # Compare full names, not classes: a message parsed through another pool is still valid.
    name = getattr(getattr(msg, "DESCRIPTOR", None), "full_name", None)
    if name != cls.DESCRIPTOR.full_name:
        raise TypeError(f"expected {cls.DESCRIPTOR.full_name}, got {type(msg).__name__}")
