"""Graph workflows: dependencies, the one decision table, structural findings and simulation.

A workflow that uses a graph key (``after``, ``join``, ``compensate``, ``edge``, ``fanOut``,
``structured``, ``maxParallel``, ``completion``) is a graph: each step runs after its
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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    "criterion",
    "decide",
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


@dataclass
class GraphState:
    """Outcomes of one run of a graph workflow, and what may start next.

    The executor and the simulation both drive it: :meth:`next` gives the steps to start and
    the skips to record; :meth:`ended` records an outcome.
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

    def __post_init__(self) -> None:
        self._mains = main_steps(self.workflow)
        self._handled = handled_failures(self.workflow)
        self._compensations = self.workflow.compensations
        self._index = {s.name: i for i, s in enumerate(self._mains)}
        self._dependants: dict[str, list[int]] = {}
        for i, s in enumerate(self._mains):
            for d in s.depends:
                self._dependants.setdefault(d.step, []).append(i)
        # Steps whose decision may have changed since the last ``next`` (a decision depends
        # only on the outcomes of the step's own dependencies, and outcomes only grow), so a
        # chain of n steps costs O(n) decisions, not O(n^2) (simulate plays n + 1 runs).
        self._dirty: set[int] = set(range(len(self._mains)))

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
        self._dirty.update(self._dependants.get(name, ()))
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
        for name in reversed(self.order):
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
    parse of responses): what :func:`report` said when the run settled.

    :param status: the job's status (COMPLETED, FAILED, DEAD, ...).
    :param error: the job's error text, used when no checkpoint explains the end (a retryable
        failure that exhausted its attempts is not checkpointed).
    """
    state = GraphState(workflow)
    for entry in checkpoints or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        name = entry["name"]
        if workflow.step(name) is None or name in state.outcomes:
            continue
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
    ``condition false`` skips stay: they are not called again.
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
    return set(_IDENT_USE.findall(_STRING_LITERAL.sub("", expr)))


def names_read(step: Step) -> set[str]:
    """Scope names the step's request mapping and gate read (an edge's own rules excluded:
    the edge's restricted scope checks those)."""
    out: set[str] = set()
    for rule in step.rules:
        if isinstance(rule.source, tuple) and rule.source:
            out.add(rule.source[0])
    for crule in step.cel_rules:
        out |= cel_names(crule.filter) | cel_names(crule.selector)
    if step.when.strip():
        out |= cel_names(step.when)
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
    while ready:
        name = ready.pop()
        reachable.add(name)
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
    return out


def read_findings(
    workflow: CompiledWorkflow, known: set[str], anc: Mapping[str, Iterable[str]]
) -> list[Finding]:
    """A step reading a step that is not its ancestor (a sibling's output is a race)."""
    out: list[Finding] = []
    for s in workflow.steps:
        if s.name not in known:
            continue
        mine = set(anc.get(s.name, ()))
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


def _play(workflow: CompiledWorkflow, failing: str | None) -> dict[str, Any]:
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
                state.ended(step.name, FAILED, "simulated failure")
            else:
                # an approval step is simulated as accepted
                state.ended(step.name, SUCCEEDED, "", ACCEPT if step.approval else "")
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


def simulate(workflow: CompiledWorkflow) -> dict[str, Any]:
    """What happens when every step succeeds, and when each step alone fails (``when`` gates
    taken as true, external steps as completed).

    :returns: ``{"allSucceed": {...}, "ifFails": [{"step", "runs", "skipped", "notRun",
        "compensates", "status", "criterion"}]}`` in declaration order.
    """
    if not workflow.graph:
        # A sequential workflow is the chain of its steps.
        from protomolt_jobs.workflow.envelope import resolve_depends

        workflow = dataclasses.replace(workflow, steps=resolve_depends(workflow.steps), graph=True)
    base = _play(workflow, None)
    per_step = []
    for s in main_steps(workflow):
        outcome = _play(workflow, s.name)
        per_step.append({"step": s.name, **outcome})
    return {"allSucceed": base, "ifFails": per_step}


def dependency_names(deps: Iterable[Dependency]) -> list[str]:
    return [d.step for d in deps]
