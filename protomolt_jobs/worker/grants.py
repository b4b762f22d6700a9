"""The grant policy: whether a claimed run's step may use the capabilities it declares.

DESIGN.md section 21. A step's ``capabilities`` grant nothing; the worker asks this policy after
the claim and before the step's call (before the intent of an ``effect: external`` step), through
the ``authorize`` callback of ``run_segment`` (the engine imports nothing of the worker). Steps
without capabilities never reach it: no statement, no hook call.

The decision comes from the first contributed
:class:`~protomolt_jobs.hooks.contract.StepAuthorizer` that answers (the host wraps the plugins'
``protomolt_authorize_step`` into one), else from the node's ``[[jobs.grants]]``
(:class:`~protomolt_jobs.config.Grant`): every capability must be covered by a grant that
applies to the run's workflow and submitter (``submitted_by``; its groups are those recorded
with the run at submit, ``submitted_groups``, joined with the host's
:class:`~protomolt_jobs.hooks.contract.PrincipalGroups`); an ``allow`` grant wins over a
``needs-approval`` one; a capability no grant covers denies the step. A claim, a queue slot or
a reservation never grants.

A ``needs-approval`` decision whose gate is not decided yet carries the gate's timers
(:class:`GateDecision`, ``runs/grant_gates.py``): the run parks on the gate with them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from protomolt_jobs.config import Grant
from protomolt_jobs.hooks.contract import StepAuthorizer, StepDecision
from protomolt_jobs.runs.grant_gates import Gate, gate_of

__all__ = ["DENY_ID", "GateDecision", "GrantPolicy"]

log = logging.getLogger("protomolt_jobs.worker")

#: The decision id of a ``[[jobs.grants]]`` denial (no grant covers a capability).
DENY_ID = "jobs.grants:none"


def _no_groups(_principal: str) -> frozenset[str]:
    return frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class GateDecision(StepDecision):
    """A ``needs-approval`` decision whose gate is still open: the run parks on the step's grant
    gate with ``timers`` (offsets from the park, ``Gate.timers``)."""

    timers: tuple[dict[str, Any], ...] = ()


def _gated(asked: StepDecision, decided: tuple[str, str, int] | None) -> StepDecision:
    """A ``needs-approval`` decision once its gate's decision (``(decision, actor, seq)``) is
    known: accept allows, anything else denies; undecided: ``asked`` (the run parks)."""
    if decided is None:
        return asked
    decision, actor, seq = decided
    gate_id = f"gate:{seq}"
    if decision == "accept":
        return StepDecision("allow", f"{asked.reason}; the gate decided accept ({actor})", gate_id)
    return StepDecision("deny", f"{asked.reason}; the gate decided {decision} ({actor})", gate_id)


class GrantPolicy:
    """Decides step grants for every claimed run of a worker (built once per worker).

    :param grants: the node's ``[[jobs.grants]]`` (``JobsConfig.grants``).
    :param authorizers: contributed ``StepAuthorizer`` objects, asked in order before the grants.
    :param groups_of: ``principal -> groups`` (``PrincipalGroups.groups_of``); None: no groups.
    """

    def __init__(
        self,
        grants: Sequence[Grant] = (),
        *,
        authorizers: Sequence[StepAuthorizer] = (),
        groups_of: Callable[[str], frozenset[str]] | None = None,
    ) -> None:
        self.grants = tuple(grants)
        self.authorizers = tuple(authorizers)
        self.groups_of = groups_of or _no_groups
        self._by_group = any(g.groups for g in self.grants)

    def check_for(
        self,
        job: Any,
        ctx: Mapping[str, Any],
        gate: Callable[[Any, str], tuple[str, str, int] | None] | None = None,
        recorded_groups: Callable[[], Sequence[str] | None] | None = None,
    ) -> Callable[[Any], StepDecision]:
        """The ``authorize`` callback of one claimed run: ``step -> StepDecision``, logging each
        decision (``step_authorized``, ``step_denied``, ``step_needs_approval``).

        :param job: the claimed ``JobRecord`` (``job_id``, ``workflow_name``, ``submitted_by``,
            ``attempt``).
        :param ctx: the segment's log context.
        :param gate: ``(job_id, step) -> (decision, actor, seq) | None``, the decision of the
            step's latest grant gate (``JobStore.grant_gate_decision``), asked only when the
            step's grant needs an approval: ``accept`` grants the step, another decision
            denies it, none leaves it ``needs-approval`` (the run parks on the gate).
        :param recorded_groups: ``() -> the groups recorded with the run at submit``
            (``JobStore.job_submitted_groups``), asked once, at the first step checked, and only
            when a grant names ``groups`` or an authorizer may read them (a run whose steps
            declare no capabilities never reads them).
        """
        info: dict[str, Any] = {
            "jobId": str(job.job_id),
            "workflowName": str(job.workflow_name),
            "submittedBy": getattr(job, "submitted_by", None),
            "attempt": int(job.attempt),
        }

        def check(step: Any) -> StepDecision:
            if "submittedGroups" not in info:
                # read only where something can look at them: a grant by group, a hook
                wanted = recorded_groups is not None and (self._by_group or self.authorizers)
                recorded = recorded_groups() if wanted and recorded_groups is not None else None
                info["submittedGroups"] = sorted(recorded or ())
            capabilities = tuple(step.capabilities)
            decision = self.decide(info, step.name, capabilities)
            if decision.decision == "needs-approval":
                decision = self._approvable(info, capabilities, decision)
            if decision.decision == "needs-approval" and gate is not None:
                decision = _gated(decision, gate(job.job_id, step.name))
            if decision.decision == "needs-approval":
                opened = self.gate(info, capabilities)
                timers = opened.timers(step.name) if opened is not None else ()
                decision = GateDecision(
                    decision.decision, decision.reason, decision.decision_id, timers
                )
            action = {"allow": "step_authorized", "deny": "step_denied"}.get(
                decision.decision, "step_needs_approval"
            )
            log.info(
                "step %s: %s (%s)",
                step.name,
                decision.decision,
                decision.reason,
                extra={
                    "action": action,
                    "step": step.name,
                    "capabilities": list(step.capabilities),
                    "decision_id": decision.decision_id,
                    **ctx,
                },
            )
            return decision

        return check

    def _approvable(
        self, job: Mapping[str, Any], capabilities: tuple[str, ...], asked: StepDecision
    ) -> StepDecision:
        """``asked`` (needs-approval) when ``[[jobs.grants]]`` names the gate's approvers (its
        ``needs-approval`` entries that apply); else a denial naming why: a gate nobody may
        decide would hold the run for ever."""
        if self.from_grants(job, capabilities).decision == "needs-approval":
            return asked
        return StepDecision(
            "deny",
            f"{asked.reason}; needs an approval, and no [[jobs.grants]] needs-approval entry "
            "that applies names its approvers",
            asked.decision_id,
        )

    def gate(self, job: Mapping[str, Any], capabilities: tuple[str, ...]) -> Gate | None:
        """The grant gate a step with ``capabilities`` opens in ``job`` (the hook's ``job``
        shape, ``submittedGroups`` included): None unless ``[[jobs.grants]]`` answers
        ``needs-approval`` for it (the gate's rules are that answer's decision id)."""
        decided = self.from_grants(job, capabilities)
        if decided.decision != "needs-approval":
            return None
        return gate_of(self.grants, decided.decision_id.split(","))

    def decide(
        self, job: Mapping[str, Any], step: str, capabilities: tuple[str, ...]
    ) -> StepDecision:
        """The decision for ``step`` of ``job`` (the hook's shape): the first authorizer's
        answer, else :meth:`from_grants`.

        :raises TypeError: an authorizer answered something that is not a ``StepDecision``.
        :raises Exception: whatever an authorizer raised (the engine fails the attempt as a
            retryable ``WORKFLOW`` error: the grant is unknown).
        """
        for authorizer in self.authorizers:
            answer = authorizer.authorize_step(job, step, capabilities)
            if answer is None:
                continue
            if not isinstance(answer, StepDecision):
                raise TypeError(f"authorize_step returned {type(answer).__name__}")
            return answer
        return self.from_grants(job, capabilities)

    def from_grants(self, job: Mapping[str, Any], capabilities: tuple[str, ...]) -> StepDecision:
        """The ``[[jobs.grants]]`` decision (see the module docstring); its decision id is the
        deciding rules (``jobs.grants[0]``), or :data:`DENY_ID`."""
        workflow = str(job.get("workflowName", ""))
        submitter = job.get("submittedBy")
        groups = self.groups_of(submitter) if submitter else frozenset()
        recorded = job.get("submittedGroups")
        if submitter and recorded:
            groups = groups | frozenset(str(g) for g in recorded)
        applying = [g for g in self.grants if g.applies(workflow, submitter, groups)]
        allowed: set[str] = set()
        gated: set[str] = set()
        missing: list[str] = []
        for capability in capabilities:
            covering = [g for g in applying if capability in g.capabilities]
            allow = [g.rule for g in covering if g.decision == "allow"]
            if allow:
                allowed.add(allow[0])
            elif covering:
                # every needs-approval grant that covers it: their approvers joined, the
                # largest quorum (verbs/approve.py builds the gate from these rules)
                gated.update(g.rule for g in covering)
            else:
                missing.append(capability)
        who = f"submitted by {submitter}" if submitter else "with no recorded submitter"
        if missing:
            return StepDecision(
                "deny",
                f"capability {', '.join(missing)} is not granted to workflow '{workflow}' {who}",
                DENY_ID,
            )
        if gated:
            rules = ", ".join(sorted(gated))
            return StepDecision(
                "needs-approval", f"{rules} grants it with an approval", ",".join(sorted(gated))
            )
        rules = ", ".join(sorted(allowed))
        return StepDecision("allow", f"granted by {rules}", ",".join(sorted(allowed)))
