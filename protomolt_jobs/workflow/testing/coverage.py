"""What no case reached: ``test-workflow``'s coverage over all the cases it ran.

- ``decisions``: each ``when`` gate's two outcomes (``"<step>: ran"``, ``"<step>: skipped"``) and
  each approval step's decisions (``"<step>: <decision>"``) that no case took;
- ``failureEdges``: each ``after`` entry ``on: failure`` (``"<step> -> <dependant>"``) whose
  step failed in no case, and each ``compensate`` step no case ran;
- ``loopExits``: each loop whose body no case repeated (``"<loop step>: repeated"``) and each
  loop no case left before its bound, its loop step skipped or failed
  (``"<loop step>: exited"``), and each loop no case exhausted (``"<loop step>: exhausted"``);
- ``escalations``: each approval step's escalation and expiry timers (timers are not played
  by the in-process run, so these are always listed).
"""

from __future__ import annotations

from collections.abc import Iterable

from protomolt_jobs.workflow.testing.harness import CaseRun
from protomolt_jobs.workflow.types import CompiledWorkflow

__all__ = ["coverage"]


def coverage(workflow: CompiledWorkflow, runs: Iterable[CaseRun]) -> dict[str, list[str]]:
    """``{"decisions", "failureEdges", "loopExits", "escalations"}``: the items no run reached."""
    ran: set[str] = set()
    skipped: set[str] = set()
    failed: set[str] = set()
    decided: set[tuple[str, str]] = set()
    iterations: dict[str, int] = {}
    exhausted: set[str] = set()
    for run in runs:
        for entry in run.checkpoints:
            name = entry.get("name")
            if not isinstance(name, str):
                continue
            if entry.get("skipped") is True:
                skipped.add(name)
            elif "failed" in entry:
                failed.add(name)
            else:
                ran.add(name)
            if isinstance(entry.get("decision"), str):
                decided.add((name, entry["decision"]))
            k = entry.get("iteration", 0)
            if isinstance(k, int):
                iterations[name] = max(iterations.get(name, 0), k)
        if run.error_kind == "LOOP" and run.failed_step:
            exhausted.add(run.failed_step)
    out: dict[str, list[str]] = {
        "decisions": [],
        "failureEdges": [],
        "loopExits": [],
        "escalations": [],
    }
    for step in workflow.steps:
        if step.when:
            if step.name not in ran and step.name not in failed:
                out["decisions"].append(f"{step.name}: ran")
            if step.name not in skipped:
                out["decisions"].append(f"{step.name}: skipped")
        if step.approval is not None:
            for d in step.approval.decisions:
                if (step.name, d) not in decided:
                    out["decisions"].append(f"{step.name}: {d}")
            for i, _ in enumerate(step.approval.escalate):
                out["escalations"].append(f"{step.name}: escalate[{i}]")
            if step.approval.expires_s is not None:
                out["escalations"].append(f"{step.name}: expires")
        for dep in step.depends or ():
            if dep.on == "failure" and dep.step not in failed:
                out["failureEdges"].append(f"{dep.step} -> {step.name}")
        if step.compensate and step.compensate not in ran:
            out["failureEdges"].append(f"{step.name} -> compensate {step.compensate}")
        if step.loop is not None:
            body_first = step.loop.to
            reps = iterations.get(body_first, 0)
            if reps == 0:
                out["loopExits"].append(f"{step.name}: repeated")
            if step.name not in skipped and step.name not in failed:
                # a loop is left before its bound when its loop step is skipped or fails
                out["loopExits"].append(f"{step.name}: exited")
            if step.name not in exhausted:
                out["loopExits"].append(f"{step.name}: exhausted")
    return out
