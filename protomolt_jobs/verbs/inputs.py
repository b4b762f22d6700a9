"""``supply-input`` (issue 29 item 6; docs/explain.md): fill an input path of a run parked
for it (WAITING with ``wait_kind = 'input'``), record the revision and requeue the run.

In order:

1. ``jobId``, ``path`` (dotted field names of the workflow's input type), ``value`` (any JSON
   but null) and an optional ``reason`` are read (``invalid-input`` naming the field);
2. the job exists (else the not-found answer) and its stored definition parses;
3. ``path`` resolves on the input type (``invalid-input``, field ``path``, naming the field
   that does not exist) and ``value`` is proto3 JSON of that field (``invalid-input``, field
   ``value``, naming the input's field and its type);
4. the store patches the input under the run's row lock (``store/inputs.py``): a run still
   WAITING for input is QUEUED with a ``workflow_input_revision`` row (actor, path, old and
   new SHA-256) and a ``supply-input`` transition; any other run is left as it is and the
   answer is ``{ok: false, error: "not-waiting-for-input", status, message}``: a cancel that
   won the race answers ``status: CANCELLED``, a supply that won answers ``status: QUEUED``
   (and the cancel then acts on the QUEUED run). A run QUEUED or RUNNING is never corrected
   (its steps may already have read the value; retry-step is the tool for that).

Scope ``job-input``: grant it to the inputs' owners and to operators (``[node.scopes]``). The
answer says whether the caller is the path's declared owner (``byOwner``).

Answers ``{ok: true, status: "QUEUED", step, path, revision, oldSha256, newSha256, byOwner}``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from google.protobuf import json_format

from protomolt_jobs.errors import NotFound
from protomolt_jobs.hooks.contract import current_groups
from protomolt_jobs.input_rules import check_json
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import (
    VERBS_LOGGER,
    JobsBackend,
    JobVerb,
    actor,
    as_job_id,
    corrupt_snapshot,
    invalid,
    not_found,
    optional_reason,
    require_string,
)
from protomolt_jobs.workflow import inputs as _inputs
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.envelope import message_class

__all__ = ["SupplyInputAction", "owned_by"]

log = logging.getLogger(VERBS_LOGGER)


def owned_by(owner: str, principal: str, groups: frozenset[str]) -> bool:
    """True when ``principal`` (in ``groups``) is ``owner``: ``user:<p>`` names a principal,
    ``team:<g>`` (or ``group:<g>``) a group, a bare name either."""
    kind, sep, name = owner.partition(":")
    if not sep:
        return owner == principal or owner in groups
    if kind == "user":
        return name == principal
    if kind in ("team", "group"):
        return name in groups
    return owner == principal


class SupplyInputAction(JobVerb):
    """``supply-input`` (scope ``job-input``): fill an input path a parked run waits for."""

    name = "supply-input"
    scope = "job-input"
    description = (
        "Supply the value of an input path ('path', dotted field names of the workflow's input "
        "type) that a job ('jobId') parked for (waiting for input): the value ('value', proto3 "
        "JSON of that field) is checked, recorded as an input revision with the caller and an "
        "optional 'reason', and the job is queued to run the step."
    )
    fields = ("jobId", "path", "value", "reason")

    def __init__(self, backend: JobsBackend, runtime: Any) -> None:
        super().__init__(backend)
        self.runtime = runtime
        self.input_schema = {
            "type": "object",
            "properties": {
                "jobId": {"type": "string", "format": "uuid"},
                "path": {
                    "type": "string",
                    "description": "Dotted field names of the input type (report.dataset_uri).",
                },
                "value": {"description": "proto3 JSON of the field at 'path' (not null)."},
                "reason": {"type": "string", "maxLength": 2000},
            },
            "required": ["jobId", "path", "value"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Check the call, then supply (the module docstring's four moves).

        :raises Unavailable: no database configured.
        :raises InvalidInput: a malformed field, a path the input type does not have, a value
            that is not proto3 JSON of the path's field.
        :raises JobCorrupt: the job's stored definition cannot be read.
        """
        store, submitter = self._accept(input)
        job_id = as_job_id(require_string(input, "jobId"))
        path = require_string(input, "path").strip()
        if not path:
            raise invalid("path", "Field 'path' must name an input field (report.dataset_uri)")
        if "value" not in input or input["value"] is None:
            raise invalid("value", "Missing required field 'value' (proto3 JSON, not null)")
        value = input["value"]
        check_json("value", value)
        reason = optional_reason(input)
        job = store.job_get(job_id)
        if job is None:
            return not_found(job_id)
        runtime: Any = self.runtime or getattr(submitter, "runtime", None)
        try:
            stored = StoredRun.load(job, runtime)
        except SnapshotError as exc:
            raise corrupt_snapshot(exc) from exc
        workflow = stored.workflow
        _resolve(workflow.input_type, path)
        patch = _patcher(workflow, path, value)
        patch(dict(job.input) if isinstance(job.input, dict) else {})  # refuse a bad value now
        declared = _inputs.declared(stored.definition)
        owner = _inputs.owner_of(declared, path)
        principal = actor()
        try:
            outcome = store.job_supply_input(job_id, path, patch, actor=principal, reason=reason)
        except NotFound:
            return not_found(job_id)
        by_owner = bool(owner) and owned_by(owner, principal, current_groups())
        log.info(
            "supply-input on job %s: %s by %s: %s",
            job_id,
            path,
            principal,
            outcome.status,
            extra={
                "action": "supply_input",
                "job_id": str(job_id),
                "actor": principal,
                "path": path,
                "status": outcome.status,
                "supplied": outcome.supplied,
                "reason": reason,
            },
        )
        if not outcome.supplied:
            where = f" (waiting on step '{outcome.step}')" if outcome.step else ""
            return {
                "ok": False,
                "error": "not-waiting-for-input",
                "status": outcome.status,
                "message": f"job {job_id} is {outcome.status}{where}; it is not waiting for "
                "input, so nothing was supplied",
            }
        return {
            "ok": True,
            "status": outcome.status,
            "step": outcome.step,
            "path": path,
            "revision": outcome.revision,
            "oldSha256": outcome.old_sha256,
            "newSha256": outcome.new_sha256,
            "owner": owner or None,
            "byOwner": by_owner,
        }


def _resolve(input_type: Any, path: str) -> None:
    """:raises InvalidInput: ``path`` is not a path of ``input_type`` (field ``path``)."""
    try:
        mapping.check_target_path(input_type, path)
    except mapping.MappingError as exc:
        raise invalid(
            "path", f"'path' is not a field path of {input_type.full_name}: {exc}"
        ) from exc


def _keys(desc: Any, segments: list[str]) -> list[tuple[str, str]]:
    """Each segment's proto name and JSON name along ``desc`` (past a Struct: the segment)."""
    out = []
    current = desc
    for seg in segments:
        fd = current.fields_by_name.get(seg) if current is not None else None
        if fd is None:
            out.append((seg, seg))
            current = None
            continue
        out.append((fd.name, fd.json_name))
        current = fd.message_type
    return out


def _patcher(workflow: Any, path: str, value: Any) -> Any:
    """``stored input -> (new input, old value or None, value)``: ``value`` written at
    ``path`` of the stored JSON (under the key the stored input already uses, proto or JSON
    name, else the JSON name), the result checked as proto3 JSON of the input type.

    :raises InvalidInput: the result does not parse (field ``value``, naming the field).
    """
    keys = _keys(workflow.input_type, path.split("."))

    def patch(stored: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        new = copy.deepcopy(stored)
        node = new
        old: Any = stored
        for i, (proto, json_name) in enumerate(keys):
            key = proto if proto in node and json_name not in node else json_name
            old = old.get(key) if isinstance(old, dict) else None
            if i == len(keys) - 1:
                node[key] = value
            else:
                child = node.get(key)
                if not isinstance(child, dict):
                    child = {}
                    node[key] = child
                node = child
        msg = message_class(workflow.input_type)()
        try:
            json_format.ParseDict(
                new, msg, ignore_unknown_fields=True, descriptor_pool=workflow.pool
            )
        except Exception as exc:  # ParseError, and whatever odd JSON makes protobuf raise
            raise invalid(
                "value",
                f"'value' is not valid for input field '{path}' of "
                f"{workflow.input_type.full_name}: {exc}",
            ) from exc
        return new, old, value

    return patch
