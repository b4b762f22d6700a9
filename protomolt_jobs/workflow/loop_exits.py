"""``simulate`` of a workflow with loops: the paths that leave each loop at each iteration
(DESIGN.md section 22; docs/workflows.md *Bounded loops*).

:func:`loop_exits` plays, for each loop and each ``k`` from 0 to ``max``, the run whose body
goes round ``k`` more times and then leaves the loop (its loop step is skipped, as a ``when``
that turns false skips it), and the run that exhausts the loop (``k = max + 1``: the loop step
asks for one more iteration; ``onExhausted`` decides). The play is ``graph.simulate``'s (every
other step succeeds, ``when`` gates hold) with the run's own loop bookkeeping
(``loops.LoopTracker``), and:

- an approval step inside the body decides, in an iteration that goes on, the decision whose
  edge leads on to the loop step (``decision:<d>``), and in the exit iteration another of its
  decisions (``accept`` when it has no other);
- every other loop leaves at once (its loop step is skipped the first time).

Paths are counted with ``graph.simulate``'s failure paths against the same caps: at most
``MAX_SIMULATION_PATHS`` paths in all and ``SIMULATION_CPU_S`` seconds of the calling thread's
CPU; what a cap left out is named in ``loopExitsTruncated``.
"""

from __future__ import annotations

import time
from typing import Any

from protomolt_jobs.workflow import graph as g
from protomolt_jobs.workflow.loops import Loop, LoopTracker, plan
from protomolt_jobs.workflow.types import ON_DECISION, CompiledWorkflow

__all__ = ["EXITS", "loop_exits"]

#: The skip reason of a loop step where a simulated path leaves its loop.
EXITS = "the loop exits here (simulated)"


def loop_exits(
    workflow: CompiledWorkflow,
    *,
    played: int = 0,
    started_s: float | None = None,
    max_paths: int = g.MAX_SIMULATION_PATHS,
    cpu_budget_s: float = g.SIMULATION_CPU_S,
) -> dict[str, Any]:
    """The loop-exit paths of ``workflow`` (module docstring); ``{}`` without loops.

    :param played: paths already played (``graph.simulate``'s failure paths).
    :param started_s: ``time.thread_time()`` when the simulation began (default: now).
    :returns: ``{"loopExits": [{"loop", "iterations", "exhausted", "runs", "skipped",
        "notRun", "status", "criterion"}], "loopExitsTruncated"?: {"played", "of",
        "reason"}}``: ``iterations`` is how many times the body ran; ``runs`` and ``skipped``
        name iteration ``k > 0`` executions ``<step>#<k>``; ``status`` COMPLETED, FAILED or
        PAUSED (a ``park`` exhaustion).
    """
    if not workflow.loops:
        return {}
    start = time.thread_time() if started_s is None else started_s
    paths = [(lp, k) for lp in plan(workflow).loops.values() for k in range(max(lp.max, 0) + 2)]
    out: list[dict[str, Any]] = []
    answer: dict[str, Any] = {"loopExits": out}
    for lp, k in paths:
        reason = ""
        if played + len(out) >= max_paths:
            reason = f"simulate plays at most {max_paths} paths (failures and loop exits)"
        elif time.thread_time() - start > cpu_budget_s:
            reason = f"simulate spent its CPU budget of {cpu_budget_s:g} s"
        if reason:
            answer["loopExitsTruncated"] = {
                "played": len(out),
                "of": len(paths),
                "reason": f"{reason}; loop '{lp.step}' from {k + 1} iterations on and the "
                "loops after it were not played",
            }
            break
        out.append(_play(workflow, lp, k))
    return answer


def _toward(workflow: CompiledWorkflow, lp: Loop) -> dict[str, str]:
    """Approval step of the body -> the decision whose edge leads on to the loop step."""
    on_path = {lp.step} | (set(g.ancestors(workflow).get(lp.step, ())) & lp.body)
    out: dict[str, str] = {}
    for s in workflow.steps:
        if s.name not in on_path:
            continue
        for d in s.depends:
            if d.on.startswith(ON_DECISION) and d.step in lp.body:
                out.setdefault(d.step, d.on[len(ON_DECISION) :])
    return out


def _other(step: Any, toward: str) -> str:
    """An approval step's decision that does not lead on to the loop step."""
    decisions = list(getattr(step.approval, "decisions", ()) or ())
    return next((d for d in decisions if d != toward), g.ACCEPT)


def _play(workflow: CompiledWorkflow, lp: Loop, k: int) -> dict[str, Any]:
    """The path where ``lp``'s body runs ``k + 1`` times and leaves (``k > max``: exhausts)."""
    state = g.GraphState(workflow)
    tracker = LoopTracker(workflow)
    toward = _toward(workflow, lp)
    runs: list[str] = []
    skipped: list[dict[str, str]] = []

    def label(name: str) -> str:
        i = tracker.iteration(name)
        return f"{name}#{i}" if i else name

    def ended(name: str, outcome: str, reason: str = "", decision: str = "") -> None:
        state.ended(name, outcome, reason, decision)
        error = tracker.ended(name, outcome) if name in tracker.plan.loops else None
        state.blocked = tracker.blocked()
        if error is not None:
            state.reasons[name] = error.message
            if state.unhandled is None:
                state.unhandled = name

    state.blocked = tracker.blocked()
    while not tracker.parked:
        due = tracker.due(())
        if due is not None:
            state.reset(tracker.restart(due))
            state.blocked = tracker.blocked()
            continue
        start, skip = state.next()
        if not start and not skip:
            break
        for step, reason in skip:
            skipped.append({"step": label(step.name), "reason": reason})
            ended(step.name, g.SKIPPED, reason)
        for step in start:
            name = step.name
            goes_on = tracker.since.get(lp.step, 0) < k
            if name in tracker.plan.loops and not (name == lp.step and goes_on):
                skipped.append({"step": label(name), "reason": EXITS})
                ended(name, g.SKIPPED, EXITS)
                continue
            runs.append(label(name))
            decision = ""
            if step.approval is not None:
                decision = g.ACCEPT
                if name in toward:
                    decision = toward[name] if goes_on else _other(step, toward[name])
            ended(name, g.SUCCEEDED, "", decision)
    if tracker.parked:
        status, sentence = "PAUSED", f"loop '{lp.step}' exhausted: onExhausted park"
    else:
        completed, sentence = state.verdict()
        if state.unhandled is not None:
            sentence = state.reasons.get(state.unhandled, sentence)
        status = "COMPLETED" if completed and state.unhandled is None else "FAILED"
    return {
        "loop": lp.step,
        "iterations": min(k, max(lp.max, 0)) + 1,
        "exhausted": k > lp.max,
        "runs": runs,
        "skipped": skipped,
        "notRun": [s.name for s in state.pending()],
        "status": status,
        "criterion": sentence,
    }
