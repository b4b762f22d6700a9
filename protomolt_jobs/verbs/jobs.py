"""The four job verbs: ``submit-workflow``, ``get-job``, ``list-jobs``, ``complete-step``.

Envelopes, messages and defaults follow the reference (upstream ``jobs/service/actions``), with
the deliberate differences of DESIGN.md section 4 and ``docs/verbs.md``:

- ``submit-workflow`` enforces exactly one definition source with the CEL rule
  :data:`SOURCE_RULE` on ``{workflow?, workflow_name}``; breaking it is ``invalid-input``.
- Every field error is ``invalid-input`` naming the field (``details.field``), unknown fields
  included (the input schemas say ``additionalProperties: false`` and are enforced); a
  missing or non-object ``input`` and a malformed ``jobId`` on submit are ``invalid-input``
  too, not ``ok: false`` answers.
- Values PostgreSQL cannot store (NUL characters, lone surrogates, non-finite numbers) are
  refused up front, and so are integers beyond +-2**53 (:data:`MAX_JSON_INT`): protobuf's
  ``Struct`` holds numbers as doubles, so a larger one could not be read back over gRPC. The
  rule lives in :mod:`protomolt_jobs.input_rules`, shared with the request topic.
- With no database configured every verb raises ``unavailable`` saying how to configure one.

Answers with ``ok: false`` (unknown job, wrong state, a definition that does not verify) are
returns, never exceptions. Nothing here imports ``protomolt_jobs.host``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from protomolt_jobs.errors import InvalidInput, JobCorrupt, NotFound, Unavailable
from protomolt_jobs.input_rules import MAX_JSON_DEPTH, MAX_JSON_INT, proto_json_path
from protomolt_jobs.input_rules import check_json as _check_json
from protomolt_jobs.input_rules import check_text as _check_text
from protomolt_jobs.input_rules import invalid as _input_invalid
from protomolt_jobs.runs.report import iso_instant
from protomolt_jobs.runs.submitter import Submitter, parse_job_id
from protomolt_jobs.store.records import (
    JOB_STATUSES,
    TERMINAL_STATUSES,
    AlreadyDone,
    ParkedStepCompleted,
    WrongState,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "NOT_CONFIGURED",
    "SOURCE_RULE",
    "CompleteStepAction",
    "GetJobAction",
    "JobsBackend",
    "ListJobsAction",
    "SubmitWorkflowAction",
    "iso_instant",
    "job_json",
    "jobs_actions",
]

log = logging.getLogger("protomolt_jobs.job_verbs")

#: The ``unavailable`` message of a node without ``jobs.dsn``.
NOT_CONFIGURED = (
    "workflow runs are not configured on this node "
    "(set jobs.dsn in protomolt.toml or PROTOMOLT_JOBS_DSN)"
)
#: The ``unavailable`` message of a configured node whose jobs role is not running.
NOT_RUNNING = (
    "workflow runs are not running on this node (the jobs role has not started or has closed)"
)
#: ``submit-workflow``: exactly one definition source (CEL over ``{workflow?, workflow_name}``).
SOURCE_RULE = "has(this.workflow) != (this.workflow_name != '')"
#: Largest offset PostgreSQL's bigint holds.
_MAX_OFFSET = 2**63 - 1
_MAX_LIMIT = 500


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
# Field readers: every failure is invalid-input naming the field
# --------------------------------------------------------------------------------------


def _invalid(field: str, message: str) -> InvalidInput:
    return InvalidInput(message, {"field": field})


def _only_known(verb: str, input: dict[str, Any], known: tuple[str, ...]) -> None:
    for key in input:
        if key not in known:
            # ascii(): the name is echoed, and a lone surrogate in it must not break a reply.
            name = ascii(str(key))[1:-1]
            raise _invalid(name, f"Unknown field '{name}'; {verb} accepts: {', '.join(known)}")


def _require_string(input: dict[str, Any], field: str) -> str:
    value = input.get(field)
    if value is None:
        raise _invalid(field, f"Missing required string field '{field}'")
    if not isinstance(value, str):
        raise _invalid(field, f"Field '{field}' must be a string")
    return _check_text(field, value)


def _optional_string(input: dict[str, Any], field: str) -> str | None:
    value = input.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid(field, f"Field '{field}' must be a string")
    return _check_text(field, value)


def _require_object(input: dict[str, Any], field: str) -> dict[str, Any]:
    value = input.get(field)
    if value is None:
        raise _invalid(field, f"Missing required object field '{field}'")
    if not isinstance(value, dict):
        raise _invalid(field, f"Field '{field}' must be a JSON object")
    _check_json(field, value)
    return value


def _optional_object(input: dict[str, Any], field: str) -> dict[str, Any] | None:
    value = input.get(field)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(field, f"Field '{field}' must be a JSON object")
    _check_json(field, value)
    return value


def _as_integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _job_id(raw: str) -> uuid.UUID:
    parsed = parse_job_id(raw)
    if parsed is None:
        raise _invalid("jobId", f"'jobId' must be a uuid; got '{raw}'")
    return parsed


# --------------------------------------------------------------------------------------
# The job document
# --------------------------------------------------------------------------------------


def job_json(job: Any, *, full: bool) -> dict[str, Any]:
    """A job row as the verbs show it (camelCase, nulls omitted).

    Keys in order: ``jobId, workflowName, status, attempt, outstandingStep?, priority,
    queue, fairnessKey, dedupKey?, deadlineAt?``, then when ``full`` ``maxAttempts, runAfter,
    control?, input, checkpoints, effectIntents?, stepGenerations?, result?``, then ``verdict?, error?, createdAt?, updatedAt?,
    completedAt?``. Never shown: the lease, the fairness pass, the definition.
    """
    body: dict[str, Any] = {
        "jobId": str(job.job_id),
        "workflowName": job.workflow_name,
        "status": job.status,
        "attempt": job.attempt,
    }
    if job.outstanding_step is not None:
        body["outstandingStep"] = job.outstanding_step
    body["priority"] = getattr(job, "priority", 3)
    body["queue"] = getattr(job, "queue", "default")
    body["fairnessKey"] = getattr(job, "fairness_key", "default")
    if getattr(job, "dedup_key", None) is not None:
        body["dedupKey"] = job.dedup_key
    if getattr(job, "deadline_at", None) is not None:
        body["deadlineAt"] = iso_instant(job.deadline_at)
    if full:
        body["maxAttempts"] = job.max_attempts
        body["runAfter"] = iso_instant(job.run_after)
        control = getattr(job, "control", None)
        if control:
            body["control"] = control
        body["input"] = job.input
        body["checkpoints"] = job.checkpoints if job.checkpoints is not None else []
        # step effects (issue #17): intents of external steps, retry-step generations
        if getattr(job, "effect_intents", None):
            body["effectIntents"] = job.effect_intents
        if getattr(job, "step_generations", None):
            body["stepGenerations"] = job.step_generations
        if job.result is not None:
            body["result"] = job.result
    for key, value in (
        ("verdict", job.verdict),
        ("error", job.error),
        ("createdAt", iso_instant(job.created_at)),
        ("updatedAt", iso_instant(job.updated_at)),
        ("completedAt", iso_instant(job.completed_at)),
    ):
        if value is not None:
            body[key] = value
    return body


def _report(store: Any, job: Any, runtime: Any) -> dict[str, Any]:
    """The final report of a terminal job (:mod:`protomolt_jobs.runs.report`)."""
    from protomolt_jobs.runs.report import report_json

    history = store.job_history(job.job_id)
    transitions = history.transitions if history is not None else ()
    try:
        order, _ = _step_graph(job, runtime)
    except JobCorrupt:  # a snapshot that does not parse: report what was checkpointed
        order = [str(c.get("name")) for c in job.checkpoints or [] if isinstance(c, dict)]
    graph = _graph_report(job, runtime)
    depends = graph.pop("_depends", None) if graph is not None else None
    return report_json(job, order, transitions, graph=graph, depends=depends)


def _wrong_state(job_id: uuid.UUID, status: str, outstanding: str | None, step: str) -> dict:
    where = f", parked on step '{outstanding}'" if outstanding else ""
    body: dict[str, Any] = {"ok": False, "status": status}
    if outstanding is not None:
        body["outstandingStep"] = outstanding
    body["error"] = f"job {job_id} is {status}{where}; it is not waiting on step '{step}'"
    return body


def _not_found(job_id: uuid.UUID) -> dict[str, Any]:
    return {"ok": False, "error": f"no workflow run {job_id}"}


# --------------------------------------------------------------------------------------
# The verbs
# --------------------------------------------------------------------------------------


class SubmitWorkflowAction:
    """``submit-workflow`` (scope ``workflow-run``): queue a workflow run as a durable job."""

    name = "submit-workflow"
    scope = "workflow-run"
    description = (
        "Queue a workflow run as a durable job: give either an inline 'workflow' or a stored "
        "'workflowName' (exactly one), its 'input', and optionally a 'jobId' (uuid) that makes "
        "the submission idempotent, a 'priority' (1 highest .. 5, default 3), a 'queue', a "
        "'fairnessKey' and a 'dedupKey' (while a run with that key is live, its id is "
        "answered with deduplicated: true); answers the job id and status."
    )
    fields = (
        "workflow",
        "workflowName",
        "input",
        "jobId",
        "priority",
        "queue",
        "fairnessKey",
        "dedupKey",
    )

    def __init__(self, backend: JobsBackend) -> None:
        self.backend = backend
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "workflow": {
                    "type": "object",
                    "description": "An inline workflow definition (the run-workflow envelope).",
                },
                "workflowName": {
                    "type": "string",
                    "description": "The name of a workflow stored in the registry.",
                },
                "input": {"type": "object", "description": "Proto3 JSON of the inputType."},
                "jobId": {
                    "type": "string",
                    "format": "uuid",
                    "description": "Idempotency key; a uuid4 is minted when absent.",
                },
                "priority": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 5,
                    "description": "1 (highest) .. 5; default: the workflow's, else 3.",
                },
                "queue": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "Resource class; default: the workflow's, else 'default'.",
                },
                "fairnessKey": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "Tenant or project runs are interleaved across; default: "
                    "the workflow's, else 'default'.",
                },
                "dedupKey": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "While a run with this key is not terminal, submitting "
                    "again answers that run (deduplicated: true).",
                },
            },
            "required": ["input"],
            "additionalProperties": False,
            "x-cel-rules": [{"id": "exactly-one-source", "expression": SOURCE_RULE}],
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Validate the envelope, then hand it to the submitter.

        :returns: ``{ok: true, jobId, status}`` or ``{ok: false, failedStep?, error}``.
        :raises Unavailable: no database configured (or the role is not running).
        :raises InvalidInput: a field is missing, mistyped, unknown, or the source rule fails.
        """
        _, submitter = self.backend.require()
        _only_known(self.name, input, self.fields)
        workflow = _optional_object(input, "workflow")
        workflow_name = _optional_string(input, "workflowName")
        payload = _require_object(input, "input")
        raw_job_id = _optional_string(input, "jobId")
        sched = _scheduling_fields(input)
        _check_source_rule(workflow, workflow_name)
        job_id = None
        if raw_job_id is not None and raw_job_id.strip():
            job_id = str(_job_id(raw_job_id))
        outcome = submitter.submit(
            workflow=workflow,
            workflow_name=workflow_name,
            input=payload,
            job_id=job_id,
            actor=_actor(),
            **sched,
        )
        if outcome.reason in ("invalid-input", "invalid-job-id"):
            # Bad input is an error on every door (the request topic keeps a reject row with
            # the same reason): an input that is not proto3 JSON of the inputType, a misspelt
            # field ({"txt": ...} for "text") included, never an ok: false answer.
            raise _input_invalid(outcome.field or "input", outcome.error, outcome.path)
        return outcome.to_json()


def _scheduling_fields(input: dict[str, Any]) -> dict[str, Any]:
    """``priority``, ``queue``, ``fairnessKey``, ``dedupKey`` as the submitter's keywords
    (None when absent); a malformed one is invalid-input naming it."""
    from protomolt_jobs.runs import scheduling

    out: dict[str, Any] = {}
    try:
        raw = input.get("priority")
        if raw is not None and (isinstance(raw, str) or _as_integer(raw) is None):
            raise scheduling.FieldError(
                "priority", f"'priority' must be an integer from 1 (highest) to 5; got {raw!r}"
            )
        out["priority"] = None if raw is None else scheduling.parse_priority("priority", raw)
        for field, keyword in (
            ("queue", "queue"),
            ("fairnessKey", "fairness_key"),
            ("dedupKey", "dedup_key"),
        ):
            value = input.get(field)
            out[keyword] = None if value is None else scheduling.parse_name(field, value)
    except scheduling.FieldError as exc:
        raise _invalid(exc.field, exc.message) from None
    return out


def _check_source_rule(workflow: dict[str, Any] | None, workflow_name: str | None) -> None:
    from protomolt_jobs.workflow import celenv

    # Only presence matters to the rule: an empty object stands in for the definition, so
    # no user payload is converted to CEL values.
    this: dict[str, Any] = {"workflow_name": (workflow_name or "").strip()}
    if workflow is not None:
        this["workflow"] = {}
    verdict = celenv.program(SOURCE_RULE).evaluate({"this": celenv.to_cel(this)})
    if not bool(verdict):
        given = "both" if workflow is not None else "neither"
        raise InvalidInput(
            f"rule exactly-one-source ({SOURCE_RULE}) failed: give exactly one of 'workflow' "
            f"and 'workflowName' (got {given})",
            {"rule": SOURCE_RULE, "fields": ["workflow", "workflowName"]},
        )


class GetJobAction:
    """``get-job`` (scope ``service-invoke``): one job with input, checkpoints and result."""

    name = "get-job"
    scope = "service-invoke"
    description = (
        "Read one workflow job by 'jobId': status, attempt, parked step, input, checkpoints, "
        "result, verdict and error."
    )
    fields = ("jobId",)

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        self.backend = backend
        self.runtime = runtime
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {"jobId": {"type": "string", "format": "uuid"}},
            "required": ["jobId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, job}`` or ``{ok: false, error: "no workflow run <id>"}``; a
            finished run's ``job`` carries ``report`` (:mod:`protomolt_jobs.runs.report`):
            ``{"status", "steps": [{"name", "status", "reason"?}], "claims", "attempts",
            "durationsMs", "operatorActions"}``, plus ``"completionOrder", "criterion"`` for a
            graph run (whose steps are the graph's own account).

        :raises Unavailable: no database configured.
        :raises InvalidInput: missing, mistyped or non-uuid ``jobId``; unknown fields.
        :raises JobCorrupt: the row holds stored JSON that cannot be decoded.
        """
        store, submitter = self.backend.require()
        _only_known(self.name, input, self.fields)
        job_id = _job_id(_require_string(input, "jobId"))
        job = store.job_get(job_id)
        if job is None:
            return _not_found(job_id)
        if getattr(job, "unreadable", None):
            raise JobCorrupt(
                f"job {job_id} has stored JSON that cannot be read: {job.unreadable}",
                {"jobId": str(job_id), "status": job.status},
            )
        body = job_json(job, full=True)
        if job.status in TERMINAL_STATUSES:
            runtime = self.runtime or getattr(submitter, "runtime", None)
            body["report"] = _report(store, job, runtime)
        return {"ok": True, "job": body}


#: Statuses after which a graph run's final report is shown by get-job.
_REPORTED = frozenset({"COMPLETED", "FAILED", "DEAD", "CANCELLED"})


def _stored_graph(job: Any, runtime: Any) -> Any:
    """The job's stored definition parsed, when it is a graph workflow; None for a sequential
    one, without a runtime, or when the stored definition no longer parses (callers that only
    add graph extras to an answer never fail because of it)."""
    if runtime is None or not isinstance(job.workflow_definition, dict):
        return None
    from protomolt_jobs.workflow import WorkflowParseError, parse_workflow

    try:
        workflow = parse_workflow(job.workflow_definition, runtime)
    except (WorkflowParseError, RecursionError):
        return None
    return workflow if workflow.graph else None


def _graph_report(job: Any, runtime: Any) -> dict[str, Any] | None:
    """A finished graph run's final report (``graph.report_from_checkpoints``), else None.

    Sequential workflows have none here; a definition that no longer parses has none either
    (the read never fails because of it).
    """
    if job.status not in _REPORTED:
        return None
    workflow = _stored_graph(job, runtime)
    if workflow is None:
        return None
    from protomolt_jobs.workflow.graph import main_steps, report_from_checkpoints

    out = report_from_checkpoints(workflow, job.checkpoints or [], job.status, job.error)
    # Taken out again by _report: the dependencies time and count each step (job_report).
    out["_depends"] = {s.name: [d.step for d in s.depends] for s in main_steps(workflow)}
    return out


class ListJobsAction:
    """``list-jobs`` (scope ``service-invoke``): job summaries, newest first."""

    name = "list-jobs"
    scope = "service-invoke"
    description = (
        "List workflow jobs newest first, optionally filtered by 'status', 'workflowName', "
        "'queue' and 'fairnessKey'; 'limit' (default 50, at most 500) and 'offset' page "
        "through them."
    )
    fields = ("status", "workflowName", "queue", "fairnessKey", "limit", "offset")

    def __init__(self, backend: JobsBackend) -> None:
        self.backend = backend
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": sorted(JOB_STATUSES)},
                "workflowName": {"type": "string"},
                "queue": {"type": "string"},
                "fairnessKey": {"type": "string"},
                "limit": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "0 or absent means 50; above 500 is clamped to 500.",
                },
                "offset": {"type": "integer", "minimum": 0},
            },
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, jobs: [summary...]}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: unknown status, mistyped fields, negative limit or offset.
        """
        store, _ = self.backend.require()
        _only_known(self.name, input, self.fields)
        status = _optional_string(input, "status")
        if status is not None and status not in JOB_STATUSES:
            raise _invalid(
                "status",
                f"'status' must be one of {', '.join(sorted(JOB_STATUSES))}; got '{status}'",
            )
        workflow_name = _optional_string(input, "workflowName")
        queue = _optional_string(input, "queue")
        fairness_key = _optional_string(input, "fairnessKey")
        limit = 0
        if input.get("limit") is not None:
            limit_value = _as_integer(input["limit"])
            if limit_value is None:
                raise _invalid("limit", "Field 'limit' must be an integer")
            if limit_value < 0:
                raise _invalid("limit", "Field 'limit' must be >= 0")
            limit = min(limit_value, _MAX_LIMIT)
        offset = 0
        if input.get("offset") is not None:
            offset_value = _as_integer(input["offset"])
            if offset_value is None or offset_value < 0:
                raise _invalid("offset", "Field 'offset' must be a non-negative integer")
            if offset_value > _MAX_OFFSET:
                raise _invalid("offset", f"Field 'offset' must be at most {_MAX_OFFSET}")
            offset = offset_value
        filters: dict[str, Any] = {}
        if queue is not None:
            filters["queue"] = queue
        if fairness_key is not None:
            filters["fairness_key"] = fairness_key
        jobs = store.job_list(
            status=status, workflow_name=workflow_name, limit=limit, offset=offset, **filters
        )
        return {"ok": True, "jobs": [job_json(job, full=False) for job in jobs]}


class CompleteStepAction:
    """``complete-step`` (scope ``service-invoke``): supply the response of a parked step."""

    name = "complete-step"
    scope = "service-invoke"
    description = (
        "Supply the 'response' of the external step 'stepName' a job ('jobId') is parked on; "
        "the job resumes, or fails as a verdict when the response breaks the step's rules."
    )
    fields = ("jobId", "stepName", "response")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        self.backend = backend
        self.runtime = runtime
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "jobId": {"type": "string", "format": "uuid"},
                "stepName": {"type": "string"},
                "response": {
                    "type": "object",
                    "description": "Proto3 JSON of the step method's output type.",
                },
            },
            "required": ["jobId", "stepName", "response"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Gate, resolve the step, parse and (when declared) validate the response, then
        complete the parked step.

        :returns: ``{ok: true, status: "QUEUED"}`` (resumed), ``{ok: true, status}`` (already
            done), ``{ok: false, status, error}`` (the step is not external: the error names
            its kind), ``{ok: false, status, outstandingStep?, error}`` (wrong state),
            ``{ok: false, status: "FAILED", error}`` (rejected by the step's rules) or
            ``{ok: false, error: "no workflow run <id>"}``.
        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field, an unknown step, a response that is not
            proto3 JSON of the step's output type.
        :raises JobCorrupt: the job's stored definition cannot be read.
        """
        store, _ = self.backend.require()
        _only_known(self.name, input, self.fields)
        raw_job_id = _require_string(input, "jobId")
        step_name = _require_string(input, "stepName")
        response = _require_object(input, "response")
        job_id = _job_id(raw_job_id)

        job = store.job_get(job_id)
        if job is None:
            return _not_found(job_id)
        # Pre-gate without the lock; the store re-gates under the row lock.
        if job.status != "WAITING" or job.outstanding_step != step_name:
            if any(
                isinstance(c, dict) and c.get("name") == step_name for c in job.checkpoints or []
            ):
                _, done = self._resolve_step(job, step_name)
                if not done.external:
                    return _not_external(job.status, step_name, done)
                return {"ok": True, "status": job.status}
            return _wrong_state(job_id, job.status, job.outstanding_step, step_name)

        compiled, step = self._resolve_step(job, step_name)
        if not step.external:
            return _not_external(job.status, step_name, step)
        message = self._parse_response(step, response)

        if step.validate:
            from protomolt_jobs.workflow.validation import summarize, validate_message

            violations = validate_message(message)
            if violations:
                summary = summarize(violations)
                error = f"VALIDATION: complete-step response failed validation: {summary}"
                try:
                    outcome = store.job_fail_parked(job_id, step_name, error, actor=_actor())
                except NotFound:
                    return _not_found(job_id)
                if isinstance(outcome, ParkedStepCompleted):
                    log.info(
                        "job %s failed: response to %s broke its rules",
                        job_id,
                        step_name,
                        extra={
                            "action": "parked_step_rejected",
                            "job_id": str(job_id),
                            "step": step_name,
                        },
                    )
                    return {"ok": False, "status": "FAILED", "error": summary}
                return self._answer(job_id, step_name, outcome)

        from protomolt_jobs.workflow import checkpoint_entry

        # The canonical proto3 JSON of the parsed response (the same rendering the worker
        # uses, with the workflow's own type pool so an Any of a workflow type renders):
        # replay re-parses it against the step's output type, so unknown fields the caller
        # sent are not kept.
        try:
            entry = checkpoint_entry(step_name, message, compiled.pool)
            from protomolt_jobs.workflow.effects import stamp

            stamp(entry, compiled, step)  # fingerprinted: a later type change is seen on replay
        except Exception as exc:  # caller input: invalid-input, never a 500
            raise _invalid(
                "response",
                f"'response' cannot be rendered as proto3 JSON of "
                f"{step.output_type.full_name}: {exc}",
            ) from exc
        try:
            outcome = store.job_complete_parked(job_id, step_name, entry, actor=_actor())
        except NotFound:
            return _not_found(job_id)
        if isinstance(outcome, ParkedStepCompleted):
            log.info(
                "job %s resumed after %s",
                job_id,
                step_name,
                extra={"action": "parked_step_completed", "job_id": str(job_id), "step": step_name},
            )
        return self._answer(job_id, step_name, outcome)

    @staticmethod
    def _answer(job_id: uuid.UUID, step: str, outcome: Any) -> dict[str, Any]:
        if isinstance(outcome, ParkedStepCompleted):
            return {"ok": True, "status": "QUEUED"}
        if isinstance(outcome, AlreadyDone):
            return {"ok": True, "status": outcome.status}
        if isinstance(outcome, WrongState):
            return _wrong_state(job_id, outcome.status, outcome.outstanding_step, step)
        raise TypeError(f"unexpected parked completion {outcome!r}")

    def _resolve_step(self, job: Any, step_name: str) -> tuple[Any, Any]:
        from protomolt_jobs.workflow.envelope import parse_workflow
        from protomolt_jobs.workflow.types import WorkflowParseError

        definition = job.workflow_definition
        if not isinstance(definition, dict):
            raise JobCorrupt(
                "the job's stored workflow definition is not readable: "
                f"expected a JSON object, found {type(definition).__name__}"
            )
        try:
            compiled = parse_workflow(definition, self.runtime)
        except WorkflowParseError as exc:
            raise JobCorrupt(f"the job's stored workflow definition does not parse: {exc}") from exc
        step = compiled.step(step_name)
        if step is None:
            raise _invalid("stepName", f"the workflow has no step named '{step_name}'")
        if step.output_type is None:
            raise JobCorrupt(
                f"the job's stored workflow definition does not parse: step '{step_name}' "
                "has no resolvable method"
            )
        return compiled, step

    @staticmethod
    def _parse_response(step: Any, response: dict[str, Any]) -> Any:
        from google.protobuf import json_format, message_factory

        message = message_factory.GetMessageClass(step.output_type)()
        try:
            # Strict: a misspelt field in a human's answer ({"aproved": true}) is refused
            # naming it, never dropped so that the field silently takes its default.
            json_format.ParseDict(response, message, ignore_unknown_fields=False)
        except Exception as exc:  # ParseError, and TypeError/ValueError/OverflowError on odd values
            raise _input_invalid(
                "response",
                f"'response' is not valid proto3 JSON for {step.output_type.full_name}: {exc}",
                proto_json_path(str(exc)),
            ) from exc
        return message


def _not_external(status: str, step_name: str, step: Any) -> dict[str, Any]:
    # Only an external step is answered from outside; a call step's checkpoint is its
    # service's answer (upstream answers ok: true here; see docs/verbs.md).
    return {
        "ok": False,
        "status": status,
        "error": f"step '{step_name}' is a {step_kind(step)} step, not an external one "
        '(completion: "external"); only an external step can be completed',
    }


def step_kind(step: Any) -> str:
    """How a step runs, for messages: ``gRPC call`` (``completion: "invoke"``, the default),
    ``external``, or the ``completion`` value as written."""
    if step.external:
        return "external"
    completion = getattr(step, "completion", "") or "invoke"
    if completion == "invoke":
        return 'gRPC call (completion: "invoke")'
    return f'completion: "{completion}"'


def jobs_actions(backend: JobsBackend, runtime: Any) -> list[Any]:
    """The job verbs over one backend, in manifest order: the four of the reference, then
    the operator verbs (:func:`control_actions`)."""
    return [
        SubmitWorkflowAction(backend),
        GetJobAction(backend, runtime),
        ListJobsAction(backend),
        CompleteStepAction(backend, runtime),
        *control_actions(backend, runtime),
    ]


# --------------------------------------------------------------------------------------
# Operator control (issue 15; docs/verbs.md "Operator control")
# --------------------------------------------------------------------------------------

#: Longest operator reason kept (code points); longer is invalid-input.
MAX_REASON_CHARS = 2000
#: The latest resume time accepted (a day short of year 10000, whatever the session's zone).
LATEST_AT = datetime(9999, 12, 30, tzinfo=UTC)
#: Statuses retry-step accepts.
RETRY_STEP_STATUSES = ("FAILED", "DEAD", "CANCELLED", "PAUSED", "COMPLETED")


def _reason(input: dict[str, Any]) -> str | None:
    reason = _optional_string(input, "reason")
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise _invalid("reason", f"Field 'reason' must be at most {MAX_REASON_CHARS} characters")
    return reason if reason and reason.strip() else None


def _actor() -> str:
    from protomolt_jobs.hooks.contract import current_principal

    return current_principal()


def _control_schema(extra: dict[str, Any] | None = None, required: tuple = ()) -> dict[str, Any]:
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


def _refused(job_id: uuid.UUID, status: str | None, message: str, **extra: Any) -> dict:
    if status is None:
        return _not_found(job_id)
    return {"ok": False, "status": status, **extra, "error": f"job {job_id} is {status}; {message}"}


class _ControlVerb:
    scope = "job-control"
    fields: tuple[str, ...] = ("jobId", "reason")

    def __init__(self, backend: JobsBackend) -> None:
        self.backend = backend
        self.input_schema = _control_schema()

    def _begin(self, input: dict[str, Any]) -> tuple[Any, uuid.UUID, str | None]:
        store, _ = self.backend.require()
        _only_known(self.name, input, self.fields)  # type: ignore[attr-defined]
        job_id = _job_id(_require_string(input, "jobId"))
        return store, job_id, _reason(input)

    def _log(self, job_id: uuid.UUID, status: str | None, reason: str | None) -> None:
        log.info(
            "%s on job %s: %s",
            self.name,  # type: ignore[attr-defined]
            job_id,
            status,
            extra={
                "action": self.name.replace("-", "_"),  # type: ignore[attr-defined]
                "job_id": str(job_id),
                "actor": _actor(),
                "status": status,
                "reason": reason,
            },
        )


class CancelJobAction(_ControlVerb):
    """``cancel-job`` (scope ``job-control``): stop a job for good, keeping its checkpoints."""

    name = "cancel-job"
    description = (
        "Cancel a job ('jobId', optional 'reason'): QUEUED, WAITING or PAUSED jobs are "
        "CANCELLED at once; a RUNNING job is CANCELLED at its next checkpoint boundary (the "
        "step in flight finishes and is checkpointed); a finished job answers ok: false."
    )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "CANCELLED"}``; ``{ok: true, status: "RUNNING",
            requested: "cancel", message}`` (binding: it ends CANCELLED); ``{ok: false,
            status, error}`` for a finished job; ``{ok: false, error}`` for an unknown one.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field.
        """
        store, job_id, reason = self._begin(input)
        outcome = store.job_cancel(job_id, actor=_actor(), reason=reason)
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
                "message": "cancel requested: the step in flight finishes and is checkpointed, "
                "then the job is CANCELLED (binding: it can no longer complete)",
            }
        return _refused(job_id, outcome.status, "only a job that has not finished can be cancelled")


class PauseJobAction(_ControlVerb):
    """``pause-job`` (scope ``job-control``): stop a job at a checkpoint boundary until resumed."""

    name = "pause-job"
    description = (
        "Pause a job ('jobId', optional 'reason'): QUEUED and WAITING jobs are PAUSED at once "
        "(a parked step is remembered); a RUNNING job is PAUSED after its step in flight is "
        "checkpointed, releasing its lease; resume-job sends it back."
    )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "PAUSED", outstandingStep?}``; ``{ok: true, status:
            "RUNNING", requested: "pause", message}``; ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field.
        """
        store, job_id, reason = self._begin(input)
        outcome = store.job_pause(job_id, actor=_actor(), reason=reason)
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
            return _refused(
                job_id, "RUNNING", f"a {pending} is already requested", requested=pending
            )
        return _refused(job_id, outcome.status, "only a QUEUED, WAITING or RUNNING job can pause")


class ResumeJobAction(_ControlVerb):
    """``resume-job`` (scope ``job-control``): send a PAUSED job back, now or at a time."""

    name = "resume-job"
    description = (
        "Resume a PAUSED job ('jobId', optional 'at' RFC 3339 time and 'reason'): it is QUEUED "
        "to start no earlier than 'at' (database clock; past or absent means now), or WAITING "
        "again on its parked step. On a RUNNING job it withdraws a pending pause."
    )
    fields = ("jobId", "at", "reason")

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = _control_schema(
            {
                "at": {
                    "type": "string",
                    "format": "date-time",
                    "description": "RFC 3339 time with an offset; compared with the "
                    "database clock.",
                }
            }
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED", runAfter}``, ``{ok: true, status:
            "WAITING", outstandingStep}``, ``{ok: true, status: "RUNNING", withdrawn:
            "pause"}`` or ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field; ``at`` not an RFC 3339 time with an offset.
        """
        store, job_id, reason = self._begin(input)
        at = _rfc3339(input, "at")
        outcome = store.job_resume(job_id, actor=_actor(), reason=reason, at=at)
        self._log(job_id, outcome.status, reason)
        if outcome.changed and outcome.status == "RUNNING":
            return {"ok": True, "status": "RUNNING", "withdrawn": "pause"}
        if outcome.changed:
            body: dict[str, Any] = {"ok": True, "status": outcome.status}
            if outcome.status == "WAITING":
                body["outstandingStep"] = outcome.outstanding_step
            else:
                body["runAfter"] = iso_instant(outcome.run_after)
            return body
        return _refused(job_id, outcome.status, "only a PAUSED job can be resumed")


_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339(input: dict[str, Any], field: str) -> datetime | None:
    raw = _optional_string(input, field)
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
        raise _invalid(
            field,
            f"Field '{field}' must be an RFC 3339 time with an offset "
            f"(like 2026-01-01T22:00:00Z); got '{raw}'",
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
        raise _invalid(
            field,
            f"Field '{field}' must be earlier than {iso_instant(LATEST_AT)}; got '{raw}'",
        )
    return moment


class RequeueJobAction(_ControlVerb):
    """``requeue-job`` (scope ``job-control``): run a DEAD or FAILED job again."""

    name = "requeue-job"
    description = (
        "Requeue a DEAD or FAILED job ('jobId', optional 'reason'): QUEUED now with fresh "
        "attempts, its checkpoints kept (it resumes at the first missing step); the old error "
        "stays in its history."
    )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED"}`` or ``{ok: false, status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field.
        """
        store, job_id, reason = self._begin(input)
        _, submitter = self.backend.require()
        kept = _graph_requeue_checkpoints(store.job_get(job_id), submitter)
        outcome = store.job_requeue(job_id, actor=_actor(), reason=reason, checkpoints=kept)
        self._log(job_id, outcome.status, reason)
        if outcome.changed:
            return {"ok": True, "status": "QUEUED"}
        if outcome.conflict:
            return _refused(job_id, outcome.status, outcome.conflict)
        return _refused(job_id, outcome.status, "only a DEAD or FAILED job can be requeued")


def _graph_requeue_checkpoints(job: Any, submitter: Any) -> list[dict[str, Any]] | None:
    """For a DEAD or FAILED graph run: the checkpoints a requeue keeps
    (``graph.requeue_checkpoints``: a graph's failed entries are final on replay, so keeping
    them would fail the run again at once); None for anything else (checkpoints kept as
    they are)."""
    if job is None or job.status not in ("DEAD", "FAILED"):
        return None
    workflow = _stored_graph(job, getattr(submitter, "runtime", None))
    if workflow is None:
        return None
    from protomolt_jobs.workflow.graph import requeue_checkpoints

    return requeue_checkpoints(workflow, job.checkpoints or [])


class RetryStepAction(_ControlVerb):
    """``retry-step`` (scope ``job-control``): run one step and its dependants again."""

    name = "retry-step"
    description = (
        "Retry one step ('jobId', 'stepName', optional 'reason') of a FAILED, DEAD, CANCELLED, "
        "PAUSED or COMPLETED job: its checkpoint and those of the steps that depend on it are "
        "dropped, every other checkpoint is kept (those steps are not called again), and the "
        "job is QUEUED with fresh attempts."
    )
    fields = ("jobId", "stepName", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = _control_schema({"stepName": {"type": "string"}}, ("stepName",))

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED", dropped: [step...]}`` or ``{ok: false,
            status, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field; a step the workflow does not have.
        :raises JobCorrupt: the job's stored definition or checkpoints cannot be read.
        """
        store, job_id, reason = self._begin(input)
        step_name = _require_string(input, "stepName")
        job = store.job_get(job_id)
        if job is None:
            return _not_found(job_id)
        if job.status not in RETRY_STEP_STATUSES:
            return _refused(
                job_id,
                job.status,
                f"retry-step needs one of {', '.join(RETRY_STEP_STATUSES)}",
            )
        if getattr(job, "unreadable", None):
            raise JobCorrupt(
                f"job {job_id} has stored JSON that cannot be read: {job.unreadable}",
                {"jobId": str(job_id), "status": job.status},
            )
        order, dependants = _step_graph(job, self.runtime)
        if step_name not in order:
            raise _invalid("stepName", f"the workflow has no step named '{step_name}'")
        dropped = {step_name, *dependants.get(step_name, ())}
        kept = [
            c
            for c in job.checkpoints or []
            if not (isinstance(c, dict) and c.get("name") in dropped)
        ]
        # An intent without a checkpoint is an external effect nothing proves (a run that was
        # RECOVERY_REQUIRED, then cancelled): only the retried step's own is the operator's word
        # (it is called again under a new generation); any other stays, so the run asks its
        # probe (or waits as RECOVERY_REQUIRED) instead of calling it blindly.
        proven = {c.get("name") for c in job.checkpoints or [] if isinstance(c, dict)}
        intents = {
            name: intent
            for name, intent in (getattr(job, "effect_intents", None) or {}).items()
            if name != step_name and name not in proven
        }
        outcome = store.job_retry_step(
            job_id,
            step=step_name,
            checkpoints=kept,
            intents=intents or None,
            expected_status=job.status,
            expected_history_seq=job.history_seq,
            actor=_actor(),
            reason=reason,
        )
        self._log(job_id, outcome.status, reason)
        if outcome.changed:
            return {
                "ok": True,
                "status": "QUEUED",
                "dropped": [n for n in order if n in dropped],
            }
        if outcome.conflict:
            return _refused(job_id, outcome.status, outcome.conflict)
        return _refused(
            job_id, outcome.status, "it changed while the retry was prepared; read it and retry"
        )


def _step_graph(job: Any, runtime: Any) -> tuple[list[str], dict[str, set[str]]]:
    """The workflow's step names in order, and for each step the steps that depend on it
    (transitively; in a sequential workflow: every later step)."""
    from protomolt_jobs.workflow.envelope import parse_workflow
    from protomolt_jobs.workflow.types import WorkflowParseError

    definition = job.workflow_definition
    if not isinstance(definition, dict):
        raise JobCorrupt("the job's stored workflow definition is not a JSON object")
    try:
        compiled = parse_workflow(definition, runtime)
    except WorkflowParseError as exc:
        raise JobCorrupt(f"the job's stored workflow definition does not parse: {exc}") from exc
    order = [s.name for s in compiled.steps]
    dependants: dict[str, set[str]] = {name: set() for name in order}
    if not getattr(compiled, "graph", False):
        # A sequential workflow: each step reads what the earlier ones produced.
        for i, name in enumerate(order):
            dependants[name] = set(order[i + 1 :])
        return order, dependants
    from protomolt_jobs.workflow.graph import ancestors

    for name, before in ancestors(compiled).items():
        for upstream in before:
            dependants.setdefault(upstream, set()).add(name)
    return order, dependants


class JobHistoryAction:
    """``job-history`` (scope ``service-invoke``): every transition of a job, oldest first."""

    name = "job-history"
    scope = "service-invoke"
    description = (
        "Read the transition log of a job ('jobId'): every change (submit, claim, checkpoint, "
        "retry, sweep, operator actions, settle) with previous and new status, actor, reason, "
        "attempt, step and time, and 'integrity' ('ok' or the first row whose hash fails)."
    )
    fields = ("jobId",)

    def __init__(self, backend: JobsBackend) -> None:
        self.backend = backend
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {"jobId": {"type": "string", "format": "uuid"}},
            "required": ["jobId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, jobId, transitions: [...], integrity, firstBadSeq?}`` or
            ``{ok: false, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed ``jobId``.
        """
        from protomolt_jobs.runs.report import history_json

        store, _ = self.backend.require()
        _only_known(self.name, input, self.fields)
        job_id = _job_id(_require_string(input, "jobId"))
        history = store.job_history(job_id)
        if history is None:
            return _not_found(job_id)
        return {"ok": True, "jobId": str(job_id), **history_json(history)}


def control_actions(backend: JobsBackend, runtime: Any) -> list[Any]:
    """The operator verbs over one backend, in manifest order (with the recovery verbs of
    step effects, :mod:`protomolt_jobs.verbs.recovery`, after retry-step)."""
    from protomolt_jobs.verbs.recovery import effect_actions

    return [
        CancelJobAction(backend),
        PauseJobAction(backend),
        ResumeJobAction(backend),
        RetryStepAction(backend, runtime),
        *effect_actions(backend, runtime),
        RequeueJobAction(backend),
        JobHistoryAction(backend),
    ]
