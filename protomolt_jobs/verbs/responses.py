"""A response supplied from outside, turned into a checkpoint entry: the answer to a parked
step (``complete-step``) and an operator's word for a step (``reconcile-step done``,
``migrate-checkpoint replace``).

Each goes through the same four moves:

1. :func:`resolve_step`: the step in the job's stored definition (:class:`StoredRun`), with an
   output type to parse against;
2. :func:`parse_response`: the response as a message of that type, strictly (a misspelt field is
   refused naming it, never dropped);
3. :func:`broken_rules`: the step's declared ``validate`` rules, when it has them (each verb
   answers a broken rule its own way);
4. :func:`checkpoint_of`: the canonical checkpoint entry, fingerprinted (``effects.stamp``), so
   that replay re-parses exactly what the worker would have stored.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.message import Message

from protomolt_jobs.errors import JobCorrupt
from protomolt_jobs.input_rules import invalid as invalid_at
from protomolt_jobs.input_rules import proto_json_path
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.verbs.base import corrupt_snapshot, invalid
from protomolt_jobs.workflow import Step, checkpoint_entry
from protomolt_jobs.workflow.artifacts import content_sha256
from protomolt_jobs.workflow.effects import stamp
from protomolt_jobs.workflow.step_run import artifact_fields
from protomolt_jobs.workflow.types import WorkflowExecutionError
from protomolt_jobs.workflow.validation import summarize, validate_message

__all__ = [
    "broken_rules",
    "checkpoint_of",
    "declared_artifacts",
    "operator_checkpoint",
    "parse_response",
    "resolve_step",
]


def resolve_step(job: Any, step_name: str, runtime: Any) -> tuple[StoredRun, Step]:
    """The job's stored run and its step ``step_name``, which must have an output type.

    :raises JobCorrupt: the stored definition is not an object, does not parse, or the step's
        method cannot be resolved.
    :raises InvalidInput: the workflow has no such step (field ``stepName``).
    """
    try:
        stored = StoredRun.load(job, runtime)
    except SnapshotError as exc:
        # This verb must act on the definition: a snapshot it cannot use is job-corrupt.
        raise corrupt_snapshot(exc) from exc
    step = stored.workflow.step(step_name)
    if step is None:
        raise invalid("stepName", f"the workflow has no step named '{step_name}'")
    if step.output_type is None:
        raise JobCorrupt(
            f"the job's stored workflow definition does not parse: step '{step_name}' "
            "has no resolvable method"
        )
    return stored, step


def parse_response(step: Any, response: dict[str, Any]) -> Message:
    """``response`` as a message of the step's output type.

    :param step: a step :func:`resolve_step` returned (its output type is known); so in the
        functions below.
    :raises InvalidInput: it is not proto3 JSON of that type (field ``response``; ``path``
        names the offending field when the parser does).
    """
    message = message_factory.GetMessageClass(step.output_type)()
    try:
        # Strict: a misspelt field in a human's answer ({"aproved": true}) is refused
        # naming it, never dropped so that the field silently takes its default.
        json_format.ParseDict(response, message, ignore_unknown_fields=False)
    except Exception as exc:  # ParseError, and TypeError/ValueError/OverflowError on odd values
        raise invalid_at(
            "response",
            f"'response' is not valid proto3 JSON for {step.output_type.full_name}: {exc}",
            proto_json_path(str(exc)),
        ) from exc
    return message


def broken_rules(step: Any, message: Message) -> str | None:
    """The summary of the step's declared ``validate`` rules ``message`` breaks; None when it
    breaks none or the step declares none."""
    if not step.validate:
        return None
    violations = validate_message(message)
    return summarize(violations) if violations else None


def checkpoint_of(stored: StoredRun, step: Any, message: Message) -> dict[str, Any]:
    """The checkpoint entry of ``message`` as the step's answer: the canonical proto3 JSON the
    worker writes (rendered with the workflow's own type pool, so an ``Any`` of a workflow type
    renders; unknown fields the caller sent are not kept), fingerprinted so a later type change
    is seen on replay, and hashed (``sha256``, ``sizeBytes``: the response artifact of
    docs/artifacts.md; no ``inputs``: nothing built its request).

    :raises InvalidInput: the message cannot be rendered (field ``response``).
    """
    workflow = stored.workflow
    try:
        entry = checkpoint_entry(step.name, message, workflow.pool)
    except Exception as exc:  # caller input: invalid-input, never a 500
        raise invalid(
            "response",
            f"'response' cannot be rendered as proto3 JSON of {step.output_type.full_name}: {exc}",
        ) from exc
    entry = stamp(entry, workflow, step)
    # the response artifact's hash, as the worker's entries carry it (docs/artifacts.md)
    entry["sha256"], entry["sizeBytes"] = content_sha256(message)
    return entry


def declared_artifacts(
    stored: StoredRun, step: Any, message: Message, entry: dict[str, Any], entries: Any
) -> None:
    """Add to ``entry`` (:func:`checkpoint_of`'s) what the step's artifact keys make of
    ``message``, exactly as the worker's entry of a called step carries them
    (``workflow.step_run.artifact_fields``): ``artifacts`` (its declared ``outputs`` ports),
    ``receipt.evidence`` (a declared ``receipt``), ``validated`` (its ``validates`` refs,
    resolved against ``entries``, the run's stored checkpoints). The store then writes their
    ``workflow_artifact`` rows in the statement that stores the entry. A step without artifact
    keys is left as it is.

    :raises InvalidInput: a declared port's ``uri`` or ``sha256`` (or a declared receipt) is
        empty or cannot be read from ``message`` (field ``response``, naming the port): the
        answer is refused and the run stays parked, never failed for it.
    """
    workflow = stored.workflow
    prior = [e for e in entries or () if isinstance(e, dict)]
    try:
        artifact_fields(entry, workflow, step, message, None, None, prior)
    except WorkflowExecutionError as exc:
        raise invalid(
            "response", f"'response' does not give what the step declares: {exc.message}"
        ) from exc


def operator_checkpoint(
    stored: StoredRun,
    step: Any,
    response: Any,
    entries: Any,
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint entry of an operator-given ``response`` (``reconcile-step``,
    ``migrate-checkpoint``): parsed, held to the step's rules, rendered, given ``base``'s
    fields it lacks (``{"receipt": ...}``, or what the replaced entry kept), then what the
    step's artifact keys make of it (:func:`declared_artifacts`, ``validates`` resolved against
    ``entries``), as ``complete-step``'s entry: the store writes their ``workflow_artifact``
    rows in the statement that stores the entry.

    :raises InvalidInput: ``response`` is not an object, not proto3 JSON of the step's output
        type, breaks its declared rules, or does not give a declared port's ``uri`` or
        ``sha256`` (or a declared receipt) (field ``response``).
    """
    if not isinstance(response, dict):
        raise invalid("response", "Field 'response' must be a JSON object")
    message = parse_response(step, response)
    summary = broken_rules(step, message)
    if summary is not None:
        raise invalid("response", f"'response' failed validation: {summary}")
    entry = checkpoint_of(stored, step, message)
    for key, value in (base or {}).items():
        entry.setdefault(key, value)
    declared_artifacts(stored, step, message, entry, entries)
    return entry
