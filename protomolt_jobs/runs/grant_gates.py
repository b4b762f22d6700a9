"""Grant gates: the approval gate a ``needs-approval`` grant opens on a step (docs/approvals.md,
*Capabilities and grants*; DESIGN.md section 21).

A step whose grant needs an approval parks its run WAITING for approval on that step, as an
approval step does; ``approve-step`` votes decide it (``accept`` grants the step, ``reject``
fails it with ``PERMISSION``). Who may vote, how many must agree and the gate's timers come
from the ``[[jobs.grants]]`` ``needs-approval`` entries that cover the step's capabilities for
the run (:class:`~protomolt_jobs.config.Grant`); :func:`gate_of` joins them. The worker (the
park's timers), ``approve-step`` (who may vote) and the dashboard's inbox (the votes so far)
read the same :class:`Gate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from protomolt_jobs.config import Grant

__all__ = ["GATE_DECISIONS", "Gate", "gate_of", "step_gate"]

#: The decisions of a grant gate: ``accept`` grants the step, ``reject`` fails it (PERMISSION).
GATE_DECISIONS: tuple[str, ...] = ("accept", "reject")


@dataclasses.dataclass(frozen=True)
class Gate:
    """One step's grant gate: the ``needs-approval`` grants that apply (``rules``), their
    approvers joined, the largest quorum, every escalation, and the earliest expiry.

    :ivar expires_s: seconds from the park to the expiry (None: never); ``on_expire`` says
        how it ends (``reject``, ``fail``, ``pause``; never an accept).
    :ivar escalate: ``(after_s, roles, principals)`` by ``after_s``.
    """

    rules: tuple[str, ...]
    roles: frozenset[str]
    principals: frozenset[str]
    quorum: int = 1
    expires_s: float | None = None
    on_expire: str = "reject"
    escalate: tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...] = ()

    def timers(self, step: str) -> tuple[dict[str, Any], ...]:
        """The gate's timers as offsets from its park (the shape of
        ``workflow.approval.timers_of``): escalations, then the expiry, each marked
        ``"gate": "grant"``; the expiry carries the ``error`` an ``onExpire: fail`` ends the
        run with (``PERMISSION: the grant gate of step '<s>' expired (decision <rules>)``)."""
        out: list[dict[str, Any]] = [
            {
                "kind": "escalate",
                "afterS": after_s,
                "index": i,
                "addRoles": list(roles),
                "addPrincipals": list(principals),
                "gate": "grant",
            }
            for i, (after_s, roles, principals) in enumerate(self.escalate)
        ]
        if self.expires_s is not None:
            out.append(
                {
                    "kind": "expire",
                    "afterS": self.expires_s,
                    "onExpire": self.on_expire,
                    "gate": "grant",
                    "error": f"PERMISSION: the grant gate of step '{step}' expired "
                    f"(decision {','.join(self.rules)})",
                }
            )
        return tuple(out)

    def approvers(self, timers: Any = None) -> tuple[list[str], list[str]]:
        """``(roles, principals)`` who may vote now: the grants' approvers, widened by the
        escalations that fired (``timers``: the run's stored ``wait_timers``)."""
        roles, principals = sorted(self.roles), sorted(self.principals)
        for timer in timers if isinstance(timers, list) else []:
            if isinstance(timer, dict) and timer.get("kind") == "escalate" and timer.get("fired"):
                roles += [r for r in timer.get("addRoles", []) if isinstance(r, str)]
                principals += [p for p in timer.get("addPrincipals", []) if isinstance(p, str)]
        return roles, principals

    def refusal(self, principal: str, groups: Iterable[str], timers: Any = None) -> str | None:
        """Why ``principal`` (in ``groups``) may not vote on this gate, or None when it may."""
        roles, principals = self.approvers(timers)
        if principal in principals or set(groups) & set(roles):
            return None
        named = [f"role '{r}'" for r in roles] + [f"principal '{p}'" for p in principals]
        return (
            f"'{principal}' is not an approver of this grant gate "
            f"(approvers: {', '.join(named) or 'none'})"
        )


def gate_of(grants: Sequence[Grant], rules: Iterable[str]) -> Gate:
    """The gate the ``needs-approval`` grants named by ``rules`` (their ``rule``, e.g.
    ``jobs.grants[1]``) open: approvers joined, the largest quorum (at least 1), every
    escalation (by ``after``), and the earliest ``expires`` with its ``onExpire`` (the first
    such grant's on a tie)."""
    wanted = set(rules)
    chosen = [g for g in grants if g.rule in wanted and g.decision == "needs-approval"]
    expiring = [g for g in chosen if g.expires_s is not None]
    first = min(expiring, key=lambda g: g.expires_s or 0.0) if expiring else None
    return Gate(
        rules=tuple(g.rule for g in chosen),
        roles=frozenset(r for g in chosen for r in g.approvers.get("roles", ())),
        principals=frozenset(p for g in chosen for p in g.approvers.get("principals", ())),
        quorum=max((g.quorum for g in chosen), default=1),
        expires_s=first.expires_s if first is not None else None,
        on_expire=first.on_expire if first is not None else "reject",
        escalate=tuple(sorted((e for g in chosen for e in g.escalate), key=lambda e: e[0])),
    )


def step_gate(grant_policy: Callable[[], Any] | None, job: Any, step: Any) -> Gate | None:
    """The grant gate ``step`` opens in ``job`` (a ``JobRecord``): None unless the step declares
    capabilities and the node's grants answer ``needs-approval`` for the run's workflow and
    submitter (its recorded groups included).

    :param grant_policy: ``() -> worker.grants.GrantPolicy`` (its ``gate(job, capabilities)``),
        as the role wires it; None: no grant gates.
    """
    capabilities = tuple(getattr(step, "capabilities", ()) or ())
    if not capabilities or grant_policy is None:
        return None
    info = {
        "workflowName": job.workflow_name,
        "submittedBy": job.submitted_by,
        "submittedGroups": list(job.submitted_groups or ()),
    }
    gate = grant_policy().gate(info, capabilities)
    return gate if isinstance(gate, Gate) else None
