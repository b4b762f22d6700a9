"""``explain-job``'s account: for every step of a live run not yet decided, what blocks it
(issue 29 item 6; DESIGN.md section 24; docs/explain.md). Read only, pure: the verb reads the
row, the approval tallies and the input revisions, and hands them here.

Shape (``explain``)::

    {"kind": "graph" | "sequential" | "unknown",
     "status", "waitKind"?, "outstandingStep"?,
     "run": [reason, ...],             # what holds the whole run (pause, timer, claim, ...)
     "steps": [{"name", "state",       # graph_view's state: waiting | running | not-reached
                "owner"?,              # the step's declared owner (its outputs)
                "blockedBy": [{"step", "state"}],   # undecided ancestors, definition order
                "waitingOn": [reason, ...],         # this step's own wait, then the run's
                "missingInputs": [{"path", "owner", "required", "declared"}]}],
     "inputs": [{"path", "owner", "required", "description"?, "present"}],
     "staleInput": [{"step", "path", "revision"}],
     "revisions": [revision, ...]}

A *reason* is ``{"kind", ...}``, one of:

- ``approval``: ``{step, quorum, tally, votes, missingVotes, roles, principals}`` (votes
  missing: the quorum less the leading decision's count);
- ``grant``: the step's grant gate, same keys plus ``rules``;
- ``completion``: an external step waits for ``complete-step``;
- ``input``: the run waits for ``supply-input`` (``paths``: the missing ones with owners);
- ``pause`` (``reason``), ``budget`` (``detail``), ``loop`` (``detail``): the run is PAUSED;
- ``timer``: a QUEUED run not to be claimed before ``at``;
- ``queue-cap``: a QUEUED run due now in a queue whose ``maxRunning`` runs are RUNNING
  (``queue``, ``maxRunning``, ``running``); ``queue-rate``: its queue's start rate lets the
  next run start at ``at``;
- ``claim``: a QUEUED run due now waits for a worker of ``queue``;
- ``recovery``: RECOVERY_REQUIRED, an operator answers (``detail``);
- ``running``: the step is in flight.

A finished run has no undecided step: ``steps`` is empty.

*Missing inputs* are a dry run of the step's mapping rules over the stored input: each path
the step reads (``workflow/inputs.py``), and each declared path it needs, that the input
lacks by proto3 presence, with its owner. Declared, required ones are what blocks a step
(``required``); undeclared ones are shown (``declared: false``) because the step reads them
at their default. *Stale input*: a step that ran before a ``supply-input`` replaced a value it
reads (its checkpoint's ``at`` is before the revision's).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format

from protomolt_jobs.runs.graph_view import graph_view
from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.workflow import inputs as _inputs
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.graph import ancestors

__all__ = ["UNDECIDED", "explain"]

#: graph_view states of a step not yet decided.
UNDECIDED = frozenset({"waiting", "running", "not-reached"})
_FINISHED = frozenset({"COMPLETED", "FAILED", "DEAD", "CANCELLED"})


def explain(
    job: Any,
    stored: StoredRun | None,
    *,
    approval: Callable[[str], dict[str, Any] | None],
    revisions: Sequence[Any] = (),
    queue_cap: Callable[[str], dict[str, Any] | None] = lambda queue: None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The account of ``job`` (the module docstring's shape).

    :param job: the ``JobRecord``.
    :param stored: its snapshotted definition, or None when it cannot be read (the steps are
        then the drawing's, without dependencies or inputs).
    :param approval: ``step -> the approval view`` (``JobInspector.approval``'s shape), asked
        only for the step an approval wait is on.
    :param revisions: the run's ``supply-input`` revisions (``store.inputs.InputRevision``).
    :param queue_cap: ``queue -> {max_running, max_starts_per_second, next_start_at,
        running}`` or None (``JobStore.queue_cap``), asked only for a QUEUED run that is due.
    :param now: the clock for a QUEUED run's ``run_after`` (default: now, UTC).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    view = graph_view(job, stored, {})
    body: dict[str, Any] = {"kind": view["kind"], "status": job.status}
    if getattr(job, "wait_kind", None) and job.status == "WAITING":
        body["waitKind"] = job.wait_kind
    if job.outstanding_step is not None and job.status not in _FINISHED:
        body["outstandingStep"] = job.outstanding_step
    run = _run_reasons(job, now, queue_cap)
    body["run"] = run
    definition = stored.definition if stored is not None else {}
    declared = _inputs.declared(definition) if stored is not None else {}
    input_msg = _input_message(job, stored)
    states = {s["name"]: s["state"] for s in view["steps"]}
    steps_out: list[dict[str, Any]] = []
    if job.status not in _FINISHED:
        before = _ancestors(stored, [s["name"] for s in view["steps"]])
        for doc in view["steps"]:
            name, state = doc["name"], doc["state"]
            if state not in UNDECIDED:
                continue
            step = stored.workflow.step(name) if stored is not None else None
            item: dict[str, Any] = {"name": name, "state": state}
            if step is not None:
                owner = _inputs.step_owner(definition, step)
                if owner:
                    item["owner"] = owner
            item["blockedBy"] = [
                {"step": a, "state": states[a]}
                for a in states
                if a in before.get(name, ()) and states[a] in UNDECIDED
            ]
            waiting = _own_wait(job, name, state, approval)
            if not item["blockedBy"]:
                waiting += run
            missing = (
                _missing(declared, step, input_msg)
                if step is not None and input_msg is not None
                else []
            )
            if waiting and waiting[0]["kind"] == "input":
                waiting[0]["paths"] = [m for m in missing if m["required"] and m["declared"]]
            item["waitingOn"] = waiting
            item["missingInputs"] = missing
            steps_out.append(item)
    body["steps"] = steps_out
    body["inputs"] = [
        d.to_json() | {"present": input_msg is not None and not _inputs.absent(input_msg, p)}
        for p, d in declared.items()
    ]
    body["staleInput"] = _stale(job, stored, revisions)
    body["revisions"] = [r.to_json() for r in revisions]
    return body


def _ancestors(stored: StoredRun | None, order: list[str]) -> dict[str, frozenset[str]]:
    """Step -> the steps it comes after: a graph's ancestors, a sequential run's earlier
    steps."""
    if stored is None:
        return {name: frozenset(order[:i]) for i, name in enumerate(order)}
    if stored.workflow.graph:
        return ancestors(stored.workflow)
    return {name: frozenset(order[:i]) for i, name in enumerate(order)}


def _run_reasons(
    job: Any, now: datetime.datetime, queue_cap: Callable[[str], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    status = job.status
    error = job.error or ""
    if status == "PAUSED":
        if error.startswith("BUDGET"):
            return [{"kind": "budget", "detail": error}]
        if error.startswith("LOOP"):
            return [{"kind": "loop", "detail": error}]
        return [{"kind": "pause", "reason": error or "paused by an operator (resume-job)"}]
    if status == "RECOVERY_REQUIRED":
        return [{"kind": "recovery", "detail": error}]
    if status == "QUEUED":
        after = getattr(job, "run_after", None)
        if isinstance(after, datetime.datetime) and after > now:
            return [{"kind": "timer", "at": after.isoformat()}]
        queue = getattr(job, "queue", "default")
        cap = queue_cap(queue)
        if cap is not None:
            limit, running = cap.get("max_running"), int(cap.get("running") or 0)
            if limit is not None and running >= int(limit):
                return [
                    {"kind": "queue-cap", "queue": queue, "maxRunning": limit, "running": running}
                ]
            start = cap.get("next_start_at")
            rated = bool(cap.get("max_starts_per_second"))
            if rated and isinstance(start, datetime.datetime) and start > now:
                return [{"kind": "queue-rate", "queue": queue, "at": start.isoformat()}]
        return [{"kind": "claim", "queue": queue}]
    return []


def _own_wait(
    job: Any, name: str, state: str, approval: Callable[[str], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    if state == "running":
        return [{"kind": "running"}]
    if job.status != "WAITING" or job.outstanding_step != name:
        return []
    kind = getattr(job, "wait_kind", None)
    if kind == _inputs.INPUT_WAIT:
        return [{"kind": "input", "verb": "supply-input"}]
    if kind == "approval":
        view = approval(name)
        if view is None:
            return [{"kind": "approval", "step": name}]
        tally = view.get("tally", {})
        quorum = int(view.get("quorum", 1))
        leading = max(tally.values(), default=0)
        reason: dict[str, Any] = {
            "kind": "grant" if "grantGate" in view else "approval",
            "step": name,
            "quorum": quorum,
            "tally": tally,
            "votes": view.get("votes", []),
            "missingVotes": max(0, quorum - leading),
            "roles": view.get("roles", []),
            "principals": view.get("principals", []),
        }
        if "grantGate" in view:
            reason["rules"] = view["grantGate"]
        return [reason]
    return [{"kind": "completion", "verb": "complete-step"}]


def _input_message(job: Any, stored: StoredRun | None) -> Any:
    if stored is None or not isinstance(getattr(job, "input", None), dict):
        return None
    workflow = stored.workflow
    msg = message_class(workflow.input_type)()
    try:
        json_format.ParseDict(
            job.input, msg, ignore_unknown_fields=True, descriptor_pool=workflow.pool
        )
    except Exception:  # noqa: BLE001 - an input that no longer parses: nothing to dry-run
        return None
    return msg


def _missing(declared: dict[str, Any], step: Any, input_msg: Any) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    reads = [r for r in _inputs.read_paths(step) if r]
    for decl in declared.values():
        if any(_inputs.related(decl.path, r) for r in reads) and _inputs.absent(
            input_msg, decl.path
        ):
            out[decl.path] = {
                "path": decl.path,
                "owner": decl.owner or None,
                "required": decl.required,
                "declared": True,
            }
    for read in reads:
        covered = any(read == p or read.startswith(p + ".") for p in declared)
        if covered or read in out or not _inputs.absent(input_msg, read):
            continue
        out[read] = {
            "path": read,
            "owner": _inputs.owner_of(declared, read) or None,
            "required": False,
            "declared": False,
        }
    return list(out.values())


def _stale(job: Any, stored: StoredRun | None, revisions: Sequence[Any]) -> list[dict[str, Any]]:
    """Steps checkpointed before a revision replaced a value they read."""
    if stored is None or not revisions:
        return []
    out = []
    entries = [c for c in job.checkpoints or [] if isinstance(c, dict)]
    for rev in revisions:
        if rev.old_sha256 is None:
            continue  # the path was absent: no step read a value for it
        for entry in entries:
            step = stored.workflow.step(str(entry.get("name")))
            stamp = _instant(entry.get("at"))
            if step is None or stamp is None or entry.get("skipped") or stamp >= rev.at:
                continue
            if any(_inputs.related(rev.path, r) for r in _inputs.read_paths(step)):
                out.append({"step": step.name, "path": rev.path, "revision": rev.seq})
    return out


def _instant(raw: Any) -> datetime.datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
