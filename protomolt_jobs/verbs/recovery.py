"""The recovery verbs of step effects (issue #17; docs/verbs.md, docs/operations.md *Recovery*).

- ``reconcile-step {jobId, stepName, outcome: "done"|"not-done", response?, reason?}``: an
  operator says what happened to an external step whose state could not be proven. ``done``
  checkpoints ``response`` (parsed against the step's output type, validated when the step
  declares ``validate``, exactly as ``complete-step``) and the run goes on after it; ``not-done``
  drops the intent, so the step is called (once, with the same idempotency key).
- ``migrate-checkpoint {jobId, stepName, action: "keep"|"discard"|"replace", response?,
  reason?}``: a checkpoint whose fingerprint changed (``checkpoint-mismatch``). ``keep`` accepts
  the stored response under the current fingerprint (``ok: false`` saying why when it no longer
  parses as the current output type); ``discard`` drops it and the checkpoints of the steps that
  depend on it (they run again); ``replace`` checkpoints the given response instead.
  A resumable step's saved progress whose fingerprint changed (``progress-mismatch``, the step
  has no checkpoint yet): ``keep`` accepts the saved progress under the current fingerprint
  (the step continues from its saved state; the next report stamps the new fingerprints),
  ``discard`` drops it (the step starts again from zero); ``replace`` is refused naming
  ``action`` (a progress state is the service's, not an operator's).

Both accept only a RECOVERY_REQUIRED run (else ``ok: false`` naming the status), write one
optimistic statement (``job_recover``: the row must still be at the history sequence read),
queue the run, and are recorded in the transition log with the caller's principal. The entry
of an operator's answer (``done``, ``replace``) carries what the step's artifact keys make of
it, as ``complete-step``'s does (``responses.operator_checkpoint``); when that asks for
``workflow_artifact`` rows the one statement is ``job_recover_artifacts``, which writes them
too, the caller as actor (docs/artifacts.md *An operator's answer*).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.verbs.base import (
    ControlVerb,
    JobsBackend,
    actor,
    control_schema,
    invalid,
    not_found,
    refused,
    require_string,
    unreadable_row,
)
from protomolt_jobs.verbs.responses import operator_checkpoint, resolve_step
from protomolt_jobs.workflow.effects import refresh
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.resumable import PROGRESS_MISMATCH

__all__ = ["RECOVERY_REQUIRED", "MigrateCheckpointAction", "ReconcileStepAction"]

#: The one status the recovery verbs accept.
RECOVERY_REQUIRED = "RECOVERY_REQUIRED"


class _RecoveryVerb(ControlVerb):
    statuses = (RECOVERY_REQUIRED,)

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime

    def _load(self, store: Any, job_id: Any, input: dict[str, Any]) -> tuple[str, Any]:
        step_name = require_string(input, "stepName")
        return step_name, store.job_get(job_id)

    def _gate(self, job_id: Any, job: Any) -> dict[str, Any] | None:
        if job is None:
            return not_found(job_id)
        if job.status != RECOVERY_REQUIRED:
            return refused(
                job_id, job.status, f"{self.name} accepts only a {RECOVERY_REQUIRED} run"
            )
        if getattr(job, "unreadable", None):
            raise unreadable_row(job)
        return None

    def _recover(
        self,
        store: Any,
        job: Any,
        step_name: str,
        checkpoints: list[dict[str, Any]],
        intents: dict[str, Any] | None,
        kind: str,
        reason: str | None,
        progress: str | None = None,
        answer: dict[str, Any] | None = None,
    ) -> Any:
        extra: dict[str, Any] = {} if progress is None else {"progress": progress}
        if answer is not None:
            # the operator's entry: the store writes its artifact rows with it
            extra["answer"] = answer
        outcome = store.job_recover(
            job.job_id,
            step=step_name,
            checkpoints=checkpoints,
            intents=intents,
            expected_history_seq=job.history_seq,
            kind=kind,
            actor=actor(),
            reason=reason,
            **extra,
        )
        self._log(job.job_id, outcome.status, reason)
        return outcome


class ReconcileStepAction(_RecoveryVerb):
    """``reconcile-step`` (scope ``job-control``): say whether an external step happened."""

    name = "reconcile-step"
    description = (
        "Reconcile a RECOVERY_REQUIRED job's step ('jobId', 'stepName', 'outcome': 'done' or "
        "'not-done', 'response' for done, optional 'reason'): done checkpoints the response "
        "(the step's output type; validated like complete-step) and the job goes on without "
        "calling the step; not-done queues the job so the step is called."
    )
    fields = ("jobId", "stepName", "outcome", "response", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend, runtime)
        self.input_schema = control_schema(
            {
                "stepName": {"type": "string"},
                "outcome": {"type": "string", "enum": ["done", "not-done"]},
                "response": {
                    "type": "object",
                    "description": "done: proto3 JSON of the step method's output type.",
                },
            },
            ("stepName", "outcome"),
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED"}``, or ``{ok: false, status?, error}``.

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field; an unknown step; ``done`` without a response
            or with one that is not proto3 JSON of the step's output type (or breaks its rules).
        :raises JobCorrupt: the job's stored definition or checkpoints cannot be read.
        """
        store, job_id, reason = self._begin(input)
        outcome_text = require_string(input, "outcome")
        if outcome_text not in ("done", "not-done"):
            raise invalid("outcome", "Field 'outcome' must be 'done' or 'not-done'")
        if outcome_text == "not-done" and input.get("response") is not None:
            raise invalid("response", "Field 'response' is only for outcome 'done'")
        if outcome_text == "done" and input.get("response") is None:
            raise invalid("response", "Field 'response' is required for outcome 'done'")
        step_name, job = self._load(store, job_id, input)
        gated = self._gate(job_id, job)
        if gated is not None:
            return gated
        stored, step = resolve_step(job, step_name, self.runtime)
        checkpoints = [c for c in job.checkpoints or [] if isinstance(c, dict)]
        if job.outstanding_step and job.outstanding_step != step_name:
            # a checkpoint for another step would land out of order (a sequential run
            # replays by position): only the step the run waits on can be reconciled
            return {
                "ok": False,
                "status": job.status,
                "outstandingStep": job.outstanding_step,
                "error": f"job {job.job_id} waits on step '{job.outstanding_step}', not "
                f"'{step_name}'",
            }
        if any(c.get("name") == step_name for c in checkpoints):
            return {
                "ok": False,
                "status": job.status,
                "error": f"step '{step_name}' already has a checkpoint; it is not the step "
                "waiting for reconciliation (see the job's error)",
            }
        intents = dict(job.effect_intents or {})
        intents.pop(step_name, None)
        entry = None
        if outcome_text == "done":
            entry = operator_checkpoint(
                stored,
                step,
                input["response"],
                checkpoints,
                {"receipt": {"reconciledBy": actor()}},
            )
            checkpoints.append(entry)
        answer = self._recover(
            store,
            job,
            step_name,
            checkpoints,
            intents or None,
            "reconcile-step",
            reason,
            answer=entry,
        )
        if answer.changed:
            return {"ok": True, "status": "QUEUED"}
        return refused(
            job_id, answer.status, "it changed while the reconciliation was prepared; read it again"
        )


class MigrateCheckpointAction(_RecoveryVerb):
    """``migrate-checkpoint`` (scope ``job-control``): keep, discard or replace a checkpoint
    whose fingerprint no longer matches the run's definition or the current descriptors."""

    name = "migrate-checkpoint"
    description = (
        "Migrate a RECOVERY_REQUIRED job's checkpoint ('jobId', 'stepName', 'action': 'keep', "
        "'discard' or 'replace', 'response' for replace, optional 'reason'): keep accepts the "
        "stored response under the current types (refused when it no longer parses), discard "
        "runs the step (and the steps depending on it) again, replace checkpoints the given "
        "response."
    )
    fields = ("jobId", "stepName", "action", "response", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend, runtime)
        self.input_schema = control_schema(
            {
                "stepName": {"type": "string"},
                "action": {"type": "string", "enum": ["keep", "discard", "replace"]},
                "response": {
                    "type": "object",
                    "description": "replace: proto3 JSON of the step method's output type.",
                },
            },
            ("stepName", "action"),
        )

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, status: "QUEUED", dropped?: [step...]}`` (a step's
            saved progress: ``{ok: true, status: "QUEUED", progress: "kept"|"dropped"}``), or
            ``{ok: false, status?, error}`` (also when ``keep`` finds a response that no
            longer parses).

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field; an unknown step or one without a checkpoint;
            ``replace`` without a valid response.
        :raises JobCorrupt: the job's stored definition or checkpoints cannot be read.
        """
        store, job_id, reason = self._begin(input)
        action = require_string(input, "action")
        if action not in ("keep", "discard", "replace"):
            raise invalid("action", "Field 'action' must be 'keep', 'discard' or 'replace'")
        if action != "replace" and input.get("response") is not None:
            raise invalid("response", "Field 'response' is only for action 'replace'")
        if action == "replace" and input.get("response") is None:
            raise invalid("response", "Field 'response' is required for action 'replace'")
        step_name, job = self._load(store, job_id, input)
        gated = self._gate(job_id, job)
        if gated is not None:
            return gated
        stored, step = resolve_step(job, step_name, self.runtime)
        checkpoints = [c for c in job.checkpoints or [] if isinstance(c, dict)]
        index = next((i for i, c in enumerate(checkpoints) if c.get("name") == step_name), None)
        if index is None and _progress_mismatch(job, step_name):
            return self._migrate_progress(store, job, step_name, checkpoints, action, reason)
        if index is None:
            raise invalid("stepName", f"step '{step_name}' has no checkpoint to migrate")
        old = checkpoints[index]
        body: dict[str, Any] = {"ok": True, "status": "QUEUED"}
        entry = None
        if action == "discard":
            dropped = {step_name, *stored.dependants().get(step_name, ())}
            checkpoints = [c for c in checkpoints if c.get("name") not in dropped]
            body["dropped"] = [n for n in stored.step_names() if n in dropped]
        elif action == "keep":
            problem = _keep_problem(stored, step, old)
            if problem is not None:
                return {"ok": False, "status": job.status, "error": problem}
            checkpoints[index] = refresh(old, stored.workflow, step)
        else:
            kept = {field: old[field] for field in ("attempt", "receipt") if field in old}
            others = checkpoints[:index] + checkpoints[index + 1 :]
            entry = operator_checkpoint(stored, step, input["response"], others, kept)
            checkpoints[index] = entry
        answer = self._recover(
            store,
            job,
            step_name,
            checkpoints,
            job.effect_intents,
            f"migrate-checkpoint:{action}",
            reason,
            answer=entry,
        )
        if answer.changed:
            return body
        return refused(
            job_id, answer.status, "it changed while the migration was prepared; read it again"
        )

    def _migrate_progress(
        self,
        store: Any,
        job: Any,
        step_name: str,
        checkpoints: list[dict[str, Any]],
        action: str,
        reason: str | None,
    ) -> dict[str, Any]:
        """``keep`` or ``discard`` the saved progress of ``step_name`` (a progress-mismatch)."""
        if action == "replace":
            raise invalid(
                "action",
                f"Field 'action': step '{step_name}' stopped on its saved progress "
                f"({PROGRESS_MISMATCH}); only 'keep' (continue from it) or 'discard' (start "
                "the step from zero) apply",
            )
        progress = "accept" if action == "keep" else "drop"
        answer = self._recover(
            store,
            job,
            step_name,
            checkpoints,
            job.effect_intents,
            f"migrate-checkpoint:{action}",
            reason,
            progress=progress,
        )
        if answer.changed:
            return {
                "ok": True,
                "status": "QUEUED",
                "progress": "kept" if action == "keep" else "dropped",
            }
        return refused(
            job.job_id,
            answer.status,
            "it changed while the migration was prepared; read it again",
        )


def _progress_mismatch(job: Any, step_name: str) -> bool:
    """True when ``job`` stopped on ``step_name``'s saved progress (``progress-mismatch``)."""
    error = getattr(job, "error", None) or ""
    return job.outstanding_step == step_name and error.startswith(PROGRESS_MISMATCH)


def _keep_problem(stored: StoredRun, step: Any, entry: dict[str, Any]) -> str | None:
    """Why the stored response cannot be kept under the current output type, or None."""
    if entry.get("skipped") is True:
        return None
    response = entry.get("response")
    type_name = step.output_type.full_name
    if not isinstance(response, dict):
        return f"the checkpoint of step '{step.name}' holds no response object to keep"
    try:
        json_format.ParseDict(
            response, message_class(step.output_type)(), descriptor_pool=stored.workflow.pool
        )
    except (json_format.ParseError, TypeError, ValueError, OverflowError, KeyError) as exc:
        return (
            f"the stored response of step '{step.name}' no longer parses as {type_name}: {exc}; "
            "use discard (run the step again) or replace (give the response)"
        )
    return None
