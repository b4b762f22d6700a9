"""Resumable steps: a long step called chunk by chunk, each response a progress checkpoint.

A step that declares ``resumable: {state, done, progress?}`` (docs/long-steps.md) is called
again and again by :func:`call`, which both runners use in place of ``calls.call_unary``
(a step without ``resumable`` goes straight to ``call_unary``: nothing changes for it):

1. the request is built once from the step's mappings; when a saved progress checkpoint of
   the step exists (``EffectContext.progress_saved``: a pause, a crash or a lost lease ended an
   earlier attempt mid-step), the request's ``state`` field is set from its saved state, so
   the call continues where the last chunk ended, never from scratch (a saved report that
   said done is not continued from: the step runs again in full, as after ``retry-step``).
   Before that, the saved report's fingerprints (adapter version, the request's SHA-256, the
   definition's and the step's descriptors' SHA-256, as :func:`~protomolt_jobs.workflow.
   effects.fingerprint` gives them) are compared with the current ones: a difference stops the
   run as ``RecoveryRequired`` (``progress-mismatch: step 'render' adapterVersion changed
   ...``), never a silent restart from zero; ``migrate-checkpoint`` keeps or drops the
   progress (docs/long-steps.md);
2. each call is one chunk. Its response's ``state`` field, the ``done`` expression's verdict
   and the ``progress`` expression's percent are handed to ``EffectContext.on_progress``,
   which stores them with ONE fenced statement that is also the heartbeat. A pending pause or
   cancel is applied by the database inside that write (the store raises
   ``ControlApplied``; the runner's failure wraps it), so control lands between chunks:
   "after the current frame" is a chunk boundary;
3. while ``done`` is false the next request is the first one with ``state`` set from the
   response; when it is true the last response is the step's response (checkpointed as any
   step's).

Without an ``EffectContext`` (a synchronous ``run-workflow``) the loop still runs, nothing is
stored and no control applies. :func:`findings` is the verifier's check of a declaration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow.calls import call_unary
from protomolt_jobs.workflow.step_run import RecoveryStop, fail
from protomolt_jobs.workflow.types import (
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    FailureKind,
    Finding,
    RecoveryRequired,
    Step,
)

__all__ = [
    "FINDING_KIND",
    "MAX_CHUNKS",
    "PROGRESS_MISMATCH",
    "call",
    "declared",
    "findings",
    "progress_mismatch",
    "reports",
]

#: The ``kind`` of the verifier's findings about ``resumable``.
FINDING_KIND = "resumable"
#: Most chunks one call of a resumable step makes in one segment (a service that never says
#: done fails the step rather than loop for ever).
MAX_CHUNKS = 100_000
#: The reason prefix of a run stopped because its saved progress's fingerprint changed.
PROGRESS_MISMATCH = "progress-mismatch"
#: The fingerprints a saved report is compared on, in this order (the first that differs is
#: named): ``report key`` -> the saved ``Progress`` attribute.
COMPARED = (
    ("adapterVersion", "adapter_version"),
    ("inputSha256", "input_sha256"),
    ("descriptorSha256", "descriptor_sha256"),
    ("definitionSha256", "definition_sha256"),
)


def declared(workflow: Any) -> bool:
    """True when a step of ``workflow`` is ``resumable`` or ``reportsProgress`` (the worker
    then wires progress)."""
    return any(
        getattr(s, "resumable", None) is not None or getattr(s, "reports_progress", False)
        for s in workflow.steps
    )


def reports(workflow: Any) -> bool:
    """True when a step of ``workflow`` declares ``reportsProgress`` (the worker then issues
    progress tokens)."""
    return any(getattr(s, "reports_progress", False) for s in workflow.steps)


def call(
    channel: grpc.Channel,
    step: Step,
    request: Message,
    call_ms: int,
    budget_ms: Callable[[], int],
    metadata: list[tuple[str, str]] | None,
    effects: Any,
    iteration: int = 0,
    workflow: CompiledWorkflow | None = None,
) -> Any:
    """``step``'s response: one ``call_unary`` for a step without ``resumable``; for a
    resumable step, chunks until ``done`` (see the module text).

    :param call_ms: the first call's deadline (ms).
    :param budget_ms: the call deadline (ms) of each later chunk (``step_run.call_budget_ms``:
        raises DEADLINE once the segment's budget is spent).
    :param effects: the job's ``EffectContext`` (its ``watch_cancel``, ``on_progress`` and
        ``progress_saved``), or None.
    :param iteration: the step's loop iteration (0 outside a loop).
    :param workflow: the step's workflow (its definition and descriptor fingerprints are
        stored with each report and compared on resume; None: neither).
    :raises RecoveryStop: the saved progress's fingerprints differ from the current ones
        (``progress-mismatch`` naming the field; nothing was called).
    :raises WorkflowExecutionError: a chunk's call failed (GRPC), ``done`` or ``progress``
        could not be evaluated (WORKFLOW naming the expression), the service never said done
        within :data:`MAX_CHUNKS` (WORKFLOW), or storing a report failed (WORKFLOW with
        ``store_failure``; its ``__cause__`` is the store's ``LeaseLost``/``ControlApplied``).
    """
    watch = effects.canceller(step) if effects is not None else None
    spec = step.resumable
    if spec is None and not step.reports_progress:
        return call_unary(channel, step, request, call_ms / 1000.0, metadata, watch)
    on_progress = getattr(effects, "on_progress", None) if effects is not None else None
    saved_of = getattr(effects, "progress_saved", None) if effects is not None else None
    input_sha256 = hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
    current = _fingerprints(workflow, step, input_sha256)
    token_of = getattr(effects, "progress_token", None) if effects is not None else None
    if step.reports_progress and token_of is not None:
        # only a step that opts in gets the header (docs/long-steps.md "ReportProgress")
        # the token carries the call's fingerprints: a state saved only by ReportProgress is
        # checked on resume as a chunk's is (store/progress_token.py)
        metadata = [*(metadata or []), token_of(step.name, iteration, spec is not None, current)]
    if spec is None:
        return _reported_call(
            channel, step, request, call_ms, metadata, watch, on_progress, iteration, current
        )
    saved = saved_of(step.name, iteration) if saved_of is not None else None
    next_request = request
    if saved is not None and saved.state is not None and not saved.done:
        # a report that said done is never continued from: its step's checkpoint was dropped
        # (retry-step) or lost with the settle, and the step runs again in full
        reason = progress_mismatch(step.name, saved, current)
        if reason is not None:
            raise RecoveryStop(RecoveryRequired(step.name, reason))
        next_request = _with_state(step, request, saved.state)
    for chunk in range(MAX_CHUNKS):
        timeout_ms = call_ms if chunk == 0 else budget_ms()
        response = call_unary(channel, step, next_request, timeout_ms / 1000.0, metadata, watch)
        activation = {"response": _cel.bind_message(response)}
        done = _done(step, activation)
        percent = 100.0 if done else _percent(step, activation)
        state = _state_of(step, response)
        if on_progress is not None:
            _report(
                on_progress,
                step,
                iteration,
                {
                    "percent": percent,
                    "details": _details(response),
                    "state": state,
                    **current,
                    "done": done,
                },
            )
        if done:
            return response
        next_request = _with_state(step, request, state)
    raise fail(
        FailureKind.WORKFLOW,
        step.name,
        f"step '{step.name}' did not finish within {MAX_CHUNKS} chunks (resumable.done)",
    )


def _reported_call(
    channel: grpc.Channel,
    step: Step,
    request: Message,
    call_ms: int,
    metadata: list[tuple[str, str]] | None,
    watch: Any,
    on_progress: Any,
    iteration: int,
    current: dict[str, str],
) -> Any:
    """One call of a ``reportsProgress`` step that is not ``resumable``; its progress row is
    closed (``done``, 100 %) after the call so get-job stops showing it as in flight."""
    response = call_unary(channel, step, request, call_ms / 1000.0, metadata, watch)
    if on_progress is not None:
        _report(
            on_progress,
            step,
            iteration,
            {
                "percent": 100.0,
                "details": _details(response),
                "state": None,
                **current,
                "done": True,
            },
        )
    return response


def _fingerprints(
    workflow: CompiledWorkflow | None, step: Step, input_sha256: str
) -> dict[str, str]:
    """The current fingerprints of ``step``'s call, keyed as a report's."""
    out = {"adapterVersion": step.adapter_version or "", "inputSha256": input_sha256}
    if workflow is not None:
        fp = fx.fingerprint(workflow)  # cached per compiled workflow
        out["descriptorSha256"] = fp.descriptor_sha256.get(step.name, "")
        out["definitionSha256"] = fp.definition_sha256
    return out


def progress_mismatch(step: str, saved: Any, current: dict[str, str]) -> str | None:
    """Why ``saved`` (a stored ``Progress``) cannot be continued from under ``current``
    (:func:`_fingerprints`), or None.

    A saved report without a definition fingerprint (written before migration 0025, by a
    ``ReportProgress`` whose token carried none, or accepted by ``migrate-checkpoint keep``
    and not reported since) is never compared; nor is
    a fingerprint the caller cannot give (no workflow: no definition or descriptor hash).

    :returns: ``progress-mismatch: step '<step>' <field> changed (was '<a>', now '<b>')``
        for the adapter version; for a hash ``... <field> changed (was <12 hex>..., now
        <12 hex>...)``.
    """
    if not getattr(saved, "definition_sha256", ""):
        return None
    for key, attr in COMPARED:
        if key not in current:
            continue
        was, now = getattr(saved, attr, "") or "", current[key] or ""
        if was == now:
            continue
        if key == "adapterVersion":
            shown = f"was '{was}', now '{now}'"
        else:
            shown = f"was {was[:12] or 'none'}..., now {now[:12] or 'none'}..."
        return f"{PROGRESS_MISMATCH}: step '{step}' {key} changed ({shown})"
    return None


def _report(on_progress: Any, step: Step, iteration: int, report: dict[str, Any]) -> None:
    try:
        on_progress(step.name, iteration, report)
    except Exception as exc:  # LeaseLost, ControlApplied, StoreError: the worker's
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"progress report of step '{step.name}' stopped the run: {exc}",
            store_failure=True,
        ) from exc


def _state_of(step: Step, response: Message) -> Any:
    """The response's state field as proto3 JSON (None when unset)."""
    assert step.resumable is not None
    as_json = json_format.MessageToDict(response, always_print_fields_with_no_presence=True)
    return as_json.get(_json_name(response, step.resumable.state))


def _json_name(msg: Message, field: str) -> str:
    fd = msg.DESCRIPTOR.fields_by_name.get(field)
    return fd.json_name if fd is not None else field


def _with_state(step: Step, request: Message, state: Any) -> Message:
    """A copy of ``request`` with its state field set from ``state`` (proto3 JSON)."""
    assert step.resumable is not None
    out = type(request)()
    out.CopyFrom(request)
    out.ClearField(step.resumable.state)
    if state is None:
        return out
    try:
        json_format.ParseDict({_json_name(out, step.resumable.state): state}, out)
    except Exception as exc:  # ParseError and its kin: a saved state of another shape
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"the saved state of step '{step.name}' does not fit request field "
            f"'{step.resumable.state}': {exc}",
        ) from exc
    return out


def _done(step: Step, activation: dict[str, Any]) -> bool:
    assert step.resumable is not None
    try:
        return _cel.evaluate_bool(step.resumable.done, activation)
    except Exception as exc:  # CelError or a value CEL cannot read
        raise fail(
            FailureKind.WORKFLOW, step.name, f"resumable.done could not be evaluated: {exc}"
        ) from exc


def _percent(step: Step, activation: dict[str, Any]) -> float | None:
    assert step.resumable is not None
    if not step.resumable.progress:
        return None
    try:
        value = _cel.from_cel(_cel.evaluate(step.resumable.progress, activation))
    except Exception as exc:  # CelError or a value CEL cannot read
        raise fail(
            FailureKind.WORKFLOW, step.name, f"resumable.progress could not be evaluated: {exc}"
        ) from exc
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(
            FailureKind.WORKFLOW,
            step.name,
            f"resumable.progress must give a number; got {type(value).__name__}",
        )
    return min(100.0, max(0.0, float(value)))


def _details(response: Message) -> str:
    """The response's ``details`` text field, when it has one ("" otherwise)."""
    fd = response.DESCRIPTOR.fields_by_name.get("details")
    if fd is None or fd.type != fd.TYPE_STRING or fd.is_repeated:
        return ""
    return str(response.details)[:1000]


def _shape(fd: Any) -> tuple[Any, ...]:
    """A field's type as comparable values (type, message type, enum type, repeated)."""
    return (
        fd.type,
        fd.message_type.full_name if fd.message_type is not None else "",
        fd.enum_type.full_name if fd.enum_type is not None else "",
        fd.is_repeated,
    )


def findings(workflow: CompiledWorkflow) -> list[Finding]:
    """Findings (kind ``resumable``) about the steps' ``resumable`` declarations, each naming
    the field: ``resumable.state`` not a field of both the request and the response (of the
    same type), ``resumable.done``/``resumable.progress`` not valid CEL, a resumable step with
    ``effect: "external"`` (a chunk is called again after a crash: only an idempotent effect
    may be), or one that is a fan-out, structured or approval step."""
    out: list[Finding] = []
    for s in workflow.steps:
        if s.reports_progress and (
            s.fan_out is not None or s.structured is not None or s.method is None
        ):
            out.append(
                Finding(s.name, FINDING_KIND, "reportsProgress: only a plain call step can report")
            )
        spec = s.resumable
        if spec is None:
            continue
        if s.effect == EFFECT_EXTERNAL:
            out.append(
                Finding(
                    s.name,
                    FINDING_KIND,
                    "resumable: a step with effect 'external' cannot be resumable (a chunk in "
                    "flight at a crash is called again)",
                )
            )
        if s.fan_out is not None or s.structured is not None or s.method is None:
            out.append(
                Finding(s.name, FINDING_KIND, "resumable: only a plain call step can be resumable")
            )
            continue
        req = s.method.input_type.fields_by_name.get(spec.state)
        res = s.method.output_type.fields_by_name.get(spec.state)
        if req is None or res is None:
            where = "request" if req is None else "response"
            out.append(
                Finding(
                    s.name,
                    FINDING_KIND,
                    f"resumable.state: '{spec.state}' is not a field of the method's {where}",
                )
            )
        elif _shape(req) != _shape(res):
            out.append(
                Finding(
                    s.name,
                    FINDING_KIND,
                    f"resumable.state: field '{spec.state}' has different types in the "
                    "request and the response",
                )
            )
        for key, text in (("done", spec.done), ("progress", spec.progress)):
            if not text:
                continue
            try:
                _cel.compile_expression(text)
            except _cel.CelError as exc:
                out.append(Finding(s.name, FINDING_KIND, f"resumable.{key}: {exc}"))
    return out
