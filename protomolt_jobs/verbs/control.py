"""The operator verbs (issue 15; ``docs/verbs.md`` "Operator control"): ``cancel-job``,
``pause-job``, ``resume-job``, ``retry-step`` and ``requeue-job``.

Each takes ``jobId`` and an optional ``reason``, makes one store call, is recorded in the
transition log with the caller's principal and logs one line (``action`` = the verb). A job in
a status the verb does not accept answers ``ok: false`` naming the status.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from protomolt_jobs.runs.report import iso_instant
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import (
    ControlVerb,
    JobsBackend,
    actor,
    control_schema,
    corrupt_snapshot,
    invalid,
    not_found,
    optional_string,
    refused,
    require_string,
    unreadable_row,
)
from protomolt_jobs.verbs.local_time import DAYS, local_fields, resolve_at
from protomolt_jobs.workflow.graph import requeue_checkpoints
from protomolt_jobs.workflow.retry_scope import SCOPES, LoopRetryError, plan_retry, unproven_intents
from protomolt_jobs.workflow.types import EFFECT_EXTERNAL

__all__ = [
    "CANCEL_STATUSES",
    "LATEST_AT",
    "PAUSE_STATUSES",
    "REQUEUE_STATUSES",
    "RESUME_STATUSES",
    "RETRY_STEP_STATUSES",
    "CancelJobAction",
    "PauseJobAction",
    "RequeueJobAction",
    "ResumeJobAction",
    "RetryStepAction",
]

#: The latest resume time accepted (a day short of year 10000, whatever the session's zone).
LATEST_AT = datetime(9999, 12, 30, tzinfo=UTC)
#: Statuses retry-step accepts.
RETRY_STEP_STATUSES = ("FAILED", "DEAD", "CANCELLED", "PAUSED", "COMPLETED")
#: Statuses cancel-job acts on (a RUNNING one is cancelled at its next boundary; one with a
#: cancel already requested answers ok: false). The store's ``job_control_cancel`` holds the same.
CANCEL_STATUSES = ("QUEUED", "RUNNING", "WAITING", "PAUSED", "RECOVERY_REQUIRED")
#: Statuses pause-job acts on (a RUNNING one with a request pending answers ok: false).
PAUSE_STATUSES = ("QUEUED", "RUNNING", "WAITING")
#: Statuses resume-job acts on (it also withdraws a RUNNING job's pending pause request, which
#: the status alone does not show).
RESUME_STATUSES = ("PAUSED",)
#: Statuses requeue-job acts on.
REQUEUE_STATUSES = ("DEAD", "FAILED")


class CancelJobAction(ControlVerb):
    """``cancel-job`` (scope ``job-control``): stop a job for good, keeping its checkpoints."""

    name = "cancel-job"
    description = (
        "Cancel a job ('jobId', optional 'compensate' and 'reason'): QUEUED, WAITING or "
        "PAUSED jobs are CANCELLED at once; a RUNNING job is CANCELLED at its next checkpoint "
        "boundary: a step without an external effect has its call cancelled, an external step "
        "finishes and is checkpointed. 'compensate' false runs no compensation step (default: "
        "the workflow's cancel.compensate, true when absent); a finished job answers ok: false."
    )
    fields = ("jobId", "compensate", "reason")
    statuses = CANCEL_STATUSES

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = control_schema(
            {
                "compensate": {
                    "type": "boolean",
                    "description": "run the compensation steps of the run's succeeded steps "
                    "(default: the workflow's cancel.compensate, true when absent)",
                }
            }
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "CANCELLED"}``; ``{ok: true, status: "RUNNING",
            requested: "cancel", message}`` (binding: it ends CANCELLED); ``{ok: false,
            status, error}`` for a finished job; ``{ok: false, error}`` for an unknown one.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field (``compensate`` not a boolean).
        """
        store, job_id, reason = self._begin(input)
        compensate = input.get("compensate")
        if compensate is not None and not isinstance(compensate, bool):
            raise invalid("compensate", "Field 'compensate' must be a boolean")
        outcome = store.job_cancel(job_id, actor=actor(), reason=reason, compensate=compensate)
        self._log(job_id, outcome.status, reason)
        if outcome.changed and outcome.status == "CANCELLED":
            return {"ok": True, "status": "CANCELLED"}
        if outcome.status == "RUNNING" and (
            outcome.changed or (outcome.control or {}).get("kind") == "cancel"
        ):
            return {
                "ok": True,
                "status": "RUNNING",
                "requested": "cancel",
                "message": "cancel requested: a step without an external effect has its call "
                "cancelled, an external step finishes and is checkpointed, then the job is "
                "CANCELLED (binding: it can no longer complete)",
            }
        return refused(job_id, outcome.status, "only a job that has not finished can be cancelled")


class PauseJobAction(ControlVerb):
    """``pause-job`` (scope ``job-control``): stop a job at a checkpoint boundary until resumed."""

    name = "pause-job"
    description = (
        "Pause a job ('jobId', optional 'reason'): QUEUED and WAITING jobs are PAUSED at once "
        "(a parked step is remembered); a RUNNING job is PAUSED after its step in flight is "
        "checkpointed, releasing its lease; resume-job sends it back."
    )
    statuses = PAUSE_STATUSES

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "PAUSED", outstandingStep?}``; ``{ok: true, status:
            "RUNNING", requested: "pause", message}``; ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field.
        """
        store, job_id, reason = self._begin(input)
        outcome = store.job_pause(job_id, actor=actor(), reason=reason)
        self._log(job_id, outcome.status, reason)
        if outcome.status == "PAUSED":
            body: dict[str, Any] = {"ok": True, "status": "PAUSED"}
            if outcome.outstanding_step:
                body["outstandingStep"] = outcome.outstanding_step
            return body
        if outcome.status == "RUNNING":
            pending = (outcome.control or {}).get("kind")
            if outcome.changed or pending == "pause":
                return {
                    "ok": True,
                    "status": "RUNNING",
                    "requested": "pause",
                    "message": "pause requested: the job is PAUSED once its step in flight is "
                    "checkpointed",
                }
            return refused(
                job_id, "RUNNING", f"a {pending} is already requested", requested=pending
            )
        return refused(job_id, outcome.status, "only a QUEUED, WAITING or RUNNING job can pause")


class ResumeJobAction(ControlVerb):
    """``resume-job`` (scope ``job-control``): send a PAUSED job back, now or at a time."""

    name = "resume-job"
    description = (
        "Resume a PAUSED job ('jobId', optional 'at', 'zone' (or 'tz'), 'day', and 'reason'): "
        "it is QUEUED to start no earlier than 'at' (database clock; past or absent means now), "
        "or WAITING again on its parked step. 'at' is an RFC 3339 time with an offset, or with "
        "'zone' (an IANA zone) a local date and time, or a time of day ('22:00') on 'day' "
        "('today', 'tomorrow', or 'next', the default: the next time the zone's clock shows "
        "it), resolved by the database (a time the clocks skip is refused, one they pass twice "
        "is the first). On a RUNNING job it withdraws a pending pause."
    )
    fields = ("jobId", "at", "zone", "tz", "day", "reason")
    statuses = RESUME_STATUSES

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = control_schema(
            {
                "at": {
                    "type": "string",
                    "description": "RFC 3339 time with an offset, or with 'zone' a local date "
                    "and time (2026-12-03T22:00); compared with the database clock.",
                },
                "zone": {
                    "type": "string",
                    "description": "IANA time zone of a local 'at' (Europe/Warsaw).",
                },
                "tz": {
                    "type": "string",
                    "description": "Another name for 'zone' (give one of them).",
                },
                "day": {
                    "type": "string",
                    "enum": list(DAYS),
                    "description": "With a time of day in 'at' ('22:00'): today, tomorrow "
                    "(the next calendar day in the zone) or next (default: the next time "
                    "the zone's clock shows it).",
                },
            }
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED", runAfter}``, ``{ok: true, status:
            "WAITING", outstandingStep, ignored?: {at}}`` (``ignored.at``: the job went back to its
            parked step, so a given ``at`` planned nothing), ``{ok: true, status: "RUNNING", withdrawn:
            "pause"}`` or ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field; ``at`` not an RFC 3339 time with an offset
            (without ``zone``), or a local time the zone cannot resolve (verbs/local_time.py).
        """
        store, job_id, reason = self._begin(input)
        at = resolve_at(store, input) if local_fields(input) else _rfc3339(input, "at")
        outcome = store.job_resume(job_id, actor=actor(), reason=reason, at=at)
        self._log(job_id, outcome.status, reason)
        if outcome.changed and outcome.status == "RUNNING":
            return {"ok": True, "status": "RUNNING", "withdrawn": "pause"}
        if outcome.changed:
            body: dict[str, Any] = {"ok": True, "status": outcome.status}
            if outcome.status == "WAITING":
                body["outstandingStep"] = outcome.outstanding_step
                if at is not None:
                    # A job paused while it waited goes back to its parked step, which runs
                    # when someone decides it: there is no start to defer. Say so rather
                    # than let the caller believe a time was planned.
                    body["ignored"] = {
                        "at": "a job paused while WAITING goes back to WAITING on its parked "
                        "step; it has no start to defer"
                    }
            else:
                body["runAfter"] = iso_instant(outcome.run_after)
            return body
        return refused(job_id, outcome.status, "only a PAUSED job can be resumed")


_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339(input: dict[str, Any], field: str) -> datetime | None:
    raw = optional_string(input, field)
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    moment = None
    # RFC 3339 (section 5.6): full date, "T", full time, an offset ("Z" or "+hh:mm"); "t" and
    # "z" may be lower case. fromisoformat alone also takes ISO 8601 forms that are not RFC
    # 3339 (week dates "2026-W01-1T...", basic "20260101T2200Z", no seconds).
    if _RFC3339.fullmatch(text):
        try:
            moment = datetime.fromisoformat(text.upper())
        except ValueError:
            moment = None
    if moment is None or moment.tzinfo is None:
        raise invalid(
            field,
            f"Field '{field}' must be an RFC 3339 time with an offset "
            f"(like 2026-01-01T22:00:00Z), or a local time with 'zone'; got '{raw}'",
        )
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        # Beyond the Python datetime range once in UTC: year 1 with a positive offset is in
        # the past (which means now); 9999-12-31 with a negative one is after year 10000.
        if moment.year <= 1:
            return None
        utc = None
    if utc is None or utc >= LATEST_AT:
        # PostgreSQL would store it, but psycopg cannot load a time after year 9999 in the
        # session's time zone (up to +14:00), so every later read of the row would fail.
        raise invalid(
            field,
            f"Field '{field}' must be earlier than {iso_instant(LATEST_AT)}; got '{raw}'",
        )
    return moment


class RetryStepAction(ControlVerb):
    """``retry-step`` (scope ``job-control``): run one step again, and its dependants as the
    ``scope`` says (``workflow/retry_scope.py``)."""

    name = "retry-step"
    description = (
        "Retry one step ('jobId', 'stepName', optional 'scope', 'newIdempotencyKey', 'reason') "
        "of a FAILED, DEAD, CANCELLED, PAUSED or COMPLETED job: its checkpoint is dropped and "
        "the job is QUEUED with fresh attempts. scope 'dependants' (default): the steps that "
        "depend on it run again too; scope 'only': they are kept and run again only if the "
        "step's new output differs from the checkpointed one (by hash). Either way a dependant "
        "with an external effect whose result is recorded is never run again; the step itself, "
        "when external, keeps its idempotency key unless 'newIdempotencyKey' is true."
    )
    fields = ("jobId", "stepName", "scope", "newIdempotencyKey", "reason")
    statuses = RETRY_STEP_STATUSES

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = control_schema(
            {
                "stepName": {"type": "string"},
                "scope": {
                    "type": "string",
                    "enum": list(SCOPES),
                    "description": "dependants (default): the step and the steps depending on "
                    "it run again; only: the step alone, its dependants only if its output "
                    "changed",
                },
                "newIdempotencyKey": {
                    "type": "boolean",
                    "description": "an external step gets a new idempotency key (default: its "
                    "call carries the key it had)",
                },
            },
            ("stepName",),
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED", dropped: [step...], scope?, rerunIfChanged?:
            [step...], keptEffects?: [step...]}`` (``scope`` when it was given; the lists when
            not empty) or ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field (``scope`` not ``only``/``dependants``,
            ``newIdempotencyKey`` not a boolean); a step the workflow does not have.
        :raises JobCorrupt: the job's stored definition or checkpoints cannot be read.
        """
        store, job_id, reason = self._begin(input)
        step_name = require_string(input, "stepName")
        given_scope = optional_string(input, "scope")
        if given_scope is not None and given_scope not in SCOPES:
            raise invalid(
                "scope", f"Field 'scope' must be one of {', '.join(SCOPES)}; got '{given_scope}'"
            )
        scope = given_scope or SCOPES[0]
        new_key = input.get("newIdempotencyKey", False)
        if new_key is None:
            new_key = False
        if not isinstance(new_key, bool):
            raise invalid("newIdempotencyKey", "Field 'newIdempotencyKey' must be a boolean")
        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        if job.status not in RETRY_STEP_STATUSES:
            return refused(
                job_id,
                job.status,
                f"retry-step needs one of {', '.join(RETRY_STEP_STATUSES)}",
            )
        if getattr(job, "unreadable", None):
            raise unreadable_row(job)
        try:
            stored = StoredRun.load(job, self.runtime)
        except SnapshotError as exc:
            # The checkpoints to drop come from the definition: without it, job-corrupt.
            raise corrupt_snapshot(exc) from exc
        if step_name not in stored.step_names():
            raise invalid("stepName", f"the workflow has no step named '{step_name}'")
        try:
            plan = plan_retry(
                stored.workflow,
                list(job.checkpoints or []),
                step_name,
                scope=scope,
                downstream=stored.dependants().get(step_name, ()),
            )
        except LoopRetryError as exc:
            return refused(job_id, job.status, str(exc))
        # An intent without a checkpoint is an external effect nothing proves (a run that was
        # RECOVERY_REQUIRED, then cancelled): only the retried step's own is the operator's word
        # (it is called again); any other stays, so the run asks its probe (or waits as
        # RECOVERY_REQUIRED) instead of calling it blindly.
        # In a loop run an intent is proven only by its own iteration's checkpoint.
        intents = unproven_intents(
            dict(getattr(job, "effect_intents", None) or {}),
            job.checkpoints or [],
            retried=step_name,
        )
        declared = stored.workflow.step(step_name)
        external = declared is not None and declared.effect == EFFECT_EXTERNAL
        outcome = store.job_retry_step(
            job_id,
            step=step_name,
            checkpoints=plan.checkpoints,
            intents=intents or None,
            expected_status=job.status,
            expected_history_seq=job.history_seq,
            actor=actor(),
            reason=_recorded_reason(given_scope, external and new_key, reason),
            # An external step called again keeps its idempotency key (the adapter answers a
            # repeated key with its first answer) unless the operator asks for a new one.
            bump_generation=not external or new_key,
        )
        self._log(job_id, outcome.status, reason)
        if outcome.changed:
            body: dict[str, Any] = {"ok": True, "status": "QUEUED", "dropped": plan.dropped}
            if given_scope is not None:
                body["scope"] = scope
            if plan.provisional:
                body["rerunIfChanged"] = plan.provisional
            if plan.kept_effects:
                body["keptEffects"] = plan.kept_effects
            return body
        if outcome.conflict:
            return refused(job_id, outcome.status, outcome.conflict)
        return refused(
            job_id, outcome.status, "it changed while the retry was prepared; read it and retry"
        )


def _recorded_reason(scope: str | None, new_key: bool, reason: str | None) -> str | None:
    """The history's reason of a retry-step: ``scope <scope>`` when a scope was given, ``new
    idempotency key`` when one was asked for, then the operator's reason (``; ``-joined)."""
    parts = [f"scope {scope}"] if scope is not None else []
    if new_key:
        parts.append("new idempotency key")
    if reason:
        parts.append(reason)
    return "; ".join(parts) or None


class RequeueJobAction(ControlVerb):
    """``requeue-job`` (scope ``job-control``): run a DEAD or FAILED job again."""

    name = "requeue-job"
    description = (
        "Requeue a DEAD or FAILED job ('jobId', optional 'reason'): QUEUED now with fresh "
        "attempts, its checkpoints kept (it resumes at the first missing step); the old error "
        "stays in its history."
    )
    statuses = REQUEUE_STATUSES

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED"}`` or ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field.
        """
        store, job_id, reason = self._begin(input)
        _, submitter = self.backend.require()
        kept = _graph_requeue_checkpoints(store.job_get(job_id), submitter)
        outcome = store.job_requeue(job_id, actor=actor(), reason=reason, checkpoints=kept)
        self._log(job_id, outcome.status, reason)
        if outcome.changed:
            return {"ok": True, "status": "QUEUED"}
        if outcome.conflict:
            return refused(job_id, outcome.status, outcome.conflict)
        return refused(job_id, outcome.status, "only a DEAD or FAILED job can be requeued")


def _graph_requeue_checkpoints(job: Any, submitter: Any) -> list[dict[str, Any]] | None:
    """For a DEAD or FAILED graph run: the checkpoints a requeue keeps
    (``graph.requeue_checkpoints``: a graph's failed entries are final on replay, so keeping
    them would fail the run again at once); None for anything else (checkpoints kept as
    they are)."""
    if job is None or job.status not in ("DEAD", "FAILED"):
        return None
    runtime = getattr(submitter, "runtime", None)
    if runtime is None:
        return None
    try:
        stored = StoredRun.load(job, runtime)
    except SnapshotError:
        return None  # the definition only refines the requeue: without it, keep them all
    if not stored.workflow.graph:
        return None
    return requeue_checkpoints(stored.workflow, job.checkpoints or [])
