"""Running workflows: :func:`run_segment` (resumable, for jobs) and :func:`run` (synchronous).

This module only dispatches: a workflow with ``graph`` set runs on ``graph_run.run_graph``
(ready steps in parallel, checkpoints keyed by step name in completion order), any other on
``sequential_run.run_steps`` (steps in order, checkpoints a prefix). The step code both share
(request, gate, budget, response check, replay, fingerprints, checkpoint entries) is
``step_run``'s; neither runner imports the other.

Everything the engine can classify leaves :func:`run_segment` as a
:class:`WorkflowExecutionError`; another exception is a defect in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from protomolt_jobs.workflow import retry_scope
from protomolt_jobs.workflow.envelope import parse_input
from protomolt_jobs.workflow.graph_run import run_graph
from protomolt_jobs.workflow.inputs import INPUT_WAIT
from protomolt_jobs.workflow.sequential_run import run_steps
from protomolt_jobs.workflow.step_run import RecoveryStop, discard_checkpoint, fail
from protomolt_jobs.workflow.types import (
    CompiledWorkflow,
    Completed,
    FailureKind,
    Parked,
    RecoveryRequired,
    Runtime,
    WorkflowParseError,
)

__all__ = ["CANNOT_GRANT", "CANNOT_PARK", "CANNOT_WAIT", "next_target", "run", "run_segment"]

#: The synchronous refusal at an external step (reference 3.1, verbatim).
CANNOT_PARK = (
    "step declares completion='external'; synchronous run-workflow cannot park - submit the "
    "workflow as a job (submit-workflow) so complete-step can supply the response"
)

#: The synchronous refusal at a step that waits for a missing input (``onMissingInput: "wait"``;
#: after ``mapping failed: waiting for input: <paths and owners>``).
CANNOT_WAIT = (
    "synchronous run-workflow cannot wait - submit the workflow as a job (submit-workflow) so "
    "supply-input can fill it"
)

#: The synchronous refusal at a step that declares capabilities (grants are checked by a job's
#: worker only; a synchronous run never calls such a step).
CANNOT_GRANT = (
    "step declares capabilities; synchronous run-workflow checks no grants - submit the "
    "workflow as a job (submit-workflow) so the worker can authorize the step"
)


def run_segment(
    workflow: CompiledWorkflow,
    input: Message | dict[str, Any],
    prior: list[dict[str, Any]],
    on_checkpoint: Callable[[dict[str, Any]], None],
    *,
    runtime: Runtime,
    call_permit: Callable[[str], Any] | None = None,
    effects: Any = None,
    authorize: Callable[[Any], Any] | None = None,
) -> Completed | Parked | RecoveryRequired:
    """Replay ``prior`` and run the rest of ``workflow``.

    A graph workflow (``workflow.graph``) runs on ``graph_run.run_graph``: ready steps in
    parallel, checkpoints keyed by step name in completion order, ``call_permit`` held around
    each call. A sequential workflow runs on ``sequential_run.run_steps``, step after step,
    exactly as before graphs.

    :param workflow: a parsed (and verified) workflow.
    :param input: the input message, or its proto3 JSON.
    :param prior: stored checkpoint entries ``{"name", "skipped", "response"?}``, a prefix;
        entries a ``retry-step`` marked are resolved first (``retry_scope.resolve``).
    :param on_checkpoint: called with each new entry as the step lands (ready to store).
    :param runtime: the host's runtime (channel factory for ``inprocess:`` targets).
    :param call_permit: graph workflows: ``target -> context manager`` held around each call.
    :param effects: the job's ``effects.EffectContext``: idempotency keys on every call,
        fingerprints in every new entry, intents before ``external`` steps (None: none).
    :param authorize: the job's grant check, ``step -> StepDecision`` (``hooks/contract.py``),
        asked after the claim and before the call (and intent) of every step that declares
        ``capabilities``; None (a synchronous run): nothing is checked.
    :returns: :class:`Completed`, :class:`Parked` (at an external step), or
        :class:`RecoveryRequired` (an external step's state cannot be proven, or a stored
        checkpoint's fingerprint changed).
    :raises WorkflowExecutionError: kind, step, message (and code for GRPC).
    """
    if not isinstance(input, Message):
        try:
            input = parse_input(workflow, input)
        except WorkflowParseError as exc:
            raise fail(FailureKind.MAPPING, "", exc.message) from exc
    steps = workflow.steps
    if not isinstance(prior, list):
        raise fail(FailureKind.WORKFLOW, "", "stored checkpoints are not an array")
    # Entries a retry-step marked (scope only, kept effects): what replays now, what is held.
    resolved = retry_scope.resolve(workflow, prior)
    held = None
    if resolved is not None:
        prior, held = resolved.prior, resolved.held
        on_checkpoint = held.wrap(on_checkpoint)
    if len(prior) > len(steps) and not workflow.loops:  # a loop's iterations add entries
        raise fail(
            FailureKind.WORKFLOW,
            "",
            f"stored checkpoints ({len(prior)}) outnumber the workflow's steps ({len(steps)})",
        )
    try:
        if workflow.graph:
            return run_graph(
                workflow,
                input,
                prior,
                on_checkpoint,
                runtime=runtime,
                call_permit=call_permit,
                effects=effects,
                held=held,
                check=authorize,
            )
        return run_steps(
            workflow,
            input,
            prior,
            on_checkpoint,
            runtime=runtime,
            effects=effects,
            held=held,
            check=authorize,
        )
    except RecoveryStop as stop:
        return stop.outcome


def run(
    workflow: CompiledWorkflow, input: Message | dict[str, Any], *, runtime: Runtime
) -> Completed:
    """Run ``workflow`` synchronously, start to end, storing nothing.

    A workflow with an external step is refused before anything is called (upstream calls
    the earlier steps first; their side effects would be wasted).

    :raises WorkflowExecutionError: as :func:`run_segment`; EXTERNAL with :data:`CANNOT_PARK`;
        PERMISSION with :data:`CANNOT_GRANT` (a step declares ``capabilities``).
    """
    for step in workflow.steps:
        if step.parks:
            raise fail(FailureKind.EXTERNAL, step.name, CANNOT_PARK)
        if step.capabilities:
            raise fail(FailureKind.PERMISSION, step.name, CANNOT_GRANT)
    result = run_segment(workflow, input, [], discard_checkpoint, runtime=runtime)
    if isinstance(result, RecoveryRequired):  # cannot happen without stored checkpoints
        raise fail(FailureKind.WORKFLOW, result.step, result.reason)
    if isinstance(result, Parked) and result.wait_kind == INPUT_WAIT:
        raise fail(
            FailureKind.MAPPING, result.step, f"mapping failed: {result.detail}; {CANNOT_WAIT}"
        )
    if isinstance(result, Parked):
        raise fail(FailureKind.EXTERNAL, result.step, CANNOT_PARK)
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
    return None if step.parks else step.target
