"""``approve-step``: one principal's vote on the approval step a job waits on.

The verb decides who may vote; the store counts (``store/approvals.py``: one transaction under
the run's row lock). In order:

1. the job exists and its stored definition has the step, an approval step
   (``invalid-input`` otherwise), and the decision is one the step declares
   (``invalid-input``, field ``decision``);
2. the caller is one of the step's approvers, by principal or by group (else
   ``permission-denied`` naming why, recorded as a ``denied`` row of the job's history);
3. the caller is not the principal that submitted the run (``ok: false``, ``self-approval``,
   recorded as a ``denied`` row of the job's history);
4. the store counts the vote (``not-open``, ``already-decided``, ``distinct-from`` (recorded
   as ``denied`` too), or the tally; at quorum or veto the decision is checkpointed and the
   job queued).

The node's policy floors in force now (not those of the submit) are applied again to the
step (``workflow/floors.py``): the quorum needed is the greater of the step's and the floors',
only decisions every floor allows as a veto decide on one vote, and a voter outside a floor's
approvers is ``permission-denied`` naming the rule. A decision taken under floors records
``policy`` (their names) and ``policySha256`` (:func:`~protomolt_jobs.workflow.floors.policy_sha256`)
in the step's checkpoint entry.

A step that waits on its *grant gate* (a ``needs-approval`` grant of ``[[jobs.grants]]``,
docs/approvals.md *Capabilities and grants*) is voted on the same way: its approvers and quorum
are those of the grants that apply (``JobsBackend.grant_policy``, ``runs/grant_gates.py``),
widened by the gate's escalations that fired, its decisions ``accept`` (the step's grant: it
runs) and ``reject`` (it fails with ``PERMISSION``); the decision requeues the run without a
checkpoint.

Answers ``{ok: true, decided, decision?, tally: {decision: n}, needed, status}`` or
``{ok: false, error: <why>, message, status?, tally?}`` (docs/approvals.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from protomolt_jobs.errors import NotFound, PermissionDenied
from protomolt_jobs.hooks.contract import current_groups
from protomolt_jobs.runs.grant_gates import GATE_DECISIONS, step_gate
from protomolt_jobs.store.approvals import Vote, VoteOutcome
from protomolt_jobs.verbs.base import (
    VERBS_LOGGER,
    JobsBackend,
    JobVerb,
    actor,
    as_job_id,
    invalid,
    not_found,
    optional_string,
    require_string,
)
from protomolt_jobs.verbs.responses import resolve_step
from protomolt_jobs.workflow.approval import approver_refusal, decision_entry
from protomolt_jobs.workflow.floors import Floor, policy_sha256, requirement, selecting
from protomolt_jobs.workflow.loops import open_iteration

__all__ = ["MAX_COMMENT_CHARS", "ApproveStepAction"]

log = logging.getLogger(VERBS_LOGGER)

#: The longest ``comment`` a vote may carry.
MAX_COMMENT_CHARS = 2000

_MESSAGES = {
    "not-open": "the job is not waiting for votes on step '{step}'",
    "already-decided": "step '{step}' is already decided",
    "distinct-from": "'{principal}' voted on step '{detail}', which step '{step}' must be "
    "decided by other principals (approval.distinctFrom)",
}


class ApproveStepAction(JobVerb):
    """``approve-step`` (scope ``job-approve``): vote on the approval step a job waits on."""

    name = "approve-step"
    scope = "job-approve"
    description = (
        "Vote 'decision' on the approval step 'stepName' a job ('jobId') waits on, with an "
        "optional 'comment'; at the step's quorum (or on a veto) the decision is recorded and "
        "the job goes on along that decision's edge."
    )
    fields = ("jobId", "stepName", "decision", "comment")

    def __init__(self, backend: JobsBackend, runtime: Any, floors: Sequence[Floor] = ()) -> None:
        super().__init__(backend)
        self.runtime = runtime
        #: the node's policy floors, applied again at each vote.
        self.floors = tuple(floors)
        self.input_schema = {
            "type": "object",
            "properties": {
                "jobId": {"type": "string", "format": "uuid"},
                "stepName": {"type": "string"},
                "decision": {"type": "string", "description": "One of the step's decisions."},
                "comment": {"type": "string", "maxLength": MAX_COMMENT_CHARS},
            },
            "required": ["jobId", "stepName", "decision"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Check the vote, then count it (the module docstring's four moves).

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field, an unknown step, a step that is not an
            approval step, a decision the step does not declare.
        :raises PermissionDenied: the caller is not one of the step's approvers.
        :raises JobCorrupt: the job's stored definition cannot be read.
        """
        store, _ = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        step_name = require_string(input, "stepName")
        decision = require_string(input, "decision")
        comment = optional_string(input, "comment")
        if comment is not None and len(comment) > MAX_COMMENT_CHARS:
            raise invalid("comment", f"'comment' is longer than {MAX_COMMENT_CHARS} characters")
        comment = comment.strip() or None if comment is not None else None

        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        stored, step = resolve_step(job, step_name, self.runtime)
        spec = step.approval
        gate = None if spec is not None else step_gate(self.backend.grant_policy, job, step)
        if spec is None and gate is None:
            raise invalid(
                "stepName",
                f"step '{step_name}' is not an approval step (completion: \"approval\") "
                "and has no grant gate",
            )
        if gate is not None:
            decisions, quorum = GATE_DECISIONS, gate.quorum
        else:
            assert spec is not None
            decisions, quorum = spec.decisions, spec.quorum
        if decision not in decisions:
            raise invalid(
                "decision",
                f"'{decision}' is not a decision of step '{step_name}'; it takes "
                f"{', '.join(decisions)}",
            )
        principal, groups = actor(), current_groups()
        # A grant gate has its approvers from the grants; the floors bind approval steps.
        applied = selecting(self.floors, stored.workflow, step) if gate is None else ()
        floor = requirement(applied)
        if gate is not None:
            why = gate.refusal(principal, groups, job.wait_timers)
        else:
            why = approver_refusal(step, principal, groups, job.wait_timers)
            if why is None and floor is not None:
                why = floor.approver_refusal(principal, sorted(groups))
        if why is not None:
            store.transition_record_denied(
                job_id, actor=principal, reason=f"permission-denied: approve-step: {why}"
            )
            raise PermissionDenied(
                f"permission denied: {why}", {"principal": principal, "step": step_name}
            )
        if job.submitted_by is not None and job.submitted_by == principal:
            message = f"'{principal}' submitted job {job_id} and may not vote on it"
            store.transition_record_denied(
                job_id, actor=principal, reason=f"self-approval: approve-step: {message}"
            )
            return {"ok": False, "status": job.status, "error": "self-approval", "message": message}

        def entry(chosen: str, tally: dict[str, int], votes: list[Vote]) -> dict[str, Any]:
            voters = [
                {"principal": v.principal, "decision": v.decision}
                | ({"comment": v.comment} if v.comment else {})
                for v in votes
            ]
            built = decision_entry(step_name, chosen, tally, voters, job.checkpoints or [])
            iteration = open_iteration(stored.workflow, job.checkpoints or [], step_name)
            if iteration:  # a loop body's step, opened again (docs/workflows.md)
                built["iteration"] = iteration
            if applied:
                built["policy"] = [f.name for f in applied]
                built["policySha256"] = policy_sha256(applied)
            return built

        veto = spec.veto if spec is not None else ()
        if floor is not None:
            quorum = max(quorum, floor.quorum)
            veto = tuple(v for v in veto if v in floor.veto)

        try:
            outcome = store.approval_vote(
                job_id,
                step_name,
                principal=principal,
                groups=sorted(groups),
                decision=decision,
                comment=comment,
                quorum=quorum,
                veto=veto,
                distinct_from=spec.distinct_from if spec is not None else (),
                entry=entry,
                policy_sha256=policy_sha256(applied) if applied else None,
                grant_gate=gate is not None,
            )
        except NotFound:
            return not_found(job_id)
        log.info(
            "approve-step on job %s: %s voted %s on %s: %s",
            job_id,
            principal,
            decision,
            step_name,
            outcome.result,
            extra={
                "action": "approve_step",
                "job_id": str(job_id),
                "step": step_name,
                "actor": principal,
                "result": outcome.result,
            },
        )
        answer = _answer(outcome, step_name, principal, quorum)
        if applied and answer["ok"]:
            answer["policy"] = [f.name for f in applied]
            answer["policySha256"] = policy_sha256(applied)
        if outcome.result == "distinct-from":  # a refused voter: no silent path
            store.transition_record_denied(
                job_id, actor=principal, reason=f"distinct-from: approve-step: {answer['message']}"
            )
        return answer


def _answer(outcome: VoteOutcome, step: str, principal: str, needed: int) -> dict[str, Any]:
    if outcome.result in ("counted", "decided", "duplicate"):
        body: dict[str, Any] = {
            "ok": True,
            "decided": outcome.result == "decided",
            "tally": outcome.tally,
            "needed": needed,
            "status": outcome.status,
        }
        if outcome.decision is not None:
            body["decision"] = outcome.decision
        if outcome.result == "duplicate":
            body["message"] = f"'{principal}' had already voted on step '{step}'; counted once"
        return body
    body = {
        "ok": False,
        "status": outcome.status,
        "error": outcome.result,
        "message": _MESSAGES[outcome.result].format(
            step=step, principal=principal, detail=outcome.detail
        ),
    }
    if outcome.result == "already-decided":
        body["decision"] = outcome.decision
        body["tally"] = outcome.tally
    if outcome.outstanding_step:
        body["outstandingStep"] = outcome.outstanding_step
    return body
