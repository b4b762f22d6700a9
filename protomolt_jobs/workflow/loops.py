"""Bounded loops in graph workflows (DESIGN.md section 22; docs/workflows.md *Bounded loops*).

A step may declare ``loop: {"to", "max", "onExhausted", "allowEffects"?}``. The forward graph
stays acyclic; the loop is a declared, bounded back-edge from the **loop step** to ``to``, an
ancestor of it. The **body** is ``to``, the loop step and every step between them (the
descendants of ``to`` that are ancestors of the loop step).

Run semantics (:class:`LoopTracker`, which ``graph_run`` consults; the decisions stay in
``graph.GraphState``):

- The loop step **succeeded** and fewer than ``max`` re-runs were made in this iteration of the
  enclosing loops: the body runs again as the next iteration. Body steps not started yet wait;
  once no body step runs, their outcomes are forgotten (``GraphState.reset``) and the body is
  decided again. The loop step's output stays bound (``replan.*`` is in scope for the body; it
  binds the output type's default before the first iteration).
- The loop step was **skipped** (or failed): the loop is *settled*, no iteration follows.
- Steps outside the body that depend on a body step wait (run or skip) until the loop is settled,
  then read the latest iteration.
- **Exhausted** (the loop step succeeds again after ``max`` re-runs, ``max`` raised by
  ``extend-loop`` for this run): ``onExhausted: "fail"`` fails the run (kind ``LOOP``) naming the
  loop step; ``"park"`` stops the run (:class:`~.types.Parked` with ``wait_kind`` ``loop``), and
  the worker pauses it for a human (``extend-loop`` requeues it; ``cancel-job`` ends it).

Iterations: a step's iteration is how many times the loops around it have started their body
again (the sum of their re-runs over the whole run), so iteration 0 is the first execution. An
entry of iteration ``k > 0`` carries ``"iteration": k``; iteration 0 entries are unchanged. The
idempotency key of iteration ``k > 0`` is ``<job>:<step>:<generation>:<k>`` (:func:`key_suffix`).

Verification (:func:`findings`, kind ``loop``): ``1 <= max <= 20``; ``to`` names a step that is
an ancestor of the loop step; bodies nest or are disjoint; an ``external`` step in a body needs
``allowEffects``; the graph unrolled ``max + 1`` times (each body copied once per iteration, each
copy of ``to`` after the previous copy of the loop step) passes ``graph.structure_findings``
within the step cap, and each copy of a step reads only copies that ran before it (the
same iteration's body steps, the loop step's previous iteration, a body's last iteration from
outside it). :func:`worst_case` is what check-workflow prints: the most step executions
and calls, and the most cost when every step's ``cost`` is a constant (a finding when it is over
``budget.maxCost``).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protomolt_jobs.workflow.types import (
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    Dependency,
    FailureKind,
    Finding,
    Step,
    WorkflowExecutionError,
)

__all__ = [
    "FINDING_KIND",
    "LOOP_WAIT",
    "MAX_ITERATIONS",
    "MAX_LOOPS",
    "Loop",
    "LoopPlan",
    "LoopTracker",
    "findings",
    "key_suffix",
    "open_iteration",
    "plan",
    "unroll",
    "unroll_with_copies",
    "unrolled_read_findings",
    "worst_case",
]

#: The ``kind`` of the findings this module makes.
FINDING_KIND = "loop"
#: The most re-runs a loop may declare (``loop.max``).
MAX_ITERATIONS = 20
#: The most loops one workflow declares (each body is found by two walks of the graph).
MAX_LOOPS = 64
#: Where the worst case stops counting (a deep nest of loops would otherwise count past 10^300).
SATURATED = 1_000_000
#: ``Parked.wait_kind`` of a run whose loop exhausted with ``onExhausted: "park"``.
LOOP_WAIT = "loop"


def key_suffix(iteration: int) -> str:
    """What an iteration adds to a step's idempotency key: ``""`` for 0, else ``":<k>"``."""
    return f":{iteration}" if iteration > 0 else ""


@dataclass(frozen=True)
class Loop:
    """One declared loop, resolved.

    :ivar step: the loop step's name.
    :ivar to: the body's first step.
    :ivar max: the declared re-runs.
    :ivar body: the body's step names (``to`` and the loop step included).
    :ivar waiting: main steps outside the body that depend on a body step (they wait until the
        loop is settled).
    :ivar inner: the loops whose body lies inside this one's (their counts restart with it).
    """

    step: str
    to: str
    max: int
    on_exhausted: str
    allow_effects: bool
    body: frozenset[str]
    waiting: frozenset[str]
    inner: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoopPlan:
    """The loops of one compiled workflow (:func:`plan`)."""

    loops: Mapping[str, Loop]
    #: step name -> the loops whose body holds it
    around: Mapping[str, tuple[str, ...]]


def _dependants(workflow: CompiledWorkflow) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    comp = workflow.compensations
    for s in workflow.steps:
        if s.name in comp:
            continue
        for d in s.depends:
            out.setdefault(d.step, []).append(s.name)
    return out


def _reach(start: str, edges: Mapping[str, Iterable[str]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _body(
    step: Step, dependants: Mapping[str, list[str]], upstream: Mapping[str, list[str]]
) -> set[str]:
    assert step.loop is not None
    return _reach(step.loop.to, dependants) & _reach(step.name, upstream)


_PLANS: weakref.WeakKeyDictionary[CompiledWorkflow, LoopPlan] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def plan(workflow: CompiledWorkflow) -> LoopPlan:
    """The resolved loops of ``workflow`` (cached per compiled workflow); empty without loops."""
    with _PLANS_LOCK:
        found = _PLANS.get(workflow)
    if found is not None:
        return found
    dependants = _dependants(workflow)
    upstream = {s.name: [d.step for d in s.depends] for s in workflow.steps}
    loops: dict[str, Loop] = {}
    for s in workflow.loops:
        assert s.loop is not None
        body = _body(s, dependants, upstream)
        waiting = {
            after for name in body for after in dependants.get(name, ()) if after not in body
        }
        loops[s.name] = Loop(
            step=s.name,
            to=s.loop.to,
            max=s.loop.max,
            on_exhausted=s.loop.on_exhausted,
            allow_effects=s.loop.allow_effects,
            body=frozenset(body),
            waiting=frozenset(waiting),
        )
    around: dict[str, list[str]] = {}
    for lp in loops.values():
        for n in lp.body:
            around.setdefault(n, []).append(lp.step)
    # bodies nest or are disjoint (the verifier says so otherwise): a loop whose step lies in
    # a larger body is inside it
    inner: dict[str, list[str]] = {}
    for lp in loops.values():
        for outer in around.get(lp.step, ()):
            if len(loops[outer].body) > len(lp.body):
                inner.setdefault(outer, []).append(lp.step)
    for name, lp in list(loops.items()):
        loops[name] = dataclasses.replace(lp, inner=tuple(inner.get(name, ())))
    built = LoopPlan(loops=loops, around={k: tuple(v) for k, v in around.items()})
    with _PLANS_LOCK:
        _PLANS[workflow] = built
    return built


# -- verification ------------------------------------------------------------------------------


def findings(workflow: CompiledWorkflow, max_steps: int) -> list[Finding]:
    """Findings about the workflow's loops (kind ``loop``, each naming the loop step or the
    body step concerned); none for a workflow without ``loop``.

    :param max_steps: the graph step cap the unrolled graph must stay within.
    """
    if not workflow.loops:
        return []
    from protomolt_jobs.workflow import graph as g

    if len(workflow.loops) > MAX_LOOPS:
        return [
            Finding(
                workflow.loops[MAX_LOOPS].name,
                FINDING_KIND,
                f"a workflow declares at most {MAX_LOOPS} loops; this one {len(workflow.loops)}",
            )
        ]
    out: list[Finding] = []
    anc = g.ancestors(workflow)
    known = {s.name for s in workflow.steps}
    sound: list[Step] = []
    for s in workflow.loops:
        assert s.loop is not None
        spec = s.loop
        if not 1 <= spec.max <= MAX_ITERATIONS:
            out.append(
                Finding(
                    s.name,
                    FINDING_KIND,
                    f"loop.max must be between 1 and {MAX_ITERATIONS}; got {spec.max}",
                )
            )
        if spec.to not in known:
            out.append(Finding(s.name, FINDING_KIND, f"loop.to names no step '{spec.to}'"))
            continue
        if spec.to == s.name or spec.to not in anc.get(s.name, ()):
            out.append(
                Finding(
                    s.name,
                    FINDING_KIND,
                    f"loop.to '{spec.to}' is not an ancestor of '{s.name}': a loop goes back to a "
                    "step the loop step runs after",
                )
            )
            continue
        if s.name in workflow.compensations:
            out.append(Finding(s.name, FINDING_KIND, "a compensation step cannot declare a loop"))
            continue
        sound.append(s)
    if out:
        return out
    lplan = plan(workflow)
    loops = list(lplan.loops.values())
    # the cap first: it bounds the bodies' sizes, and so the pairwise checks below
    worst = worst_case(workflow)
    if worst["executions"] > max_steps:
        return [
            Finding(
                loops[0].step,
                FINDING_KIND,
                f"unrolled {{max + 1}} times the graph has {worst['executions']} step executions, "
                f"over the cap of {max_steps} steps",
            )
        ]
    for i, a in enumerate(loops):
        for b in loops[i + 1 :]:
            common = a.body & b.body
            if common and not (a.body <= b.body or b.body <= a.body):
                out.append(
                    Finding(
                        b.step,
                        FINDING_KIND,
                        f"the bodies of loops '{a.step}' and '{b.step}' cross (they share "
                        f"{', '.join(sorted(common))}); loop bodies nest or are disjoint",
                    )
                )
    by_name = {s.name: s for s in workflow.steps}
    for lp in loops:
        if lp.allow_effects:
            continue
        for name in sorted(lp.body):
            step = by_name[name]
            if step.effect == EFFECT_EXTERNAL:
                out.append(
                    Finding(
                        name,
                        FINDING_KIND,
                        f"step '{name}' has effect 'external' inside the body of loop "
                        f"'{lp.step}'; the loop must say allowEffects: true (each iteration "
                        "makes the effect again)",
                    )
                )
    if out:
        return out
    unrolled, copies = unroll_with_copies(workflow)
    for f in g.structure_findings(unrolled, {s.name for s in unrolled.steps}):
        base = f.step.split("@", 1)[0]
        out.append(Finding(base, FINDING_KIND, f"unrolled: {f.error}"))
    out.extend(unrolled_read_findings(workflow, unrolled, copies))
    max_cost = _max_cost(workflow.definition)
    if max_cost is not None and worst.get("cost") is not None and worst["cost"] > max_cost:
        out.append(
            Finding(
                loops[0].step,
                FINDING_KIND,
                f"worst case: {worst['executions']} step executions, {worst['calls']} calls, "
                f"cost {worst['cost']:g}, over budget.maxCost {max_cost:g}",
            )
        )
    return out


def _multiplicity(
    workflow: CompiledWorkflow, extra: Mapping[str, int] | None = None
) -> dict[str, int]:
    lplan = plan(workflow)
    extra = extra or {}
    out: dict[str, int] = {}
    for s in workflow.steps:
        m = 1
        for name in lplan.around.get(s.name, ()):
            lp = lplan.loops[name]
            m = min(m * (max(lp.max, 0) + int(extra.get(name, 0)) + 1), SATURATED)
        out[s.name] = m
    comp_of = {s.compensate: s.name for s in workflow.steps if s.compensate}
    for comp, undone in comp_of.items():
        if comp in out:
            out[comp] = out.get(undone, 1)
    return out


def worst_case(
    workflow: CompiledWorkflow, extra: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The most a run of ``workflow`` can do when every loop runs to its bound.

    :param extra: loop step -> re-runs ``extend-loop`` added (a stored run's).
    :returns: ``{"executions": int, "calls": int, "cost": float | None, "loops": [{"step",
        "to", "max", "body"}]}``: executions of steps (compensations included), calls (steps
        that park make none), and the summed constant ``cost`` of every execution (None when
        some step's cost depends on its response). Counts stop at :data:`SATURATED`.
    """
    mult = _multiplicity(workflow, extra)
    executions = min(sum(mult.values()), SATURATED)
    calls = min(sum(m for name, m in mult.items() if not _parks(workflow, name)), SATURATED)
    cost: float | None = 0.0
    for step in workflow.definition.get("steps") or []:
        if not isinstance(step, dict) or not isinstance(step.get("cost"), str):
            continue
        value = _constant(step["cost"])
        if value is None:
            cost = None
            break
        assert cost is not None
        cost += value * mult.get(str(step.get("name")), 1)
    lplan = plan(workflow)
    return {
        "executions": executions,
        "calls": calls,
        "cost": cost,
        "loops": [
            {"step": lp.step, "to": lp.to, "max": lp.max, "body": sorted(lp.body)}
            for lp in lplan.loops.values()
        ],
    }


def _parks(workflow: CompiledWorkflow, name: str) -> bool:
    step = workflow.step(name)
    return step is not None and step.parks


def _constant(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _max_cost(definition: Any) -> float | None:
    budget = definition.get("budget") if isinstance(definition, Mapping) else None
    value = budget.get("maxCost") if isinstance(budget, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def unroll(workflow: CompiledWorkflow) -> CompiledWorkflow:
    """``workflow`` with each loop body copied ``max + 1`` times (innermost loops first): copy
    ``k`` of a body step is ``<name>@<loop step><k>``, the copy of ``to`` also runs after copy ``k - 1`` of
    the loop step, and a step outside the body that depended on a body step depends on the
    last copy. Only the dependency structure is meaningful (for the structural checks)."""
    return unroll_with_copies(workflow)[0]


#: copy name -> (the step it copies, {loop step: its iteration in this copy})
_Copies = dict[str, tuple[str, dict[str, int]]]


def unroll_with_copies(workflow: CompiledWorkflow) -> tuple[CompiledWorkflow, _Copies]:
    """:func:`unroll`, and ``{copy name: (the step it copies, {loop step: iteration})}``."""
    steps = list(workflow.steps)
    copies: _Copies = {s.name: (s.name, {}) for s in steps}
    lplan = plan(workflow)
    for lp in sorted(lplan.loops.values(), key=lambda x: len(x.body)):
        members = {s.name for s in steps if copies[s.name][0] in lp.body}
        k_last = max(lp.max, 0)

        def copy_name(n: str, k: int, tag: str = lp.step) -> str:
            return f"{n}@{tag}{k}" if k else n  # unique per loop: nested copies never clash

        out: list[Step] = []
        for s in steps:
            if s.name in members:
                copies[s.name][1][lp.step] = 0
                out.append(dataclasses.replace(s, loop=None))
            else:
                deps = tuple(
                    Dependency(copy_name(d.step, k_last) if d.step in members else d.step, d.on)
                    for d in s.depends
                )
                out.append(dataclasses.replace(s, depends=deps))
        for k in range(1, k_last + 1):
            for s in steps:
                if s.name not in members:
                    continue
                deps = tuple(
                    Dependency(copy_name(d.step, k) if d.step in members else d.step, d.on)
                    for d in s.depends
                )
                if s.name == lp.to:
                    deps = (*deps, Dependency(copy_name(lp.step, k - 1)))
                name = copy_name(s.name, k)
                base, at = copies[s.name]
                copies[name] = (base, {**at, lp.step: k})
                out.append(
                    dataclasses.replace(s, name=name, depends=deps, loop=None, compensate="")
                )
        steps = out
    unrolled = dataclasses.replace(
        workflow, steps=tuple(dataclasses.replace(s, index=i) for i, s in enumerate(steps))
    )
    return unrolled, copies


def unrolled_read_findings(
    workflow: CompiledWorkflow, unrolled: CompiledWorkflow, copies: _Copies
) -> list[Finding]:
    """The unrolled graph's reads: every copy of a step reads, for each step name it reads,
    the copy the run binds then (a body step: the same iteration's; the loop step around it:
    the previous iteration's, its default before the first; a body step read from outside the
    body: the last iteration's), and that copy must be one of its ancestors in the unrolled
    graph (a later or sibling copy is a race or a value not yet produced)."""
    from protomolt_jobs.workflow import graph as g

    lplan = plan(workflow)
    by_name = {s.name: s for s in workflow.steps}
    index = {(base, tuple(sorted(at.items()))): name for name, (base, at) in copies.items()}
    anc = g.ancestors(unrolled)
    plain = g.ancestors(workflow)
    out: list[Finding] = []
    reported: set[tuple[str, str]] = set()
    for copy in unrolled.steps:
        base, at = copies.get(copy.name, (copy.name, {}))
        step = by_name.get(base)
        if step is None:
            continue
        for read in sorted(g.names_read(step)):
            if read == base or read not in by_name or (base, read) in reported:
                continue
            if read not in plain.get(base, ()) and read not in lplan.around.get(base, ()):
                continue  # not an ancestor: the plain graph's read check names it
            want: dict[str, int] = {}
            for loop_step in lplan.around.get(read, ()):
                k = at.get(loop_step, max(lplan.loops[loop_step].max, 0))
                if read == loop_step and loop_step in at:
                    k -= 1  # the loop step's output of the iteration before
                want[loop_step] = k
            if any(k < 0 for k in want.values()):
                continue  # before the first iteration: the output type's default
            instance = index.get((read, tuple(sorted(want.items()))))
            if instance is None or instance in anc.get(copy.name, ()):
                continue
            reported.add((base, read))
            out.append(
                Finding(
                    base,
                    FINDING_KIND,
                    f"unrolled: '{copy.name}' reads '{instance}', which is not its ancestor "
                    "(in that iteration the value is not produced yet, or a sibling's output "
                    "is a race)",
                )
            )
    return out


def open_iteration(workflow: CompiledWorkflow, checkpoints: Iterable[Any], step: str) -> int:
    """The iteration a body step that waits (an approval step open now) runs in, read from
    the run's checkpoints: every success of a loop step around it started its body again (a
    run waiting inside a body has met no exhaustion since), so it is the sum of those loop
    steps' succeeded entries. 0 outside every body and for a workflow without loops."""
    if not workflow.loops:
        return 0
    around = set(plan(workflow).around.get(step, ()))
    return sum(
        1
        for c in checkpoints
        if isinstance(c, dict)
        and c.get("name") in around
        and c.get("skipped") is not True
        and "failed" not in c
    )


# -- the run -----------------------------------------------------------------------------------


@dataclass
class LoopTracker:
    """The loops of one graph run: iterations, pending re-runs, settled loops.

    :param workflow: the compiled workflow (it has loops).
    :param extensions: ``() -> {loop step: re-runs extend-loop added}``, asked only when a loop
        reaches its bound (None: no extension).
    """

    workflow: CompiledWorkflow
    extensions: Callable[[], Mapping[str, Any]] | None = None
    plan: LoopPlan = field(init=False)
    #: loop step -> re-runs over the whole run; and within the enclosing loops' iteration
    total: dict[str, int] = field(default_factory=dict)
    since: dict[str, int] = field(default_factory=dict)
    #: loops whose loop step succeeded below the bound: the body runs again once idle
    pending: list[str] = field(default_factory=list)
    settled: set[str] = field(default_factory=set)
    #: the loop step a ``park`` exhaustion stopped the run at, or ""
    parked: str = ""
    _extra: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.plan = plan(self.workflow)

    # -- iterations --------------------------------------------------------------------------

    def iteration(self, step: str) -> int:
        """The iteration ``step`` runs in now (0 outside every body)."""
        return sum(self.total.get(name, 0) for name in self.plan.around.get(step, ()))

    def in_body(self, step: str) -> bool:
        return step in self.plan.around

    def blocked(self) -> set[str]:
        """Steps that may not be decided now: the bodies of loops about to run again, and the
        steps waiting on unsettled loops."""
        out: set[str] = set()
        for lp in self.plan.loops.values():
            if lp.step in self.pending:
                out |= lp.body
            if lp.step not in self.settled:
                out |= lp.waiting
        return out

    # -- events ------------------------------------------------------------------------------

    def ended(self, step: str, outcome: str) -> WorkflowExecutionError | None:
        """A loop step ended: schedule the next iteration, settle, or exhaust.

        :returns: the LOOP failure of a ``fail`` exhaustion (the run fails naming it), else None.
        """
        lp = self.plan.loops.get(step)
        if lp is None:
            return None
        if outcome != "succeeded":
            self.settled.add(step)
            return None
        bound = lp.max + self._extension(step, self.since.get(step, 0) >= lp.max)
        if self.since.get(step, 0) < bound:
            if step not in self.pending:
                self.pending.append(step)
            return None
        self.settled.add(step)
        if lp.on_exhausted == "park":
            self.parked = step
            return None
        return WorkflowExecutionError(
            FailureKind.LOOP,
            step,
            f"loop '{step}' exhausted: its body ran {bound + 1} times (loop.max {lp.max}"
            + (f" + {bound - lp.max} by extend-loop" if bound > lp.max else "")
            + f") and '{step}' asked for another iteration",
        )

    def _extension(self, step: str, needed: bool) -> int:
        if not needed or self.extensions is None:
            return 0
        if self._extra is None:
            found = self.extensions() or {}
            self._extra = {
                k: int(v)
                for k, v in found.items()
                if isinstance(v, int) and not isinstance(v, bool) and v > 0
            }
        return self._extra.get(step, 0)

    def due(self, running: Iterable[str]) -> str | None:
        """A pending loop whose body has no step running (its re-run can start), or None."""
        busy = set(running)
        for step in self.pending:
            if not (self.plan.loops[step].body & busy):
                return step
        return None

    def restart(self, step: str) -> frozenset[str]:
        """Count one re-run of ``step``'s loop (the caller resets the body's outcomes).

        :returns: the body.
        """
        lp = self.plan.loops[step]
        self.pending.remove(step)
        self.total[step] = self.total.get(step, 0) + 1
        self.since[step] = self.since.get(step, 0) + 1
        for inner in lp.inner:
            self.since[inner] = 0
            self.settled.discard(inner)
            if inner in self.pending:
                self.pending.remove(inner)
        return lp.body
