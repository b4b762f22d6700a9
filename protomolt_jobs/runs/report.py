"""The final report of a finished job (``get-job`` of a terminal job) and the history document
(``job-history``), built from the row's checkpoints and its transition log.

Report shape (docs/verbs.md)::

    {"status": "COMPLETED" | "FAILED" | "DEAD" | "CANCELLED",
     "steps": [{"name", "status": "succeeded" | "skipped" | "failed" | "not run",
                "reason"?: str}],              # skipped: gate false / upstream ...; cancelled
     "claims": <int>,                          # segments started (claim transitions)
     "attempts": {step: <int>},                # segments that started on that step
     "durationsMs": {step: <int>},             # its segment start (or park) to its checkpoint
     "operatorActions": [{"kind", "actor", "reason"?, "at"}],
     "completionOrder"?, "criterion"?,         # graph runs: the graph's own account
     "cancel"?: {"requestedAt", "actor", "compensate": bool,   # a CANCELLED run
                 "effectsAfterRequest": [step], "compensations": [step]}}

For a graph run ``steps``, ``completionOrder`` and ``criterion`` are the graph's report
(``workflow.graph.report_from_checkpoints``); the log adds the rest. Attempts and durations
come from the log: a step is attempted once per segment that reaches it (a claim, or the
checkpoint of the step before it while the segment runs on), and a
step's duration runs from the last claim or checkpoint before its own checkpoint (for a parked
step, from the park to ``complete-step``). A graph run (``depends`` given) counts and times
each step from its dependencies instead, since its steps run side by side: a step is attempted
in each segment in which it became ready (every dependency checkpointed) while it had no
checkpoint, a skipped step never; its duration runs from the later of its segment's claim and
its last dependency's checkpoint; a step the graph's report calls ``not run`` (its edge did
not match, or the run ended first) has no attempts. Steps a worker could not start at once (``maxParallel``, a
target's permits) show the wait in their duration; the checkpoints stay exact.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["OPERATOR_KINDS", "cancel_json", "history_json", "report_json", "transition_json"]

#: Transition kinds that record an operator's action (not a worker's or the sweeper's).
OPERATOR_KINDS = frozenset(
    {
        "cancel",
        "cancel-request",
        "pause",
        "pause-request",
        "pause-withdrawn",
        "resume",
        "requeue",
        "retry-step",
        "complete-step",
        "fail-step",
        "sql",
        "vote",
        "decision",
    }
)
#: Kinds whose ``step`` is a step that has just been checkpointed.
_CHECKPOINT_KINDS = frozenset(
    {"checkpoint", "complete", "complete-step", "cancel", "pause", "decision"}
)


def iso_instant(moment: datetime | None) -> str | None:
    """ISO-8601 UTC with a ``Z``, fractions in groups of 3 only as needed (Java
    ``Instant.toString``): ``2026-01-01T00:00:00Z``, ``...00:00:00.120Z``."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    micros = moment.microsecond
    if micros:
        text += f".{micros // 1000:03d}" if micros % 1000 == 0 else f".{micros:06d}"
    return text + "Z"


def _iso(moment: datetime) -> str:
    return iso_instant(moment) or ""


def transition_json(t: Any) -> dict[str, Any]:
    """One transition as the verbs show it (camelCase, nulls omitted)."""
    body: dict[str, Any] = {
        "seq": t.seq,
        "kind": t.kind,
        "actor": t.actor,
    }
    if t.prev_status is not None:
        body["prevStatus"] = t.prev_status
    body["newStatus"] = t.new_status
    body["attempt"] = t.attempt
    if t.step is not None:
        body["step"] = t.step
    if t.reason is not None:
        body["reason"] = t.reason
    body["at"] = _iso(t.at)
    return body


def history_json(history: Any) -> dict[str, Any]:
    """``{transitions: [...], integrity: "ok" | "broken at seq N", firstBadSeq?}``."""
    body: dict[str, Any] = {"transitions": [transition_json(t) for t in history.transitions]}
    if history.first_bad_seq is None:
        body["integrity"] = "ok"
    else:
        body["integrity"] = f"broken at seq {history.first_bad_seq}"
        body["firstBadSeq"] = history.first_bad_seq
    return body


def report_json(
    job: Any,
    step_names: list[str],
    transitions: tuple[Any, ...],
    *,
    graph: dict[str, Any] | None = None,
    depends: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The final report of a terminal job.

    :param job: the ``JobRecord`` (status terminal).
    :param step_names: the workflow's steps in declaration order (from the snapshot), or the
        checkpointed names when the snapshot cannot be read.
    :param transitions: the job's transitions, oldest first.
    :param graph: a graph run's own report (steps, completion order, criterion), or None.
    :param depends: a graph run's main steps (compensation steps aside) -> the steps each
        depends on; None for a sequential run.
    :returns: the report (shape in the module docstring).
    """
    # A row whose time could not be read (edited by hand; the integrity check names it)
    # counts for nothing here.
    transitions = tuple(t for t in transitions if t.at is not None)
    checkpoints = [c for c in job.checkpoints or [] if isinstance(c, dict)]
    by_name = {str(c.get("name")): c for c in checkpoints}
    attempts: dict[str, int] = {}
    durations: dict[str, int] = {}
    done: list[str] = [str(c.get("name")) for c in checkpoints]
    order = list(step_names) or done
    progress: list[str] = []  # checkpointed names as the log replays them
    last_boundary: datetime | None = None
    failed_step: str | None = None
    failed_reason: str | None = None
    claims = 0
    actions: list[dict[str, Any]] = []

    def attempt_next() -> None:
        pending = [n for n in order if n not in progress]
        if pending:
            attempts[pending[0]] = attempts.get(pending[0], 0) + 1

    for t in transitions:
        if t.kind == "claim":
            claims += 1
            attempt_next()
            last_boundary = t.at
        elif t.kind in _CHECKPOINT_KINDS and t.step:
            if last_boundary is not None:
                durations[t.step] = int((t.at - last_boundary).total_seconds() * 1000)
            if t.step not in progress:
                progress.append(t.step)
            if t.new_status == "RUNNING":
                attempt_next()  # the segment goes on with the next step
            last_boundary = t.at
        elif t.kind == "park":
            last_boundary = t.at
        elif t.kind == "retry-step" and t.step:
            keep = order.index(t.step) if t.step in order else len(progress)
            progress = [n for n in progress if n in order[:keep]]
        elif t.kind in ("requeue", "sql"):
            progress = [n for n in progress if n in done]
        if t.kind in ("fail", "dead", "fail-step") and t.step:
            failed_step, failed_reason = t.step, t.reason
        if t.kind in OPERATOR_KINDS:
            action: dict[str, Any] = {"kind": t.kind, "actor": t.actor, "at": _iso(t.at)}
            if t.reason:
                action["reason"] = t.reason
            actions.append(action)
    if depends is not None:
        attempts, durations = _graph_attempts(transitions, depends, by_name)
    if graph is not None:
        steps = list(graph.get("steps", []))
        # A step the graph never started (its edge did not match, or the run ended first) was
        # counted ready by its dependencies' checkpoints alone: it was never attempted.
        for entry in steps:
            if entry.get("status") == "not run":
                attempts.pop(entry.get("name"), None)
    else:
        steps = _sequential_steps(job, order, by_name, failed_step, failed_reason)
    report: dict[str, Any] = {"status": job.status, "steps": steps}
    if graph is not None:
        for key, value in graph.items():
            if key not in ("status", "steps"):
                report[key] = value
    report["claims"] = claims
    report["attempts"] = {n: attempts[n] for n in order if n in attempts}
    report["durationsMs"] = {n: durations[n] for n in order if n in durations and n in by_name}
    report["operatorActions"] = actions
    return report


def _graph_attempts(
    transitions: tuple[Any, ...],
    depends: dict[str, list[str]],
    by_name: dict[str, dict[str, Any]],
) -> tuple[dict[str, int], dict[str, int]]:
    """Attempts and durations of a graph run's steps (the module docstring says how)."""
    attempts: dict[str, int] = {}
    durations: dict[str, int] = {}
    done: dict[str, datetime] = {}  # step -> its checkpoint's time, as the log replays them
    counted: set[str] = set()  # attempted in the current segment
    seg_start: datetime | None = None
    last_boundary: datetime | None = None
    parked_at: datetime | None = None

    def count_ready() -> None:
        for name, deps in depends.items():
            if name not in done and name not in counted and all(d in done for d in deps):
                attempts[name] = attempts.get(name, 0) + 1
                counted.add(name)

    for t in transitions:
        if t.kind == "claim":
            seg_start = last_boundary = t.at
            counted = set()
            count_ready()
        elif t.kind in _CHECKPOINT_KINDS and t.step:
            name = t.step
            if t.kind == "complete-step" and parked_at is not None:
                start: datetime | None = parked_at
            elif name in depends:
                start = seg_start
                for d in depends[name]:
                    if d in done and (start is None or done[d] > start):
                        start = done[d]
            else:  # a compensation step: they run one after the other
                start = last_boundary
            if start is not None:
                durations[name] = int((t.at - start).total_seconds() * 1000)
            if name not in done:
                if name not in counted and name not in attempts and name not in depends:
                    attempts[name] = 1  # a compensation that ran
                done[name] = t.at
            last_boundary = t.at
            if t.new_status == "RUNNING":
                count_ready()
        elif t.kind == "park":
            parked_at = last_boundary = t.at
        elif t.kind in ("requeue", "sql", "retry-step"):
            keep = set(by_name) - ({t.step} if t.kind == "retry-step" and t.step else set())
            done = {n: at for n, at in done.items() if n in keep}
    skipped = {n for n, c in by_name.items() if c.get("skipped") is True}
    return (
        {n: k for n, k in attempts.items() if n not in skipped},
        durations,
    )


def _sequential_steps(
    job: Any,
    order: list[str],
    by_name: dict[str, dict[str, Any]],
    failed_step: str | None,
    failed_reason: str | None,
) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    stopped = False
    for name in order:
        entry = by_name.get(name)
        item: dict[str, Any] = {"name": name}
        if entry is not None and entry.get("failed"):
            failed = entry["failed"]
            item["status"] = "failed"
            if isinstance(failed, dict) and failed.get("message"):
                item["reason"] = str(failed["message"])
        elif entry is not None and entry.get("skipped"):
            item["status"] = "skipped"
            item["reason"] = str(entry.get("reason") or "its condition was false")
        elif entry is not None:
            item["status"] = "succeeded"
        elif name == failed_step and job.status in ("FAILED", "DEAD"):
            item["status"] = "failed"
            if failed_reason:
                item["reason"] = failed_reason
            stopped = True
        else:
            item["status"] = "not run"
            if job.status == "CANCELLED":
                item["reason"] = "cancelled"
            elif job.status in ("FAILED", "DEAD") and (stopped or failed_step is None):
                item["reason"] = "upstream failure"
        steps.append(item)
    return steps


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def cancel_json(
    job: Any, *, external: set[str], compensations: set[str], compensate: bool
) -> dict[str, Any] | None:
    """What a cancel of a CANCELLED job kept and undid (the report's ``cancel``).

    :param job: the ``JobRecord`` (its ``cancel_request`` and checkpoints).
    :param external: the workflow's steps with ``effect: "external"``.
    :param compensations: the workflow's compensation steps.
    :param compensate: whether the cancel ran compensations (the request's ``compensate``,
        else the workflow's ``cancel.compensate``).
    :returns: ``{requestedAt, actor, compensate, effectsAfterRequest, compensations}``:
        the external steps whose checkpoint was stored at or after the request (their call
        was left to finish), and the compensation steps that ran; None when the job is not
        CANCELLED or has no recorded request.
    """
    request = getattr(job, "cancel_request", None)
    if job.status != "CANCELLED" or not isinstance(request, dict):
        return None
    requested = _parse_time(request.get("requestedAt"))
    after: list[str] = []
    ran: list[str] = []
    for entry in job.checkpoints or []:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name"))
        if name in compensations:
            ran.append(name)
            continue
        at = _parse_time(entry.get("at"))
        if (
            name in external
            and not entry.get("skipped")
            and requested is not None
            and at is not None
            and at >= requested
        ):
            after.append(name)
    body: dict[str, Any] = {
        "requestedAt": iso_instant(requested),
        "actor": request.get("actor"),
        "compensate": compensate,
        "effectsAfterRequest": after,
        "compensations": ran,
    }
    return body
