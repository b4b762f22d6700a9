"""Approval steps in the engine: the decision a checkpoint records, what it means for the run,
and the verifier's findings about approval definitions (docs/approvals.md).

An approval step (``completion: "approval"``) makes no call: the run parks on it (``Parked``
with ``wait_kind`` ``approval``) until ``approve-step`` votes reach a decision, which is
stored as the step's checkpoint entry::

    {"name": "review", "decision": "fix", "tally": {"fix": 2, "accept": 1},
     "voters": ["alice", "bob", "carol"], "response": {"decision": "fix", ...}}

The entry's ``response`` is a ``google.protobuf.Struct`` (what later steps see of it).
Replaying that entry, the run goes on by the decision:

- ``approval.end`` says ``fail``: the step fails (kind ``APPROVAL``; a ``failure`` edge may
  handle it, else the run fails); ``complete``: the step succeeded and no edge of it is taken.
- A graph workflow takes the step's ``decision:<d>`` edges (``success`` edges are
  ``decision:accept``).
- A sequential workflow goes on after ``accept``; any other decision without an ``end`` fails
  the run (kind ``APPROVAL``), as if its ``end`` said ``fail``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from protomolt_jobs.workflow import artifacts as _artifacts
from protomolt_jobs.workflow.types import (
    ACCEPT,
    ON_DECISION,
    ON_DONE,
    ON_SUCCESS,
    CompiledWorkflow,
    FailureKind,
    Finding,
    Parked,
    Step,
    WorkflowExecutionError,
)

__all__ = [
    "approval_failure",
    "approver_refusal",
    "decision_entry",
    "decision_of",
    "findings",
    "parked",
    "sequential_failure",
    "timers_of",
]


def timers_of(step: Step) -> tuple[dict[str, Any], ...]:
    """An approval step's timers as offsets from its park (the park stamps them with database
    time): each escalation ``{"kind": "escalate", "afterS", "index", "addRoles",
    "addPrincipals"}`` and the expiry ``{"kind": "expire", "afterS", "onExpire"}``; none for
    any other step."""
    spec = step.approval
    if spec is None:
        return ()
    out: list[dict[str, Any]] = [
        {
            "kind": "escalate",
            "afterS": after_s,
            "index": i,
            "addRoles": list(roles),
            "addPrincipals": list(principals),
        }
        for i, (after_s, roles, principals) in enumerate(spec.escalate)
    ]
    if spec.expires_s is not None:
        out.append({"kind": "expire", "afterS": spec.expires_s, "onExpire": spec.on_expire})
    return tuple(out)


def parked(step: Step, iteration: int = 0) -> Parked:
    """The :class:`Parked` a run stops with at ``step`` (external or approval).

    :param iteration: the loop iteration ``step`` waits in; above 0 each timer carries it
        (``"iteration": k``), so the expiry sweeper's decision entry records it.
    """
    timers = timers_of(step)
    if iteration > 0:
        timers = tuple({**t, "iteration": iteration} for t in timers)
    return Parked(step.name, step.completion, timers)


def decision_of(step: Step, entry: Any) -> str | None:
    """The decision an approval step's stored checkpoint entry records (None when ``step`` is
    not an approval step or the entry records none, e.g. a skip)."""
    if step.approval is None or not isinstance(entry, dict):
        return None
    decision = entry.get("decision")
    return decision if isinstance(decision, str) and decision else None


def approver_refusal(
    step: Step, principal: str, groups: Iterable[str], timers: Any = None
) -> str | None:
    """Why ``principal`` (in ``groups``) may not vote on ``step``, or None when it may.

    :param timers: the run's stored timers (``wait_timers``): the escalations that fired
        widen the approvers.
    """
    spec = step.approval
    if spec is None:
        return f"step '{step.name}' is not an approval step"
    roles, principals = list(spec.roles), list(spec.principals)
    for timer in timers if isinstance(timers, list) else []:
        if isinstance(timer, dict) and timer.get("kind") == "escalate" and timer.get("fired"):
            roles += [r for r in timer.get("addRoles", []) if isinstance(r, str)]
            principals += [p for p in timer.get("addPrincipals", []) if isinstance(p, str)]
    if principal in principals or set(groups) & set(roles):
        return None
    allowed = [f"role '{r}'" for r in roles] + [f"principal '{p}'" for p in principals]
    return (
        f"'{principal}' is not an approver of step '{step.name}' (approvers: {', '.join(allowed)})"
    )


def approval_failure(step: Step, decision: str) -> WorkflowExecutionError | None:
    """The failure an ``end: fail`` decision makes of its step (None for any other)."""
    assert step.approval is not None
    if step.approval.ending(decision) != "fail":
        return None
    return _failure(step, decision)


def sequential_failure(step: Step, decision: str) -> WorkflowExecutionError | None:
    """In a sequential workflow: None when the run goes on (``accept``) or completes (``end:
    complete``), else the failure that ends it."""
    assert step.approval is not None
    if decision == ACCEPT and step.approval.ending(decision) != "fail":
        return None
    if step.approval.ending(decision) == "complete":
        return None
    return _failure(step, decision)


def _failure(step: Step, decision: str) -> WorkflowExecutionError:
    return WorkflowExecutionError(
        FailureKind.APPROVAL, step.name, f"approval step '{step.name}' decided '{decision}'"
    )


def decision_entry(
    step: str,
    decision: str,
    tally: dict[str, int],
    voters: list[dict[str, Any]],
    seen: list[Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint entry of a decided approval step (``approve-step`` stores it).

    :param tally: decision -> distinct voters.
    :param voters: ``{principal, decision, comment?}`` in vote order.
    :param seen: the run's checkpoints while the step waited (what the approvers saw; they
        cannot change while the run waits): recorded as ``seenSha256``, the SHA-256 of their
        canonical JSON, and ``seenArtifacts`` (``{ref: sha256}`` of the artifacts among them,
        when they carry hashes: ``artifacts.seen_artifacts``). None: not recorded.
    """
    response = {
        "decision": decision,
        "tally": dict(tally),
        "voters": [v["principal"] for v in voters],
    }
    entry: dict[str, Any] = {
        "name": step,
        "decision": decision,
        "tally": dict(tally),
        "voters": voters,
        "response": response,
    }
    if seen is not None:
        canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        entry["seenSha256"] = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        # per artifact: the hash of each artifact the approvers were shown (issue 29: a
        # publication step with approvedBy checks the one it consumes against it)
        shown = _artifacts.seen_artifacts(seen)
        if shown:
            entry["seenArtifacts"] = shown
    return entry


def findings(workflow: CompiledWorkflow) -> list[Finding]:
    """Findings about approval steps: decision edges that name no approval step or no declared
    decision, ``distinctFrom`` naming no approval step, and (graph workflows) a declared
    decision with neither an edge nor an ``end``."""
    out: list[Finding] = []
    by_name = {s.name: s for s in workflow.steps}
    for s in workflow.steps:
        for d in s.depends:
            if not d.on.startswith(ON_DECISION):
                continue
            up = by_name.get(d.step)
            wanted = d.on[len(ON_DECISION) :]
            if up is None:
                continue  # the graph's finding names the unknown dependency
            if up.approval is None:
                out.append(
                    Finding(
                        s.name,
                        "approval",
                        f"'after' entry for '{d.step}': on '{d.on}' needs an approval step; "
                        f"'{d.step}' is not one",
                    )
                )
            elif wanted not in up.approval.decisions:
                out.append(
                    Finding(
                        s.name,
                        "approval",
                        f"'after' entry for '{d.step}': decision '{wanted}' is not one of "
                        f"{', '.join(up.approval.decisions)}",
                    )
                )
        if s.approval is None:
            continue
        for other in s.approval.distinct_from:
            target = by_name.get(other)
            if target is None or target.approval is None:
                out.append(
                    Finding(
                        s.name,
                        "approval",
                        f"approval.distinctFrom names '{other}', which is not an approval step",
                    )
                )
        if workflow.graph:
            out.extend(_uncovered(workflow, s))
    return out


def _uncovered(workflow: CompiledWorkflow, step: Step) -> list[Finding]:
    """Declared decisions of ``step`` that no edge takes and no ``end`` ends."""
    assert step.approval is not None
    covered: set[str] = set()
    for s in workflow.steps:
        for d in s.depends:
            if d.step != step.name:
                continue
            if d.on == ON_DONE:
                covered.update(step.approval.decisions)
            elif d.on == ON_SUCCESS:
                covered.add(ACCEPT)
            elif d.on.startswith(ON_DECISION):
                covered.add(d.on[len(ON_DECISION) :])
    covered.update(decision for decision, _ in step.approval.end)
    depended = any(d.step == step.name for s in workflow.steps for d in s.depends)
    if not depended and ACCEPT in step.approval.decisions:
        covered.add(ACCEPT)  # a sink: accept completes its branch
    return [
        Finding(
            step.name,
            "approval",
            f'decision \'{d}\' has no edge (after: {{"step": "{step.name}", "on": '
            f'"decision:{d}"}}) and no approval.end',
        )
        for d in step.approval.decisions
        if d not in covered
    ]
