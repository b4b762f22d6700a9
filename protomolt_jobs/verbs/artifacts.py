"""The artifact verbs (issue 29; docs/artifacts.md): ``list-artifacts {jobId}``,
``get-artifact {artifactId}`` and ``lineage {artifactId, direction?, depth?}`` (scope
``service-invoke`` like the other read verbs: they write nothing), and
``retract-artifact {artifactId, reason?}`` and ``promote-artifact {artifactId, reason}`` (scope
``job-control``: an operator's state change, logged with the caller and the reason).

Artifacts are derived from the run's checkpoint entries (``runs/artifacts.py``). An artifact
id's first 16 hex digits are its run's (``workflow/artifacts.artifact_id``), so the run is found
by the id alone (the ``list-jobs idPrefix`` range over the primary key).
"""

from __future__ import annotations

import logging
from typing import Any

from protomolt_jobs.runs.artifacts import MAX_DEPTH, RunArtifacts, is_uuid
from protomolt_jobs.runs.report import iso_instant
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import (
    VERBS_LOGGER,
    JobsBackend,
    JobVerb,
    actor,
    as_integer,
    as_job_id,
    invalid,
    not_found,
    optional_reason,
    require_string,
    unreadable_row,
)
from protomolt_jobs.workflow import artifacts as wa

__all__ = [
    "GetArtifactAction",
    "LineageAction",
    "ListArtifactsAction",
    "PromoteArtifactAction",
    "RetractArtifactAction",
]

log = logging.getLogger(VERBS_LOGGER)

#: ``lineage``'s directions.
DIRECTIONS = ("up", "down", "both")
#: ``lineage``'s default depth.
DEFAULT_DEPTH = 10


def _workflow(job: Any, runtime: Any) -> Any:
    """The run's compiled workflow (for the artifacts' states), or None when it cannot be read
    (the artifacts are listed anyway, every one ``draft``)."""
    if runtime is None:
        return None
    try:
        return StoredRun.load(job, runtime).workflow
    except SnapshotError:
        return None


class _ArtifactVerb(JobVerb):
    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend)
        self.runtime = runtime

    def _artifacts(self, store: Any, submitter: Any, job: Any) -> RunArtifacts:
        if getattr(job, "unreadable", None):
            raise unreadable_row(job)
        runtime = self.runtime or getattr(submitter, "runtime", None)
        return RunArtifacts(job, _workflow(job, runtime), _row_states(store, job.job_id))

    def _find(self, input: dict[str, Any]) -> tuple[RunArtifacts, dict[str, Any]] | None:
        store, submitter = self._accept(input)
        artifact_id = require_string(input, "artifactId")
        if not is_uuid(artifact_id):
            raise invalid("artifactId", f"'artifactId' must be a uuid; got {artifact_id[:60]!r}")
        self._check(input)
        for summary in store.job_list(id_prefix=wa.job_prefix(artifact_id), limit=500):
            job = store.job_get(summary.job_id)
            if job is None:
                continue
            found = self._artifacts(store, submitter, job)
            art = found.get(str(artifact_id).lower())
            if art is not None:
                return found, art
        return None

    def _check(self, input: dict[str, Any]) -> None:
        """Check the verb's other fields (before any read)."""


def _row_states(store: Any, job_id: Any) -> dict[str, str]:
    """``{artifactId: state}`` of the run's ``workflow_artifact`` rows (migration 0027)."""
    read = getattr(store, "artifact_kept", None)
    if read is None:
        return {}
    return {str(r["artifact_id"]): str(r["state"]) for r in read(job_id)}


def _no_artifact(artifact_id: Any) -> dict[str, Any]:
    return {"ok": False, "error": f"no artifact {artifact_id}"}


class ListArtifactsAction(_ArtifactVerb):
    """``list-artifacts`` (scope ``service-invoke``): every artifact of one run."""

    name = "list-artifacts"
    scope = "service-invoke"
    description = (
        "List every artifact of a run ('jobId'): each step's response, its declared output "
        "ports and its receipts, with producer, hashes, inputs (lineage), state and 'stale'."
    )
    fields = ("jobId",)

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend, runtime)
        self.input_schema = {
            "type": "object",
            "properties": {"jobId": {"type": "string", "format": "uuid"}},
            "required": ["jobId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, jobId, artifacts: [...]}`` (``runs/artifacts.py``: each
            ``{artifactId, jobId, step, iteration, checkpoint, port, kind, sha256, sizeBytes,
            mediaType?, uri?, value? (receipts), state, current, stale, producer, inputs,
            at}``); for a deleted run, its kept (promoted, detached) artifacts with
            ``runDeleted: true``; or ``{ok: false, error}``.

        :raises InvalidInput: missing or malformed ``jobId``; an unknown field.
        :raises JobCorrupt: the row holds JSON that cannot be decoded.
        """
        store, submitter = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        job = store.job_get(job_id)
        if job is None:
            kept = _kept(store, job_id)
            if kept:  # the run was deleted; its promoted artifacts were kept (detached)
                return {"ok": True, "jobId": str(job_id), "runDeleted": True, "artifacts": kept}
            return not_found(job_id)
        found = self._artifacts(store, submitter, job)
        return {"ok": True, "jobId": str(job_id), "artifacts": found.summaries()}


def _kept(store: Any, job_id: Any) -> list[dict[str, Any]]:
    """The artifacts of a deleted run kept in ``workflow_artifact`` (migration 0027)."""
    read = getattr(store, "artifact_kept", None)
    if read is None:
        return []
    out = []
    for row in read(job_id):
        art: dict[str, Any] = {
            "artifactId": str(row["artifact_id"]),
            "jobId": str(row["job_id"]),
            "step": row["step"],
            "iteration": row["iteration"],
            "port": row["port"],
            "kind": row["kind"],
            "sha256": row["sha256"],
            "state": row["state"],
            "detached": row["detached"],
        }
        for col, key in (("uri", "uri"), ("media_type", "mediaType"), ("size_bytes", "sizeBytes")):
            if row[col] is not None:
                art[key] = row[col]
        out.append(art)
    return out


class GetArtifactAction(_ArtifactVerb):
    """``get-artifact`` (scope ``service-invoke``): one artifact, with its value."""

    name = "get-artifact"
    scope = "service-invoke"
    description = (
        "Read one artifact by 'artifactId': its metadata (producer, hashes, state, stale, "
        "inputs) and its value inline (a response's proto3 JSON, a receipt) or its uri (a "
        "declared output port)."
    )
    fields = ("artifactId",)

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend, runtime)
        self.input_schema = {
            "type": "object",
            "properties": {"artifactId": {"type": "string", "format": "uuid"}},
            "required": ["artifactId"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, artifact: {..., value?, transitions: [{at, actor, from, to,
            reason}]}}`` or ``{ok: false, error}``.

        :raises InvalidInput: missing or malformed ``artifactId``; an unknown field.
        """
        hit = self._find(input)
        if hit is None:
            return _no_artifact(input["artifactId"])
        found, art = hit
        out = dict(art)
        if art["kind"] == "response":
            out["value"] = _response_of(found, art)
        store, _ = self.backend.require()
        changes = getattr(store, "artifact_transitions", None)
        if changes is not None:
            # the logged state changes (actor, reason, at) of an artifact with a row
            out["transitions"] = [
                {
                    "at": iso_instant(t["at"]),
                    "actor": t["actor"],
                    "from": t["from_state"],
                    "to": t["to_state"],
                    "reason": t["reason"],
                }
                for t in changes(art["artifactId"])
            ]
        return {"ok": True, "artifact": out}


def _response_of(found: RunArtifacts, art: dict[str, Any]) -> Any:
    return found.entry(art["checkpoint"]).get("response")


class LineageAction(_ArtifactVerb):
    """``lineage`` (scope ``service-invoke``): the producers and consumers of an artifact."""

    name = "lineage"
    scope = "service-invoke"
    description = (
        "Walk an artifact's lineage ('artifactId', 'direction': up | down | both, default "
        "both; 'depth' 1 to 50, default 10): the artifacts its step read (up) and those read "
        "from it (down), each with 'stale' when an input changed since."
    )
    fields = ("artifactId", "direction", "depth")

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend, runtime)
        self.input_schema = {
            "type": "object",
            "properties": {
                "artifactId": {"type": "string", "format": "uuid"},
                "direction": {"type": "string", "enum": list(DIRECTIONS)},
                "depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH},
            },
            "required": ["artifactId"],
            "additionalProperties": False,
        }

    def _check(self, input: dict[str, Any]) -> None:
        direction = input.get("direction", "both")
        if direction is None:
            direction = "both"
        if direction not in DIRECTIONS:
            raise invalid("direction", "Field 'direction' must be one of up, down, both")
        depth = input.get("depth", DEFAULT_DEPTH)
        value = as_integer(depth) if depth is not None else DEFAULT_DEPTH
        if value is None or not 1 <= value <= MAX_DEPTH:
            raise invalid("depth", f"Field 'depth' must be a whole number from 1 to {MAX_DEPTH}")

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, artifact, direction, depth, nodes: [artifact + distance],
            edges: [{from, to}]}`` (``RunArtifacts.lineage``) or ``{ok: false, error}``.

        :raises InvalidInput: missing or malformed ``artifactId``, ``direction`` or ``depth``.
        """
        hit = self._find(input)
        if hit is None:
            return _no_artifact(input["artifactId"])
        found, art = hit
        direction = input.get("direction") or "both"
        depth = as_integer(input.get("depth")) if input.get("depth") is not None else None
        walk = found.lineage(art["artifactId"], direction, depth or DEFAULT_DEPTH)
        assert walk is not None
        return {"ok": True, **walk}


class RetractArtifactAction(_ArtifactVerb):
    """``retract-artifact`` (scope ``job-control``): mark an artifact ``retracted``."""

    name = "retract-artifact"
    scope = "job-control"
    description = (
        "Retract one artifact ('artifactId', optional 'reason'): its state becomes 'retracted', "
        "logged with the caller and the reason; a publication step that consumes it refuses it "
        "(ARTIFACT). The run itself is not touched."
    )
    fields = ("artifactId", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend, runtime)
        self.input_schema = {
            "type": "object",
            "properties": {
                "artifactId": {"type": "string", "format": "uuid"},
                "reason": {"type": "string", "description": "why (kept with the change)"},
            },
            "required": ["artifactId"],
            "additionalProperties": False,
        }

    def _check(self, input: dict[str, Any]) -> None:
        optional_reason(input)

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, artifactId, state: "retracted", changed}`` (``changed``
            false: it already was) or ``{ok: false, error}`` (no such artifact).

        :raises InvalidInput: missing or malformed ``artifactId`` or ``reason``; an unknown
            field.
        """
        hit = self._find(input)
        if hit is None:
            return _no_artifact(input["artifactId"])
        _, art = hit
        store, _ = self.backend.require()
        reason = optional_reason(input)
        changed = store.artifact_retract(
            art, current=str(art["state"]), actor=actor(), reason=reason
        )
        log.info(
            "retract-artifact %s of job %s",
            art["artifactId"],
            art["jobId"],
            extra={
                "action": "retract_artifact",
                "job_id": art["jobId"],
                "artifact_id": art["artifactId"],
                "actor": actor(),
                "reason": reason,
                "changed": changed,
            },
        )
        return {
            "ok": True,
            "artifactId": art["artifactId"],
            "state": "retracted",
            "changed": changed,
        }


#: The error kind of a ``promote-artifact`` on an artifact that is not ``verified``.
NOT_VERIFIED = "not-verified"


def _reason(input: dict[str, Any]) -> str:
    """``promote-artifact``'s required ``reason``.

    :raises InvalidInput: missing, not a string, blank or too long (field ``reason``).
    """
    if "reason" not in input or input["reason"] is None:
        raise invalid("reason", "Field 'reason' is required: say why the artifact is promoted")
    reason = optional_reason(input)
    if reason is None:
        raise invalid("reason", "Field 'reason' must not be blank")
    return reason


class PromoteArtifactAction(_ArtifactVerb):
    """``promote-artifact`` (scope ``job-control``): an operator promotes a verified artifact
    outside a publication step."""

    name = "promote-artifact"
    scope = "job-control"
    description = (
        "Promote one verified artifact ('artifactId', 'reason'): its state becomes 'promoted', "
        "logged with the caller and the reason (kept when its run is pruned). Only a "
        "'verified' artifact may be promoted; any other state is refused ('not-verified', "
        "naming the state). The run itself is not touched."
    )
    fields = ("artifactId", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any = None) -> None:
        super().__init__(backend, runtime)
        self.input_schema = {
            "type": "object",
            "properties": {
                "artifactId": {"type": "string", "format": "uuid"},
                "reason": {"type": "string", "description": "why (kept with the change)"},
            },
            "required": ["artifactId", "reason"],
            "additionalProperties": False,
        }

    def _check(self, input: dict[str, Any]) -> None:
        _reason(input)

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{ok: true, artifactId, state: "promoted", changed: true}``;
            ``{ok: false, artifactId, state: <its state>, errorKind: "not-verified", error}``
            for an artifact that is not ``verified`` (``changed`` false; a ``promoted`` one
            included: nothing is logged twice); or ``{ok: false, error}`` (no such artifact).

        :raises InvalidInput: missing or malformed ``artifactId`` or ``reason`` (required,
            non-blank); an unknown field.
        """
        hit = self._find(input)
        if hit is None:
            return _no_artifact(input["artifactId"])
        _, art = hit
        reason = _reason(input)
        state = str(art["state"])
        changed = False
        if state == "verified":
            store, _ = self.backend.require()
            changed, state = store.artifact_promote(
                art, current=state, actor=actor(), reason=reason
            )
            if not changed and state == "verified":
                # read verified, but another operator's change (a retract, a promote) won the
                # row first: answer the state it is in now (one more read, only here)
                state = _row_states(store, art["jobId"]).get(str(art["artifactId"]), state)
        log.info(
            "promote-artifact %s of job %s",
            art["artifactId"],
            art["jobId"],
            extra={
                "action": "promote_artifact",
                "job_id": art["jobId"],
                "artifact_id": art["artifactId"],
                "actor": actor(),
                "reason": reason,
                "changed": changed,
                "state": state,
            },
        )
        if not changed:
            return {
                "ok": False,
                "artifactId": art["artifactId"],
                "state": state,
                "changed": False,
                "errorKind": NOT_VERIFIED,
                "error": f"{NOT_VERIFIED}: artifact {art['artifactId']} is {state}; only a "
                "verified artifact can be promoted",
            }
        return {"ok": True, "artifactId": art["artifactId"], "state": "promoted", "changed": True}
