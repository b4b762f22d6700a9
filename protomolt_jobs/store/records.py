"""The store's records: frozen dataclasses decoded from rows, and the inputs of its writes.

Statuses of a job (the ``chk_workflow_run_status`` constraint)::

    (insert) -> QUEUED -> RUNNING -> COMPLETED | FAILED | DEAD       (terminal)
                  ^          |  -> WAITING -> QUEUED (step completed) | FAILED (rejected)
                  +----------+  (retry with backoff, graceful release, lease swept)
    (insert) -> FAILED            (the request topic's "fail at birth")

Operator control (migration 0002, docs/verbs.md): QUEUED | WAITING | PAUSED -> CANCELLED
(terminal) and QUEUED | WAITING -> PAUSED at once; a RUNNING job gets a request in ``control``
that its worker's next boundary write honours (-> CANCELLED or PAUSED); PAUSED -> QUEUED or
WAITING (resume); DEAD | FAILED -> QUEUED (requeue); FAILED | DEAD | CANCELLED | PAUSED |
COMPLETED -> QUEUED with fewer checkpoints (retry-step).

Outbox rows go PENDING -> PUBLISHED, or PENDING -> FAILED after 10 failed publishes (the DLQ).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "DEFINITION_CACHE_CHARS",
    "DEFINITION_CACHE_SIZE",
    "JOB_STATUSES",
    "OUTBOX_MAX_ATTEMPTS",
    "OUTBOX_STATUSES",
    "TERMINAL_STATUSES",
    "AlreadyDone",
    "ControlOutcome",
    "History",
    "InsertOutcome",
    "JobRecord",
    "Lease",
    "NewJob",
    "OutboxRow",
    "ParkedCompletion",
    "ParkedStepCompleted",
    "SweepResult",
    "Transition",
    "WrongState",
    "decoded_definition",
    "is_shared_definition",
]

#: Every job status, as the CHECK constraint spells them.
JOB_STATUSES = frozenset(
    {
        "QUEUED",
        "RUNNING",
        "WAITING",
        "COMPLETED",
        "FAILED",
        "DEAD",
        "PAUSED",
        "CANCELLED",
        "RECOVERY_REQUIRED",
    }
)
#: Statuses no worker moves a job out of (an operator may: requeue-job, retry-step).
TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "DEAD", "CANCELLED"})
#: Every outbox row status.
OUTBOX_STATUSES = frozenset({"PENDING", "PUBLISHED", "FAILED"})
#: Failed publishes after which an outbox row is FAILED (the dead letter of the relay).
OUTBOX_MAX_ATTEMPTS = 10


#: The JSONB columns of a job row, with the JSON shape each must decode to.
_JSON_COLUMNS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("workflow_definition", (dict,)),
    ("input", (dict,)),
    ("checkpoints", (list,)),
    ("result", (dict,)),
    ("control", (dict,)),
    ("effect_intents", (dict,)),
    ("step_generations", (dict,)),
    ("wait_timers", (list,)),
    ("cancel_request", (dict,)),
)


#: Columns a row may lack (queries that do not select them): the record keeps the default.
_OPTIONAL_COLUMNS = frozenset(
    {
        "wait_kind",
        "wait_seq",
        "wait_timers",
        "submitted_by",
        "submitted_groups",
        "priority",
        "queue",
        "fairness_key",
        "dedup_key",
        "deadline_at",
        "trace_context",
        "control",
        "paused_from",
        "history_seq",
        "effect_intents",
        "step_generations",
        "cancel_request",
    }
)


@dataclass(frozen=True, slots=True)
class Lease:
    """The fence of a claimed job: every write about it matches
    ``status='RUNNING' AND job_id AND lease_owner=owner AND attempt=attempt AND
    lease_token=token``.

    ``token`` is a random UUID the database stamps on every claim and clears with the lease.
    ``attempt`` alone cannot fence: a graceful release gives the attempt back and a completed
    parked step resets it to 0, so the same ``(job_id, owner, attempt)`` can be handed out
    again; the token of an earlier claim never matches again.
    """

    job_id: uuid.UUID
    owner: str
    attempt: int
    token: uuid.UUID


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One ``workflow_run`` row. JSONB columns are decoded (``dict``/``list``); times are
    timezone-aware datetimes from the database clock.

    ``unreadable`` is None for a sound row. When a stored JSON column does not decode (for
    example nesting deeper than the decoder's recursion limit) or is not the JSON shape the
    store writes (objects; an array for ``checkpoints``), that column is None on the record
    and ``unreadable`` says which column and why, ``"; "``-separated, e.g. ``"input:
    RecursionError: maximum recursion depth exceeded"``. Callers must treat such a record as
    corrupt: a worker that claimed it fails it (it is never executed), a read surface answers
    ``job-corrupt``. The store never raises on such a row, so one bad row cannot block claims.
    """

    job_id: uuid.UUID
    workflow_name: str
    workflow_definition: dict[str, Any] | None
    input: dict[str, Any] | None
    status: str
    attempt: int
    max_attempts: int
    run_after: datetime
    outstanding_step: str | None
    checkpoints: list[dict[str, Any]] | None
    result: dict[str, Any] | None
    verdict: str | None
    error: str | None
    lease_owner: str | None
    lease_token: uuid.UUID | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    unreadable: str | None = None
    #: W3C traceparent stored at submit; only the claim reads it (None elsewhere).
    trace_context: str | None = None
    #: Scheduling (migration 0003): 1 (highest) .. 5, the queue, the fairness key, the dedup
    #: key (None when not given) and the run's deadline (None without ``budget.deadline``).
    priority: int = 3
    queue: str = "default"
    fairness_key: str = "default"
    dedup_key: str | None = None
    deadline_at: datetime | None = None
    #: A pending operator request on a RUNNING row: ``{kind: "cancel"|"pause", actor,
    #: reason, requestedAt}``, or None (read by ``job_get`` only; None elsewhere).
    control: dict[str, Any] | None = None
    #: The status a PAUSED job returns to on resume (QUEUED or WAITING).
    paused_from: str | None = None
    #: Transitions recorded so far (the last one's sequence number); 0 where not read.
    history_seq: int = 0
    #: Effects (migration 0006): ``{step: {key, generation, attempt, at}}`` intents of
    #: external steps, and ``{step: n}`` retry-step generations (None when none; read by the
    #: claims, ``job_get`` and ``job_lock`` only).
    effect_intents: dict[str, Any] | None = None
    step_generations: dict[str, Any] | None = None
    #: Approvals (migration 0014): why a WAITING run waits (None: an external step;
    #: ``approval``), the transition seq of the park that opened its approval step (read by
    #: ``job_lock`` only) and the principal that submitted it (``job_get``, ``job_lock``).
    wait_kind: str | None = None
    wait_seq: int | None = None
    submitted_by: str | None = None
    #: An approval step's timers as stamped by its park (``[{kind, at, fired?, ...}]``;
    #: read by ``job_get``, ``job_lock`` and the timer sweep).
    wait_timers: list[Any] | None = None
    #: The last cancel-job's request (migration 0015), kept after it is applied: ``{actor,
    #: reason, requestedAt, compensate}`` (``compensate`` null: the workflow's default), or
    #: None (read by ``job_get`` only).
    cancel_request: dict[str, Any] | None = None
    #: The groups the submitter had at submit (migration 0017; None: none recorded; read by
    #: ``job_get`` only).
    submitted_groups: list[str] | None = None

    @property
    def lease(self) -> Lease:
        """The fence of this claimed row.

        :raises ValueError: when the row is not RUNNING under a lease owner and token.
        """
        if self.status != "RUNNING" or not self.lease_owner or self.lease_token is None:
            raise ValueError(
                f"job {self.job_id} has no lease: status {self.status}, "
                f"lease_owner {self.lease_owner!r}, lease_token {self.lease_token}"
            )
        return Lease(self.job_id, self.lease_owner, self.attempt, self.lease_token)

    @classmethod
    def from_row(cls, row: dict[str, Any], *, shared_definition: bool = False) -> JobRecord:
        """Build a record from a row: a mapping with this class's field names (``unreadable``
        excepted), whose JSON columns hold JSON text (the queries select them ``::text``).

        Never raises for bad stored JSON: a column that does not decode, or decodes to the
        wrong shape, becomes None and is named in ``unreadable``. Call it after the reading
        transaction has committed.

        :param shared_definition: decode ``workflow_definition`` through the process's cache
            of definitions by exact text (:func:`decoded_definition`): the record then holds a
            dict shared with every other record of the same text, which nobody may change.
        """
        values = {name: row[name] for name in _JOB_REQUIRED}
        for name, default in _JOB_OPTIONAL:
            values[name] = row.get(name, default)
        problems: list[str] = []
        for column, shapes in _JSON_COLUMNS:
            raw = values[column]
            if shared_definition and column == "workflow_definition" and type(raw) is str:
                value, problem = decoded_definition(raw)
            else:
                value, problem = _decode_json(raw, shapes)
            values[column] = value
            if problem is not None:
                problems.append(f"{column}: {problem}")
        return cls(**values, unreadable="; ".join(problems) if problems else None)


#: Decoded workflow definitions kept by :func:`decoded_definition` (distinct texts), and the
#: most characters of text they may hold together (a longer text is decoded and not kept).
DEFINITION_CACHE_SIZE = 64
DEFINITION_CACHE_CHARS = 4 * 1024 * 1024
#: Characters of each end of a text that, with its length, pick its cache slot.
_SLOT_ENDS = 256
_definitions: OrderedDict[tuple[int, str, str], tuple[str, dict[str, Any]]] = OrderedDict()
_shared: dict[int, dict[str, Any]] = {}
_cached_chars = 0
_definitions_lock = threading.Lock()


def decoded_definition(text: str) -> tuple[Any, str | None]:
    """A stored definition's JSON text decoded as :meth:`JobRecord.from_row` decodes it
    (``(object, None)``, or ``(None, reason)``), through a bounded LRU of the last
    :data:`DEFINITION_CACHE_SIZE` texts that decoded to an object (and at most
    :data:`DEFINITION_CACHE_CHARS` characters of them).

    Exact: a text is answered from the cache only when it equals the cached text character
    for character (the slot is picked by the length and both ends; the comparison is a
    ``memcmp``, about 0.6 us for 28 KB against ~22 us of ``json.loads``). Every job of a
    workflow stores the same definition, so a worker's claims decode it once. The object is
    shared by every caller of the same text: treat it as read-only (as a parsed workflow's
    ``definition`` is). Thread-safe.
    """
    global _cached_chars
    key = (len(text), text[:_SLOT_ENDS], text[-_SLOT_ENDS:])
    with _definitions_lock:
        entry = _definitions.get(key)
        if entry is not None and entry[0] == text:
            _definitions.move_to_end(key)
            return entry[1], None
    value, problem = _decode_json(text, (dict,))
    if problem is None and len(text) <= DEFINITION_CACHE_CHARS:
        with _definitions_lock:
            old = _definitions.pop(key, None)
            if old is not None:
                _shared.pop(id(old[1]), None)
                _cached_chars -= len(old[0])
            _definitions[key] = (text, value)
            _shared[id(value)] = value
            _cached_chars += len(text)
            while (
                len(_definitions) > DEFINITION_CACHE_SIZE or _cached_chars > DEFINITION_CACHE_CHARS
            ):
                _, (gone, evicted) = _definitions.popitem(last=False)
                _shared.pop(id(evicted), None)
                _cached_chars -= len(gone)
    return value, problem


def is_shared_definition(value: Any) -> bool:
    """Whether ``value`` is a definition :func:`decoded_definition` holds now (by identity):
    one that nobody changes, so what is derived from it may be kept by its identity."""
    return _shared.get(id(value)) is value


def _decode_json(raw: Any, shapes: tuple[type, ...]) -> tuple[Any, str | None]:
    """Decode one JSON column: ``(value, None)``, or ``(None, reason)`` when it cannot be read.

    SQL NULL stays None without a problem (only ``result`` may be NULL by the schema). An
    already-decoded value (a driver that loads JSONB itself) is shape-checked as is.
    """
    if raw is None:
        return None, None
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
    else:
        value = raw
    if not isinstance(value, shapes):
        wanted = " or ".join("JSON object" if s is dict else "JSON array" for s in shapes)
        return None, f"not a {wanted} (found {type(value).__name__})"
    return value, None


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
    #: W3C traceparent of the span that started the job's trace (None: tracing off).
    trace_context: str | None = None
    #: 1 (highest) .. 5.
    priority: int = 3
    #: The resource class; workers serve a configured list of queues.
    queue: str = "default"
    #: The tenant or project that fair interleaving is across.
    fairness_key: str = "default"
    #: The key's weight (> 0): its jobs get ``weight`` times the share of a weight-1 key.
    fairness_weight: float = 1.0
    #: While a run with this key is not terminal, another insert answers that run.
    dedup_key: str | None = None
    #: ``budget.deadline`` in seconds (deadline_at = now() + this), or None.
    deadline_s: float | None = None
    #: Who submitted it (the transition log's actor): an API principal, ``kafka:<topic>``.
    actor: str = "api"
    #: The submitting caller's groups (recorded as ``submitted_groups``; empty: none).
    groups: tuple[str, ...] = ()
    #: The workflow's retention (migration 0020): final status (``COMPLETED``, ``FAILED``,
    #: ``DEAD``, ``CANCELLED``) -> seconds its runs are kept; None: the node-wide
    #: ``jobs.run_retention_seconds``.
    retention: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class InsertOutcome:
    """What ``job_insert`` found: the stored row, whether this call created it, and whether
    the row is another job's live run holding the same ``dedup_key``."""

    job: JobRecord
    created: bool
    deduplicated: bool = False


@dataclass(frozen=True, slots=True)
class ParkedStepCompleted:
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
ParkedCompletion = ParkedStepCompleted | AlreadyDone | WrongState


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One ``workflow_run_events_outbox`` row; ``payload`` is a serialized WorkflowRunEvent
    (raw protobuf, not framed) and ``kafka_key`` the job id string. A row stored as columns
    (``payload`` NULL, migration 0005) gets its bytes from ``events.column_payload`` when it
    is read: the same message the store's ``build_event`` writes, ``occurred_at`` = the row's
    ``created_at``."""

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
        values = {name: row[name] for name in _OUTBOX_FIELDS}
        if values["payload"] is None:
            # A row written as columns (migration 0005, the one-statement fenced writes):
            # its bytes are encoded here, when the row is read to be published or shown.
            from protomolt_jobs.store.events import column_payload

            values["payload"] = column_payload(row)
        else:
            values["payload"] = bytes(values["payload"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """One sweep pass: expired leases requeued, and jobs sent DEAD (attempts exhausted)."""

    requeued: int = 0
    dead: int = 0
    dead_job_ids: tuple[uuid.UUID, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """What a control write found. ``changed`` is True when this call changed the row; then
    ``status`` is the status after it (CANCELLED/PAUSED/QUEUED/WAITING, or RUNNING when a
    request was recorded for the worker). When ``changed`` is False the row was left alone and
    ``status`` is its current status (None for an unknown job), ``control`` its pending request.
    """

    changed: bool
    status: str | None
    control: dict[str, Any] | None = None
    outstanding_step: str | None = None
    run_after: datetime | None = None
    #: Why a requeue or retry-step of an ended run was refused although its status allows it:
    #: its ``dedupKey`` is held by another live run (the key was freed when it ended).
    conflict: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One row of the transition log (``workflow_run_transition``)."""

    seq: int
    prev_status: str | None
    new_status: str
    kind: str
    actor: str
    reason: str | None
    attempt: int
    step: str | None
    #: database time; None when the stored time cannot be read (a hand edit to infinity or
    #: past year 9999; the integrity check names that row)
    at: datetime | None


@dataclass(frozen=True, slots=True)
class History:
    """A job's transitions, oldest first, and the result of checking their hash chain:
    ``first_bad_seq`` is None when every hash matches, the sequence is unbroken and the last
    hash is the row's head; else the first sequence number that does not hold."""

    transitions: tuple[Transition, ...]
    first_bad_seq: int | None


# Field names read by the ``from_row`` builders, computed once (``dataclasses.fields`` per row
# was a measurable share of a claim's client CPU).
_JOB_REQUIRED = tuple(
    f.name for f in fields(JobRecord) if f.name != "unreadable" and f.name not in _OPTIONAL_COLUMNS
)
_JOB_OPTIONAL = tuple((f.name, f.default) for f in fields(JobRecord) if f.name in _OPTIONAL_COLUMNS)
_OUTBOX_FIELDS = tuple(f.name for f in fields(OutboxRow))
