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
DEAD                    ""      ""        error
======================= ======= ========= =========
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from google.protobuf import struct_pb2

from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent

EventType = WorkflowRunEvent.Type

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_NAME_CHARS",
    "MAX_VERDICT_CHARS",
    "OutboxEvent",
    "build_event",
    "event_type_name",
]

#: ``WorkflowRunEvent.error`` max_len (code points).
MAX_ERROR_CHARS = 4000
#: ``WorkflowRunEvent.verdict`` max_len (code points).
MAX_VERDICT_CHARS = 500
#: ``WorkflowRunEvent.step`` and ``workflow_name`` max_len (code points).
MAX_NAME_CHARS = 200


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
    :returns: an :class:`OutboxEvent` with a fresh random ``event_id``.
    :raises ValueError: for an unknown type, a naive ``occurred_at`` or a negative ``attempt``,
        naming the field.
    """
    event_type = event_type_name(type)
    if occurred_at.tzinfo is None or occurred_at.utcoffset() is None:
        raise ValueError("occurred_at: must be timezone-aware (the database's now())")
    if attempt < 0:
        raise ValueError(f"attempt: must be >= 0; got {attempt}")
    event_id = uuid.uuid4()
    job_key = str(job_id)
    detail = struct_pb2.Struct()
    detail.update({"status": status_after or ""})
    message = WorkflowRunEvent(
        event_id=str(event_id),
        job_id=job_key,
        workflow_name=(workflow_name or "")[:MAX_NAME_CHARS],
        type=EventType.Value(f"TYPE_{event_type}"),
        step=(step or "")[:MAX_NAME_CHARS],
        attempt=attempt,
        verdict=(verdict or "")[:MAX_VERDICT_CHARS],
        error=(error or "")[:MAX_ERROR_CHARS],
        detail=detail,
    )
    message.occurred_at.FromDatetime(occurred_at)
    return OutboxEvent(
        event_id=event_id,
        event_type=event_type,
        payload=message.SerializeToString(),
        kafka_key=job_key,
    )
