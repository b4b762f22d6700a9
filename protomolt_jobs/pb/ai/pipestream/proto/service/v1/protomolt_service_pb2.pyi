from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitWorkflowRequest(_message.Message):
    __slots__ = ("workflow", "workflow_name", "input", "job_id")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    workflow: _struct_pb2.Struct
    workflow_name: str
    input: _struct_pb2.Struct
    job_id: str
    def __init__(self, workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., workflow_name: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class SubmitWorkflowResponse(_message.Message):
    __slots__ = ("ok", "job_id", "status", "error", "failed_step")
    OK_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_STEP_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    job_id: str
    status: str
    error: str
    failed_step: str
    def __init__(self, ok: _Optional[bool] = ..., job_id: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., failed_step: _Optional[str] = ...) -> None: ...

class WorkflowRunCheckpoint(_message.Message):
    __slots__ = ("name", "skipped", "response")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    name: str
    skipped: bool
    response: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., skipped: _Optional[bool] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class WorkflowRun(_message.Message):
    __slots__ = ("job_id", "workflow_name", "status", "attempt", "outstanding_step", "input", "checkpoints", "result", "error", "created_at", "updated_at", "completed_at", "verdict")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_STEP_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workflow_name: str
    status: str
    attempt: int
    outstanding_step: str
    input: _struct_pb2.Struct
    checkpoints: _containers.RepeatedCompositeFieldContainer[WorkflowRunCheckpoint]
    result: _struct_pb2.Struct
    error: str
    created_at: str
    updated_at: str
    completed_at: str
    verdict: str
    def __init__(self, job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., status: _Optional[str] = ..., attempt: _Optional[int] = ..., outstanding_step: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., checkpoints: _Optional[_Iterable[_Union[WorkflowRunCheckpoint, _Mapping]]] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., completed_at: _Optional[str] = ..., verdict: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("ok", "job", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    job: WorkflowRun
    error: str
    def __init__(self, ok: _Optional[bool] = ..., job: _Optional[_Union[WorkflowRun, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("status", "workflow_name", "limit", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: str
    workflow_name: str
    limit: int
    offset: int
    def __init__(self, status: _Optional[str] = ..., workflow_name: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("ok", "jobs", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    jobs: _containers.RepeatedCompositeFieldContainer[WorkflowRun]
    error: str
    def __init__(self, ok: _Optional[bool] = ..., jobs: _Optional[_Iterable[_Union[WorkflowRun, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class CompleteStepRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "response")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    response: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CompleteStepResponse(_message.Message):
    __slots__ = ("ok", "status", "error", "outstanding_step")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_STEP_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: str
    error: str
    outstanding_step: str
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., outstanding_step: _Optional[str] = ...) -> None: ...

class RunWorkflowRequest(_message.Message):
    __slots__ = ("workflow", "input", "workflow_name")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    workflow: _struct_pb2.Struct
    input: _struct_pb2.Struct
    workflow_name: str
    def __init__(self, workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., workflow_name: _Optional[str] = ...) -> None: ...

class WorkflowStepResult(_message.Message):
    __slots__ = ("name", "skipped")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    name: str
    skipped: bool
    def __init__(self, name: _Optional[str] = ..., skipped: _Optional[bool] = ...) -> None: ...

class RunWorkflowResponse(_message.Message):
    __slots__ = ("ok", "output_type", "output", "steps", "failed_step", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    FAILED_STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    output_type: str
    output: _struct_pb2.Struct
    steps: _containers.RepeatedCompositeFieldContainer[WorkflowStepResult]
    failed_step: str
    error: str
    def __init__(self, ok: _Optional[bool] = ..., output_type: _Optional[str] = ..., output: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[WorkflowStepResult, _Mapping]]] = ..., failed_step: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class CheckWorkflowRequest(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: _struct_pb2.Struct
    def __init__(self, workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class WorkflowFinding(_message.Message):
    __slots__ = ("step", "kind", "error")
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    step: str
    kind: str
    error: str
    def __init__(self, step: _Optional[str] = ..., kind: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class CheckWorkflowResponse(_message.Message):
    __slots__ = ("ok", "findings")
    OK_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    findings: _containers.RepeatedCompositeFieldContainer[WorkflowFinding]
    def __init__(self, ok: _Optional[bool] = ..., findings: _Optional[_Iterable[_Union[WorkflowFinding, _Mapping]]] = ...) -> None: ...
