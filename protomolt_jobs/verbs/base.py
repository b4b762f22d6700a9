"""What every job verb shares: the late-bound backend, the verb classes, the field readers and
the answers.

Envelopes, messages and defaults follow the reference (upstream ``jobs/service/actions``), with
the deliberate differences of DESIGN.md section 4 and ``docs/verbs.md``:

- Every field error is ``invalid-input`` naming the field (``details.field``), unknown fields
  included (the input schemas say ``additionalProperties: false`` and are enforced).
- Values PostgreSQL cannot store (NUL characters, lone surrogates, non-finite numbers, integers
  beyond +-2**53) are refused up front by :mod:`protomolt_jobs.input_rules`, shared with the
  request topic.
- With no database configured every job verb raises ``unavailable`` saying how to configure one
  (:data:`NOT_CONFIGURED`).

Answers with ``ok: false`` (unknown job, wrong state) are returns, never exceptions: the
answer builders here return them. Nothing here imports ``protomolt_jobs.host``.
"""

from __future__ import annotations

import abc
import logging
import math
import threading
import uuid
from typing import Any

from protomolt_jobs.errors import InvalidInput, JobCorrupt, Unavailable
from protomolt_jobs.hooks.contract import JOB_STATUSES_KEY, current_principal
from protomolt_jobs.input_rules import check_json, check_text
from protomolt_jobs.runs.stored_run import SnapshotError
from protomolt_jobs.runs.submitter import Submitter, parse_job_id

__all__ = [
    "MAX_REASON_CHARS",
    "NOT_CONFIGURED",
    "NOT_RUNNING",
    "VERBS_LOGGER",
    "ControlVerb",
    "JobVerb",
    "JobsBackend",
    "Verb",
    "actor",
    "as_integer",
    "as_job_id",
    "control_schema",
    "invalid",
    "not_found",
    "only_known",
    "optional_object",
    "optional_reason",
    "optional_string",
    "refused",
    "require_object",
    "require_string",
    "unreadable_row",
    "wrong_state",
]

#: The logger the job verbs write to (``action`` names in ``extra``).
VERBS_LOGGER = "protomolt_jobs.job_verbs"
#: The ``unavailable`` message of a node without ``jobs.dsn``.
NOT_CONFIGURED = (
    "workflow runs are not configured on this node "
    "(set jobs.dsn in protomolt.toml or PROTOMOLT_JOBS_DSN)"
)
#: The ``unavailable`` message of a configured node whose jobs role is not running.
NOT_RUNNING = (
    "workflow runs are not running on this node (the jobs role has not started or has closed)"
)
#: Longest operator reason kept (code points); longer is invalid-input.
MAX_REASON_CHARS = 2000

log = logging.getLogger(VERBS_LOGGER)


# --------------------------------------------------------------------------------------
# The late-bound backend
# --------------------------------------------------------------------------------------


class JobsBackend:
    """What the verbs need at call time: the store and the submitter.

    The jobs role contributes its verbs at wire, before any database is opened; it binds the
    store at start and unbinds it at close, so the same verb objects answer ``unavailable``
    before, ``ok`` while running, and ``unavailable`` after.

    :param configured: True when a database is configured (selects the ``unavailable`` text).
    """

    def __init__(self, *, configured: bool) -> None:
        self.configured = configured
        self._store: Any = None
        self._submitter: Submitter | None = None
        self._lock = threading.Lock()
        #: ``() -> worker.grants.GrantPolicy`` (set by the role at wire): approve-step finds
        #: the approvers of a step's grant gate through it; None: no grant gates.
        self.grant_policy: Any = None
        #: ``jobs.loop_extend_cap`` (set by the role at wire): extend-loop's ceiling.
        self.loop_extend_cap: int = 20
        #: ``jobs.lease_seconds`` (set by the role at wire): how far report-progress extends
        #: a run's lease.
        self.lease_s: float = 300.0

    def bind(self, store: Any, submitter: Submitter) -> None:
        """Serve with ``store`` and ``submitter`` (called by the role's start)."""
        with self._lock:
            self._store, self._submitter = store, submitter

    def unbind(self) -> None:
        """Stop serving (called by the role's close)."""
        with self._lock:
            self._store, self._submitter = None, None

    def require(self) -> tuple[Any, Submitter]:
        """The bound store and submitter.

        :raises Unavailable: no database configured, or the role is not running.
        """
        with self._lock:
            store, submitter = self._store, self._submitter
        if store is None or submitter is None:
            raise Unavailable(NOT_CONFIGURED if not self.configured else NOT_RUNNING)
        return store, submitter


# --------------------------------------------------------------------------------------
# The verb classes
# --------------------------------------------------------------------------------------


class Verb(abc.ABC):
    """One catalog action (the host's ``Action`` shape, ``hooks/contract.py``).

    :ivar name: kebab-case, verb first (``submit-workflow``).
    :ivar scope: the scope a restricted caller must hold.
    :ivar description: one sentence for a tool-using caller.
    :ivar fields: the input keys the verb accepts; any other is ``invalid-input``.
    :ivar input_schema: the JSON Schema of the input envelope (``additionalProperties: false``).
    """

    name: str
    scope: str
    description: str
    fields: tuple[str, ...]
    input_schema: dict[str, Any]

    @abc.abstractmethod
    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Answer one call: a JSON object (``ok: false`` answers included).

        :raises ActionError: when the verb cannot answer (``invalid-input``, ``unavailable``,
            ``job-corrupt`` ...).
        """


class JobVerb(Verb):
    """A verb over the jobs store, reached through the late-bound :class:`JobsBackend`.

    :param backend: the role's backend.
    """

    def __init__(self, backend: JobsBackend) -> None:
        self.backend = backend

    def _accept(self, input: dict[str, Any]) -> tuple[Any, Submitter]:
        """The bound store and submitter, once ``input`` names only the verb's fields.

        :raises Unavailable: no database configured, or the role is not running.
        :raises InvalidInput: a field the verb does not accept.
        """
        store, submitter = self.backend.require()
        only_known(self.name, input, self.fields)
        return store, submitter


class ControlVerb(JobVerb):
    """An operator verb (scope ``job-control``): ``jobId``, an optional ``reason``, and one
    log line per call naming the caller (``action`` = the verb's name in snake case).

    ``statuses`` is the verb's state rule: the job statuses it acts on (any other is answered
    ``ok: false`` naming the status). It is published in the input schema under
    :data:`JOB_STATUSES_KEY`, so a surface (the dashboard) offers the verb only where it applies
    without a copy of the rule; an integration test holds the store's SQL to it.
    """

    scope = "job-control"
    fields: tuple[str, ...] = ("jobId", "reason")
    statuses: tuple[str, ...] = ()

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = control_schema()

    @property
    def input_schema(self) -> dict[str, Any]:
        """The verb's JSON Schema, annotated with :data:`JOB_STATUSES_KEY` when the verb
        declares its statuses."""
        if not self.statuses:
            return self._schema
        return {**self._schema, JOB_STATUSES_KEY: list(self.statuses)}

    @input_schema.setter
    def input_schema(self, schema: dict[str, Any]) -> None:
        self._schema = schema

    def _begin(self, input: dict[str, Any]) -> tuple[Any, uuid.UUID, str | None]:
        """The store, the ``jobId`` and the ``reason`` (None when blank) of a call.

        :raises Unavailable: no database configured.
        :raises InvalidInput: an unknown field, a malformed ``jobId`` or ``reason``.
        """
        store, _ = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        return store, job_id, optional_reason(input)

    def _log(self, job_id: uuid.UUID, status: str | None, reason: str | None) -> None:
        log.info(
            "%s on job %s: %s",
            self.name,
            job_id,
            status,
            extra={
                "action": self.name.replace("-", "_"),
                "job_id": str(job_id),
                "actor": actor(),
                "status": status,
                "reason": reason,
            },
        )


def control_schema(extra: dict[str, Any] | None = None, required: tuple[str, ...] = ()) -> dict:
    """The input schema of an operator verb: ``jobId``, the verb's ``extra`` properties, then
    ``reason``; ``jobId`` and ``required`` are required."""
    properties: dict[str, Any] = {
        "jobId": {"type": "string", "format": "uuid"},
        **(extra or {}),
        "reason": {
            "type": "string",
            "maxLength": MAX_REASON_CHARS,
            "description": "Why (kept in the job's history with the caller's principal).",
        },
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["jobId", *required],
        "additionalProperties": False,
    }


def actor() -> str:
    """The calling principal, recorded with every change a verb makes."""
    return current_principal()


# --------------------------------------------------------------------------------------
# Field readers: every failure is invalid-input naming the field
# --------------------------------------------------------------------------------------


def invalid(field: str, message: str) -> InvalidInput:
    """``invalid-input`` naming ``field`` (``details.field``)."""
    return InvalidInput(message, {"field": field})


def only_known(verb: str, input: dict[str, Any], known: tuple[str, ...]) -> None:
    """:raises InvalidInput: ``input`` has a key not in ``known`` (named, ASCII-escaped)."""
    for key in input:
        if key not in known:
            # ascii(): the name is echoed, and a lone surrogate in it must not break a reply.
            name = ascii(str(key))[1:-1]
            raise invalid(name, f"Unknown field '{name}'; {verb} accepts: {', '.join(known)}")


def require_string(input: dict[str, Any], field: str) -> str:
    """:raises InvalidInput: ``field`` is missing, not a string, or text PostgreSQL refuses."""
    value = input.get(field)
    if value is None:
        raise invalid(field, f"Missing required string field '{field}'")
    if not isinstance(value, str):
        raise invalid(field, f"Field '{field}' must be a string")
    return check_text(field, value)


def optional_string(input: dict[str, Any], field: str) -> str | None:
    """``field``, or None when absent or null.

    :raises InvalidInput: not a string, or text PostgreSQL refuses.
    """
    value = input.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(field, f"Field '{field}' must be a string")
    return check_text(field, value)


def require_object(input: dict[str, Any], field: str) -> dict[str, Any]:
    """:raises InvalidInput: ``field`` is missing, not an object, or holds a value PostgreSQL
    or proto3 JSON cannot keep (:func:`protomolt_jobs.input_rules.check_json`)."""
    value = input.get(field)
    if value is None:
        raise invalid(field, f"Missing required object field '{field}'")
    if not isinstance(value, dict):
        raise invalid(field, f"Field '{field}' must be a JSON object")
    check_json(field, value)
    return value


def optional_object(input: dict[str, Any], field: str) -> dict[str, Any] | None:
    """``field``, or None when absent or null.

    :raises InvalidInput: as :func:`require_object`.
    """
    value = input.get(field)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(field, f"Field '{field}' must be a JSON object")
    check_json(field, value)
    return value


def as_integer(value: Any) -> int | None:
    """``value`` as an int (an integral finite float included), None for anything else
    (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def as_job_id(raw: str) -> uuid.UUID:
    """:raises InvalidInput: ``raw`` is not a uuid (field ``jobId``)."""
    parsed = parse_job_id(raw)
    if parsed is None:
        raise invalid("jobId", f"'jobId' must be a uuid; got '{raw}'")
    return parsed


def optional_reason(input: dict[str, Any]) -> str | None:
    """An operator's ``reason``, None when absent or blank.

    :raises InvalidInput: not a string, or longer than :data:`MAX_REASON_CHARS`.
    """
    reason = optional_string(input, "reason")
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise invalid("reason", f"Field 'reason' must be at most {MAX_REASON_CHARS} characters")
    return reason if reason and reason.strip() else None


# --------------------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------------------


def not_found(job_id: uuid.UUID) -> dict[str, Any]:
    """``{ok: false, error: "no workflow run <id>"}``."""
    return {"ok": False, "error": f"no workflow run {job_id}"}


def wrong_state(
    job_id: uuid.UUID, status: str, outstanding: str | None, step: str
) -> dict[str, Any]:
    """``{ok: false, status, outstandingStep?, error}``: the job is not parked on ``step``."""
    where = f", parked on step '{outstanding}'" if outstanding else ""
    body: dict[str, Any] = {"ok": False, "status": status}
    if outstanding is not None:
        body["outstandingStep"] = outstanding
    body["error"] = f"job {job_id} is {status}{where}; it is not waiting on step '{step}'"
    return body


def refused(job_id: uuid.UUID, status: str | None, message: str, **extra: Any) -> dict[str, Any]:
    """``{ok: false, status, **extra, error: "job <id> is <status>; <message>"}``, or the
    not-found answer when ``status`` is None (the job does not exist)."""
    if status is None:
        return not_found(job_id)
    return {"ok": False, "status": status, **extra, "error": f"job {job_id} is {status}; {message}"}


def corrupt_snapshot(exc: SnapshotError) -> JobCorrupt:
    """``job-corrupt`` for a verb that must act on a job's stored definition and cannot use it
    (:class:`~protomolt_jobs.runs.stored_run.SnapshotError` of any kind): ``the job's stored
    workflow definition is not readable: ...`` or ``... does not parse: ...``."""
    if exc.kind == "not-object":
        return JobCorrupt(
            "the job's stored workflow definition is not readable: "
            f"expected a JSON object, found {exc.found}"
        )
    if exc.kind == "unreadable":
        return JobCorrupt(f"the job's stored workflow definition is not readable: {exc.detail}")
    return JobCorrupt(f"the job's stored workflow definition does not parse: {exc.detail}")


def unreadable_row(job: Any) -> JobCorrupt:
    """``job-corrupt`` for a row whose stored JSON the store could not decode
    (``job.unreadable`` names the columns); details ``{jobId, status}``."""
    return JobCorrupt(
        f"job {job.job_id} has stored JSON that cannot be read: {job.unreadable}",
        {"jobId": str(job.job_id), "status": job.status},
    )
