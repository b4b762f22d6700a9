"""A job's steps and edges with each step's state: what an operator surface draws.

``get-job`` with ``"graph": true`` adds this document as the job's ``graph`` (docs/verbs.md);
the dashboard draws it as an SVG and ``protomolt-jobs jobs show`` as text. The host computes
the layout; everything that needs the snapshotted definition is decided here.

Shape::

    {"kind": "graph" | "sequential" | "unknown",
     "steps": [{"name", "state",
                "attempts"?: int, "durationMs"?: int, "iterations"?: int,
                "reason"?: str,             # a skip's, a failure's, a step not reached
                "when"?: str,               # the step's condition
                "completion"?: "external" | "approval",
                "decision"?: str,           # an approval step that decided
                "compensation"?: true,      # a step that runs only to undo another
                "progress"?: {"percent", "details"}}],  # a resumable step's last report
     "edges": [{"from", "to", "kind", "label"?}]}

``state`` is one of :data:`STATES`; ``kind`` one of :data:`EDGE_KINDS`. Steps are in
definition order; ``unknown`` is a run whose stored definition cannot be read (the steps are
its checkpoints, without edges).

How an edge's kind is chosen: a dependency (``after``, or a sequential step's predecessor) is
its ``on`` (``success``, ``failure``, ``done``; ``decision:<d>`` is ``decision`` labelled
``<d>``), except that a ``success`` edge into a step with a ``when`` is ``condition`` labelled
with the condition; a step's ``compensate`` is a ``compensation`` edge to the compensation
step; a step's ``loop: {to, max}`` is a ``loop`` edge back to ``to`` labelled ``max <n>``.

How a state is chosen, first match: a checkpoint that failed (``failed``) or skipped
(``skipped``, with the engine's reason); a succeeded step whose compensation step ran
(``compensated``); any other checkpoint (``succeeded``); the step a live job is parked on or
waits on for recovery (``waiting``); a step of a RUNNING job whose dependencies have ended and
that has none (``running``: in flight); the failed step of a finished run the report names
(``failed``); else ``not-reached`` (with the report's reason when it gives one).
"""

from __future__ import annotations

from typing import Any

from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.workflow.graph import FAILED, SKIPPED, SUCCEEDED, GraphState
from protomolt_jobs.workflow.retry_scope import settled
from protomolt_jobs.workflow.types import ON_DECISION, ON_SUCCESS, CompiledWorkflow

__all__ = ["EDGE_KINDS", "STATES", "graph_view"]

#: The states a step is drawn in.
STATES = (
    "succeeded",
    "failed",
    "skipped",
    "compensated",
    "running",
    "waiting",
    "not-reached",
)
#: The kinds of edge between steps.
EDGE_KINDS = ("success", "failure", "done", "condition", "decision", "compensation", "loop")
#: Statuses in which no step is in flight or parked any more.
_FINISHED = frozenset({"COMPLETED", "FAILED", "DEAD", "CANCELLED"})


def graph_view(
    job: Any,
    stored: StoredRun | None,
    report: dict[str, Any],
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The drawing document of ``job`` (the module docstring gives its shape).

    :param job: the ``JobRecord``.
    :param stored: its snapshotted definition, or None when it cannot be read.
    :param report: ``runs.report.report_json`` of the job (attempts, durations, and the
        failed step and reasons of a finished run), built for any status.
    :param progress: get-job's ``progress`` (a resumable step's last report), or None: the
        step it names gets ``progress: {percent, details}`` (docs/long-steps.md).
    :returns: ``{"kind", "steps", "edges"}``.
    """
    checkpoints = [c for c in job.checkpoints or [] if isinstance(c, dict)]
    attempts = report.get("attempts", {})
    durations = report.get("durationsMs", {})
    reported = {s.get("name"): s for s in report.get("steps", []) if isinstance(s, dict)}
    if stored is None:
        last = {str(c.get("name")): c for c in checkpoints}
        steps = []
        for name, entry in last.items():
            doc = _step(name, _iterations(name, checkpoints), attempts, durations)
            doc["state"], reason = _state(job, name, entry, False, False)
            if reason:
                doc["reason"] = reason
            steps.append(doc)
        return {"kind": "unknown", "steps": steps, "edges": []}
    workflow = stored.workflow
    raw = _raw_steps(stored.definition)
    live = list(settled(workflow, checkpoints))
    by_name: dict[str, dict[str, Any]] = {}
    for entry in live:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            by_name[entry["name"]] = entry
    comp = workflow.compensations
    undone = {
        s.name
        for s in workflow.steps
        if s.compensate and s.compensate in by_name and not by_name[s.compensate].get("skipped")
    }
    flight = _in_flight(job, workflow, live) if job.status == "RUNNING" else set()
    steps = []
    for s in workflow.steps:
        doc = _step(s.name, _iterations(s.name, checkpoints), attempts, durations)
        found = by_name.get(s.name)
        state, reason = _state(job, s.name, found, s.name in undone, s.name in flight)
        if state == "not-reached":
            item = reported.get(s.name, {})
            if item.get("status") == "failed":
                state = "failed"
            elif job.status in _FINISHED:
                doc.pop("attempts", None)  # the run ended before it: never attempted
            if item.get("reason"):
                reason = str(item["reason"])
        doc["state"] = state
        if reason:
            doc["reason"] = reason
        if s.when:
            doc["when"] = s.when
        if s.completion in ("external", "approval"):
            doc["completion"] = s.completion
        if found is not None and isinstance(found.get("decision"), str):
            doc["decision"] = found["decision"]
        if s.name in comp:
            doc["compensation"] = True
        if progress is not None and progress.get("step") == s.name:
            doc["progress"] = {
                "percent": progress.get("percent"),
                "details": progress.get("details"),
            }
        steps.append(doc)
    return {
        "kind": "graph" if workflow.graph else "sequential",
        "steps": steps,
        "edges": _edges(workflow, raw),
    }


def _raw_steps(definition: Any) -> dict[str, dict[str, Any]]:
    """The definition's step objects by name (for keys the compiled step does not carry)."""
    steps = definition.get("steps") if isinstance(definition, dict) else None
    out: dict[str, dict[str, Any]] = {}
    for s in steps if isinstance(steps, list) else []:
        if isinstance(s, dict) and isinstance(s.get("name"), str):
            out[s["name"]] = s
    return out


def _iterations(name: str, checkpoints: list[dict[str, Any]]) -> int:
    """How many iterations of a loop body the checkpoints hold for ``name`` (0: no loop)."""
    seen = [
        c["iteration"]
        for c in checkpoints
        if c.get("name") == name and isinstance(c.get("iteration"), int)
    ]
    return max(seen) + 1 if seen and max(seen) > 0 else 0


def _step(
    name: str, iterations: int, attempts: dict[str, Any], durations: dict[str, Any]
) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "state": "not-reached"}
    if isinstance(attempts.get(name), int):
        doc["attempts"] = attempts[name]
    if isinstance(durations.get(name), int):
        doc["durationMs"] = durations[name]
    if iterations:
        doc["iterations"] = iterations
    return doc


def _state(
    job: Any, name: str, entry: dict[str, Any] | None, undone: bool, flying: bool
) -> tuple[str, str]:
    if entry is not None:
        if entry.get("failed"):
            failed = entry["failed"]
            message = failed.get("message") if isinstance(failed, dict) else None
            return "failed", str(message or "")
        if entry.get("skipped"):
            return "skipped", str(entry.get("reason") or "its condition was false")
        return ("compensated" if undone else "succeeded"), ""
    if job.status not in _FINISHED and job.outstanding_step == name:
        if job.status == "RECOVERY_REQUIRED":
            return "waiting", "recovery required" + (f": {job.error}" if job.error else "")
        return "waiting", ""
    if flying:
        return "running", ""
    return "not-reached", ""


def _in_flight(job: Any, workflow: CompiledWorkflow, live: list[Any]) -> set[str]:
    """The steps a RUNNING job has started and not checkpointed: the first unfinished step of
    a sequential run; the steps a graph run may start given what has ended (its compensation
    step next, after an unhandled failure)."""
    done = {e.get("name") for e in live if isinstance(e, dict)}
    if not workflow.graph:
        for s in workflow.steps:
            if s.name not in done:
                return {s.name}
        return set()
    state = GraphState(workflow)
    for entry in live:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or workflow.step(name) is None or name in state.outcomes:
            continue
        if entry.get("failed"):
            state.ended(name, FAILED)
        elif entry.get("skipped"):
            state.ended(name, SKIPPED, str(entry.get("reason", "")))
        else:
            decision = entry.get("decision")
            state.ended(name, SUCCEEDED, "", decision if isinstance(decision, str) else "")
    if state.unhandled is not None:
        undo = state.to_compensate()
        return {undo[0].name} if undo else set()
    start, _ = state.next()
    return {s.name for s in start}


def _edges(workflow: CompiledWorkflow, raw: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    edges: list[dict[str, Any]] = []
    previous = None
    for s in workflow.steps:
        if workflow.graph:
            deps = [(d.step, d.on) for d in s.depends]
        else:
            deps = [(previous.name, ON_SUCCESS)] if previous is not None else []
        previous = s
        for upstream, on in deps:
            edge: dict[str, Any] = {"from": upstream, "to": s.name}
            if on.startswith(ON_DECISION):
                edge |= {"kind": "decision", "label": on[len(ON_DECISION) :]}
            elif on == ON_SUCCESS and s.when:
                edge |= {"kind": "condition", "label": s.when}
            else:
                edge["kind"] = on
            edges.append(edge)
    for s in workflow.steps:
        if s.compensate:
            edges.append({"from": s.name, "to": s.compensate, "kind": "compensation"})
    for s in workflow.steps:
        loop = raw.get(s.name, {}).get("loop")
        if isinstance(loop, dict) and isinstance(loop.get("to"), str):
            edge = {"from": s.name, "to": loop["to"], "kind": "loop"}
            if isinstance(loop.get("max"), int):
                edge["label"] = f"max {loop['max']}"
            edges.append(edge)
    return edges
