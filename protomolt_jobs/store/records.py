"""The store's records: frozen dataclasses decoded from rows, and the inputs of its writes.

Statuses of a job (the ``chk_workflow_run_status`` constraint)::

    (insert) -> QUEUED -> RUNNING -> COMPLETED | FAILED | DEAD       (terminal)
                  ^          |  -> WAITING -> QUEUED (step completed) | FAILED (rejected)
                  +----------+  (retry with backoff, graceful release, lease swept)
    (insert) -> FAILED            (the request topic's "fail at birth")

Outbox rows go PENDING -> PUBLISHED, or PENDING -> FAILED after 10 failed publishes (the DLQ).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "JOB_STATUSES",
    "OUTBOX_MAX_ATTEMPTS",
    "OUTBOX_STATUSES",
    "TERMINAL_STATUSES",
    "AlreadyDone",
    "Completed",
    "InsertOutcome",
    "JobRecord",
    "Lease",
    "NewJob",
    "OutboxRow",
    "ParkedCompletion",
    "SweepResult",
    "WrongState",
]

#: Every job status, as the CHECK constraint spells them.
JOB_STATUSES = frozenset({"QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD"})
#: Statuses nothing moves a job out of.
TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "DEAD"})
#: Every outbox row status.
OUTBOX_STATUSES = frozenset({"PENDING", "PUBLISHED", "FAILED"})
#: Failed publishes after which an outbox row is FAILED (the dead letter of the relay).
OUTBOX_MAX_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class Lease:
    """The fence of a claimed job: every write about it matches
    ``status='RUNNING' AND job_id AND lease_owner=owner AND attempt=attempt``."""

    job_id: uuid.UUID
    owner: str
    attempt: int


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One ``workflow_run`` row. JSONB columns are decoded (``dict``/``list``); times are
    timezone-aware datetimes from the database clock."""

    job_id: uuid.UUID
    workflow_name: str
    workflow_definition: dict[str, Any]
    input: dict[str, Any]
    status: str
    attempt: int
    max_attempts: int
    run_after: datetime
    outstanding_step: str | None
    checkpoints: list[dict[str, Any]]
    result: dict[str, Any] | None
    verdict: str | None
    error: str | None
    lease_owner: str | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None

    @property
    def lease(self) -> Lease:
        """The fence of this claimed row.

        :raises ValueError: when the row is not RUNNING under a lease owner.
        """
        if self.status != "RUNNING" or not self.lease_owner:
            raise ValueError(
                f"job {self.job_id} has no lease: status {self.status}, "
                f"lease_owner {self.lease_owner!r}"
            )
        return Lease(self.job_id, self.lease_owner, self.attempt)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobRecord:
        """Decode a row (a mapping with at least this class's field names)."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert. ``status`` is QUEUED, or FAILED for the request topic's "fail at birth"
    (then ``error`` says why). ``workflow_definition`` is the raw envelope snapshot."""

    job_id: uuid.UUID
    workflow_name: str
    workflow_definition: dict[str, Any]
    input: dict[str, Any]
    max_attempts: int = 3
    status: Literal["QUEUED", "FAILED"] = "QUEUED"
    error: str | None = None


@dataclass(frozen=True, slots=True)
class InsertOutcome:
    """What ``job_insert`` found: the stored row, and whether this call created it."""

    job: JobRecord
    created: bool


@dataclass(frozen=True, slots=True)
class Completed:
    """A parked step was completed (or failed as a verdict) by this call."""


@dataclass(frozen=True, slots=True)
class AlreadyDone:
    """The step is already checkpointed (a redelivery); nothing changed."""

    status: str


@dataclass(frozen=True, slots=True)
class WrongState:
    """The job is not WAITING on that step; nothing changed."""

    status: str
    outstanding_step: str | None


#: The outcome of a parked completion.
ParkedCompletion = Completed | AlreadyDone | WrongState


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One ``workflow_run_events_outbox`` row; ``payload`` is a serialized WorkflowRunEvent
    (raw protobuf, not framed) and ``kafka_key`` the job id string."""

    event_id: uuid.UUID
    seq: int
    event_type: str
    payload: bytes
    kafka_key: str
    attempts: int
    status: str
    created_at: datetime
    published_at: datetime | None
    last_error: str | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> OutboxRow:
        """Decode a row (a mapping with at least this class's field names)."""
        values = {f.name: row[f.name] for f in fields(cls)}
        values["payload"] = bytes(values["payload"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """One sweep pass: expired leases requeued, and jobs sent DEAD (attempts exhausted)."""

    requeued: int = 0
    dead: int = 0
    dead_job_ids: tuple[uuid.UUID, ...] = field(default=())
