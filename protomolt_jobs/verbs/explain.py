"""``explain-job`` (issue 29 item 6; docs/explain.md): for every step of a live run not yet
decided, what blocks it: its undecided dependencies with their states, what it waits on
(votes, a completion, a grant gate, a supplied input, a timer, a claim, a pause, a budget),
and the input paths its mapping rules read that the stored input lacks, with their owners.

Read only (scope ``service-invoke``, as ``get-job``): the answer is
``{ok: true, jobId, explain}`` with :mod:`protomolt_jobs.runs.explain`'s shape, or the
not-found answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protomolt_jobs.runs.explain import explain
from protomolt_jobs.runs.inspector import JobInspector
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import (
    JobsBackend,
    JobVerb,
    as_job_id,
    not_found,
    require_string,
    unreadable_row,
)
from protomolt_jobs.workflow.floors import Floor

__all__ = ["ExplainJobAction"]


class ExplainJobAction(JobVerb):
    """``explain-job`` (scope ``service-invoke``): why a run's undecided steps have not run."""

    name = "explain-job"
    scope = "service-invoke"
    description = (
        "Explain a workflow job ('jobId'): for every step not yet decided, the dependencies "
        "that block it and their states, what it waits on (votes, a completion, a grant gate, "
        "a missing input, a timer, a pause, a budget) and the input paths it reads that the "
        "run lacks, with their owners. Read only."
    )
    fields = ("jobId",)

    def __init__(self, backend: JobsBackend, runtime: Any, floors: Sequence[Floor] = ()) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.floors = tuple(floors)
        self.input_schema = {
            "type": "object",
            "properties": {"jobId": {"type": "string", "format": "uuid"}},
            "required": ["jobId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, jobId, explain}`` or ``{ok: false, error}`` (no such job).

        :raises Unavailable: no database configured.
        :raises InvalidInput: missing, mistyped or non-uuid ``jobId``; unknown fields.
        :raises JobCorrupt: the row holds stored JSON that cannot be decoded.
        """
        store, submitter = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        if getattr(job, "unreadable", None):
            raise unreadable_row(job)
        runtime = self.runtime or getattr(submitter, "runtime", None)
        try:
            stored = StoredRun.load(job, runtime) if runtime is not None else None
        except SnapshotError:
            stored = None
        inspector = JobInspector(lambda: store, runtime, self.floors, self.backend.grant_policy)
        revisions = store.input_revisions(job_id)
        body = explain(
            job,
            stored,
            approval=lambda step: inspector.approval(str(job_id), step),
            revisions=revisions,
            queue_cap=store.queue_cap,
        )
        return {"ok": True, "jobId": str(job_id), "explain": body}
