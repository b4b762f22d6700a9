"""The read verbs: ``get-job`` (one job, with the final report of a finished one), ``list-jobs``
(summaries, newest first) and ``job-history`` (the transition log). Nothing here writes."""

from __future__ import annotations

from typing import Any

from protomolt_jobs.runs.artifacts import RunArtifacts, receipts_json
from protomolt_jobs.runs.artifacts import report_json as artifacts_report
from protomolt_jobs.runs.graph_view import graph_view
from protomolt_jobs.runs.report import cancel_json, history_json, iso_instant, report_json
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.store.reads import ID_PREFIX
from protomolt_jobs.store.records import JOB_STATUSES, TERMINAL_STATUSES
from protomolt_jobs.verbs.base import (
    JobsBackend,
    JobVerb,
    as_integer,
    as_job_id,
    invalid,
    not_found,
    optional_string,
    require_string,
    unreadable_row,
)
from protomolt_jobs.workflow import cancel
from protomolt_jobs.workflow.graph import main_steps, report_from_checkpoints
from protomolt_jobs.workflow.types import EFFECT_EXTERNAL

__all__ = ["GetJobAction", "JobHistoryAction", "ListJobsAction", "job_json"]

#: Largest offset PostgreSQL's bigint holds.
_MAX_OFFSET = 2**63 - 1
_MAX_LIMIT = 500


def job_json(job: Any, *, full: bool) -> dict[str, Any]:
    """A job row as the verbs show it (camelCase, nulls omitted).

    Keys in order: ``jobId, workflowName, status, attempt, outstandingStep?, priority,
    queue, fairnessKey, dedupKey?, deadlineAt?`` (``phase: waiting_approval`` after
    ``outstandingStep`` when the run waits for approve-step votes, ``waiting_input`` when it waits
    for supply-input), then when ``full``
    ``maxAttempts, runAfter, control?, input, checkpoints, effectIntents?, stepGenerations?,
    result?`` (a summary of a QUEUED job has ``runAfter`` too: when it will be claimed), then ``verdict?,
    error?, createdAt?, updatedAt?, completedAt?``. Never shown: the lease, the fairness pass,
    the definition.
    """
    body: dict[str, Any] = {
        "jobId": str(job.job_id),
        "workflowName": job.workflow_name,
        "status": job.status,
        "attempt": job.attempt,
    }
    if job.outstanding_step is not None:
        body["outstandingStep"] = job.outstanding_step
    if job.status == "WAITING" and getattr(job, "wait_kind", None) == "approval":
        body["phase"] = "waiting_approval"  # approve-step votes decide the step
    elif job.status == "WAITING" and getattr(job, "wait_kind", None) == "input":
        body["phase"] = "waiting_input"  # supply-input fills the path (docs/explain.md)
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
    elif job.status == "QUEUED" and getattr(job, "run_after", None) is not None:
        body["runAfter"] = iso_instant(job.run_after)  # when a QUEUED job will run (list-jobs)
    if full:
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


class GetJobAction(JobVerb):
    """``get-job`` (scope ``service-invoke``): one job with input, checkpoints and result."""

    name = "get-job"
    scope = "service-invoke"
    description = (
        "Read one workflow job by 'jobId': status, attempt, parked step, input, checkpoints, "
        "result, verdict and error; with 'graph': true also its steps and edges with each "
        "step's state (for drawing)."
    )
    fields = ("jobId", "graph")

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = {
            "type": "object",
            "properties": {
                "jobId": {"type": "string", "format": "uuid"},
                "graph": {
                    "type": "boolean",
                    "description": "add 'graph': the steps, their states and the edges by kind",
                },
            },
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
        store, submitter = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        drawing = input.get("graph", False)
        if not isinstance(drawing, bool):
            raise invalid("graph", "Field 'graph' must be a boolean")
        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        if getattr(job, "unreadable", None):
            raise unreadable_row(job)
        body = job_json(job, full=True)
        if job.status not in TERMINAL_STATUSES:
            progress = _progress(store, job_id)
            if progress is not None:
                body["progress"] = progress
        if job.status in TERMINAL_STATUSES or drawing:
            runtime = self.runtime or getattr(submitter, "runtime", None)
            stored = _stored(job, runtime)
            report = _report(store, job, stored)
            if job.status in TERMINAL_STATUSES:
                body["report"] = report
            if drawing:
                body["graph"] = graph_view(job, stored, report, body.get("progress"))
        return {"ok": True, "job": body}


def _progress(store: Any, job_id: Any) -> dict[str, Any] | None:
    """The last progress report of the run's step in flight (a resumable step's:
    ``{step, iteration, percent, details, updatedAt}``), or None (docs/long-steps.md)."""
    read = getattr(store, "job_progress_current", None)
    if read is None:
        return None
    progress = read(job_id)
    return None if progress is None else dict(progress.to_json())


def _stored(job: Any, runtime: Any) -> StoredRun | None:
    """The job's snapshotted definition, or None when it cannot be read (a read never fails
    because of it: the report and the drawing show what was checkpointed)."""
    if runtime is None:
        return None
    try:
        return StoredRun.load(job, runtime)
    except SnapshotError:
        return None


def _report(store: Any, job: Any, stored: StoredRun | None) -> dict[str, Any]:
    """The final report of a terminal job (:mod:`protomolt_jobs.runs.report`), or of a live
    one for its drawing. The stored definition only adds to it: without one that parses, the
    steps are the checkpointed ones and a graph run gets no graph account."""
    history = store.job_history(job.job_id)
    transitions = history.transitions if history is not None else ()
    if stored is None:
        order = [str(c.get("name")) for c in job.checkpoints or [] if isinstance(c, dict)]
    else:
        order = stored.step_names()
    graph: dict[str, Any] | None = None
    depends: dict[str, list[str]] | None = None
    if stored is not None and stored.workflow.graph:
        workflow = stored.workflow
        graph = report_from_checkpoints(workflow, job.checkpoints or [], job.status, job.error)
        # The dependencies time and count each step (runs/report.py).
        depends = {s.name: [d.step for d in s.depends] for s in main_steps(workflow)}
    report = report_json(job, order, transitions, graph=graph, depends=depends)
    # every artifact the run keeps (a cancelled run's too: cancel never touches them) and the
    # receipts of its external effects (issue 29; docs/artifacts.md)
    rows = getattr(store, "artifact_kept", None)
    states = {str(r["artifact_id"]): str(r["state"]) for r in rows(job.job_id)} if rows else {}
    kept = RunArtifacts(job, stored.workflow if stored is not None else None, states).summaries()
    if kept:
        report["artifacts"] = artifacts_report(kept)
        receipts = receipts_json(kept)
        if receipts:
            report["receipts"] = receipts
    if job.status == "CANCELLED" and getattr(job, "cancel_request", None):
        compiled = stored.workflow if stored is not None else None
        cancelled = cancel_json(
            job,
            external={s.name for s in compiled.steps if s.effect == EFFECT_EXTERNAL}
            if compiled is not None
            else set(),
            compensations=set(compiled.compensations) if compiled is not None else set(),
            compensate=cancel.compensates(
                stored.definition if stored is not None else None,
                (job.cancel_request or {}).get("compensate"),
            ),
        )
        if cancelled is not None:
            report["cancel"] = cancelled
    return report


class ListJobsAction(JobVerb):
    """``list-jobs`` (scope ``service-invoke``): job summaries, newest first."""

    name = "list-jobs"
    scope = "service-invoke"
    description = (
        "List workflow jobs newest first, optionally filtered by 'status', 'workflowName', "
        "'queue', 'fairnessKey' and 'idPrefix' (the first 4 to 32 hex digits of the id); "
        "'limit' (default 50, at most 500) and 'offset' page through them."
    )
    fields = ("status", "workflowName", "queue", "fairnessKey", "idPrefix", "limit", "offset")

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = {
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": sorted(JOB_STATUSES)},
                "workflowName": {"type": "string"},
                "queue": {"type": "string"},
                "fairnessKey": {"type": "string"},
                "idPrefix": {
                    "type": "string",
                    "pattern": "^[0-9a-fA-F]{4,32}$",
                    "description": "the first 4 to 32 hex digits of the job id (no dashes).",
                },
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
        :raises InvalidInput: unknown status, mistyped fields, an ``idPrefix`` that is not 4
            to 32 hex digits, negative limit or offset.
        """
        store, _ = self._accept(input)
        status = optional_string(input, "status")
        if status is not None and status not in JOB_STATUSES:
            raise invalid(
                "status",
                f"'status' must be one of {', '.join(sorted(JOB_STATUSES))}; got '{status}'",
            )
        workflow_name = optional_string(input, "workflowName")
        queue = optional_string(input, "queue")
        fairness_key = optional_string(input, "fairnessKey")
        id_prefix = optional_string(input, "idPrefix")
        if id_prefix is not None and not ID_PREFIX.fullmatch(id_prefix):
            raise invalid(
                "idPrefix",
                f"'idPrefix' must be the first 4 to 32 hex digits of a job id (no dashes); "
                f"got {id_prefix[:40]!r}",
            )
        limit = 0
        if input.get("limit") is not None:
            limit_value = as_integer(input["limit"])
            if limit_value is None:
                raise invalid("limit", "Field 'limit' must be an integer")
            if limit_value < 0:
                raise invalid("limit", "Field 'limit' must be >= 0")
            limit = min(limit_value, _MAX_LIMIT)
        offset = 0
        if input.get("offset") is not None:
            offset_value = as_integer(input["offset"])
            if offset_value is None or offset_value < 0:
                raise invalid("offset", "Field 'offset' must be a non-negative integer")
            if offset_value > _MAX_OFFSET:
                raise invalid("offset", f"Field 'offset' must be at most {_MAX_OFFSET}")
            offset = offset_value
        filters: dict[str, Any] = {}
        if queue is not None:
            filters["queue"] = queue
        if fairness_key is not None:
            filters["fairness_key"] = fairness_key
        if id_prefix is not None:
            filters["id_prefix"] = id_prefix
        jobs = store.job_list(
            status=status, workflow_name=workflow_name, limit=limit, offset=offset, **filters
        )
        return {"ok": True, "jobs": [job_json(job, full=False) for job in jobs]}


class JobHistoryAction(JobVerb):
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
        super().__init__(backend)
        self.input_schema = {
            "type": "object",
            "properties": {
                "jobId": {"type": "string", "format": "uuid"},
                "graph": {
                    "type": "boolean",
                    "description": "add 'graph': the steps, their states and the edges by kind",
                },
            },
            "required": ["jobId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, jobId, transitions: [...], integrity, firstBadSeq?}`` or
            ``{ok: false, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed ``jobId``.
        """
        store, _ = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        history = store.job_history(job_id)
        if history is None:
            return not_found(job_id)
        return {"ok": True, "jobId": str(job_id), **history_json(history)}
