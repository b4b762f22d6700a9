"""Running a sequential workflow inside one segment: the steps in order, one at a time.

:func:`run_steps` is what ``runner.run_segment`` calls for a workflow without ``graph``. It
replays a checkpoint prefix, then runs the remaining steps in order (reference sections 3
and 6):

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

With an ``effects.EffectContext`` every call carries its idempotency key, and an ``external``
step's intent is recorded before its call; a resumed segment that finds an intent and no
checkpoint asks the step's ``verify`` probe instead of calling it blindly.

The result is the output mapping, or else the last executed response (a gated-off step, live or
replayed, does not replace it; upstream lets a replayed skip replace it, reference gap 3).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from protomolt_jobs.workflow import approval, inputs, resumable
from protomolt_jobs.workflow import artifacts as _artifacts
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow.calls import SegmentChannels
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.external import record_intent, resume_external
from protomolt_jobs.workflow.graph import names_read
from protomolt_jobs.workflow.step_run import (
    GrantGate,
    Scope,
    authorize,
    build_message,
    call_budget_ms,
    check_fingerprint,
    deliver_checkpoint,
    discard_checkpoint,
    fail,
    gate_open,
    render_checkpoint,
    replay,
    validate_response,
    workflow_output,
)
from protomolt_jobs.workflow.types import (
    ACCEPT,
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    Completed,
    FailureKind,
    Parked,
    Runtime,
    Step,
)

__all__ = ["run_steps"]


def run_steps(
    workflow: CompiledWorkflow,
    input_msg: Message,
    prior: list[dict[str, Any]],
    on_checkpoint: Callable[[dict[str, Any]], None],
    *,
    runtime: Runtime,
    effects: Any = None,
    held: Any = None,
    check: Callable[[Step], Any] | None = None,
) -> Completed | Parked:
    """Replay ``prior`` and run the rest of a sequential workflow (see the module docstring).

    :param prior: stored checkpoint entries, a prefix of the steps (the caller checked that
        it is a list no longer than the steps).
    :param on_checkpoint: called with each new entry as its step lands
        (``step_run.discard_checkpoint``: nothing is rendered).
    :param effects: the job's ``effects.EffectContext``, or None.
    :param held: ``retry_scope.Held``: entries replayed when their step is reached instead of
        running it (a retry-step's kept effects and unchanged-output dependants), or None.
    :param check: the job's grant check (``step_run.authorize``), asked after a step's
        gate and before its request, intent and call; None: nothing is checked.
    :returns: :class:`Completed` (``steps``: ``{"name", "skipped"}`` per step) or
        :class:`Parked` at the first external step not yet checkpointed, or at a step whose
        grant needs an approval (``authorize``: the step's grant gate).
    :raises WorkflowExecutionError: the step's failure (kind, step, message, code for GRPC).
    :raises RecoveryStop: a stored fingerprint changed, or an external step's state cannot be
        proven.
    """
    steps = workflow.steps
    deadline = time.monotonic() + workflow.deadline_ms / 1000.0
    scope = Scope({"input": input_msg})
    outcomes: list[dict[str, Any]] = []
    last: Message = input_msg
    #: the run's entries so far (a publication step checks what it consumes against them)
    entries: list[Any] = list(prior)
    with SegmentChannels(runtime) as channels:
        for i, step in enumerate(steps):
            if step.unsupported or step.output_type is None:
                raise fail(
                    FailureKind.WORKFLOW,
                    step.name,
                    f"step '{step.name}' uses {', '.join(step.unsupported) or 'no method'}, which "
                    "this engine does not run; verify the workflow first",
                )
            stored = i < len(prior)
            entry = prior[i] if stored else held.take(step.name) if held else None
            if stored or entry is not None:
                if not stored:
                    entries.append(entry)
                check_fingerprint(workflow, step, entry)
                replayed = replay(workflow, i, step, entry)
                skipped = replayed is None
                value = message_class(step.output_type)() if replayed is None else replayed
                scope.bind(step.name, value)
                outcomes.append({"name": step.name, "skipped": skipped})
                if not skipped:
                    last = value
                decision = approval.decision_of(step, prior[i])
                if decision is not None:
                    failure = approval.sequential_failure(step, decision)
                    if failure is not None:
                        raise failure
                    if decision != ACCEPT:
                        break  # approval.end: complete
                continue
            if step.parks:
                return approval.parked(step)
            if step.when.strip() and not gate_open(step, scope):
                scope.bind(step.name, message_class(step.output_type)())
                outcomes.append({"name": step.name, "skipped": True})
                entries.append(_record(on_checkpoint, workflow, step, None, effects))
                continue
            try:
                grant = authorize(step, check, can_park=True)
            except GrantGate as gate:
                return gate.parked  # approve-step's decision is the grant
            try:
                inputs.check_step(workflow, step, scope.values)
            except inputs.InputWait as wait:
                return wait.parked  # supply-input fills the path and requeues
            consumed = lineage = None
            if effects is not None:
                consumed = _artifacts.check_consumed(
                    workflow,
                    step,
                    entries,
                    effects.artifact_bytes,
                    effects.artifact_rows,
                    effects.job_id,
                )
            request = build_message(step.input_type, step.rules, step.cel_rules, scope, step.name)
            if effects is not None:  # lineage: what the request read, hashed before the call
                lineage = _artifacts.inputs_of(step, scope.values, names_read(step))
            call_ms = call_budget_ms(step, deadline)
            metadata = None
            receipt = None
            found = None
            if effects is not None:
                key = effects.key(step.name)
                metadata = [(fx.IDEMPOTENCY_HEADER, key)]
                if step.effect == EFFECT_EXTERNAL:
                    if step.name in effects.intents:
                        found = resume_external(
                            workflow, step, scope, channels.channel, effects, call_ms
                        )
                    else:
                        record_intent(effects, step, key)
                    receipt = {"idempotencyKey": key}
            if found is not None:
                response, receipt = found
            else:
                response = resumable.call(
                    channels.channel(step),
                    step,
                    request,
                    call_ms,
                    functools.partial(call_budget_ms, step, deadline),
                    metadata,
                    effects,
                    workflow=workflow,
                )
                if step.validate:
                    validate_response(step, response)
            scope.bind(step.name, response)
            outcomes.append({"name": step.name, "skipped": False})
            entries.append(
                _record(
                    on_checkpoint,
                    workflow,
                    step,
                    response,
                    effects,
                    request=request,
                    receipt=receipt,
                    grant=grant,
                    inputs=lineage,
                    consumed=consumed,
                    entries=entries,
                )
            )
            last = response
    output, output_json = workflow_output(workflow, scope, last)
    return Completed(
        output=output,
        output_json=output_json,
        output_type=output.DESCRIPTOR.full_name,
        steps=outcomes,
    )


def _record(
    on_checkpoint: Callable[[dict[str, Any]], None],
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
) -> dict[str, Any] | None:
    if on_checkpoint is discard_checkpoint:
        return None  # synchronous run: nothing is stored, so nothing needs rendering
    entry = render_checkpoint(
        workflow,
        step,
        response,
        effects,
        request=request,
        receipt=receipt,
        grant=grant,
        inputs=inputs,
        consumed=consumed,
        entries=entries,
    )
    deliver_checkpoint(on_checkpoint, step, entry)
    return entry
