"""The step code both runners share: scope, request, gate, budget, response check, replay,
fingerprint check and checkpoint entries.

``sequential_run`` (steps in order) and ``graph_run`` (ready steps in parallel) differ in how
they order steps, never in how one step is built, gated, called, checked or checkpointed; that
is here. Every failure is a :class:`~protomolt_jobs.workflow.types.WorkflowExecutionError` with
the reference's text, except :class:`RecoveryStop` (the run stops as
:class:`~protomolt_jobs.workflow.types.RecoveryRequired`, which ``runner.run_segment`` returns).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pool, json_format
from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import artifacts as _artifacts
from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.proto_json import message_to_dict
from protomolt_jobs.workflow.types import (
    APPROVAL,
    CompiledWorkflow,
    FailureKind,
    Parked,
    RecoveryRequired,
    Step,
    WorkflowExecutionError,
)

__all__ = [
    "DRIFT",
    "GrantGate",
    "RecoveryStop",
    "Scope",
    "artifact_fields",
    "authorize",
    "build_message",
    "call_budget_ms",
    "check_fingerprint",
    "checkpoint_entry",
    "deliver_checkpoint",
    "discard_checkpoint",
    "fail",
    "gate_open",
    "render_checkpoint",
    "replay",
    "validate_response",
    "workflow_output",
]

#: The tail of every replay mismatch's message.
DRIFT = "the workflow definition changed under the job"


def fail(kind: FailureKind, step: str, message: str, **kw: Any) -> WorkflowExecutionError:
    """The error a run raises at ``step`` (``kw``: ``code``, ``store_failure``)."""
    return WorkflowExecutionError(kind, step, message, **kw)


class RecoveryStop(ProtomoltJobsError):
    """The run must stop as :class:`RecoveryRequired` (raised from replay or from an external
    step's resume; ``runner.run_segment`` returns :attr:`outcome`)."""

    def __init__(self, outcome: RecoveryRequired) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class GrantGate(ProtomoltJobsError):
    """A step's grant needs an approval: the run parks on an approval gate for the step
    (``sequential_run`` returns :attr:`parked`); ``approve-step``'s decision is the grant."""

    def __init__(self, parked: Parked) -> None:
        super().__init__(f"step '{parked.step}' waits for its grant")
        self.parked = parked


class Scope:
    """Names bound so far (``input`` and each step, name -> message) and their activation
    values, built lazily (``cel.bind_message``: deferred, or CEL values when conversion can
    fail). A sequential run binds each step as it lands; a graph step reads a copy."""

    def __init__(self, values: dict[str, Message]) -> None:
        self.values = values
        self._cel: dict[str, Any] = {}

    def bind(self, name: str, value: Message) -> None:
        """Bind ``name`` to ``value`` (its activation value is rebuilt when next asked)."""
        self.values[name] = value
        self._cel.pop(name, None)

    def cel(self) -> dict[str, Any]:
        """The activation: name -> CEL value, for every bound name."""
        for name, value in self.values.items():
            if name not in self._cel:
                self._cel[name] = _cel.bind_message(value)
        return self._cel


def checkpoint_entry(
    step: str,
    response: Message | None,
    pool: descriptor_pool.DescriptorPool | None = None,
) -> dict[str, Any]:
    """The stored form of one checkpoint: ``{"name", "skipped", "response"?}`` (proto3 JSON).

    The response prints fields at their default value too (``{"ids": [], "fail": false}``), as
    upstream's transcoder does (``alwaysPrintFieldsWithNoPresence``): a checkpoint reads the
    same in either implementation. Entries stored before this (defaults left out) parse to the
    same message.

    :param pool: the workflow's type pool; ``Any`` fields are rendered with the types it
        holds (None: the default pool only).
    :raises TypeError: (or another ``Exception``) when the response cannot be rendered, e.g.
        an ``Any`` packing a type the pool does not know.
    """
    if response is None:
        return {"name": step, "skipped": True}
    return {
        "name": step,
        "skipped": False,
        "response": message_to_dict(response, descriptor_pool=pool),
    }


def render_checkpoint(
    workflow: CompiledWorkflow,
    step: Step,
    response: Message | None,
    effects: Any,
    *,
    request: Message | None = None,
    receipt: Any = None,
    grant: dict[str, Any] | None = None,
    inputs: list[dict[str, Any]] | None = None,
    consumed: list[dict[str, Any]] | None = None,
    entries: list[Any] | None = None,
) -> dict[str, Any]:
    """The entry a step that just ended stores: :func:`checkpoint_entry`, stamped with its
    fingerprints (``effects.stamp``) when the run has an ``effects.EffectContext``, and then
    with its artifact fields (``workflow/artifacts.py``): ``sha256``, ``sizeBytes``,
    ``inputs`` (the lineage recorded when the request was built), and for a step that
    declares them ``artifacts`` (output ports), ``receipt.evidence`` and ``consumed``.

    :param response: the step's response, None for a skipped step.
    :param effects: the job's ``EffectContext``, or None (nothing is stamped).
    :param grant: the step's grant (:func:`authorize`), stored as the entry's ``grant``.
    :param inputs: ``[{step, iteration, sha256}]`` read when the request was built, or None.
    :param consumed: ``[{ref, sha256, ...}]`` a publication step consumed (checked before its
        call).
    :param entries: the run's entries so far: a validator step's ``validated`` refs are
        resolved against them (None: nothing is validated).
    :raises WorkflowExecutionError: WORKFLOW (not a store failure: the same response would fail
        again, so no retry, upstream 4.4) when the entry cannot be rendered as JSON; ARTIFACT
        when a declared port cannot be read; RECEIPT when a declared receipt is empty.
    """
    try:
        entry = checkpoint_entry(step.name, response, workflow.pool)
        if effects is not None:
            fx.stamp(
                entry, workflow, step, request=request, attempt=effects.attempt, receipt=receipt
            )
        if grant is not None:
            entry["grant"] = grant
    except Exception as exc:  # protobuf/json rendering raises assorted types
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"could not render the checkpoint for '{step.name}' as JSON: {exc}",
        ) from exc
    if effects is not None and response is not None:
        artifact_fields(entry, workflow, step, response, inputs, consumed, entries)
    return entry


def artifact_fields(
    entry: dict[str, Any],
    workflow: CompiledWorkflow,
    step: Step,
    response: Message,
    inputs: list[dict[str, Any]] | None,
    consumed: list[dict[str, Any]] | None,
    entries: list[Any] | None,
) -> None:
    """Add to ``entry`` the response artifact's fields (``sha256``, ``sizeBytes``, ``inputs``
    when given), and the declared ports, receipt, validation and consumption (``validated``
    and ``consumed`` become the artifacts' state changes, written by the checkpoint's own
    statement: ``store/artifact_rows.py``). The worker's entries and ``complete-step``'s
    (``verbs/responses.py``) both take their fields from here.

    :raises WorkflowExecutionError: ARTIFACT when a declared port cannot be read; RECEIPT when
        a declared receipt is empty.
    """
    entry["sha256"], entry["sizeBytes"] = _artifacts.content_sha256(response)
    if inputs is not None:
        entry["inputs"] = inputs
    if _artifacts.of(workflow, step.name).empty:
        return
    ports = _artifacts.port_records(workflow, step, response)
    if ports:
        entry["artifacts"] = ports
    evidence = _artifacts.receipt_value(workflow, step, response)
    if evidence is not None:
        receipt = entry.get("receipt")
        entry["receipt"] = {**(receipt if isinstance(receipt, dict) else {}), "evidence": evidence}
    if consumed:
        entry["consumed"] = consumed
    if entries is not None:
        verified = _artifacts.validated(workflow, step, entries)
        if verified:
            entry["validated"] = verified


#: The decisions an ``authorize`` callback may return (``StepDecision.decision``).
ALLOW, DENY, NEEDS_APPROVAL = "allow", "deny", "needs-approval"


def authorize(
    step: Step, check: Callable[[Step], Any] | None, *, can_park: bool = False
) -> dict[str, Any] | None:
    """Ask ``check`` (the worker's grant policy) whether ``step`` may run: only for a step that
    declares ``capabilities`` (others cost nothing: None, ``check`` is not called).

    :param check: ``step -> decision`` with ``decision`` (``allow`` | ``deny`` |
        ``needs-approval``), ``reason`` and ``decision_id`` (a ``hooks.contract.StepDecision``),
        or None (a run outside a job: nothing is checked).
    :param can_park: the runner can park at this step (a sequential run, a step a graph run
        schedules): ``needs-approval`` raises :class:`GrantGate` (its ``Parked`` carries the
        decision's ``timers``, when it has any); otherwise (a compensation step of a failing
        graph run) it is a PERMISSION failure naming why.
    :returns: the grant stored in the step's checkpoint entry
        (``{"decision": "allow", "reason", "decisionId", "capabilities"}``), or None.
    :raises WorkflowExecutionError: PERMISSION ``<reason> (decision <id>)`` when denied (never
        retried); WORKFLOW with ``store_failure`` (retried) when the check itself failed.
    :raises GrantGate: ``needs-approval`` where the run can park.
    """
    if not step.capabilities or check is None:
        return None
    try:
        decision = check(step)
        verdict, reason, decision_id = decision.decision, decision.reason, decision.decision_id
    except WorkflowExecutionError:
        raise
    except Exception as exc:  # a policy engine that failed: the grant is unknown, retry
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"the grant check of step '{step.name}' failed: {type(exc).__name__}: {exc}",
            store_failure=True,
        ) from exc
    if verdict == ALLOW:
        return {
            "decision": ALLOW,
            "reason": reason,
            "decisionId": decision_id,
            "capabilities": list(step.capabilities),
        }
    if verdict == NEEDS_APPROVAL:
        if can_park:
            raise GrantGate(Parked(step.name, APPROVAL, tuple(getattr(decision, "timers", ()))))
        # a compensation of a failing run cannot wait for votes: named, never a silent grant
        reason = f"{reason}; needs an approval, and a compensation step cannot wait for one"
    raise fail(FailureKind.PERMISSION, step.name, f"{reason} (decision {decision_id})")


def deliver_checkpoint(
    on_checkpoint: Callable[[dict[str, Any]], None], step: Step, entry: dict[str, Any]
) -> None:
    """Hand one entry to ``on_checkpoint``.

    :raises WorkflowExecutionError: WORKFLOW with ``store_failure=True`` when it raises (the
        step's response may not have persisted; the original exception is ``__cause__``).
    """
    try:
        on_checkpoint(entry)
    except Exception as exc:  # any observer failure fails the step
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint observer failed; the step's response may not have persisted: {exc}",
            store_failure=True,
        ) from exc


def discard_checkpoint(_entry: dict[str, Any]) -> None:
    """The ``on_checkpoint`` of a synchronous run: nothing is stored (a sequential run does not
    even render its entries)."""


def replay(workflow: CompiledWorkflow, i: int, step: Step, entry: Any) -> Message | None:
    """The message stored checkpoint ``i`` binds for ``step`` (None for a skipped entry).

    The entry must name ``step`` and its response must parse strictly as the step's current
    output type (an unknown field is drift).

    :raises WorkflowExecutionError: WORKFLOW naming the mismatch (upstream 4.4).
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint {i} is not a {{name, skipped, response}} object; {DRIFT}",
        )
    if entry["name"] != step.name:
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint {i} belongs to step '{entry['name']}' but the workflow's step {i} is "
            f"'{step.name}'; {DRIFT}",
        )
    if entry.get("skipped") is True:
        return None
    assert step.output_type is not None
    type_name = step.output_type.full_name
    response = entry.get("response")
    if not isinstance(response, dict):
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint '{step.name}' response is not valid proto3 JSON for {type_name}: "
            "expected a JSON object",
        )
    msg = message_class(step.output_type)()
    try:
        json_format.ParseDict(response, msg, descriptor_pool=workflow.pool)
    except Exception as exc:  # ParseError, and whatever odd JSON makes protobuf raise
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint '{step.name}' response is not valid proto3 JSON for {type_name}: {exc}",
        ) from exc
    return msg


def check_fingerprint(workflow: CompiledWorkflow, step: Step, entry: Any) -> None:
    """Stop when a stored entry's fingerprint no longer matches the workflow (entries without
    fingerprints, and malformed or misplaced ones, pass: :func:`replay` reports those).

    :raises RecoveryStop: ``checkpoint-mismatch`` naming the field that changed.
    """
    if not isinstance(entry, dict) or entry.get("name") != step.name:
        return  # replay reports a malformed or misplaced entry as before
    if "definitionSha256" not in entry and "descriptorSha256" not in entry:
        return
    changed = fx.mismatch(workflow, step, entry)
    if changed is not None:
        raise RecoveryStop(RecoveryRequired(step.name, fx.mismatch_reason(step.name, changed)))


def build_message(
    type_desc: Any,
    rules: Any,
    cel_rules: Any,
    scope: Scope,
    step_name: str,
) -> Message:
    """A ``type_desc`` message filled by the text ``rules`` then the ``cel_rules`` over
    ``scope``: a step's request, a verify probe's request, an edge's value, the output.

    :raises WorkflowExecutionError: MAPPING (``mapping failed: ...``) at ``step_name``.
    """
    msg = message_class(type_desc)()
    try:
        mapping.apply_text_rules(msg, rules, scope.values)
        if cel_rules:
            mapping.apply_cel_rules(msg, cel_rules, scope.cel())
    except mapping.MappingError as exc:
        raise fail(FailureKind.MAPPING, step_name, f"mapping failed: {exc}") from exc
    except Exception as exc:
        # protobuf's own setters reject what the converters let through, and reading a
        # response into CEL can fail on its values (a Timestamp out of datetime's range)
        raise fail(FailureKind.MAPPING, step_name, f"mapping failed: {exc}") from exc
    return msg


def gate_open(step: Step, scope: Scope) -> bool:
    """True when ``step``'s gate (``when``, evaluated over ``scope``) lets it run; ``target``
    is bound to an empty request (the verifier lets a gate read it). Call it only for a step
    that has a ``when``.

    :raises WorkflowExecutionError: GATE (``gate failed: ...``) when it cannot be evaluated.
    """
    assert step.input_type is not None
    try:
        activation = dict(scope.cel())
        activation["target"] = _cel.bind_message(message_class(step.input_type)())
        return _cel.evaluate_bool(step.when, activation)
    except Exception as exc:  # CelError, or a bound value CEL cannot hold
        raise fail(FailureKind.GATE, step.name, f"gate failed: {exc}") from exc


def call_budget_ms(step: Step, deadline: float) -> int:
    """The deadline of ``step``'s call in milliseconds: ``min(step deadlineMs, remaining)``,
    where remaining is what is left of the segment's budget until ``deadline`` (a
    ``time.monotonic()`` instant, seconds).

    :raises WorkflowExecutionError: DEADLINE when nothing is left (before any call).
    """
    remaining_ms = math.floor((deadline - time.monotonic()) * 1000)
    if remaining_ms <= 0:
        raise fail(
            FailureKind.DEADLINE, step.name, "workflow deadline exhausted before the step ran"
        )
    return min(step.deadline_ms, remaining_ms) if step.deadline_ms > 0 else remaining_ms


def validate_response(step: Step, response: Message) -> None:
    """Check ``response`` against its type's validation rules (a step with ``validate``).

    :raises WorkflowExecutionError: VALIDATION naming the violations; WORKFLOW when a rule
        cannot run (a broken rule fails the step, never escapes untyped: gap 4).
    """
    from protomolt_jobs.workflow.validation import summarize, validate_message

    try:
        violations = validate_message(response)
    except Exception as exc:  # a broken rule must fail the step, not escape untyped (gap 4)
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"response validation could not run: {type(exc).__name__}: {exc}",
        ) from exc
    if violations:
        raise fail(
            FailureKind.VALIDATION,
            step.name,
            f"response failed validation: {summarize(violations)}",
        )


def workflow_output(
    workflow: CompiledWorkflow, scope: Scope, last: Message
) -> tuple[Message, dict[str, Any]]:
    """The run's result and its proto3 JSON: the output mapping over ``scope`` when the
    workflow declares one, else ``last`` (the last response that ran, or the input).

    :raises WorkflowExecutionError: MAPPING at ``output``; WORKFLOW at ``output`` when the
        result cannot be rendered (an ``Any`` whose type is not in the pool).
    """
    if workflow.output is not None:
        out = workflow.output
        output = build_message(out.type, out.rules, out.cel_rules, scope, "output")
    else:
        output = last
    try:
        output_json = message_to_dict(output, descriptor_pool=workflow.pool)
    except Exception as exc:  # json_format raises assorted types
        raise fail(
            FailureKind.WORKFLOW, "output", f"failed to render the workflow output: {exc}"
        ) from exc
    return output, output_json
