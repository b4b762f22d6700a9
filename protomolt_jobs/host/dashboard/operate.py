"""The dashboard's operator actions: which apply to a job, the verb envelope a form makes, and
the sentence its answer becomes.

Which actions a job page offers is not a copy of the verbs' rules: each operator verb publishes
the statuses it acts on in its input schema (``x-jobStatuses``,
:data:`~protomolt_jobs.hooks.contract.JOB_STATUSES_KEY`), and :func:`offered` reads them from
the catalog manifest for the signed-in caller (so scopes count too). A WAITING job is offered
cancel and pause, never resume or requeue; a RECOVERY_REQUIRED one cancel, reconcile-step and
migrate-checkpoint.

The job page's artifacts list offers ``promote-artifact`` (:data:`ARTIFACT_VERBS`) on each
``verified`` artifact, to a caller whose scopes allow it; it posts to the same action route as
the job's operator verbs, with the artifact's id and a reason (the verb requires one).

Every action form carries a reason and a ``confirm`` box that must be ticked: the server
refuses a post without it (``invalid-input`` naming ``confirm``), so a stray click does nothing
with or without JavaScript. Form values the dashboard reads itself (the resume time and zone, a
JSON response, the compensate choice) are refused here with ``invalid-input`` naming the field;
everything else is the verb's to refuse, with its own message.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from typing import Any

from protomolt_jobs.hooks.contract import JOB_STATUSES_KEY, artifact_job_prefix
from protomolt_jobs.host.dashboard.times import DEFAULT_ZONE, FormError

__all__ = [
    "ACTION_VERBS",
    "ARTIFACT_VERBS",
    "BULK_VERBS",
    "OPERATOR_VERBS",
    "envelope",
    "offered",
    "outcome",
    "scopes",
    "status_table",
]

#: The operator verbs a job page may offer, in the order shown.
OPERATOR_VERBS = (
    "cancel-job",
    "pause-job",
    "resume-job",
    "requeue-job",
    "retry-step",
    "extend-loop",
    "reconcile-step",
    "migrate-checkpoint",
)
#: The verbs the job page's artifacts list offers, each on one artifact of the job (only a
#: ``verified`` one: ``promote-artifact`` refuses any other state).
ARTIFACT_VERBS = ("promote-artifact",)
#: Every verb the job page's action route runs.
ACTION_VERBS = OPERATOR_VERBS + ARTIFACT_VERBS
#: Offered only for a run whose workflow declares a loop.
LOOP_VERBS = ("extend-loop",)
#: The verbs the jobs list applies to several selected jobs at once.
BULK_VERBS = ("cancel-job", "requeue-job", "retry-step")
#: Longest text kept from a form's JSON box (the verbs bound their inputs again).
_MAX_JSON_CHARS = 1_000_000


def status_table(manifest: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """``{verb: statuses it acts on}`` for the operator verbs in ``manifest`` (the catalog's
    entries ``{name, inputSchema, ...}``) that publish their statuses."""
    table: dict[str, tuple[str, ...]] = {}
    for entry in manifest:
        if not isinstance(entry, dict) or entry.get("name") not in OPERATOR_VERBS:
            continue
        schema = entry.get("inputSchema")
        statuses = schema.get(JOB_STATUSES_KEY) if isinstance(schema, dict) else None
        if isinstance(statuses, list):
            table[str(entry["name"])] = tuple(str(s) for s in statuses)
    return table


def scopes(manifest: Iterable[Any]) -> dict[str, str]:
    """``{verb: the scope it needs}`` from the catalog's manifest entries (what each form
    declares on the page)."""
    return {
        str(e["name"]): str(e.get("scope", ""))
        for e in manifest
        if isinstance(e, dict) and e.get("name") in ACTION_VERBS
    }


def offered(table: dict[str, tuple[str, ...]], status: str, *, loops: bool = False) -> list[str]:
    """The operator verbs that apply to a job in ``status``, in :data:`OPERATOR_VERBS` order
    (:data:`LOOP_VERBS` only when ``loops``: the job's workflow declares a loop)."""
    return [
        verb
        for verb in OPERATOR_VERBS
        if status in table.get(verb, ()) and (loops or verb not in LOOP_VERBS)
    ]


#: A time of day as an ``<input type="time">`` sends it (seconds optional).
_CLOCK = re.compile(r"\d{2}:\d{2}(:\d{2})?", re.ASCII)

#: The error prefix of a run stopped on a long step's saved progress (the engine's
#: ``workflow/resumable.py`` ``PROGRESS_MISMATCH``; the host meets the engine only through the
#: verbs, so the word is repeated here and a unit test holds the two together).
PROGRESS_MISMATCH = "progress-mismatch"


def migratable(job: dict[str, Any], names: list[str], done: Any) -> list[str]:
    """The steps the migrate-checkpoint form offers, in workflow order: the checkpointed ones
    (``done``), and the step a RECOVERY_REQUIRED run stopped on when its saved progress no
    longer fits (``progress-mismatch``: it has no checkpoint yet; docs/long-steps.md)."""
    stopped = ""
    if str(job.get("error") or "").startswith(PROGRESS_MISMATCH):
        stopped = str(job.get("outstandingStep") or "")
    return [n for n in names if n in done or n == stopped]


def loop_steps(job: dict[str, Any]) -> list[str]:
    """The loop steps of a job read with ``graph: true`` (its drawing's ``loop`` edges), in
    the drawing's order; empty for a workflow without loops."""
    graph = job.get("graph")
    edges = graph.get("edges") if isinstance(graph, dict) else None
    return [
        str(e["from"])
        for e in edges or []
        if isinstance(e, dict) and e.get("kind") == "loop" and isinstance(e.get("from"), str)
    ]


def _resume_time(form: dict[str, str]) -> dict[str, str]:
    """The resume form's time as ``resume-job``'s fields: a date and time (``at``, a
    ``datetime-local`` box) or a time of day (``clock``) on ``day``, with ``zone``; the verb
    and the database resolve them by the rule every door shares (verbs/local_time.py). Both
    blank: ``{}`` (now).

    :raises FormError: ``clock`` together with ``at``, or ``clock`` not ``HH:MM[:SS]``.
    """
    at = form.get("at", "").strip()
    clock = form.get("clock", "").strip()
    if not at and not clock:
        return {}
    zone = form.get("zone", "").strip() or DEFAULT_ZONE
    if at and clock:
        raise FormError(
            "clock", "'clock' and 'at' are two ways to say when: give a date and time or a time"
        )
    if at:
        return {"at": at, "zone": zone}
    if not _CLOCK.fullmatch(clock):
        raise FormError("clock", f"'clock' must be a time of day like 22:00; got {clock!r}")
    return {"at": clock, "day": form.get("day", "").strip() or "next", "zone": zone}


def _json_field(form: dict[str, str], name: str) -> Any:
    raw = form.get(name, "")
    if not raw.strip():
        return None
    if len(raw) > _MAX_JSON_CHARS:
        raise FormError(name, f"'{name}' must be at most {_MAX_JSON_CHARS} characters of JSON")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise FormError(name, f"'{name}' must be a JSON object; {exc}") from None
    if not isinstance(value, dict):
        raise FormError(name, f"'{name}' must be a JSON object; got {type(value).__name__}")
    return value


def _artifact_of(job_id: str, form: dict[str, str]) -> str:
    """The form's ``artifactId``, which must be an artifact of job ``job_id`` (its id's first
    16 hex digits are the job's: ``hooks.contract.artifact_id``).

    :raises FormError: not a UUID, or an artifact of another job.
    """
    aid = form.get("artifactId", "").strip()
    try:
        prefix = artifact_job_prefix(aid)
    except ValueError:
        raise FormError(
            "artifactId", f"'artifactId' must be an artifact id (a UUID); got {aid[:80]!r}"
        ) from None
    try:
        mine = uuid.UUID(job_id).hex[:16] == prefix
    except ValueError:
        mine = False
    if not mine:
        raise FormError("artifactId", f"'artifactId': artifact {aid} is not one of this job's")
    return aid


def envelope(verb: str, job_id: str, form: dict[str, str]) -> dict[str, Any]:
    """The verb's input for ``job_id`` from the submitted form (for ``promote-artifact``:
    ``{artifactId, reason}``, the artifact one of the job's).

    :raises FormError: ``confirm`` not ticked; a malformed resume time or zone, compensate
        choice, or JSON ``response``; an ``artifactId`` that is not one of the job's.
    """
    if form.get("confirm") != "on":
        raise FormError("confirm", f"'confirm' must be ticked to run {verb}")
    reason = form.get("reason", "").strip()
    if verb in ARTIFACT_VERBS:
        # no jobId: the artifact's id names its run; a blank reason is the verb's to refuse
        return {"artifactId": _artifact_of(job_id, form), "reason": reason}
    body: dict[str, Any] = {"jobId": job_id}
    if reason:
        body["reason"] = reason
    if verb == "cancel-job":
        choice = form.get("compensate", "")
        if choice not in ("", "true", "false"):
            raise FormError(
                "compensate", f"'compensate' must be true, false or empty; got {choice!r}"
            )
        if choice:
            body["compensate"] = choice == "true"
    elif verb == "resume-job":
        body.update(_resume_time(form))
    elif verb == "retry-step":
        body["stepName"] = form.get("stepName", "")
        if form.get("scope", ""):
            body["scope"] = form["scope"]
    elif verb == "extend-loop":
        body["step"] = form.get("step", "")
        by = form.get("by", "").strip()
        # digits become the number; anything else goes as typed and the verb names 'by'
        body["by"] = int(by) if by.isdigit() and len(by) <= 6 else by
    elif verb == "reconcile-step":
        body["stepName"] = form.get("stepName", "")
        body["outcome"] = form.get("outcome", "")
        response = _json_field(form, "response")
        if response is not None:
            body["response"] = response
    elif verb == "migrate-checkpoint":
        body["stepName"] = form.get("stepName", "")
        body["action"] = form.get("action", "")
        response = _json_field(form, "response")
        if response is not None:
            body["response"] = response
    return body


def outcome(verb: str, answer: dict[str, Any], error: str) -> tuple[bool, str]:
    """``(ok, sentence)`` for one verb call: what happened, or why not and the job's status
    now (a race lost to another operator or to the worker names the state the job is in)."""
    if error:
        return False, f"{verb}: {error}"
    if not answer.get("ok"):
        why = answer.get("error") or answer.get("message") or "refused"
        return False, f"{verb} refused: {why}"
    if verb in ARTIFACT_VERBS:
        return True, f"{verb}: artifact {answer.get('artifactId')} is now {answer.get('state')}"
    status = answer.get("status", "")
    if answer.get("requested"):
        return True, f"{verb}: {answer.get('message') or 'requested'}"
    if answer.get("withdrawn"):
        return True, f"{verb}: the pending {answer['withdrawn']} request was withdrawn; RUNNING"
    text = f"{verb}: now {status}"
    if answer.get("runAfter"):
        text += f", to run after {answer['runAfter']}"
    if answer.get("outstandingStep"):
        text += f", waiting on {answer['outstandingStep']}"
    if "extendedBy" in answer:
        text += f"; loop '{answer.get('step')}' may now re-run {answer.get('max')} times"
    if answer.get("dropped"):
        text += f"; steps to run again: {', '.join(answer['dropped'])}"
    return True, text
