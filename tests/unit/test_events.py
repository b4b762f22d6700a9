"""The event factory: payload fields, detail.status, truncation and refusals (no services)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, validate_event
from protomolt_jobs.store.events import (
    build_event,
    column_payload,
    event_type_name,
    event_violations,
)

WHEN = datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=UTC)


def decode(payload: bytes) -> WorkflowRunEvent:
    msg = WorkflowRunEvent()
    msg.ParseFromString(payload)
    return msg


def test_accepted_event_carries_the_row_facts():
    job_id = uuid.uuid4()
    ev = build_event(
        job_id=job_id,
        workflow_name="enrich",
        type=EventType.TYPE_ACCEPTED,
        attempt=0,
        status_after="QUEUED",
        occurred_at=WHEN,
    )
    assert ev.event_type == "ACCEPTED"
    assert ev.kafka_key == str(job_id)
    msg = decode(ev.payload)
    assert msg.event_id == str(ev.event_id)
    assert msg.job_id == str(job_id)
    assert msg.workflow_name == "enrich"
    assert msg.type == EventType.TYPE_ACCEPTED
    assert msg.attempt == 0
    assert dict(msg.detail) == {"status": "QUEUED"}
    assert msg.occurred_at.ToDatetime(tzinfo=UTC) == WHEN
    assert (msg.step, msg.verdict, msg.error) == ("", "", "")
    assert validate_event(msg) == []


def test_each_event_id_is_fresh():
    kw = {
        "job_id": uuid.uuid4(),
        "workflow_name": "w",
        "type": "ACCEPTED",
        "attempt": 0,
        "status_after": "QUEUED",
        "occurred_at": WHEN,
    }
    assert build_event(**kw).event_id != build_event(**kw).event_id


@pytest.mark.parametrize(
    ("type_", "status", "fields"),
    [
        ("STEP_CHECKPOINT", "RUNNING", {"step": "embed"}),
        ("WAITING", "WAITING", {"step": "approve"}),
        ("COMPLETED", "COMPLETED", {"verdict": "3 steps, output acme.v1.Ticket"}),
        ("FAILED", "FAILED", {"step": "embed", "error": "VALIDATION: bad"}),
        ("DEAD", "DEAD", {"error": "GRPC: gRPC UNAVAILABLE from x"}),
    ],
)
def test_every_type_builds_a_valid_event(type_, status, fields):
    ev = build_event(
        job_id=str(uuid.uuid4()),
        workflow_name="w",
        type=type_,
        attempt=2,
        status_after=status,
        occurred_at=WHEN,
        **fields,
    )
    msg = decode(ev.payload)
    assert ev.event_type == type_
    assert EventType.Name(msg.type) == f"TYPE_{type_}"
    assert msg.detail["status"] == status
    assert msg.attempt == 2
    for key, value in fields.items():
        assert getattr(msg, key) == value
    assert validate_event(msg) == []


def test_long_texts_are_truncated_to_the_contract_in_code_points():
    error = "é" * 5000
    ev = build_event(
        job_id=uuid.uuid4(),
        workflow_name="n" * 300,
        type=EventType.TYPE_FAILED,
        attempt=1,
        status_after="FAILED",
        occurred_at=WHEN,
        step="s" * 250,
        error=error,
    )
    msg = decode(ev.payload)
    assert msg.error == "é" * 4000
    assert msg.workflow_name == "n" * 200
    assert msg.step == "s" * 200
    assert validate_event(msg) == []
    done = build_event(
        job_id=uuid.uuid4(),
        workflow_name="w",
        type="TYPE_COMPLETED",
        attempt=1,
        status_after="COMPLETED",
        occurred_at=WHEN,
        verdict="v" * 600,
    )
    assert decode(done.payload).verdict == "v" * 500


def test_occurred_at_keeps_the_instant_of_any_timezone():
    local = WHEN.astimezone(timezone(timedelta(hours=-5)))
    ev = build_event(
        job_id=uuid.uuid4(),
        workflow_name="w",
        type="ACCEPTED",
        attempt=0,
        status_after="QUEUED",
        occurred_at=local,
    )
    assert decode(ev.payload).occurred_at.ToDatetime(tzinfo=UTC) == WHEN


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": "TYPE_UNSPECIFIED"}, "type"),
        ({"type": 0}, "type"),
        ({"type": 99}, "type"),
        ({"type": "EXPLODED"}, "type"),
        ({"occurred_at": datetime(2026, 1, 1)}, "occurred_at"),
        ({"attempt": -1}, "attempt"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    base = {
        "job_id": uuid.uuid4(),
        "workflow_name": "w",
        "type": "ACCEPTED",
        "attempt": 0,
        "status_after": "QUEUED",
        "occurred_at": WHEN,
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=f"^{field}:"):
        build_event(**base)


def test_event_type_name_accepts_numbers_and_both_spellings():
    assert event_type_name(EventType.TYPE_DEAD) == "DEAD"
    assert event_type_name("TYPE_WAITING") == "WAITING"
    assert event_type_name("STEP_CHECKPOINT") == "STEP_CHECKPOINT"


@pytest.mark.parametrize(
    ("type_", "status", "fields"),
    [
        ("ACCEPTED", "QUEUED", {}),
        ("STEP_CHECKPOINT", "RUNNING", {"step": "s" * 250}),
        ("COMPLETED", "COMPLETED", {"verdict": "v" * 600}),
        ("FAILED", "FAILED", {"step": "x", "error": "e" * 5000}),
        ("CANCELLED", "CANCELLED", {"error": "CANCELLED by ops: no"}),
        ("PAUSED", "PAUSED", {"step": "x"}),
    ],
)
def test_a_column_row_encodes_the_bytes_build_event_makes(type_, status, fields):
    """An outbox row stored as columns (migration 0005) is published as the very bytes
    build_event would have written for the same facts (occurred_at = the row's created_at)."""
    at = datetime(2026, 12, 1, 16, 0, 0, 123456, tzinfo=UTC)
    job_id = uuid.uuid4()
    built = build_event(
        job_id=job_id,
        workflow_name="wf" * 150,
        type=type_,
        attempt=2,
        status_after=status,
        occurred_at=at,
        **fields,
    )
    row = {
        "event_id": built.event_id,
        "event_type": type_,
        "kafka_key": str(job_id),
        "created_at": at,
        "workflow_name": "wf" * 150,
        "attempt": 2,
        "status_after": status,
        "step": fields.get("step"),
        "verdict": fields.get("verdict"),
        "error": fields.get("error"),
    }
    assert column_payload(row) == built.payload


def test_a_broken_column_row_is_encoded_for_the_relay_to_refuse():
    row = {
        "event_id": uuid.uuid4(),
        "event_type": "NO_SUCH_TYPE",
        "kafka_key": str(uuid.uuid4()),
        "created_at": datetime.now(UTC),
        "workflow_name": "wf",
        "attempt": 1,
        "status_after": "COMPLETED",
        "step": None,
        "verdict": None,
        "error": None,
    }
    event = WorkflowRunEvent.FromString(column_payload(row))
    assert [v.rule_id for v in event_violations(event)] == ["required"]
    row["event_type"] = "COMPLETED"
    event = WorkflowRunEvent.FromString(column_payload(row))
    assert [v.rule_id for v in event_violations(event)] == ["completed-carries-verdict"]
