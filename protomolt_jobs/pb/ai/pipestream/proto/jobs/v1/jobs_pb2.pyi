import datetime

from protomolt_jobs.pb.ai.pipestream.proto.meta.v1 import metadata_pb2 as _metadata_pb2
from protomolt_jobs.pb.ai.pipestream.proto.validate.v1 import validate_pb2 as _validate_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkflowRunEvent(_message.Message):
    __slots__ = ("event_id", "job_id", "workflow_name", "type", "step", "attempt", "verdict", "error", "detail", "occurred_at")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_ACCEPTED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_STEP_CHECKPOINT: _ClassVar[WorkflowRunEvent.Type]
        TYPE_WAITING: _ClassVar[WorkflowRunEvent.Type]
        TYPE_COMPLETED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_FAILED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_DEAD: _ClassVar[WorkflowRunEvent.Type]
        TYPE_CANCELLED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_PAUSED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_RESUMED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_REQUEUED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_CONTROL_REQUESTED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_RECOVERY_REQUIRED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_APPROVAL_DECIDED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_APPROVAL_ESCALATED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_YIELDED: _ClassVar[WorkflowRunEvent.Type]
    TYPE_UNSPECIFIED: WorkflowRunEvent.Type
    TYPE_ACCEPTED: WorkflowRunEvent.Type
    TYPE_STEP_CHECKPOINT: WorkflowRunEvent.Type
    TYPE_WAITING: WorkflowRunEvent.Type
    TYPE_COMPLETED: WorkflowRunEvent.Type
    TYPE_FAILED: WorkflowRunEvent.Type
    TYPE_DEAD: WorkflowRunEvent.Type
    TYPE_CANCELLED: WorkflowRunEvent.Type
    TYPE_PAUSED: WorkflowRunEvent.Type
    TYPE_RESUMED: WorkflowRunEvent.Type
    TYPE_REQUEUED: WorkflowRunEvent.Type
    TYPE_CONTROL_REQUESTED: WorkflowRunEvent.Type
    TYPE_RECOVERY_REQUIRED: WorkflowRunEvent.Type
    TYPE_APPROVAL_DECIDED: WorkflowRunEvent.Type
    TYPE_APPROVAL_ESCALATED: WorkflowRunEvent.Type
    TYPE_YIELDED: WorkflowRunEvent.Type
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    job_id: str
    workflow_name: str
    type: WorkflowRunEvent.Type
    step: str
    attempt: int
    verdict: str
    error: str
    detail: _struct_pb2.Struct
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, event_id: _Optional[str] = ..., job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., type: _Optional[_Union[WorkflowRunEvent.Type, str]] = ..., step: _Optional[str] = ..., attempt: _Optional[int] = ..., verdict: _Optional[str] = ..., error: _Optional[str] = ..., detail: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkflowRunRequest(_message.Message):
    __slots__ = ("job_id", "workflow_name", "input")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workflow_name: str
    input: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
