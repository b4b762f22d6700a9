"""Running workflows: :func:`run_segment` (resumable, for jobs) and :func:`run` (synchronous).

A segment replays a checkpoint prefix, then runs the remaining steps in order (reference
section 3 and 6):

1. **Replay** ``prior[i]`` for step ``i``: the entry must name step ``i`` and its stored
   response must parse as the step's current output type (strictly: an unknown field is drift).
   Either mismatch is a WORKFLOW failure with the reference's text (upstream 4.4). Replayed
   steps call nothing and are not handed to ``on_checkpoint`` again.
2. **External** step (``completion: "external"``): stop with :class:`Parked`.
3. **Gate** (``when``): false binds the default instance of the output type and records a
   skipped checkpoint. ``target`` is bound to an empty request, so a gate that reads it (the
   verifier allows it) behaves the same at run time.
4. **Request**: text rules then CEL rules over the scope; **budget**: what is left of the
   segment's ``deadlineMs`` (it restarts every segment), <= 0 is DEADLINE before any call;
   the call deadline is ``min(step deadlineMs, remaining)``.
5. **Call**, optional **validation** of the response, **bind** into the scope, **checkpoint**
   (``on_checkpoint`` gets ``{"name", "skipped", "response"?}`` before the next step starts; if it
   raises, the run fails as WORKFLOW with ``store_failure=True``). A response that cannot be
   rendered as proto3 JSON (an ``Any`` whose type the workflow's pool does not know) is a
   WORKFLOW failure that is not a store failure: calling the service again cannot fix it.

Everything the engine can classify leaves :func:`run_segment` as a
:class:`WorkflowExecutionError`; another exception is a defect in the engine.

The result is the output mapping, or else the last executed response (a gated-off step, live or
replayed, does not replace it; upstream lets a replayed skip replace it, reference gap 3).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pool, json_format
from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.calls import SegmentChannels, call_unary
from protomolt_jobs.workflow.envelope import message_class, parse_input
from protomolt_jobs.workflow.types import (
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    Completed,
    FailureKind,
    Parked,
    RecoveryRequired,
    Runtime,
    Step,
    WorkflowExecutionError,
    WorkflowParseError,
)

__all__ = ["CANNOT_PARK", "checkpoint_entry", "next_target", "run", "run_segment"]

log = logging.getLogger("protomolt_jobs.workflow")

#: The synchronous refusal at an external step (reference 3.1, verbatim).
CANNOT_PARK = (
    "step declares completion='external'; synchronous run-workflow cannot park - submit the "
    "workflow as a job (submit-workflow) so complete-step can supply the response"
)
_DRIFT = "the workflow definition changed under the job"


def _fail(kind: FailureKind, step: str, message: str, **kw: Any) -> WorkflowExecutionError:
    return WorkflowExecutionError(kind, step, message, **kw)


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
        "response": json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True, descriptor_pool=pool
        ),
    }


class _Scope:
    """Names bound so far (``input`` and each step) and their activation values, built lazily
    (``cel.bind_message``: deferred, or CEL values when conversion can fail)."""

    def __init__(self, input_msg: Message) -> None:
        self.values: dict[str, Message] = {"input": input_msg}
        self._cel: dict[str, Any] = {}

    def bind(self, name: str, value: Message) -> None:
        self.values[name] = value
        self._cel.pop(name, None)

    def cel(self) -> dict[str, Any]:
        for name, value in self.values.items():
            if name not in self._cel:
                self._cel[name] = _cel.bind_message(value)
        return self._cel


def _replay(workflow: CompiledWorkflow, i: int, step: Step, entry: Any) -> Message | None:
    """The message a stored checkpoint binds (None for a skipped entry)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint {i} is not a {{name, skipped, response}} object; {_DRIFT}",
        )
    if entry["name"] != step.name:
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint {i} belongs to step '{entry['name']}' but the workflow's step {i} is "
            f"'{step.name}'; {_DRIFT}",
        )
    if entry.get("skipped") is True:
        return None
    assert step.output_type is not None
    type_name = step.output_type.full_name
    response = entry.get("response")
    if not isinstance(response, dict):
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint '{step.name}' response is not valid proto3 JSON for {type_name}: "
            "expected a JSON object",
        )
    msg = message_class(step.output_type)()
    try:
        json_format.ParseDict(response, msg, descriptor_pool=workflow.pool)
    except Exception as exc:  # ParseError, and whatever odd JSON makes protobuf raise
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint '{step.name}' response is not valid proto3 JSON for {type_name}: {exc}",
        ) from exc
    return msg


def _build(
    type_desc: Any,
    rules: Any,
    cel_rules: Any,
    scope: _Scope | Any,  # runner's _Scope or a graph run's read-only _Values (same shape)
    step_name: str,
) -> Message:
    msg = message_class(type_desc)()
    try:
        mapping.apply_text_rules(msg, rules, scope.values)
        if cel_rules:
            mapping.apply_cel_rules(msg, cel_rules, scope.cel())
    except mapping.MappingError as exc:
        raise _fail(FailureKind.MAPPING, step_name, f"mapping failed: {exc}") from exc
    except Exception as exc:
        # protobuf's own setters reject what the converters let through, and reading a
        # response into CEL can fail on its values (a Timestamp out of datetime's range)
        raise _fail(FailureKind.MAPPING, step_name, f"mapping failed: {exc}") from exc
    return msg


def _gate(step: Step, scope: _Scope) -> bool:
    assert step.input_type is not None
    try:
        activation = dict(scope.cel())
        activation["target"] = _cel.bind_message(message_class(step.input_type)())
        return _cel.evaluate_bool(step.when, activation)
    except Exception as exc:  # CelError, or a bound value CEL cannot hold
        raise _fail(FailureKind.GATE, step.name, f"gate failed: {exc}") from exc


def _validate(step: Step, response: Message) -> None:
    from protomolt_jobs.workflow.validation import summarize, validate_message

    try:
        violations = validate_message(response)
    except Exception as exc:  # a broken rule must fail the step, not escape untyped (gap 4)
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"response validation could not run: {type(exc).__name__}: {exc}",
        ) from exc
    if violations:
        raise _fail(
            FailureKind.VALIDATION,
            step.name,
            f"response failed validation: {summarize(violations)}",
        )


def _ignore(_entry: dict[str, Any]) -> None:
    return None


class _RecoveryStop(ProtomoltJobsError):
    """Internal: the run must stop as :class:`RecoveryRequired` (raised from replay or from
    an external step's resume; :func:`run_segment` returns it)."""

    def __init__(self, outcome: RecoveryRequired) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


def _check_fingerprint(workflow: CompiledWorkflow, step: Step, entry: Any) -> None:
    """Stop (``checkpoint-mismatch``) when a stored entry's fingerprint no longer matches."""
    if not isinstance(entry, dict) or entry.get("name") != step.name:
        return  # _replay reports a malformed or misplaced entry as before
    if "definitionSha256" not in entry and "descriptorSha256" not in entry:
        return
    from protomolt_jobs.workflow import effects as fx

    changed = fx.mismatch(workflow, step, entry)
    if changed is not None:
        raise _RecoveryStop(RecoveryRequired(step.name, fx.mismatch_reason(step.name, changed)))


def _resume_external(
    workflow: CompiledWorkflow,
    step: Step,
    scope: _Scope,
    channels: SegmentChannels,
    effects: Any,
    call_ms: int,
) -> tuple[Message, Any] | None:
    """An external step with an intent and no checkpoint: ask its ``verify`` probe.

    :returns: ``(response to bind, receipt)`` when the probe finds the effect; None when it
        finds nothing (the step is called).
    :raises _RecoveryStop: no ``verify``, or the probe could not tell (it failed).
    """
    from protomolt_jobs.workflow import effects as fx

    v = step.verify
    if v is None:
        raise _RecoveryStop(
            RecoveryRequired(
                step.name,
                f"step '{step.name}' has effect 'external', an intent and no checkpoint, and no "
                "'verify' probe: reconcile-step must say whether it happened",
            )
        )
    probe = fx.probe_step(step)
    try:
        request = _build(v.method.input_type, v.rules, v.cel_rules, scope, step.name)
        response = call_unary(
            channels.channel(probe),
            probe,
            request,
            call_ms / 1000.0,
            [(fx.IDEMPOTENCY_HEADER, effects.key(step.name))],
        )
        activation = dict(scope.cel())
        activation["response"] = _cel.bind_message(response)
        found = _cel.evaluate_bool(v.found, activation)
        if not found:
            return None
        if v.receipt.strip():
            receipt = _cel_json(_cel.evaluate(v.receipt, activation))
        else:
            receipt = fx.response_json(response, workflow.pool)
    except Exception as exc:  # a failed call, mapping or CEL: the probe cannot tell
        message = getattr(exc, "message", None) or str(exc)
        raise _RecoveryStop(
            RecoveryRequired(
                step.name,
                f"step '{step.name}' has an intent and no checkpoint, and its verify probe "
                f"failed: {message}",
            )
        ) from exc
    assert step.output_type is not None
    if v.method.output_type.full_name == step.output_type.full_name:
        bound: Message = response
    else:
        bound = message_class(step.output_type)()
    return bound, receipt


def _cel_json(value: Any) -> Any:
    """A CEL result as JSON (maps, lists, scalars; anything else as its text)."""
    from celpy import celtypes

    if value is None:
        return None
    if isinstance(value, celtypes.BoolType | bool):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType | int):
        return int(value)
    if isinstance(value, celtypes.DoubleType | float):
        return float(value)
    if isinstance(value, celtypes.MapType | dict):
        return {str(k): _cel_json(v) for k, v in value.items()}
    if isinstance(value, celtypes.ListType | list | tuple):
        return [_cel_json(v) for v in value]
    return str(value)


def _record(
    on_checkpoint: Callable[[dict[str, Any]], None],
    step: Step,
    response: Message | None,
    pool: descriptor_pool.DescriptorPool,
    workflow: CompiledWorkflow | None = None,
    effects: Any = None,
    request: Message | None = None,
    receipt: Any = None,
) -> None:
    if on_checkpoint is _ignore:
        return  # synchronous run: nothing is stored, so nothing needs rendering
    try:
        entry = checkpoint_entry(step.name, response, pool)
        if effects is not None and workflow is not None:
            from protomolt_jobs.workflow.effects import stamp

            stamp(entry, workflow, step, request=request, attempt=effects.attempt, receipt=receipt)
    except Exception as exc:
        # Not a store failure: the same response would fail again, so no retry (upstream 4.4).
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"could not render the checkpoint for '{step.name}' as JSON: {exc}",
        ) from exc
    try:
        on_checkpoint(entry)
    except Exception as exc:  # any observer failure fails the step
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"checkpoint observer failed; the step's response may not have persisted: {exc}",
            store_failure=True,
        ) from exc


def run_segment(
    workflow: CompiledWorkflow,
    input: Message | dict[str, Any],
    prior: list[dict[str, Any]],
    on_checkpoint: Callable[[dict[str, Any]], None],
    *,
    runtime: Runtime,
    call_permit: Callable[[str], Any] | None = None,
    effects: Any = None,
) -> Completed | Parked | RecoveryRequired:
    """Replay ``prior`` and run the rest of ``workflow``.

    A graph workflow (``workflow.graph``) runs on ``graph_run.run_graph``: ready steps in
    parallel, checkpoints keyed by step name in completion order, ``call_permit`` held around
    each call. A sequential workflow runs here, step after step, exactly as before graphs.

    :param workflow: a parsed (and verified) workflow.
    :param input: the input message, or its proto3 JSON.
    :param prior: stored checkpoint entries ``{"name", "skipped", "response"?}``, a prefix.
    :param on_checkpoint: called with each new entry as the step lands (ready to store).
    :param runtime: the host's runtime (channel factory for ``inprocess:`` targets).
    :param call_permit: graph workflows: ``target -> context manager`` held around each call.
    :param effects: the job's ``effects.EffectContext``: idempotency keys on every call,
        fingerprints in every new entry, intents before ``external`` steps (None: none).
    :returns: :class:`Completed`, :class:`Parked` (at an external step), or
        :class:`RecoveryRequired` (an external step's state cannot be proven, or a stored
        checkpoint's fingerprint changed).
    :raises WorkflowExecutionError: kind, step, message (and code for GRPC).
    """
    if not isinstance(input, Message):
        try:
            input = parse_input(workflow, input)
        except WorkflowParseError as exc:
            raise _fail(FailureKind.MAPPING, "", exc.message) from exc
    steps = workflow.steps
    if not isinstance(prior, list):
        raise _fail(FailureKind.WORKFLOW, "", "stored checkpoints are not an array")
    if len(prior) > len(steps):
        raise _fail(
            FailureKind.WORKFLOW,
            "",
            f"stored checkpoints ({len(prior)}) outnumber the workflow's steps ({len(steps)})",
        )
    try:
        if workflow.graph:
            from protomolt_jobs.workflow.graph_run import run_graph

            return run_graph(
                workflow,
                input,
                prior,
                on_checkpoint,
                runtime=runtime,
                call_permit=call_permit,
                effects=effects,
            )
        return _run_steps(workflow, input, prior, on_checkpoint, runtime, effects)
    except _RecoveryStop as stop:
        return stop.outcome


def _run_steps(
    workflow: CompiledWorkflow,
    input: Message,
    prior: list[dict[str, Any]],
    on_checkpoint: Callable[[dict[str, Any]], None],
    runtime: Runtime,
    effects: Any,
) -> Completed | Parked:
    steps = workflow.steps
    deadline = time.monotonic() + workflow.deadline_ms / 1000.0
    scope = _Scope(input)
    outcomes: list[dict[str, Any]] = []
    last: Message = input
    with SegmentChannels(runtime) as channels:
        for i, step in enumerate(steps):
            if step.unsupported or step.output_type is None:
                raise _fail(
                    FailureKind.WORKFLOW,
                    step.name,
                    f"step '{step.name}' uses {', '.join(step.unsupported) or 'no method'}, which "
                    "this engine does not run; verify the workflow first",
                )
            if i < len(prior):
                _check_fingerprint(workflow, step, prior[i])
                replayed = _replay(workflow, i, step, prior[i])
                skipped = replayed is None
                value = message_class(step.output_type)() if replayed is None else replayed
                scope.bind(step.name, value)
                outcomes.append({"name": step.name, "skipped": skipped})
                if not skipped:
                    last = value
                continue
            if step.external:
                return Parked(step.name)
            if step.when.strip() and not _gate(step, scope):
                scope.bind(step.name, message_class(step.output_type)())
                outcomes.append({"name": step.name, "skipped": True})
                _record(on_checkpoint, step, None, workflow.pool, workflow, effects)
                continue
            request = _build(step.input_type, step.rules, step.cel_rules, scope, step.name)
            remaining_ms = math.floor((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise _fail(
                    FailureKind.DEADLINE,
                    step.name,
                    "workflow deadline exhausted before the step ran",
                )
            call_ms = min(step.deadline_ms, remaining_ms) if step.deadline_ms > 0 else remaining_ms
            metadata = None
            receipt = None
            found = None
            if effects is not None:
                from protomolt_jobs.workflow.effects import IDEMPOTENCY_HEADER

                key = effects.key(step.name)
                metadata = [(IDEMPOTENCY_HEADER, key)]
                if step.effect == EFFECT_EXTERNAL:
                    if step.name in effects.intents:
                        found = _resume_external(workflow, step, scope, channels, effects, call_ms)
                    else:
                        _intent(effects, step, key)
                    receipt = {"idempotencyKey": key}
            if found is not None:
                response, receipt = found
            else:
                response = call_unary(
                    channels.channel(step), step, request, call_ms / 1000.0, metadata
                )
                if step.validate:
                    _validate(step, response)
            scope.bind(step.name, response)
            outcomes.append({"name": step.name, "skipped": False})
            _record(
                on_checkpoint,
                step,
                response,
                workflow.pool,
                workflow,
                effects,
                request,
                receipt,
            )
            last = response
    if workflow.output is not None:
        out = workflow.output
        output = _build(out.type, out.rules, out.cel_rules, scope, "output")
    else:
        output = last
    try:
        output_json = json_format.MessageToDict(
            output, always_print_fields_with_no_presence=True, descriptor_pool=workflow.pool
        )
    except Exception as exc:  # an Any whose type is not in the pool
        raise _fail(
            FailureKind.WORKFLOW, "output", f"failed to render the workflow output: {exc}"
        ) from exc
    return Completed(
        output=output,
        output_json=output_json,
        output_type=output.DESCRIPTOR.full_name,
        steps=outcomes,
    )


def _intent(effects: Any, step: Step, key: str) -> None:
    """Store the intent of an external step before its call (a failure: the step is not
    called and the run is retried like a failed checkpoint write)."""
    if effects.on_intent is None:
        return
    try:
        effects.on_intent(step.name, key)
    except Exception as exc:  # any failure to record the intent fails the step
        raise _fail(
            FailureKind.WORKFLOW,
            step.name,
            f"could not record the intent of external step '{step.name}': {exc}",
            store_failure=True,
        ) from exc


def run(
    workflow: CompiledWorkflow, input: Message | dict[str, Any], *, runtime: Runtime
) -> Completed:
    """Run ``workflow`` synchronously, start to end, storing nothing.

    A workflow with an external step is refused before anything is called (upstream calls
    the earlier steps first; their side effects would be wasted).

    :raises WorkflowExecutionError: as :func:`run_segment`; EXTERNAL with :data:`CANNOT_PARK`.
    """
    for step in workflow.steps:
        if step.external:
            raise _fail(FailureKind.EXTERNAL, step.name, CANNOT_PARK)
    result = run_segment(workflow, input, [], _ignore, runtime=runtime)
    if isinstance(result, RecoveryRequired):  # cannot happen without stored checkpoints
        raise _fail(FailureKind.WORKFLOW, result.step, result.reason)
    if isinstance(result, Parked):
        raise _fail(FailureKind.EXTERNAL, result.step, CANNOT_PARK)
    return result


def next_target(workflow: CompiledWorkflow, n_done: int) -> str | None:
    """The target the next segment calls first: step ``n_done``'s, or None when every step is
    done, that step is external (it parks without a call), or the workflow is a graph (its
    calls take their permits one by one: ``run_segment(call_permit=...)``)."""
    if workflow.graph:
        return None  # a graph run takes a permit per call, for each call's own target
    if n_done < 0 or n_done >= len(workflow.steps):
        return None
    step = workflow.steps[n_done]
    return None if step.external else step.target
