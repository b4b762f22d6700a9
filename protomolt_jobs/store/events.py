"""The event factory: one outbox row (a serialized ``WorkflowRunEvent``) per commit point.

The store calls :func:`build_event` inside the transaction that changes the job, with the
transaction's ``now()`` as ``occurred_at`` and the job's status *after* the change as
``detail.status`` (DESIGN.md section 5; upstream stamps the status before the change). Text
fields are truncated to the contract's ``max_len`` here, in the event only: the row keeps them
whole.

======================= ======= ========= =========
event                   step    verdict   error
======================= ======= ========= =========
ACCEPTED                ""      ""        ""
STEP_CHECKPOINT         step    ""        ""
WAITING                 step    ""        ""
COMPLETED               ""      verdict   ""
FAILED                  step?   ""        error
DEAD                    step?   ""        error
CANCELLED               step?   ""        "CANCELLED by <actor>[: <reason>]"
PAUSED                  step?   ""        reason?
RESUMED                 ""      ""        reason?
REQUEUED                step?   ""        reason?
CONTROL_REQUESTED       ""      kind      reason?
======================= ======= ========= =========
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from google.protobuf import struct_pb2

from protomolt_jobs.limits import MAX_ERROR_CHARS, MAX_NAME_CHARS, MAX_VERDICT_CHARS
from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent

EventType = WorkflowRunEvent.Type

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_NAME_CHARS",
    "MAX_VERDICT_CHARS",
    "EventViolation",
    "OutboxEvent",
    "build_event",
    "column_payload",
    "event_type_name",
    "event_violations",
]


class EventViolation(NamedTuple):
    """One broken rule of the event contract; the fields of ``validation.Violation``
    (``path`` is ``""`` for a message-level CEL rule)."""

    path: str
    rule_id: str
    message: str


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_REQUIRED = "field is required"
_TYPE_COMPLETED = EventType.Value("TYPE_COMPLETED")
_TYPE_FAILED = EventType.Value("TYPE_FAILED")
_TYPE_DEAD = EventType.Value("TYPE_DEAD")
_TYPE_CANCELLED = EventType.Value("TYPE_CANCELLED")
_DEFINED_TYPES = frozenset(EventType.values())


def event_violations(msg: WorkflowRunEvent) -> list[EventViolation]:
    """The rules ``jobs.proto`` declares on ``WorkflowRunEvent``, checked in plain Python.

    The same verdicts, paths, rule ids and messages as ``wire.validate_event`` (the declared
    field rules and the three CEL rules ``completed-carries-verdict``,
    ``terminal-carries-error`` and ``cancelled-carries-reason``), in the same order, at a few microseconds instead of the
    CEL interpreter's milliseconds: :func:`build_event` runs it on every event it makes, and
    the relay on every payload it publishes. ``tests/unit/test_events_property.py`` proves
    the two checks agree on arbitrary messages, so a rule added to the proto without its twin
    here fails that test.

    :returns: the violations, empty when the event keeps the contract.
    """
    out: list[EventViolation] = []
    for name in ("event_id", "job_id"):
        value = getattr(msg, name)
        if not value:
            out.append(EventViolation(name, "required", _REQUIRED))
        elif not _UUID.match(value):
            out.append(EventViolation(name, "string.uuid", "value must be a valid UUID"))
    if not msg.workflow_name:
        out.append(EventViolation("workflow_name", "required", _REQUIRED))
    elif len(msg.workflow_name) > MAX_NAME_CHARS:
        out.append(_too_long("workflow_name", MAX_NAME_CHARS))
    kind = msg.type
    if not kind:
        out.append(EventViolation("type", "required", _REQUIRED))
    elif kind not in _DEFINED_TYPES:
        out.append(
            EventViolation("type", "enum.defined_only", f"must be a defined enum value, got {kind}")
        )
    if len(msg.step) > MAX_NAME_CHARS:
        out.append(_too_long("step", MAX_NAME_CHARS))
    if msg.attempt < 0:
        out.append(EventViolation("attempt", "int32.gte", "must be >= 0"))
    if len(msg.verdict) > MAX_VERDICT_CHARS:
        out.append(_too_long("verdict", MAX_VERDICT_CHARS))
    if len(msg.error) > MAX_ERROR_CHARS:
        out.append(_too_long("error", MAX_ERROR_CHARS))
    if not msg.HasField("occurred_at"):
        out.append(EventViolation("occurred_at", "required", _REQUIRED))
    if kind == _TYPE_COMPLETED and not msg.verdict:
        out.append(
            EventViolation(
                "",
                "completed-carries-verdict",
                "a COMPLETED event must carry its one-line verdict",
            )
        )
    if kind in (_TYPE_FAILED, _TYPE_DEAD) and not msg.error:
        out.append(
            EventViolation(
                "",
                "terminal-carries-error",
                "a FAILED or DEAD event must carry the verbatim error",
            )
        )
    if kind == _TYPE_CANCELLED and not msg.error:
        out.append(
            EventViolation(
                "",
                "cancelled-carries-reason",
                "a CANCELLED event must carry who cancelled and why in error",
            )
        )
    return out


def _too_long(path: str, limit: int) -> EventViolation:
    return EventViolation(path, "string.max_len", f"length must be at most {limit}")


#: The field a message-level rule is about, for build_event's refusal.
_RULE_FIELD = {
    "completed-carries-verdict": "verdict",
    "terminal-carries-error": "error",
    "cancelled-carries-reason": "error",
}


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event ready for the outbox: ``event_id`` (the row id and the consumers' dedupe key),
    ``event_type`` (the enum name without ``TYPE_``, e.g. ``"STEP_CHECKPOINT"``), ``payload``
    (the serialized ``WorkflowRunEvent``, not framed) and ``kafka_key`` (the job id string)."""

    event_id: uuid.UUID
    event_type: str
    payload: bytes
    kafka_key: str


def event_type_name(type: int | str) -> str:
    """The outbox ``event_type`` of an event type.

    :param type: an ``EventType`` value (``EventType.TYPE_DEAD``), or its name with or without
        the ``TYPE_`` prefix.
    :returns: the name without ``TYPE_`` (``"DEAD"``).
    :raises ValueError: for an unknown type or ``TYPE_UNSPECIFIED``, naming the field ``type``.
    """
    if isinstance(type, str):
        name = type if type.startswith("TYPE_") else f"TYPE_{type}"
        try:
            EventType.Value(name)
        except ValueError:
            raise ValueError(f"type: unknown event type {type!r}") from None
    else:
        try:
            name = EventType.Name(type)
        except ValueError:
            raise ValueError(f"type: unknown event type number {type!r}") from None
    if name == "TYPE_UNSPECIFIED":
        raise ValueError("type: TYPE_UNSPECIFIED is not an event")
    return name.removeprefix("TYPE_")


def build_event(
    *,
    job_id: uuid.UUID | str,
    workflow_name: str,
    type: int | str,
    attempt: int,
    status_after: str,
    occurred_at: datetime,
    step: str = "",
    verdict: str = "",
    error: str = "",
) -> OutboxEvent:
    """Build one lifecycle event and its outbox row fields.

    :param job_id: the job (also the Kafka key).
    :param workflow_name: the job's workflow name (truncated to 200 code points).
    :param type: an ``EventType`` value or name (see :func:`event_type_name`).
    :param attempt: the job's attempt counter after the change (0 for ACCEPTED).
    :param status_after: the job's status after the change; becomes ``detail.status``.
    :param occurred_at: the transaction's ``now()``; must be timezone-aware.
    :param step: the step, for STEP_CHECKPOINT, WAITING and FAILED (truncated to 200).
    :param verdict: the one-line summary, COMPLETED only (truncated to 500).
    :param error: the verbatim error, FAILED and DEAD (truncated to 4000).
    :returns: an :class:`OutboxEvent` with a fresh random ``event_id``; its payload keeps
        every rule of the event contract (:func:`event_violations` is empty), so the relay
        publishes it without re-checking the CEL rules (DESIGN.md section 17).
    :raises ValueError: for an unknown type, a naive ``occurred_at``, a negative ``attempt``,
        a ``job_id`` that is not a UUID, or an event that would break the contract (a blank
        ``workflow_name``, a COMPLETED event without ``verdict``, a FAILED or DEAD event
        without ``error``), naming the field and the rule.
    """
    event_type = event_type_name(type)
    if occurred_at.tzinfo is None or occurred_at.utcoffset() is None:
        raise ValueError("occurred_at: must be timezone-aware (the database's now())")
    if attempt < 0:
        raise ValueError(f"attempt: must be >= 0; got {attempt}")
    event_id = uuid.uuid4()
    if isinstance(job_id, uuid.UUID):
        job_key = str(job_id)
    else:
        try:
            job_key = str(uuid.UUID(str(job_id)))
        except ValueError:
            raise ValueError(f"job_id: not a UUID: {job_id!r}") from None
    try:  # a text protobuf cannot carry (a lone surrogate) fails here, not in the relay
        message = _message(
            event_id=str(event_id),
            job_id=job_key,
            workflow_name=workflow_name,
            type=EventType.Value(f"TYPE_{event_type}"),
            attempt=attempt,
            status_after=status_after,
            occurred_at=occurred_at,
            step=step,
            verdict=verdict,
            error=error,
        )
        problems = event_violations(message)
        payload = b"" if problems else message.SerializeToString()
    except (ValueError, UnicodeError) as exc:
        raise ValueError(f"event: cannot be serialized: {exc}") from None
    if problems:
        path, rule_id, text = problems[0]
        raise ValueError(f"{path or _RULE_FIELD.get(rule_id, 'event')}: {text} ({rule_id})")
    return OutboxEvent(
        event_id=event_id,
        event_type=event_type,
        payload=payload,
        kafka_key=job_key,
    )


def _message(
    *,
    event_id: str,
    job_id: str,
    workflow_name: str | None,
    type: int,
    attempt: int,
    status_after: str | None,
    occurred_at: datetime,
    step: str | None,
    verdict: str | None,
    error: str | None,
) -> WorkflowRunEvent:
    """The event message, text fields truncated to the contract's limits (not checked)."""
    detail = struct_pb2.Struct()
    detail.update({"status": status_after or ""})
    message = WorkflowRunEvent(
        event_id=event_id,
        job_id=job_id,
        workflow_name=(workflow_name or "")[:MAX_NAME_CHARS],
        type=type,  # type: ignore[arg-type]  # an enum number; 0 for an unknown row type
        step=(step or "")[:MAX_NAME_CHARS],
        attempt=attempt,
        verdict=(verdict or "")[:MAX_VERDICT_CHARS],
        error=(error or "")[:MAX_ERROR_CHARS],
        detail=detail,
    )
    message.occurred_at.FromDatetime(occurred_at)
    return message


def column_payload(row: Mapping[str, Any]) -> bytes:
    """The serialized ``WorkflowRunEvent`` of an outbox row written as columns (migration 0005:
    the one-statement fenced writes insert the event's fields, not its bytes).

    The same message :func:`build_event` makes: ``event_id`` and ``job_id`` (the row's
    ``kafka_key``) from the row, ``type`` from ``event_type``, ``occurred_at`` = the row's
    ``created_at`` (the writing transaction's ``now()``), ``detail.status`` = ``status_after``,
    text fields truncated to the contract's limits. It does not refuse: a row that breaks the
    contract (an unknown ``event_type``, a COMPLETED row without ``verdict``) is encoded as it
    is, and the relay's :func:`event_violations` check makes it FAILED like any poison payload.

    :param row: a mapping with ``event_id``, ``event_type``, ``kafka_key``, ``created_at``,
        ``workflow_name``, ``attempt``, ``status_after``, ``step``, ``verdict``, ``error``.
    :returns: the payload bytes (not framed).
    """
    name = str(row["event_type"] or "")
    try:
        type = EventType.Value(name if name.startswith("TYPE_") else f"TYPE_{name}")
    except ValueError:
        type = 0  # TYPE_UNSPECIFIED: the check reports "type: field is required"
    attempt = row["attempt"]
    created_at = row["created_at"]
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    payload: bytes = _message(
        event_id=str(row["event_id"]),
        job_id=str(row["kafka_key"] or ""),
        workflow_name=row["workflow_name"],
        type=type,
        attempt=int(attempt) if attempt is not None else 0,
        status_after=row["status_after"],
        occurred_at=created_at,
        step=row["step"],
        verdict=row["verdict"],
        error=row["error"],
    ).SerializeToString()
    return payload
