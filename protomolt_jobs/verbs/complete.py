"""``complete-step``: supply the response of the external step a job is parked on.

The job resumes (QUEUED, the response checkpointed), or fails as a verdict when the response
breaks the step's declared rules. The store re-gates under the row lock, so a second answer
to the same step is ``ok: true`` with the status it found.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from protomolt_jobs.errors import NotFound, PermissionDenied
from protomolt_jobs.hooks.contract import current_groups
from protomolt_jobs.store.records import AlreadyDone, ParkedStepCompleted, WrongState
from protomolt_jobs.verbs.base import (
    VERBS_LOGGER,
    JobsBackend,
    JobVerb,
    actor,
    as_job_id,
    not_found,
    require_object,
    require_string,
    wrong_state,
)
from protomolt_jobs.verbs.responses import (
    broken_rules,
    checkpoint_of,
    declared_artifacts,
    parse_response,
    resolve_step,
)
from protomolt_jobs.workflow.approval import approver_refusal

__all__ = ["CompleteStepAction", "step_kind"]

log = logging.getLogger(VERBS_LOGGER)


class CompleteStepAction(JobVerb):
    """``complete-step`` (scope ``job-complete``): supply the response of a parked step."""

    name = "complete-step"
    scope = "job-complete"
    description = (
        "Supply the 'response' of the external step 'stepName' a job ('jobId') is parked on; "
        "the job resumes, or fails as a verdict when the response breaks the step's rules."
    )
    fields = ("jobId", "stepName", "response")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = {
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
        store, _ = self._accept(input)
        raw_job_id = require_string(input, "jobId")
        step_name = require_string(input, "stepName")
        response = require_object(input, "response")
        job_id = as_job_id(raw_job_id)

        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        # Pre-gate without the lock; the store re-gates under the row lock.
        if job.status != "WAITING" or job.outstanding_step != step_name:
            if any(
                isinstance(c, dict) and c.get("name") == step_name for c in job.checkpoints or []
            ):
                _, done = resolve_step(job, step_name, self.runtime)
                if done.approval is not None:
                    return self._approval_step(store, job_id, done, job.wait_timers)
                if not done.external:
                    return _not_external(job.status, step_name, done)
                return {"ok": True, "status": job.status}
            return wrong_state(job_id, job.status, job.outstanding_step, step_name)

        stored, step = resolve_step(job, step_name, self.runtime)
        if step.approval is not None:
            return self._approval_step(store, job_id, step, job.wait_timers)
        if not step.external:
            return _not_external(job.status, step_name, step)
        message = parse_response(step, response)

        summary = broken_rules(step, message)
        if summary is not None:
            error = f"VALIDATION: complete-step response failed validation: {summary}"
            try:
                outcome = store.job_fail_parked(job_id, step_name, error, actor=actor())
            except NotFound:
                return not_found(job_id)
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
            return _answer(job_id, step_name, outcome)

        entry = checkpoint_of(stored, step, message)
        # its declared ports, receipt and validation, as a worker's entry carries them; the
        # store writes their rows in the statement that stores the entry
        declared_artifacts(stored, step, message, entry, job.checkpoints)
        try:
            outcome = store.job_complete_parked(job_id, step_name, entry, actor=actor())
        except NotFound:
            return not_found(job_id)
        if isinstance(outcome, ParkedStepCompleted):
            log.info(
                "job %s resumed after %s",
                job_id,
                step_name,
                extra={"action": "parked_step_completed", "job_id": str(job_id), "step": step_name},
            )
        return _answer(job_id, step_name, outcome)

    def _approval_step(
        self, store: Any, job_id: uuid.UUID, step: Any, timers: Any
    ) -> dict[str, Any]:
        """complete-step on an approval step: votes decide it, never a response. A caller
        who is not one of its approvers is ``permission-denied`` (recorded as a ``denied``
        row of the job's history); an approver is pointed to ``approve-step``."""
        principal = actor()
        why = approver_refusal(step, principal, current_groups(), timers)
        if why is not None:
            store.transition_record_denied(
                job_id, actor=principal, reason=f"permission-denied: complete-step: {why}"
            )
            raise PermissionDenied(
                f"permission denied: {why}", {"principal": principal, "step": step.name}
            )
        return {
            "ok": False,
            "status": "WAITING",
            "error": f"step '{step.name}' is an approval step: votes decide it; vote with "
            "approve-step {jobId, stepName, decision}",
        }


def _answer(job_id: uuid.UUID, step: str, outcome: Any) -> dict[str, Any]:
    if isinstance(outcome, ParkedStepCompleted):
        return {"ok": True, "status": "QUEUED"}
    if isinstance(outcome, AlreadyDone):
        return {"ok": True, "status": outcome.status}
    if isinstance(outcome, WrongState):
        return wrong_state(job_id, outcome.status, outcome.outstanding_step, step)
    raise TypeError(f"unexpected parked completion {outcome!r}")


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
