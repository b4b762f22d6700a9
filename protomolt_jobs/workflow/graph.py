"""Graph workflows: dependencies, the one decision table, structural findings and simulation.

A workflow that uses a graph key (``after``, ``join``, ``compensate``, ``edge``, ``fanOut``,
``structured``, ``loop``, ``maxParallel``, ``completion``) is a graph: each step runs after its
dependencies (``Step.depends``, resolved by the envelope) instead of after the step before it.
This module owns what the verifier, the executor (``graph_run``) and ``check-workflow
{"simulate": true}`` must agree on; nothing here calls anything.

The decision table (every skip and every start goes through :func:`decide`)
-----------------------------------------------------------------------------

An edge ``(d, on)`` **matches** d's outcome when ``on`` is ``success`` and d succeeded,
``failure`` and d failed, or ``done`` (any outcome, a skip included). Then, for a step whose
``when`` is left aside:

====== =============================================== ===================================
join   runs when                                       is skipped when (reason)
====== =============================================== ===================================
all    every edge matched                              one edge cannot match any more:
                                                       ``upstream <d> failed|skipped|
                                                       succeeded``
any    every dependency ended and one edge matched     every dependency ended and no edge
       (it waits for all: it may read every one)       matched: ``no upstream edge
                                                       matched (<d> failed, ...)``
====== =============================================== ===================================

A step with no dependency runs at once. A ``when`` that is false skips a step that would run
(``condition false: <expr>``). A skipped step binds its output type's default, so every
later read is well defined; a skip propagates only through edges that do not match it
(``on: done`` runs after a skip).

A **failure** is *handled* when some step depends on the failed step with ``on: failure`` or
``on: done``; it is *unhandled* otherwise. After an unhandled failure no new step starts; the
steps in flight finish and are checkpointed; the run ends FAILED naming that failure.

**Completion criterion**: the run is COMPLETED when nothing is runnable, no failure went
unhandled and every required step succeeded or was skipped by its own ``when``. Required:
``completion.require`` when given, else every sink (a step no other step depends on) that is
neither a compensation step nor a pure failure handler (all of its edges ``on: failure``: it
runs only when something failed, so its skip is the good case).

**Compensation**: when the run ends FAILED (an unhandled failure, or the criterion unmet),
every step that declared ``compensate`` and succeeded has its compensation step run, in
reverse completion order, each checkpointed like any step.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protomolt_jobs.workflow.retry_scope import settled
from protomolt_jobs.workflow.types import (
    ACCEPT,
    ON_DECISION,
    ON_DONE,
    ON_FAILURE,
    ON_SUCCESS,
    CompiledWorkflow,
    Dependency,
    Finding,
    Step,
)

__all__ = [
    "FAILED",
    "SKIPPED",
    "SUCCEEDED",
    "GraphState",
    "ancestors",
    "contradiction_findings",
    "criterion",
    "decide",
    "graph_edges",
    "names_read",
    "simulate",
    "structure_findings",
]

SUCCEEDED, FAILED, SKIPPED = "succeeded", "failed", "skipped"
#: ``maxParallel`` and fan-out bounds (upstream's caps for fan-out).
MAX_PARALLEL = 64
CONDITION_FALSE = "condition false: "
#: The reason of a step skipped because an approval step decided another branch.
NOT_TAKEN = "branch not taken: "


def _ended(name: str, outcomes: Mapping[str, str], decisions: Mapping[str, str]) -> str:
    if name in decisions:
        return f"decided {decisions[name]}"
    return outcomes[name]


def matches(on: str, outcome: str, decision: str | None = None) -> bool:
    """Whether an edge ``on`` matches the upstream ``outcome``.

    ``decision`` is the upstream's decision when it is an approval step that decided (None
    otherwise): ``decision:<d>`` matches that decision only, and ``success`` matches a
    succeeded approval step only when it decided ``accept`` (docs/approvals.md).
    """
    if on.startswith(ON_DECISION):
        return outcome == SUCCEEDED and decision == on[len(ON_DECISION) :]
    if on == ON_SUCCESS:
        return outcome == SUCCEEDED and decision in (None, ACCEPT)
    if on == ON_FAILURE:
        return outcome == FAILED
    return True  # ON_DONE: any end


def decide(
    step: Step, outcomes: Mapping[str, str], decisions: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """The decision table for a step not started yet.

    :param outcomes: step name -> ``succeeded``/``failed``/``skipped`` for ended steps.
    :param decisions: approval step name -> its decision, for the approval steps that decided.
    :returns: ``("run", "")``, ``("skip", reason)`` or None (still waiting).
    """
    decided = decisions or {}
    deps = step.depends
    if not deps:
        return ("run", "")
    if step.join == "any":
        if any(d.step not in outcomes for d in deps):
            return None
        if any(matches(d.on, outcomes[d.step], decided.get(d.step)) for d in deps):
            return ("run", "")
        ended = ", ".join(f"{d.step} {_ended(d.step, outcomes, decided)}" for d in deps)
        return ("skip", f"no upstream edge matched ({ended})")
    for d in deps:
        outcome = outcomes.get(d.step)
        if outcome is not None and not matches(d.on, outcome, decided.get(d.step)):
            if d.step in decided:
                return ("skip", f"{NOT_TAKEN}{d.step} decided {decided[d.step]}")
            return ("skip", f"upstream {d.step} {outcome}")
    if all(d.step in outcomes for d in deps):
        return ("run", "")
    return None


def main_steps(workflow: CompiledWorkflow) -> list[Step]:
    """The steps of the graph proper (every step but the compensation steps), in order."""
    comp = workflow.compensations
    return [s for s in workflow.steps if s.name not in comp]


def handled_failures(workflow: CompiledWorkflow) -> frozenset[str]:
    """Steps whose failure some step depends on (``on: failure`` or ``on: done``)."""
    return frozenset(
        d.step for s in main_steps(workflow) for d in s.depends if d.on in (ON_FAILURE, ON_DONE)
    )


def required(workflow: CompiledWorkflow) -> tuple[str, ...]:
    """``completion.require``, or the default: every sink that is neither a compensation step
    nor a pure failure handler."""
    if workflow.require is not None:
        return workflow.require
    mains = main_steps(workflow)
    depended = {d.step for s in mains for d in s.depends}
    out = []
    for s in mains:
        if s.name in depended:
            continue
        if s.depends and all(d.on == ON_FAILURE for d in s.depends):
            continue
        out.append(s.name)
    return tuple(out)


def criterion(
    workflow: CompiledWorkflow, outcomes: Mapping[str, str], reasons: Mapping[str, str]
) -> tuple[bool, str]:
    """Whether the completion criterion holds, and the sentence that says why."""
    req = required(workflow)
    label = (
        f"completion.require [{', '.join(req)}]"
        if workflow.require is not None
        else f"every sink [{', '.join(req)}]"
    )
    for name in req:
        outcome = outcomes.get(name)
        if outcome == SUCCEEDED:
            continue
        if outcome == SKIPPED and reasons.get(name, "").startswith((CONDITION_FALSE, NOT_TAKEN)):
            continue
        why = reasons.get(name, "")
        status = outcome or "not run"
        return False, f"{label}: required step '{name}' {status}" + (f" ({why})" if why else "")
    return True, f"{label}: every required step succeeded (or was gated off by its condition)"


@dataclass(frozen=True, eq=False)
class _Plan:
    """The static shape a :class:`GraphState` walks, built once per compiled workflow."""

    mains: tuple[Step, ...]
    handled: frozenset[str]
    compensations: frozenset[str]
    #: upstream name -> [(index of the dependant main step, the edge's ``on``)], one per edge
    dependants: Mapping[str, tuple[tuple[int, str], ...]]
    #: the main steps with no dependency (decidable at once)
    roots: tuple[int, ...]
    #: main step name -> its index in ``mains``
    index: Mapping[str, int] = field(default_factory=dict)


_PLANS: weakref.WeakKeyDictionary[CompiledWorkflow, _Plan] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def _plan(workflow: CompiledWorkflow) -> _Plan:
    with _PLANS_LOCK:
        plan = _PLANS.get(workflow)
    if plan is not None:
        return plan
    mains = tuple(main_steps(workflow))
    dependants: dict[str, list[tuple[int, str]]] = {}
    for i, s in enumerate(mains):
        for d in s.depends:
            dependants.setdefault(d.step, []).append((i, d.on))
    plan = _Plan(
        mains=mains,
        handled=handled_failures(workflow),
        compensations=workflow.compensations,
        dependants={k: tuple(v) for k, v in dependants.items()},
        roots=tuple(i for i, s in enumerate(mains) if not s.depends),
        index={s.name: i for i, s in enumerate(mains)},
    )
    with _PLANS_LOCK:
        _PLANS[workflow] = plan
    return plan


@dataclass
class GraphState:
    """Outcomes of one run of a graph workflow, and what may start next.

    The executor and the simulation both drive it: :meth:`next` gives the steps to start and
    the skips to record; :meth:`ended` records an outcome. A step is looked at only once it is
    *decidable* (``join: all``: an edge can no longer match, or every dependency ended;
    ``join: any``: every dependency ended), so one run costs time linear in steps and edges.
    """

    workflow: CompiledWorkflow
    outcomes: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: step names in completion order (replayed ones first, in their stored order).
    order: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    #: the first failure no edge handles (the run's verdict), or None.
    unhandled: str | None = None
    #: approval step name -> its decision, for the approval steps that decided.
    decisions: dict[str, str] = field(default_factory=dict)
    #: steps that may not be decided now (a loop's: ``loops.LoopTracker.blocked``); they stay
    #: decidable and are looked at again once unblocked. Empty without loops.
    blocked: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        plan = _plan(self.workflow)
        self._index = plan.index
        self._mains = plan.mains
        self._handled = plan.handled
        self._compensations = plan.compensations
        self._dependants = plan.dependants
        # per main step: dependency edges ended so far, and whether one can no longer match
        self._ended = [0] * len(plan.mains)
        self._mismatch = [False] * len(plan.mains)
        # Steps whose decision may have changed since the last ``next`` and that are
        # decidable (a decision depends only on the outcomes of the step's own dependencies,
        # and outcomes only grow), so each step is decided about once per run.
        self._dirty: set[int] = set(plan.roots)

    def ended(self, name: str, outcome: str, reason: str = "", decision: str = "") -> None:
        """Record that ``name`` ended with ``outcome`` (``reason`` for skips and failures;
        ``decision`` for an approval step that decided)."""
        if decision:
            self.decisions[name] = decision
        self.running.discard(name)
        self.outcomes[name] = outcome
        if reason:
            self.reasons[name] = reason
        self.order.append(name)
        mains = self._mains
        for i, on in self._dependants.get(name, ()):
            self._ended[i] += 1
            if not matches(on, outcome, self.decisions.get(name)):
                self._mismatch[i] = True
            step = mains[i]
            if self._ended[i] >= len(step.depends) or (self._mismatch[i] and step.join != "any"):
                self._dirty.add(i)
        if (
            outcome == FAILED
            and name not in self._handled
            and self.unhandled is None
            and name not in self._compensations
        ):
            self.unhandled = name

    def next(self) -> tuple[list[Step], list[tuple[Step, str]]]:
        """``(steps to start, [(step, reason) to skip])`` given what has ended so far; nothing
        after an unhandled failure. Skips are returned, not recorded: record each with
        :meth:`ended` (a skip can make further steps decidable: call again)."""
        if self.unhandled is not None:
            return [], []
        start: list[Step] = []
        skip: list[tuple[Step, str]] = []
        for i in sorted(self._dirty):
            step = self._mains[i]
            if step.name in self.outcomes:
                self._dirty.discard(i)
                continue
            if step.name in self.running:
                continue  # stays dirty: a running step given back without an outcome reruns
            if self.blocked and step.name in self.blocked:
                continue  # stays dirty: decided once its loop lets it
            decision = decide(step, self.outcomes, self.decisions)
            if decision is None:
                self._dirty.discard(i)
                continue
            # A decided step stays dirty until it runs or ends (the caller may start it later).
            if decision[0] == "run":
                start.append(step)
            else:
                skip.append((step, self._not_taken(step, decision[1])))
        return start, skip

    def reset(self, names: Iterable[str]) -> None:
        """Forget the outcomes of ``names`` (a loop body about to run again): they, and the
        steps that depend on them, are decided again from the outcomes left."""
        forget = set(names)
        for name in forget:
            self.outcomes.pop(name, None)
            self.reasons.pop(name, None)
            self.decisions.pop(name, None)
        touched = {self._index[n] for n in forget if n in self._index}
        for name in forget:
            touched.update(i for i, _ in self._dependants.get(name, ()))
        for i in touched:
            step = self._mains[i]
            ended = mismatch = 0
            for d in step.depends:
                outcome = self.outcomes.get(d.step)
                if outcome is None:
                    continue
                ended += 1
                if not matches(d.on, outcome, self.decisions.get(d.step)):
                    mismatch = 1
            self._ended[i], self._mismatch[i] = ended, bool(mismatch)
            if ended >= len(step.depends) or (mismatch and step.join != "any"):
                self._dirty.add(i)

    def _not_taken(self, step: Step, reason: str) -> str:
        """A skip behind a branch an approval step did not take is itself not taken."""
        for d in step.depends:
            if reason == f"upstream {d.step} {SKIPPED}":
                above = self.reasons.get(d.step, "")
                if above.startswith(NOT_TAKEN):
                    return above
        return reason

    def pending(self) -> list[Step]:
        """Main steps that have not ended."""
        return [s for s in self._mains if s.name not in self.outcomes]

    def verdict(self) -> tuple[bool, str]:
        """``(completed, sentence)`` once nothing runs and nothing is runnable."""
        if self.unhandled is not None:
            why = self.reasons.get(self.unhandled, "")
            return False, f"unhandled failure of step '{self.unhandled}'" + (
                f": {why}" if why else ""
            )
        return criterion(self.workflow, self.outcomes, self.reasons)

    def to_compensate(self) -> list[Step]:
        """Compensation steps to run (reverse completion order of the steps they undo), those
        already ended excluded."""
        by_name = {s.name: s for s in self.workflow.steps}
        out = []
        seen: set[str] = set()
        for name in reversed(self.order):
            if name in seen:
                continue  # a loop body's step ended once per iteration: undone once
            seen.add(name)
            step = by_name.get(name)
            if step is None or not step.compensate or self.outcomes.get(name) != SUCCEEDED:
                continue
            comp = by_name.get(step.compensate)
            if comp is not None and comp.name not in self.outcomes:
                out.append(comp)
        return out


def report(state: GraphState, completed: bool, sentence: str) -> dict[str, Any]:
    """The final report of a graph run: every step with its status (and reason), in
    declaration order; steps that never started are ``not run``; and the criterion."""
    steps = []
    for s in state.workflow.steps:
        outcome = state.outcomes.get(s.name)
        if outcome is None:
            if s.name in state.workflow.compensations:
                continue  # a compensation that was not needed
            entry = {"name": s.name, "status": "not run"}
            if state.unhandled is not None:
                entry["reason"] = f"the run failed at '{state.unhandled}' before it could start"
        else:
            entry = {"name": s.name, "status": outcome}
            if state.reasons.get(s.name):
                entry["reason"] = state.reasons[s.name]
        steps.append(entry)
    return {
        "status": "COMPLETED" if completed else "FAILED",
        "steps": steps,
        "completionOrder": list(state.order),
        "criterion": sentence,
    }


def report_from_checkpoints(
    workflow: CompiledWorkflow, checkpoints: list[Any], status: str, error: str | None = None
) -> dict[str, Any]:
    """The final report of a stored graph run, rebuilt from its checkpoints (no call, no
    parse of responses): what :func:`report` said when the run settled. A workflow with a
    loop has a row per iteration of each body step (``"iteration": k`` on rows after the
    first), the earlier ones before the latest.

    :param status: the job's status (COMPLETED, FAILED, DEAD, ...).
    :param error: the job's error text, used when no checkpoint explains the end (a retryable
        failure that exhausted its attempts is not checkpointed).
    """
    state = GraphState(workflow)
    looped = bool(workflow.loops)
    #: a loop body's earlier iterations: name -> [(iteration, row)], shown before the latest
    earlier: dict[str, list[dict[str, Any]]] = {}
    iteration: dict[str, int] = {}
    for entry in settled(workflow, checkpoints or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        name = entry["name"]
        if workflow.step(name) is None:
            continue
        if name in state.outcomes:
            if not looped:
                continue
            row = {"name": name, "status": state.outcomes[name]}
            if iteration.get(name):
                row["iteration"] = iteration[name]
            if state.reasons.get(name):
                row["reason"] = state.reasons[name]
            earlier.setdefault(name, []).append(row)
            state.reset([name])
        k = entry.get("iteration")
        iteration[name] = k if isinstance(k, int) and not isinstance(k, bool) else 0
        if "failed" in entry:
            failed = entry["failed"] if isinstance(entry["failed"], dict) else {}
            state.ended(name, FAILED, str(failed.get("message", "")))
        elif entry.get("skipped") is True:
            state.ended(name, SKIPPED, str(entry.get("reason", "")))
        else:
            found = entry.get("decision")
            decision = found if isinstance(found, str) else ""
            step = workflow.step(name)
            spec = step.approval if step is not None else None
            if decision and spec is not None and spec.ending(decision) == "fail":
                reason = f"approval step '{name}' decided '{decision}'"
                state.ended(name, FAILED, reason, decision)
            else:
                state.ended(name, SUCCEEDED, "", decision)
    completed, sentence = state.verdict()
    if status != "COMPLETED" and completed:
        sentence = f"the run ended {status}" + (f": {error}" if error else "")
    elif status != "COMPLETED" and state.unhandled is None and error and sentence not in error:
        # (a run the criterion failed has the criterion as its error: say it once)
        sentence = f"{sentence}; the run ended {status}: {error}"
    out = report(state, status == "COMPLETED", sentence)
    out["status"] = status
    if looped:
        rows: list[dict[str, Any]] = []
        for row in out["steps"]:
            rows.extend(earlier.get(row["name"], ()))
            if iteration.get(row["name"]):
                row["iteration"] = iteration[row["name"]]
            rows.append(row)
        out["steps"] = rows
    if status == "CANCELLED":
        for entry in out["steps"]:
            if entry["status"] == "not run":
                entry["reason"] = "cancelled"
    return out


def descendants(workflow: CompiledWorkflow, names: Iterable[str]) -> set[str]:
    """``names`` and every step that (transitively) depends on one of them, whatever the edge."""
    out = set(names)
    changed = True
    while changed:
        changed = False
        for s in main_steps(workflow):
            if s.name not in out and any(d.step in out for d in s.depends):
                out.add(s.name)
                changed = True
    return out


def requeue_checkpoints(workflow: CompiledWorkflow, checkpoints: list[Any]) -> list[Any]:
    """The checkpoints a failed graph run keeps when it is sent back to QUEUED with fresh
    attempts (for ``requeue-job``): without failed entries, compensation entries, the entries
    of steps a compensation undid, skips that an upstream outcome decided, and every entry of a
    step downstream of one dropped (its inputs may change). Succeeded steps (not undone) and
    ``condition false`` skips stay: they are not called again. A workflow with a loop keeps
    the entries before the first dropped one, where only a step's latest entry (its latest
    iteration's) or a compensation's can be dropped: the run resumes in the iteration it
    failed in, its earlier iterations and its count kept.
    """
    entries = [
        e for e in checkpoints or [] if isinstance(e, dict) and isinstance(e.get("name"), str)
    ]
    comp = workflow.compensations
    ran = {e["name"] for e in entries}
    undone = {s.name for s in workflow.steps if s.compensate and s.compensate in ran}
    dropped: set[str] = set(undone)
    for e in entries:
        upstream_skip = e.get("skipped") is True and not str(e.get("reason", "")).startswith(
            CONDITION_FALSE
        )
        if e["name"] in comp or "failed" in e or upstream_skip:
            dropped.add(e["name"])
    if workflow.loops:
        # A loop body's steps repeat: keep the entries before the first one dropped (a prefix
        # of the completion order replays as a run that stopped there, in the iteration it
        # stopped in). Only a step's latest entry can be dropped: its earlier iterations'
        # entries are finished history (a failure there was handled, or the loop would not
        # have gone on), so the count and those iterations' steps are kept.
        latest = {e["name"]: i for i, e in enumerate(entries)}
        first = next(
            (
                i
                for i, e in enumerate(entries)
                if e["name"] in comp or (e["name"] in dropped and latest[e["name"]] == i)
            ),
            len(entries),
        )
        return entries[:first]
    dropped = descendants(workflow, dropped - comp) | (dropped & comp)
    return [e for e in entries if e["name"] not in dropped]


# -- static structure --------------------------------------------------------------------------


def ancestors(workflow: CompiledWorkflow) -> dict[str, frozenset[str]]:
    """Step name -> every step it (transitively) depends on, whatever the edge; a compensation
    step's ancestors are the step it undoes and that step's ancestors. Unknown names and cycles
    are tolerated (the findings report them)."""
    by_name = {s.name: s for s in workflow.steps}
    memo: dict[str, frozenset[str]] = {}

    def walk(root: str) -> frozenset[str]:
        # Iterative depth-first post-order: a chain of thousands of steps must not hit the
        # interpreter's recursion limit (a RecursionError reached submit-workflow as a 500).
        # A step met again while it is still open closes a cycle and contributes nothing
        # more (the cycle finding reports it).
        if root in memo:
            return memo[root]
        open_: set[str] = set()
        stack: list[tuple[str, int]] = [(root, 0)]
        open_.add(root)
        while stack:
            name, i = stack[-1]
            step = by_name.get(name)
            deps = step.depends if step is not None else ()
            if i < len(deps):
                stack[-1] = (name, i + 1)
                nxt = deps[i].step
                if nxt not in memo and nxt not in open_ and nxt in by_name:
                    open_.add(nxt)
                    stack.append((nxt, 0))
                continue
            out: set[str] = set()
            for d in deps:
                out.add(d.step)
                out |= memo.get(d.step, frozenset())
            memo[name] = frozenset(out)
            open_.discard(name)
            stack.pop()
        return memo[root]

    result = {s.name: walk(s.name) for s in workflow.steps}
    for s in workflow.steps:
        if s.compensate and s.compensate in by_name:
            result[s.compensate] = frozenset({s.name}) | result.get(s.name, frozenset())
    return result


_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_IDENT_USE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)")


def cel_names(expr: str) -> set[str]:
    """Identifiers an expression uses at the top level (``a.b`` gives ``a``), literals aside."""
    return set(_cel_names(expr))


@functools.lru_cache(maxsize=4096)
def _cel_names(expr: str) -> frozenset[str]:
    # Every step that runs asks again (``names_read``: its lineage); the texts are few.
    return frozenset(_IDENT_USE.findall(_STRING_LITERAL.sub("", expr)))


def names_read(step: Step) -> set[str]:
    """Scope names the step's request mapping and gate read (an edge's own rules excluded:
    the edge's restricted scope checks those)."""
    out: set[str] = set()
    for rule in step.rules:
        if isinstance(rule.source, tuple) and rule.source:
            out.add(rule.source[0])
    for crule in step.cel_rules:
        out |= _cel_names(crule.filter) | _cel_names(crule.selector)
    if step.when.strip():
        out |= _cel_names(step.when)
    return out


def _cycles(workflow: CompiledWorkflow, known: set[str]) -> list[list[str]]:
    """Each cycle once, as a path in run order (``[a, b, a]``: b runs after a, a after b)."""
    succ: dict[str, list[str]] = {s.name: [] for s in workflow.steps if s.name in known}
    for s in workflow.steps:
        if s.name not in known:
            continue
        for d in s.depends:
            if d.step in succ:
                succ[d.step].append(s.name)
    color: dict[str, int] = {}
    path: list[str] = []
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def dfs(root: str) -> None:
        # Iterative (a long chain must not hit the recursion limit): ``path`` is the open
        # chain from ``root``, each frame remembers which successor it tries next.
        color[root] = 1
        path.append(root)
        frames: list[tuple[str, int]] = [(root, 0)]
        while frames:
            node, i = frames[-1]
            nexts = succ[node]
            if i < len(nexts):
                frames[-1] = (node, i + 1)
                nxt = nexts[i]
                if color.get(nxt) == 1:
                    cycle = path[path.index(nxt) :] + [nxt]
                    key = frozenset(cycle)
                    if key not in seen:
                        seen.add(key)
                        found.append(cycle)
                elif color.get(nxt) is None:
                    color[nxt] = 1
                    path.append(nxt)
                    frames.append((nxt, 0))
                continue
            frames.pop()
            path.pop()
            color[node] = 2

    for name in succ:
        if color.get(name) is None:
            dfs(name)
    return found


def structure_findings(workflow: CompiledWorkflow, known: set[str]) -> list[Finding]:
    """Findings about the graph itself: bounds, unknown dependencies, compensation and
    ``require`` names, cycles (the path spelled ``a -> b -> a``) and unreachable steps.

    :param known: the step names the verifier accepted (identifiers, not duplicates).
    """
    out: list[Finding] = []
    if not 1 <= workflow.max_parallel <= MAX_PARALLEL:
        out.append(
            Finding(
                "",
                "graph",
                f"maxParallel must be between 1 and {MAX_PARALLEL}; got {workflow.max_parallel}",
            )
        )
    comp_of: dict[str, str] = {}
    for s in workflow.steps:
        if not s.compensate:
            continue
        if s.compensate not in known:
            out.append(Finding(s.name, "graph", f"compensate names no step '{s.compensate}'"))
        elif s.compensate == s.name:
            out.append(Finding(s.name, "graph", "a step cannot compensate itself"))
        elif s.compensate in comp_of:
            out.append(
                Finding(
                    s.name,
                    "graph",
                    f"compensation step '{s.compensate}' already undoes '{comp_of[s.compensate]}'; "
                    "give each compensated step its own",
                )
            )
        else:
            comp_of[s.compensate] = s.name
    for s in workflow.steps:
        if s.name in comp_of and s.after is not None:
            out.append(
                Finding(
                    s.name,
                    "graph",
                    f"a compensation step takes no 'after': it runs only when the run fails "
                    f"after '{comp_of[s.name]}' succeeded",
                )
            )
        if s.name in comp_of and s.compensate:
            out.append(Finding(s.name, "graph", "a compensation step cannot declare 'compensate'"))
    blocked: set[str] = set()
    for s in workflow.steps:
        if s.name not in known or s.name in comp_of:
            continue
        for d in s.depends:
            if d.step == s.name:
                continue  # the cycle finding names it
            if d.step not in known:
                out.append(Finding(s.name, "graph", f"unknown dependency '{d.step}'"))
                blocked.add(s.name)
            elif d.step in comp_of:
                out.append(
                    Finding(
                        s.name,
                        "graph",
                        f"unreachable: it depends on '{d.step}', a compensation step that runs "
                        f"only to undo '{comp_of[d.step]}'",
                    )
                )
                blocked.add(s.name)
    if workflow.require is not None:
        for r in workflow.require:
            if r not in known:
                out.append(Finding("", "completion", f"completion.require names no step '{r}'"))
            elif r in comp_of:
                out.append(
                    Finding(
                        "",
                        "completion",
                        f"completion.require names '{r}', a compensation step (it runs only "
                        "when the run fails)",
                    )
                )
    mains = {n for n in known if n not in comp_of}
    in_cycle: set[str] = set()
    for cycle in _cycles(workflow, mains):
        in_cycle |= set(cycle)
        out.append(Finding(cycle[0], "graph", f"cycle: {' -> '.join(cycle)}"))
    # Reachable: every dependency reachable (a join-any step waits for all of them too).
    # In-degree propagation, linear in steps and edges (a fixpoint over every step per pass
    # took 30 s of CPU for a 4000-step chain).
    by_name = {s.name: s for s in workflow.steps}
    waiting: dict[str, int] = {}
    dependants: dict[str, list[str]] = {}
    ready: list[str] = []
    for name in mains:
        if name in blocked:
            continue
        deps = by_name[name].depends
        waiting[name] = len(deps)
        for d in deps:
            dependants.setdefault(d.step, []).append(name)
        if not deps:
            ready.append(name)
    reachable: set[str] = set()
    topological: list[str] = []
    while ready:
        name = ready.pop()
        reachable.add(name)
        topological.append(name)
        for after in dependants.get(name, ()):
            waiting[after] -= 1
            if waiting[after] == 0:
                ready.append(after)
    for s in workflow.steps:
        name = s.name
        if name not in mains or name in reachable or name in blocked or name in in_cycle:
            continue
        waits = next((d.step for d in s.depends if d.step not in reachable), "")
        out.append(
            Finding(name, "graph", f"unreachable: it waits on '{waits}', which can never run")
        )
    out.extend(contradiction_findings(by_name, topological))
    return out


_OUTCOME_WORD = {ON_SUCCESS: "succeed", ON_FAILURE: "fail"}


def contradiction_findings(by_name: Mapping[str, Step], order: list[str]) -> list[Finding]:
    """Steps that can never run because their dependency conditions cannot all hold.

    For each step, the outcomes its running *requires* (``d`` succeeded, ``d`` failed) are
    propagated in topological order: a ``join: all`` step requires what every ``success`` or
    ``failure`` edge requires (the upstream's outcome, and whatever made the upstream run);
    a ``join: any`` step only what every one of its edges requires (a ``done`` edge requires
    nothing). A step that requires a step both to succeed and to fail can never run (the
    decision table skips it every time); so can a step that requires the outcome of a step
    that can never run (for ``join: any``: when every edge does). Sound, not complete: a
    finding is always a step that never runs, and ``when`` gates are not read.

    Each step's requirements are two bit sets over ``order`` (Python ints), so the pass is
    linear in edges times ``len(order) / 64`` words: milliseconds at the caps.

    :param by_name: every step by name, in declaration order (the findings' order).
    :param order: the reachable main steps, each after all of its dependencies.
    :returns: one ``graph`` finding per step that can never run, naming it and the step
        whose outcomes contradict (or the dependency that can never run).
    """
    bit = {name: 1 << i for i, name in enumerate(order)}
    # name -> (must have succeeded, must have failed), or None: can never run
    needs: dict[str, tuple[int, int] | None] = {}
    out: list[Finding] = []

    def edge_needs(d: Dependency) -> tuple[int, int] | None:
        # What one matching edge requires; None when it can never match.
        if d.on == ON_DONE:
            return (0, 0)
        upstream = needs.get(d.step, (0, 0))
        if upstream is None:
            return None
        ok, bad = upstream
        if d.on == ON_SUCCESS:
            return (ok | bit.get(d.step, 0), bad)
        return (ok, bad | bit.get(d.step, 0))

    for name in order:
        step = by_name[name]
        per_edge = [(d, edge_needs(d)) for d in step.depends]
        if not per_edge:
            needs[name] = (0, 0)
            continue
        dead = next((d for d, n in per_edge if n is None), None)
        if step.join == "any":
            alive = [n for _, n in per_edge if n is not None]
            if not alive:
                needs[name] = None
                out.append(_never_runs(name, dead))
                continue
            ok, bad = alive[0]
            for a, b in alive[1:]:
                ok, bad = ok & a, bad & b
        else:
            if dead is not None:
                needs[name] = None
                out.append(_never_runs(name, dead))
                continue
            ok = bad = 0
            for _, n in per_edge:
                assert n is not None
                ok, bad = ok | n[0], bad | n[1]
        clash = ok & bad
        if not clash:
            needs[name] = (ok, bad)
            continue
        needs[name] = None
        low = (clash & -clash).bit_length() - 1
        out.append(_contradiction(step, order[low], per_edge, bit[order[low]]))
    position = {n: i for i, n in enumerate(by_name)}
    return sorted(out, key=lambda f: position.get(f.step, 0))


def _never_runs(name: str, dead: Dependency | None) -> Finding:
    assert dead is not None
    return Finding(
        name,
        "graph",
        f"can never run: it needs '{dead.step}' to {_OUTCOME_WORD[dead.on]}, and "
        f"'{dead.step}' can never run",
    )


def _contradiction(
    step: Step,
    target: str,
    per_edge: list[tuple[Dependency, tuple[int, int] | None]],
    mask: int,
) -> Finding:
    def via(index: int) -> str:
        for d, n in per_edge:
            if n is not None and n[index] & mask:
                return f"{d.step} on {d.on}" if d.step == target else f"through '{d.step}'"
        return ""

    how = f"join '{step.join}'"
    return Finding(
        step.name,
        "graph",
        f"can never run: its dependency conditions contradict each other ({how}): '{target}' "
        f"would have to succeed ({via(0)}) and fail ({via(1)})",
    )


def read_findings(
    workflow: CompiledWorkflow,
    known: set[str],
    anc: Mapping[str, Iterable[str]],
    also: Mapping[str, Iterable[str]] | None = None,
) -> list[Finding]:
    """A step reading a step that is not its ancestor (a sibling's output is a race).

    :param also: step -> further names it may read (a loop body's steps read the loop step).
    """
    out: list[Finding] = []
    for s in workflow.steps:
        if s.name not in known:
            continue
        mine = set(anc.get(s.name, ()))
        if also:
            mine.update(also.get(s.name, ()))
        for name in sorted(names_read(s)):
            if name in known and name != s.name and name not in mine:
                out.append(
                    Finding(
                        s.name,
                        "graph",
                        f"reads '{name}', which is not an ancestor of '{s.name}' (a sibling's "
                        f"output is a race); add it to 'after'",
                    )
                )
            elif name == s.name:
                out.append(Finding(s.name, "graph", f"'{s.name}' reads its own output"))
    return out


# -- simulation ----------------------------------------------------------------------------------


#: Failure paths ``simulate`` plays at most (``allSucceed`` aside); the step cap keeps a graph
#: under it today, and a bigger one (an unrolled loop) gets the first ones and a ``truncated``.
MAX_SIMULATION_PATHS = 1024
#: CPU seconds (the calling thread's) ``simulate`` may spend on its paths: once spent, the paths
#: left are not played and the answer says so in ``truncated``. At the caps (1024 steps, 4096
#: dependencies) every path is played in well under this.
SIMULATION_CPU_S = 2.0
SIMULATED_FAILURE = "simulated failure"


@dataclass
class _Trace:
    """The all-succeed play, wave by wave (a wave is what one ``GraphState.next`` gave), so
    a path where one step fails unhandled (it stops the run at the end of its wave) is a
    prefix of it, cut without playing it again."""

    started: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    #: per wave, ``len(started)``, ``len(skipped)`` and ``len(order)`` once it ended
    ends: list[tuple[int, int, int]] = field(default_factory=list)
    #: main step -> the wave it ended in (started or skipped)
    wave: dict[str, int] = field(default_factory=dict)
    started_set: frozenset[str] = frozenset()
    #: ``(position in order, step, its compensation)`` of every started step that declares one
    compensated: list[tuple[int, str, str]] = field(default_factory=list)


def _play(
    workflow: CompiledWorkflow, failing: str | None, trace: _Trace | None = None
) -> dict[str, Any]:
    state = GraphState(workflow)
    started: list[str] = []
    skipped: list[dict[str, str]] = []
    while True:
        start, skip = state.next()
        if not start and not skip:
            break
        for step, reason in skip:
            state.ended(step.name, SKIPPED, reason)
            skipped.append({"step": step.name, "reason": reason})
        for step in start:
            started.append(step.name)
            if step.name == failing:
                state.ended(step.name, FAILED, SIMULATED_FAILURE)
            else:
                # an approval step is simulated as accepted
                state.ended(step.name, SUCCEEDED, "", ACCEPT if step.approval else "")
        if trace is not None:
            w = len(trace.ends)
            trace.ends.append((len(started), len(skipped), len(state.order)))
            for step, _ in skip:
                trace.wave[step.name] = w
            for step in start:
                trace.wave[step.name] = w
    if trace is not None:
        trace.started, trace.skipped, trace.order = started, skipped, list(state.order)
        trace.started_set = frozenset(started)
        by_name = {s.name: s for s in workflow.steps}
        trace.compensated = [
            (i, name, by_name[name].compensate)
            for i, name in enumerate(trace.order)
            if name in trace.started_set
            and by_name[name].compensate
            and by_name[name].compensate in by_name
        ]
    completed, sentence = state.verdict()
    compensates = [] if completed else [c.name for c in state.to_compensate()]
    not_run = [s.name for s in state.pending()]
    return {
        "runs": started,
        "skipped": skipped,
        "notRun": not_run,
        "compensates": compensates,
        "status": "COMPLETED" if completed else "FAILED",
        "criterion": sentence,
    }


def _unhandled_path(
    workflow: CompiledWorkflow, trace: _Trace, base: dict[str, Any], failing: str
) -> dict[str, Any]:
    """The path where ``failing`` (whose failure no edge handles) fails: the all-succeed play
    up to the end of the wave that started it, then nothing new (what :func:`_play` gives,
    in time linear in the answer)."""
    w = trace.wave.get(failing)
    if w is None or failing not in trace.started_set:
        # it never starts when everything succeeds (skipped or never reached): same run
        return {**base, "runs": list(base["runs"]), "skipped": list(base["skipped"])}
    n_started, n_skipped, n_order = trace.ends[w]
    compensates = [
        comp for i, name, comp in reversed(trace.compensated) if i < n_order and name != failing
    ]
    not_run = [s.name for s in main_steps(workflow) if trace.wave.get(s.name, w + 1) > w]
    return {
        "runs": trace.started[:n_started],
        "skipped": trace.skipped[:n_skipped],
        "notRun": not_run,
        "compensates": compensates,
        "status": "FAILED",
        "criterion": f"unhandled failure of step '{failing}': {SIMULATED_FAILURE}",
    }


def simulate(
    workflow: CompiledWorkflow,
    *,
    max_paths: int = MAX_SIMULATION_PATHS,
    cpu_budget_s: float = SIMULATION_CPU_S,
) -> dict[str, Any]:
    """What happens when every step succeeds, and when each step alone fails (``when`` gates
    taken as true, external steps as completed).

    A path whose failing step no edge handles is cut from the all-succeed play (it runs what
    that play ran up to the failing step's wave); a handled failure is played in full (time
    linear in steps and dependencies). At most ``max_paths`` failure paths are played, and
    none once ``cpu_budget_s`` seconds of this thread's CPU are spent.

    :param max_paths: failure paths played at most (declaration order).
    :param cpu_budget_s: CPU seconds (``time.thread_time``) the paths may take.
    :returns: ``{"allSucceed": {...}, "ifFails": [{"step", "runs", "skipped", "notRun",
        "compensates", "status", "criterion"}]}`` in declaration order; with
        ``"truncated": {"played": int, "of": int, "reason": str}`` when a bound left paths
        out (the steps whose failure was not played are not in ``ifFails``).
    """
    if not workflow.graph:
        # A sequential workflow is the chain of its steps.
        from protomolt_jobs.workflow.envelope import resolve_depends

        workflow = dataclasses.replace(workflow, steps=resolve_depends(workflow.steps), graph=True)
    started_s = time.thread_time()
    trace = _Trace()
    base = _play(workflow, None, trace)
    handled = handled_failures(workflow)
    mains = main_steps(workflow)
    per_step: list[dict[str, Any]] = []
    out: dict[str, Any] = {"allSucceed": base, "ifFails": per_step}
    for s in mains:
        reason = ""
        if len(per_step) >= max_paths:
            reason = f"simulate plays at most {max_paths} failure paths"
        elif time.thread_time() - started_s > cpu_budget_s:
            reason = f"simulate spent its CPU budget of {cpu_budget_s:g} s"
        if reason:
            out["truncated"] = {
                "played": len(per_step),
                "of": len(mains),
                "reason": f"{reason}; the failures of '{s.name}' and the steps after it "
                "were not played",
            }
            break
        if s.name in handled:
            outcome = _play(workflow, s.name)
        else:
            outcome = _unhandled_path(workflow, trace, base, s.name)
        per_step.append({"step": s.name, **outcome})
    return out


def graph_edges(workflow: CompiledWorkflow) -> list[dict[str, str]]:
    """The graph's edges for drawing: ``{"from", "to", "on", "kind"}`` with ``kind`` ``after``
    (a dependency: ``to`` runs after ``from`` ended with ``on``), ``compensate`` (``to`` undoes
    ``from``) or ``loop`` (the back-edge of a loop step ``from`` to its body's first step
    ``to``; ``on`` is ``success``)."""
    out: list[dict[str, str]] = []
    for s in workflow.steps:
        for d in s.depends:
            out.append({"from": d.step, "to": s.name, "on": d.on, "kind": "after"})
        if s.compensate:
            out.append({"from": s.name, "to": s.compensate, "on": ON_FAILURE, "kind": "compensate"})
        if s.loop is not None:
            out.append({"from": s.name, "to": s.loop.to, "on": ON_SUCCESS, "kind": "loop"})
    return out


def dependency_names(deps: Iterable[Dependency]) -> list[str]:
    return [d.step for d in deps]
