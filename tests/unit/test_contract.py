"""The wire contract's declared rules (issue 2 acceptance) and its descriptor set."""

from __future__ import annotations

import uuid

import pytest
from google.protobuf import descriptor_pool, message_factory, struct_pb2, timestamp_pb2

from protomolt_jobs.kafka.wire import (
    EventType,
    WorkflowRunEvent,
    WorkflowRunRequest,
    descriptor_set,
    validate_event,
    validate_request,
)
from protomolt_jobs.workflow.validation import Violation, summarize


def _ts() -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_767_225_600, nanos=5)


def make_event(**overrides) -> WorkflowRunEvent:
    fields = {
        "event_id": str(uuid.uuid4()),
        "job_id": str(uuid.uuid4()),
        "workflow_name": "parse-document",
        "type": EventType.TYPE_ACCEPTED,
        "attempt": 0,
        "occurred_at": _ts(),
    }
    fields.update(overrides)
    event = WorkflowRunEvent(**fields)
    event.detail.update({"status": "QUEUED"})
    return event


def make_request(**overrides) -> WorkflowRunRequest:
    fields = {"job_id": str(uuid.uuid4()), "workflow_name": "parse-document"}
    fields.update(overrides)
    req = WorkflowRunRequest(**fields)
    if "input" not in overrides:
        req.input.update({"text": "hello"})
    return req


def rules(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.path, v.rule_id) for v in violations}


VALID_EVENTS = {
    "ACCEPTED": {"type": EventType.TYPE_ACCEPTED},
    "STEP_CHECKPOINT": {"type": EventType.TYPE_STEP_CHECKPOINT, "step": "fetch", "attempt": 1},
    "WAITING": {"type": EventType.TYPE_WAITING, "step": "approve", "attempt": 1},
    "COMPLETED": {
        "type": EventType.TYPE_COMPLETED,
        "verdict": "2 steps, output a.v1.B",
        "attempt": 1,
    },
    "FAILED": {"type": EventType.TYPE_FAILED, "error": "boom", "step": "fetch", "attempt": 2},
    "DEAD": {"type": EventType.TYPE_DEAD, "error": "gRPC UNAVAILABLE from x", "attempt": 3},
    "CANCELLED": {"type": EventType.TYPE_CANCELLED, "error": "CANCELLED by alice: stop"},
    "PAUSED": {"type": EventType.TYPE_PAUSED, "step": "fetch", "attempt": 1},
    "RESUMED": {"type": EventType.TYPE_RESUMED},
    "REQUEUED": {"type": EventType.TYPE_REQUEUED, "step": "fetch"},
    "CONTROL_REQUESTED": {"type": EventType.TYPE_CONTROL_REQUESTED, "verdict": "cancel"},
    "RECOVERY_REQUIRED": {
        "type": EventType.TYPE_RECOVERY_REQUIRED,
        "step": "charge",
        "error": "checkpoint-mismatch: step 'charge' descriptorSha256 changed",
    },
    "APPROVAL_DECIDED": {
        "type": EventType.TYPE_APPROVAL_DECIDED,
        "step": "review",
        "verdict": "fix",
    },
    "APPROVAL_ESCALATED": {"type": EventType.TYPE_APPROVAL_ESCALATED, "step": "review"},
    "YIELDED": {"type": EventType.TYPE_YIELDED, "step": "render"},
}


@pytest.mark.parametrize("name", sorted(VALID_EVENTS))
def test_valid_event_of_every_type_passes(name):
    assert validate_event(make_event(**VALID_EVENTS[name])) == []


def test_every_event_type_has_a_valid_example():
    names = {v.name for v in EventType.DESCRIPTOR.values if v.number != 0}
    assert {f"TYPE_{n}" for n in VALID_EVENTS} == names


def test_event_type_numbers_are_the_upstream_ones():
    assert [(v.name, v.number) for v in WorkflowRunEvent.DESCRIPTOR.enum_types[0].values] == [
        ("TYPE_UNSPECIFIED", 0),
        ("TYPE_ACCEPTED", 1),
        ("TYPE_STEP_CHECKPOINT", 2),
        ("TYPE_WAITING", 3),
        ("TYPE_COMPLETED", 4),
        ("TYPE_FAILED", 5),
        ("TYPE_DEAD", 6),
        # protomolt-jobs additions (issue 15), appended after the upstream six
        ("TYPE_CANCELLED", 7),
        ("TYPE_PAUSED", 8),
        ("TYPE_RESUMED", 9),
        ("TYPE_REQUEUED", 10),
        ("TYPE_CONTROL_REQUESTED", 11),
        ("TYPE_RECOVERY_REQUIRED", 12),
        # approvals (issue 26), appended after the last
        ("TYPE_APPROVAL_DECIDED", 13),
        ("TYPE_APPROVAL_ESCALATED", 14),
        # preemption (issue 28), appended after the last
        ("TYPE_YIELDED", 15),
    ]
    assert EventType.TYPE_DEAD == 6 and EventType.Name(4) == "TYPE_COMPLETED"


def test_completed_without_verdict_is_rejected_by_its_rule():
    violations = validate_event(make_event(type=EventType.TYPE_COMPLETED, attempt=1))
    assert violations == [
        Violation(
            "", "completed-carries-verdict", "a COMPLETED event must carry its one-line verdict"
        )
    ]


@pytest.mark.parametrize("kind", [EventType.TYPE_FAILED, EventType.TYPE_DEAD])
def test_failed_or_dead_without_error_is_rejected_by_its_rule(kind):
    violations = validate_event(make_event(type=kind, attempt=1))
    assert violations == [
        Violation(
            "", "terminal-carries-error", "a FAILED or DEAD event must carry the verbatim error"
        )
    ]


def test_cancelled_without_its_reason_is_rejected_by_its_rule():
    violations = validate_event(make_event(type=EventType.TYPE_CANCELLED))
    assert violations == [
        Violation(
            "",
            "cancelled-carries-reason",
            "a CANCELLED event must carry who cancelled and why in error",
        )
    ]


def test_verdict_rule_does_not_apply_to_other_types():
    # A FAILED event needs an error, not a verdict; a COMPLETED one needs no error.
    assert validate_event(make_event(type=EventType.TYPE_FAILED, error="x")) == []
    assert validate_event(make_event(type=EventType.TYPE_COMPLETED, verdict="ok")) == []


def test_type_unspecified_is_rejected_as_required():
    violations = validate_event(make_event(type=EventType.TYPE_UNSPECIFIED))
    assert rules(violations) == {("type", "required")}
    assert violations[0].message == "field is required"


def test_undeclared_enum_number_is_rejected():
    assert rules(validate_event(make_event(type=42))) == {("type", "enum.defined_only")}


@pytest.mark.parametrize("field", ["job_id", "event_id"])
@pytest.mark.parametrize(
    "bad", ["not-a-uuid", "123", str(uuid.uuid4())[:-1], str(uuid.uuid4()) + "0"]
)
def test_non_uuid_ids_are_rejected(field, bad):
    violations = validate_event(make_event(**{field: bad}))
    assert violations == [Violation(field, "string.uuid", "value must be a valid UUID")]


@pytest.mark.parametrize("field", ["job_id", "event_id", "workflow_name"])
def test_empty_required_strings_are_rejected_once(field):
    assert validate_event(make_event(**{field: ""})) == [
        Violation(field, "required", "field is required")
    ]


def test_uppercase_uuid_is_accepted():
    assert validate_event(make_event(job_id=str(uuid.uuid4()).upper())) == []


def test_workflow_name_of_201_characters_is_rejected():
    violations = validate_event(make_event(workflow_name="w" * 201))
    assert violations == [
        Violation("workflow_name", "string.max_len", "length must be at most 200")
    ]
    assert validate_event(make_event(workflow_name="w" * 200)) == []


def test_max_len_counts_code_points_not_bytes():
    # 200 four-byte code points are 800 UTF-8 bytes and still within the limit.
    assert validate_event(make_event(workflow_name="\U0001f600" * 200)) == []
    assert rules(validate_event(make_event(workflow_name="\U0001f600" * 201))) == {
        ("workflow_name", "string.max_len")
    }


@pytest.mark.parametrize(("field", "limit"), [("step", 200), ("verdict", 500), ("error", 4000)])
def test_other_length_limits(field, limit):
    base = {"type": EventType.TYPE_FAILED, "error": "x"}
    assert validate_event(make_event(**{**base, field: "e" * limit})) == []
    assert rules(validate_event(make_event(**{**base, field: "e" * (limit + 1)}))) == {
        (field, "string.max_len")
    }


def test_missing_occurred_at_is_rejected():
    event = make_event()
    event.ClearField("occurred_at")
    assert validate_event(event) == [Violation("occurred_at", "required", "field is required")]


def test_epoch_occurred_at_counts_as_set():
    # Presence, not value: an explicitly set zero timestamp is present.
    assert validate_event(make_event(occurred_at=timestamp_pb2.Timestamp())) == []


def test_negative_attempt_is_rejected():
    assert validate_event(make_event(attempt=-1)) == [
        Violation("attempt", "int32.gte", "must be >= 0")
    ]


def test_several_violations_are_all_reported_and_summarized():
    event = WorkflowRunEvent(type=EventType.TYPE_DEAD, job_id="x", attempt=-2)
    violations = validate_event(event)
    assert rules(violations) == {
        ("event_id", "required"),
        ("job_id", "string.uuid"),
        ("workflow_name", "required"),
        ("attempt", "int32.gte"),
        ("occurred_at", "required"),
        ("", "terminal-carries-error"),
    }
    text = summarize(violations)
    assert "job_id: value must be a valid UUID" in text
    assert text.endswith(": a FAILED or DEAD event must carry the verbatim error")
    assert text.count("; ") == len(violations) - 1


def test_valid_request_passes():
    assert validate_request(make_request()) == []


def test_request_with_empty_input_object_counts_as_present():
    req = make_request(input=struct_pb2.Struct())
    assert req.HasField("input")
    assert validate_request(req) == []


def test_request_without_input_is_rejected():
    req = make_request()
    req.ClearField("input")
    assert validate_request(req) == [Violation("input", "required", "field is required")]


def test_request_with_non_uuid_job_id_is_rejected():
    assert rules(validate_request(make_request(job_id="job-1"))) == {("job_id", "string.uuid")}


def test_request_with_overlong_name_is_rejected():
    assert rules(validate_request(make_request(workflow_name="n" * 201))) == {
        ("workflow_name", "string.max_len")
    }


def test_request_without_name_is_rejected():
    assert rules(validate_request(make_request(workflow_name=""))) == {
        ("workflow_name", "required")
    }


def test_validators_refuse_the_wrong_message_type():
    with pytest.raises(TypeError, match="WorkflowRunRequest"):
        validate_request(make_event())
    with pytest.raises(TypeError, match="WorkflowRunEvent"):
        validate_event(make_request())


def test_message_order_in_the_file():
    # Confluent framing uses the message index: event 0, request 1.
    file = WorkflowRunEvent.DESCRIPTOR.file
    assert [m.name for m in file.message_types_by_name.values()] == [
        "WorkflowRunEvent",
        "WorkflowRunRequest",
    ]
    assert file.package == "ai.pipestream.proto.jobs.v1"
    assert file.name == "ai/pipestream/proto/jobs/v1/jobs.proto"


def test_descriptor_set_lists_dependencies_first_and_loads_into_a_fresh_pool():
    fds = descriptor_set()
    names = [f.name for f in fds.file]
    assert names[-1] == "ai/pipestream/proto/jobs/v1/jobs.proto"
    assert len(names) == len(set(names))
    for i, f in enumerate(fds.file):
        for dep in f.dependency:
            assert names.index(dep) < i, f"{dep} must come before {f.name}"
    assert {
        "ai/pipestream/proto/validate/v1/validate.proto",
        "ai/pipestream/proto/meta/v1/metadata.proto",
        "google/protobuf/struct.proto",
        "google/protobuf/timestamp.proto",
        "google/protobuf/descriptor.proto",
    } <= set(names)
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    cls = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("ai.pipestream.proto.jobs.v1.WorkflowRunEvent")
    )
    event = make_event(type=EventType.TYPE_COMPLETED, verdict="ok")
    copy = cls.FromString(event.SerializeToString())
    assert copy.verdict == "ok" and copy.type == 4


def test_rules_fire_on_an_event_from_the_descriptor_set_pool():
    # The relay and tests may decode events through a pool built from descriptor_set().
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_set().file:
        pool.Add(f)
    cls = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("ai.pipestream.proto.jobs.v1.WorkflowRunEvent")
    )
    bad = cls.FromString(make_event(type=EventType.TYPE_DEAD, job_id="zz").SerializeToString())
    assert rules(validate_event(bad)) == {("job_id", "string.uuid"), ("", "terminal-carries-error")}


def test_descriptor_set_is_a_fresh_copy():
    fds = descriptor_set()
    fds.file[0].name = "changed"
    assert descriptor_set().file[0].name != "changed"


def test_event_meta_options_carry_the_upstream_description():
    from protomolt_jobs.pb.ai.pipestream.proto.meta.v1 import metadata_pb2

    meta = WorkflowRunEvent.DESCRIPTOR.GetOptions().Extensions[metadata_pb2.message]
    assert meta.description.startswith("One workflow-run lifecycle event")
    assert dict(meta.labels) == {"component": "jobs", "surface": "kafka"}
    assert meta.owner == "protomolt" and meta.sensitivity == "internal"
