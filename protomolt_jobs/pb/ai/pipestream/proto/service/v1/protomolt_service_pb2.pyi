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
    __slots__ = ("job_id", "workflow_name", "status", "attempt", "outstanding_step", "input", "checkpoints", "result", "error", "created_at", "updated_at", "completed_at", "verdict", "max_attempts", "run_after", "control", "report", "phase", "progress")
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
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RUN_AFTER_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
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
    max_attempts: int
    run_after: str
    control: _struct_pb2.Struct
    report: _struct_pb2.Struct
    phase: str
    progress: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., status: _Optional[str] = ..., attempt: _Optional[int] = ..., outstanding_step: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., checkpoints: _Optional[_Iterable[_Union[WorkflowRunCheckpoint, _Mapping]]] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., completed_at: _Optional[str] = ..., verdict: _Optional[str] = ..., max_attempts: _Optional[int] = ..., run_after: _Optional[str] = ..., control: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., report: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., phase: _Optional[str] = ..., progress: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

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

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job_id", "at", "reason", "zone", "tz", "day")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    TZ_FIELD_NUMBER: _ClassVar[int]
    DAY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    at: str
    reason: str
    zone: str
    tz: str
    day: str
    def __init__(self, job_id: _Optional[str] = ..., at: _Optional[str] = ..., reason: _Optional[str] = ..., zone: _Optional[str] = ..., tz: _Optional[str] = ..., day: _Optional[str] = ...) -> None: ...

class RetryStepRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "reason", "scope", "new_idempotency_key")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    NEW_IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    reason: str
    scope: str
    new_idempotency_key: bool
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., reason: _Optional[str] = ..., scope: _Optional[str] = ..., new_idempotency_key: _Optional[bool] = ...) -> None: ...

class ReconcileStepRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "outcome", "response", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    outcome: str
    response: _struct_pb2.Struct
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., outcome: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class MigrateCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "action", "response", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    action: str
    response: _struct_pb2.Struct
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., action: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class RequeueJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class JobControlResponse(_message.Message):
    __slots__ = ("ok", "status", "error", "requested", "message", "outstanding_step", "run_after", "withdrawn", "dropped", "scope", "rerun_if_changed", "kept_effects", "progress")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_STEP_FIELD_NUMBER: _ClassVar[int]
    RUN_AFTER_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RERUN_IF_CHANGED_FIELD_NUMBER: _ClassVar[int]
    KEPT_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: str
    error: str
    requested: str
    message: str
    outstanding_step: str
    run_after: str
    withdrawn: str
    dropped: _containers.RepeatedScalarFieldContainer[str]
    scope: str
    rerun_if_changed: _containers.RepeatedScalarFieldContainer[str]
    kept_effects: _containers.RepeatedScalarFieldContainer[str]
    progress: str
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., requested: _Optional[str] = ..., message: _Optional[str] = ..., outstanding_step: _Optional[str] = ..., run_after: _Optional[str] = ..., withdrawn: _Optional[str] = ..., dropped: _Optional[_Iterable[str]] = ..., scope: _Optional[str] = ..., rerun_if_changed: _Optional[_Iterable[str]] = ..., kept_effects: _Optional[_Iterable[str]] = ..., progress: _Optional[str] = ...) -> None: ...

class JobHistoryRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WorkflowRunTransition(_message.Message):
    __slots__ = ("seq", "kind", "actor", "prev_status", "new_status", "attempt", "step", "reason", "at")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    PREV_STATUS_FIELD_NUMBER: _ClassVar[int]
    NEW_STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: str
    actor: str
    prev_status: str
    new_status: str
    attempt: int
    step: str
    reason: str
    at: str
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[str] = ..., actor: _Optional[str] = ..., prev_status: _Optional[str] = ..., new_status: _Optional[str] = ..., attempt: _Optional[int] = ..., step: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[str] = ...) -> None: ...

class JobHistoryResponse(_message.Message):
    __slots__ = ("ok", "job_id", "transitions", "integrity", "first_bad_seq", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    job_id: str
    transitions: _containers.RepeatedCompositeFieldContainer[WorkflowRunTransition]
    integrity: str
    first_bad_seq: int
    error: str
    def __init__(self, ok: _Optional[bool] = ..., job_id: _Optional[str] = ..., transitions: _Optional[_Iterable[_Union[WorkflowRunTransition, _Mapping]]] = ..., integrity: _Optional[str] = ..., first_bad_seq: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ApproveStepRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "decision", "comment")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    decision: str
    comment: str
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., decision: _Optional[str] = ..., comment: _Optional[str] = ...) -> None: ...

class ApproveStepResponse(_message.Message):
    __slots__ = ("ok", "decided", "decision", "tally", "needed", "error", "status", "message")
    class TallyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OK_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TALLY_FIELD_NUMBER: _ClassVar[int]
    NEEDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    decided: bool
    decision: str
    tally: _containers.ScalarMap[str, int]
    needed: int
    error: str
    status: str
    message: str
    def __init__(self, ok: _Optional[bool] = ..., decided: _Optional[bool] = ..., decision: _Optional[str] = ..., tally: _Optional[_Mapping[str, int]] = ..., needed: _Optional[int] = ..., error: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ExtendLoopRequest(_message.Message):
    __slots__ = ("job_id", "step", "by", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: str
    by: int
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[str] = ..., by: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ExtendLoopResponse(_message.Message):
    __slots__ = ("ok", "status", "error", "step", "max", "extended_by", "requeued")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: str
    error: str
    step: str
    max: int
    extended_by: int
    requeued: bool
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., step: _Optional[str] = ..., max: _Optional[int] = ..., extended_by: _Optional[int] = ..., requeued: _Optional[bool] = ...) -> None: ...

class ReplayCheckRequest(_message.Message):
    __slots__ = ("workflow_name", "candidate", "limit", "finished")
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    candidate: _struct_pb2.Struct
    limit: int
    finished: int
    def __init__(self, workflow_name: _Optional[str] = ..., candidate: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., limit: _Optional[int] = ..., finished: _Optional[int] = ...) -> None: ...

class ReplayExamined(_message.Message):
    __slots__ = ("live", "finished")
    LIVE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    live: int
    finished: int
    def __init__(self, live: _Optional[int] = ..., finished: _Optional[int] = ...) -> None: ...

class ReplayDrift(_message.Message):
    __slots__ = ("job_id", "status", "outstanding_step", "stored_version", "checkpoint", "step", "rule", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_STEP_FIELD_NUMBER: _ClassVar[int]
    STORED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: str
    outstanding_step: str
    stored_version: bool
    checkpoint: int
    step: str
    rule: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[str] = ..., outstanding_step: _Optional[str] = ..., stored_version: _Optional[bool] = ..., checkpoint: _Optional[int] = ..., step: _Optional[str] = ..., rule: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReplayCheckResponse(_message.Message):
    __slots__ = ("ok", "workflow_name", "examined", "more", "drifting", "unreadable", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    EXAMINED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    DRIFTING_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    workflow_name: str
    examined: ReplayExamined
    more: bool
    drifting: _containers.RepeatedCompositeFieldContainer[ReplayDrift]
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, ok: _Optional[bool] = ..., workflow_name: _Optional[str] = ..., examined: _Optional[_Union[ReplayExamined, _Mapping]] = ..., more: _Optional[bool] = ..., drifting: _Optional[_Iterable[_Union[ReplayDrift, _Mapping]]] = ..., unreadable: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class TestWorkflowRequest(_message.Message):
    __slots__ = ("workflow", "workflow_name", "tests")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    workflow: _struct_pb2.Struct
    workflow_name: str
    tests: _struct_pb2.ListValue
    def __init__(self, workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., workflow_name: _Optional[str] = ..., tests: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ...) -> None: ...

class TestWorkflowResponse(_message.Message):
    __slots__ = ("ok", "passed", "failed", "cases", "coverage", "error", "failed_step")
    OK_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CASES_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_STEP_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    passed: int
    failed: int
    cases: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    coverage: _struct_pb2.Struct
    error: str
    failed_step: str
    def __init__(self, ok: _Optional[bool] = ..., passed: _Optional[int] = ..., failed: _Optional[int] = ..., cases: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., coverage: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ..., failed_step: _Optional[str] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("workflow_name", "version")
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    version: int
    def __init__(self, workflow_name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetWorkflowResponse(_message.Message):
    __slots__ = ("ok", "workflow_name", "version", "latest_version", "current", "definition", "stored_at", "stored_by", "retention", "last_test", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_FIELD_NUMBER: _ClassVar[int]
    STORED_BY_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    LAST_TEST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    workflow_name: str
    version: int
    latest_version: int
    current: bool
    definition: _struct_pb2.Struct
    stored_at: str
    stored_by: str
    retention: _struct_pb2.Struct
    last_test: _struct_pb2.Struct
    error: str
    def __init__(self, ok: _Optional[bool] = ..., workflow_name: _Optional[str] = ..., version: _Optional[int] = ..., latest_version: _Optional[int] = ..., current: _Optional[bool] = ..., definition: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., stored_at: _Optional[str] = ..., stored_by: _Optional[str] = ..., retention: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., last_test: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("token", "percent", "details", "state")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    token: str
    percent: float
    details: str
    state: _struct_pb2.Value
    def __init__(self, token: _Optional[str] = ..., percent: _Optional[float] = ..., details: _Optional[str] = ..., state: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: str
    def __init__(self, answer: _Optional[str] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("ok", "job_id", "explain", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    job_id: str
    explain: _struct_pb2.Struct
    error: str
    def __init__(self, ok: _Optional[bool] = ..., job_id: _Optional[str] = ..., explain: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class SupplyInputRequest(_message.Message):
    __slots__ = ("job_id", "path", "value", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    path: str
    value: _struct_pb2.Value
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., path: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class SupplyInputResponse(_message.Message):
    __slots__ = ("ok", "status", "error", "message", "step", "path", "revision", "old_sha256", "new_sha256", "owner", "by_owner")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    OLD_SHA256_FIELD_NUMBER: _ClassVar[int]
    NEW_SHA256_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    BY_OWNER_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: str
    error: str
    message: str
    step: str
    path: str
    revision: int
    old_sha256: str
    new_sha256: str
    owner: str
    by_owner: bool
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., message: _Optional[str] = ..., step: _Optional[str] = ..., path: _Optional[str] = ..., revision: _Optional[int] = ..., old_sha256: _Optional[str] = ..., new_sha256: _Optional[str] = ..., owner: _Optional[str] = ..., by_owner: _Optional[bool] = ...) -> None: ...

class ListArtifactsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListArtifactsResponse(_message.Message):
    __slots__ = ("ok", "error", "job_id", "artifacts", "run_deleted")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    RUN_DELETED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    job_id: str
    artifacts: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    run_deleted: bool
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., job_id: _Optional[str] = ..., artifacts: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., run_deleted: _Optional[bool] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class GetArtifactResponse(_message.Message):
    __slots__ = ("ok", "error", "artifact")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    artifact: _struct_pb2.Struct
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., artifact: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class LineageRequest(_message.Message):
    __slots__ = ("artifact_id", "direction", "depth")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    direction: str
    depth: int
    def __init__(self, artifact_id: _Optional[str] = ..., direction: _Optional[str] = ..., depth: _Optional[int] = ...) -> None: ...

class LineageEdge(_message.Message):
    __slots__ = ("to",)
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    to: str
    def __init__(self, to: _Optional[str] = ..., **kwargs) -> None: ...

class LineageResponse(_message.Message):
    __slots__ = ("ok", "error", "artifact", "direction", "depth", "nodes", "edges")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    artifact: _struct_pb2.Struct
    direction: str
    depth: int
    nodes: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    edges: _containers.RepeatedCompositeFieldContainer[LineageEdge]
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., artifact: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., direction: _Optional[str] = ..., depth: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[LineageEdge, _Mapping]]] = ...) -> None: ...

class RetractArtifactRequest(_message.Message):
    __slots__ = ("artifact_id", "reason")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    reason: str
    def __init__(self, artifact_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetractArtifactResponse(_message.Message):
    __slots__ = ("ok", "error", "artifact_id", "state", "changed")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    artifact_id: str
    state: str
    changed: bool
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., artifact_id: _Optional[str] = ..., state: _Optional[str] = ..., changed: _Optional[bool] = ...) -> None: ...

class PromoteArtifactRequest(_message.Message):
    __slots__ = ("artifact_id", "reason")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    reason: str
    def __init__(self, artifact_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PromoteArtifactResponse(_message.Message):
    __slots__ = ("ok", "error", "artifact_id", "state", "changed", "error_kind")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    artifact_id: str
    state: str
    changed: bool
    error_kind: str
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., artifact_id: _Optional[str] = ..., state: _Optional[str] = ..., changed: _Optional[bool] = ..., error_kind: _Optional[str] = ...) -> None: ...
