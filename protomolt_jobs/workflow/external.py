"""External steps (``effect: "external"``; docs/workflows.md *Effects*): the intent written
before the call and the ``verify`` probe asked when a resumed run finds an intent without a
checkpoint. Shared by the sequential and the graph executor, so both keep the same rule: an
external step is never called blindly twice; what cannot be proven stops the run as
:class:`~protomolt_jobs.workflow.types.RecoveryRequired` until ``reconcile-step`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow.calls import call_unary
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.step_run import RecoveryStop, Scope, build_message, fail
from protomolt_jobs.workflow.types import (
    CompiledWorkflow,
    FailureKind,
    RecoveryRequired,
    Step,
)

__all__ = ["record_intent", "resume_external"]


def record_intent(effects: Any, step: Step, key: str) -> None:
    """Store the intent of an external step before its call (a failure: the step is not
    called and the run is retried like a failed checkpoint write)."""
    if effects.on_intent is None:
        return
    try:
        effects.on_intent(step.name, key)
    except Exception as exc:  # any failure to record the intent fails the step
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"could not record the intent of external step '{step.name}': {exc}",
            store_failure=True,
        ) from exc


def resume_external(
    workflow: CompiledWorkflow,
    step: Step,
    scope: Scope,
    channel_for: Callable[[Step], grpc.Channel],
    effects: Any,
    call_ms: int,
) -> tuple[Message, Any] | None:
    """An external step with an intent and no checkpoint: ask its ``verify`` probe.

    :param channel_for: the segment's channel for a step (the probe's target).

    :returns: ``(response to bind, receipt)`` when the probe finds the effect; None when it
        finds nothing (the step is called).
    :raises RecoveryStop: no ``verify``, or the probe could not tell (it failed).
    """
    v = step.verify
    if v is None:
        raise RecoveryStop(
            RecoveryRequired(
                step.name,
                f"step '{step.name}' has effect 'external', an intent and no checkpoint, and no "
                "'verify' probe: reconcile-step must say whether it happened",
            )
        )
    probe = fx.probe_step(step)
    try:
        request = build_message(v.method.input_type, v.rules, v.cel_rules, scope, step.name)
        response = call_unary(
            channel_for(probe),
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
        raise RecoveryStop(
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
