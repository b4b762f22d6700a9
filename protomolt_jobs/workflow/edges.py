"""Upstream's typed edges and bounded fan-out, run inside a graph segment (reference 3.4).

An edge step's request is built only from its declared ``sources`` (a restricted scope) as a
``produceType`` message; without ``fanOut`` that message (validated first when the edge says
``validate``) is the request. With ``fanOut`` the repeated message field at ``items`` holds one
item per branch: every item is validated before any branch starts (a rejected item is a failed
branch that never runs), then the branches call the step's method, ``maxConcurrency`` at once,
under one call deadline computed before the first branch. FAIL_FAST: once a branch fails no
further branch starts, and the lowest-index failure is the step's error
(``branch '<step>#<i>' failed: <summary>``, its kind and code). CONTINUE: the failed branches are
left out. The outputs that succeeded are collected in index order into ``collectInto`` of
``collectType``.

``projectTo`` needs projection annotations this engine does not read: the verifier refuses it
(``projection target X declares no projection sources``), so no run reaches a projection.

The calls go through the graph run the step belongs to, seen here only as :class:`StepCalls`
(``graph_run`` passes its run state); the request is built and checked by ``step_run``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import threading
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.step_run import Scope, build_message, fail, validate_response
from protomolt_jobs.workflow.types import FailureKind, Step, WorkflowExecutionError

__all__ = ["StepCalls", "branch_id", "execute_edge"]


class StepCalls(Protocol):
    """What an edge step needs of the graph run it belongs to: the segment's budget, channels,
    per-target permits and structured generator (all thread-safe: branches run on a pool)."""

    def call_ms(self, step: Step) -> int:
        """The call deadline in ms from what is left of the segment's budget.

        :raises WorkflowExecutionError: DEADLINE when nothing is left.
        """
        ...

    def channel(self, step: Step) -> grpc.Channel:
        """The segment's channel to ``step``'s target."""
        ...

    def call(self, step: Step, request: Message, call_ms: int, channel: grpc.Channel) -> Message:
        """Call ``step``'s method under its target's permit.

        :raises WorkflowExecutionError: GRPC (with its code) or DEADLINE.
        """
        ...

    def generate(self, step: Step, grounding: Message | None) -> Message:
        """Ask the structured generator for ``step``'s target type, grounded on ``grounding``.

        :raises WorkflowExecutionError: STRUCTURED, DEADLINE or WORKFLOW.
        """
        ...


def branch_id(step: str, index: int) -> str:
    """``<step>#<index>``, upstream's branch name."""
    return f"{step}#{index}"


def _items(produced: Message, path: str) -> list[Message]:
    current: Any = produced
    segments = path.split(".")
    for i, seg in enumerate(segments):
        fd = current.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            raise ValueError(f"{current.DESCRIPTOR.full_name} has no field '{seg}'")
        if i < len(segments) - 1:
            if fd.is_repeated or fd.message_type is None:
                raise ValueError(f"'{seg}' is not a singular message field")
            current = getattr(current, seg)
            continue
        if not fd.is_repeated or fd.message_type is None:
            raise ValueError(f"'{seg}' is not a repeated message field")
        return list(getattr(current, seg))
    raise ValueError(f"items path '{path}' names no field")


def _validation_summary(msg: Message) -> str:
    from protomolt_jobs.workflow.validation import summarize, validate_message

    violations = validate_message(msg)
    return summarize(violations) if violations else ""


def execute_edge(run: StepCalls, step: Step, scope: dict[str, Message]) -> Message:
    """Run an edge step (with or without fan-out) on the calling pool thread.

    :param scope: name -> message of the run so far (``input`` and the ended steps).
    :raises WorkflowExecutionError: EDGE, MAPPING, VALIDATION, DEADLINE, GRPC as upstream.
    """
    edge = step.edge
    assert edge is not None
    restricted: dict[str, Message] = {}
    for source in edge.sources:
        if source not in scope:
            raise fail(
                FailureKind.EDGE,
                step.name,
                f"edge source '{source}' is not 'input' or a prior step",
            )
        restricted[source] = scope[source]
    produced = build_message(
        edge.produce_type, edge.rules, edge.cel_rules, Scope(restricted), step.name
    )
    if step.fan_out is None:
        if edge.validate:
            summary = _validation_summary(produced)
            if summary:
                raise fail(
                    FailureKind.VALIDATION,
                    step.name,
                    f"edge value failed validation before the step executed: {summary}",
                )
        if step.structured is not None:
            return run.generate(step, produced)
        call_ms = run.call_ms(step)
        response = run.call(step, produced, call_ms, run.channel(step))
        if step.validate:
            validate_response(step, response)
        return response
    return _fan_out(run, step, produced)


def _fan_out(run: StepCalls, step: Step, produced: Message) -> Message:
    fan, edge = step.fan_out, step.edge
    assert fan is not None and edge is not None
    try:
        items = _items(produced, fan.items)
    except ValueError as exc:
        raise fail(FailureKind.EDGE, step.name, f"fan-out items path rejected: {exc}") from exc
    if len(items) > fan.max_items:
        raise fail(
            FailureKind.EDGE,
            step.name,
            f"fan-out produced {len(items)} items, over the max_items cap of {fan.max_items}",
        )
    n = len(items)
    slots: list[Message | None] = [None] * n
    failures: dict[int, WorkflowExecutionError] = {}
    # Items are validated before any branch starts; a rejected item is a failed branch.
    first_rejected = n
    if edge.validate:
        for i, item in enumerate(items):
            summary = _validation_summary(item)
            if summary:
                failures[i] = fail(
                    FailureKind.VALIDATION,
                    step.name,
                    f"branch value failed validation: {summary}",
                )
                first_rejected = min(first_rejected, i)
    fail_fast = fan.failure_policy == "FAIL_FAST"
    if n == 0 or (fail_fast and first_rejected == 0):
        return _collect(step, slots, failures, fail_fast)
    structured = step.structured is not None
    # gRPC branches share one call deadline and one channel, computed before the first branch.
    call_ms = 0 if structured else run.call_ms(step)
    channel = None if structured else run.channel(step)
    abandoned = threading.Event()
    lock = threading.Lock()

    def branch(i: int) -> None:
        if fail_fast and abandoned.is_set():
            return  # not started: the fan-out was abandoned after a failure
        try:
            if structured:
                try:
                    response = run.generate(step, items[i])
                except WorkflowExecutionError as exc:
                    if exc.kind is not FailureKind.STRUCTURED:
                        raise
                    raise fail(
                        FailureKind.STRUCTURED,
                        step.name,
                        f"structured generation failed at branch '{branch_id(step.name, i)}'",
                    ) from exc
            else:
                assert channel is not None
                response = run.call(step, items[i], call_ms, channel)
            if step.validate:
                summary = _validation_summary(response)
                if summary:
                    raise fail(
                        FailureKind.VALIDATION,
                        step.name,
                        f"branch response failed validation: {summary}",
                    )
        except WorkflowExecutionError as exc:
            with lock:
                failures[i] = exc
            abandoned.set()
            return
        slots[i] = response

    # A pre-rejected item stops the submission of later items under FAIL_FAST.
    last = first_rejected if fail_fast else n
    width = max(1, min(fan.max_concurrency, n))
    with cf.ThreadPoolExecutor(max_workers=width, thread_name_prefix=f"fanout-{step.name}") as pool:
        # each branch in a copy of this thread's context (the segment's trace span, if any)
        submitted = [
            pool.submit(contextvars.copy_context().run, branch, i)
            for i in range(last)
            if i not in failures
        ]
        for future in submitted:
            future.result()
    return _collect(step, slots, failures, fail_fast)


def _collect(
    step: Step,
    slots: list[Message | None],
    failures: dict[int, WorkflowExecutionError],
    fail_fast: bool,
) -> Message:
    fan = step.fan_out
    assert fan is not None
    if fail_fast and failures:
        i = min(failures)
        first = failures[i]
        raise WorkflowExecutionError(
            first.kind,
            step.name,
            f"branch '{branch_id(step.name, i)}' failed: {first.message}",
            code=first.code,
        )
    collected = message_class(fan.collect_type)()
    try:
        field = getattr(collected, fan.collect_into)
        for value in slots:
            if value is not None:
                field.add().MergeFrom(value)
    except Exception as exc:  # protobuf's setters raise assorted types
        raise fail(FailureKind.EDGE, step.name, f"fan-out collect rejected: {exc}") from exc
    return collected
