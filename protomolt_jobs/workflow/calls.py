"""Dynamic unary gRPC: descriptor-built messages over the host's channels or per-segment ones.

A segment uses at most one channel per ``(target, tls)``. When the runtime has a channel
factory (``Runtime.channel_factory``, the node's cached channels), every target's channel
comes from it and belongs to it (not closed here): a channel per job would cost its set-up
and a TCP + HTTP/2 handshake inside the job's first call. ``inprocess:NAME`` targets need the
factory; a network target the factory refuses, or any target without a factory, gets a
channel of the segment's own, closed when the segment ends, however it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Self

import grpc
from google.protobuf.message import Message

from protomolt_jobs.telemetry import metrics, tracing
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.types import FailureKind, Runtime, Step, WorkflowExecutionError

__all__ = ["INPROCESS_PREFIX", "CallCancelled", "SegmentChannels", "call_unary"]

log = logging.getLogger("protomolt_jobs.workflow")

#: Targets with this prefix are served by the host's in-process server.
INPROCESS_PREFIX = "inprocess:"


class CallCancelled(WorkflowExecutionError):
    """A call the run's cancel stopped (``watch_cancel``): GRPC ``CANCELLED``. Retryable, so a
    graph run does not checkpoint it as a failed step: the run is being cancelled, and the
    worker settles it so (``job_stop``) instead of retrying."""

    @property
    def retryable(self) -> bool:
        return True


class SegmentChannels:
    """The channels of one segment, keyed by ``(target, tls)``; use as a context manager."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._open: dict[tuple[str, bool], grpc.Channel] = {}
        self._owned: list[grpc.Channel] = []

    def channel(self, step: Step) -> grpc.Channel:
        """The channel for ``step``'s target, opened on first use.

        :raises WorkflowExecutionError: WORKFLOW (not retryable) when an ``inprocess:`` target
            has no factory, the factory raises (it refuses the target), or grpc cannot open a
            channel for the target.
        """
        key = (step.target, step.tls)
        ch = self._open.get(key)
        if ch is not None:
            return ch
        if step.target.startswith(INPROCESS_PREFIX):
            factory = self._runtime.channel_factory
            if factory is None:
                raise WorkflowExecutionError(
                    FailureKind.WORKFLOW,
                    step.name,
                    f"outbound channel policy rejected step: target '{step.target}' needs the "
                    "host's in-process channels and this runtime has none",
                )
            try:
                ch = factory(step.target, step.tls)
            except Exception as exc:
                # The host refused the target (e.g. no in-process service of that name): the
                # workflow names something this host cannot reach; retrying will not help.
                raise WorkflowExecutionError(
                    FailureKind.WORKFLOW,
                    step.name,
                    f"outbound channel policy rejected step: target '{step.target}': {exc}",
                ) from exc
        else:
            factory = self._runtime.channel_factory
            if factory is not None:
                try:
                    ch = factory(step.target, step.tls)
                except Exception:  # the factory would not share one: open our own, as before
                    log.debug(
                        "channel factory refused a network target; opening a segment channel",
                        exc_info=True,
                        extra={"action": "channel_factory_refused", "target": step.target},
                    )
                    ch = None
                if ch is not None:
                    self._open[key] = ch
                    return ch
            try:
                if step.tls:
                    ch = grpc.secure_channel(step.target, grpc.ssl_channel_credentials())
                else:
                    ch = grpc.insecure_channel(step.target)
            except Exception as exc:  # a target grpc cannot even parse (channels are lazy)
                raise WorkflowExecutionError(
                    FailureKind.WORKFLOW,
                    step.name,
                    f"could not open a channel to target '{step.target}': {exc}",
                ) from exc
            self._owned.append(ch)
        self._open[key] = ch
        return ch

    def close(self) -> None:
        """Close the channels this segment opened (idempotent)."""
        owned, self._owned = self._owned, []
        self._open.clear()
        for ch in owned:
            try:
                ch.close()
            except Exception:  # closing is best effort; a broken channel must not mask the result
                log.debug(
                    "channel close failed", exc_info=True, extra={"action": "channel_close_failed"}
                )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call_unary(
    channel: grpc.Channel,
    step: Step,
    request: Message,
    timeout_s: float,
    metadata: list[tuple[str, str]] | None = None,
    watch_cancel: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
) -> Any:
    """One unary call of ``step``'s method; the response parsed as the method's output type.

    :param timeout_s: the call deadline from now, in seconds.
    :param metadata: gRPC metadata to send (the idempotency key), besides the trace context.
    :param watch_cancel: ``(fn) -> withdraw``: when given, the call is made as a future whose
        ``cancel`` is handed to it, so a cancel request stops the call at once (the service
        sees its context cancelled); withdrawn when the call ends.
    :raises WorkflowExecutionError: GRPC with the status code for any non-OK status (a call that
        outlives ``timeout_s`` is ``DEADLINE_EXCEEDED``; a closed channel is ``UNAVAILABLE``; a
        cancelled call is ``CANCELLED``).
    """
    assert step.method is not None
    # The method's output, not the step's binding type (a fan-out binds its collect type).
    response_cls = message_class(step.method.output_type)
    multicallable = channel.unary_unary(
        step.full_method,
        request_serializer=_serialize,
        response_deserializer=response_cls.FromString,
    )
    if not tracing.enabled():
        return _invoke(multicallable, step, request, timeout_s, metadata, watch_cancel)
    with tracing.step_span(step.name, step.full_method, step.target) as carrier:
        try:
            return _invoke(
                multicallable, step, request, timeout_s, carrier + (metadata or []), watch_cancel
            )
        except WorkflowExecutionError as exc:
            tracing.step_failed(exc.code.name if exc.code else "UNKNOWN", exc.message)
            raise


def _invoke(
    multicallable: Any,
    step: Step,
    request: Message,
    timeout_s: float,
    metadata: list[tuple[str, str]] | None,
    watch_cancel: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
) -> Any:
    started = time.perf_counter()
    outcome = "OK"
    try:
        if watch_cancel is None:
            return multicallable(request, timeout=timeout_s, metadata=metadata)
        future = multicallable.future(request, timeout=timeout_s, metadata=metadata)
        withdraw = watch_cancel(future.cancel)
        try:
            return future.result()
        except grpc.FutureCancelledError as exc:
            code = grpc.StatusCode.CANCELLED
            outcome = code.name
            raise CallCancelled(
                FailureKind.GRPC,
                step.name,
                f"gRPC {code.name} from {step.target}: the run's cancel stopped the call",
                code=code,
            ) from exc
        finally:
            withdraw()
    except ValueError as exc:
        # grpc refuses a closed channel this way: the host closed its in-process channel
        # (shutting down). Another claim, on a live node, can make the call: retryable.
        code = grpc.StatusCode.UNAVAILABLE
        outcome = code.name
        raise WorkflowExecutionError(
            FailureKind.GRPC,
            step.name,
            f"gRPC {code.name} from {step.target}: {exc}",
            code=code,
        ) from exc
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
        details = exc.details() if callable(getattr(exc, "details", None)) else None
        code = code or grpc.StatusCode.UNKNOWN
        outcome = code.name
        raise WorkflowExecutionError(
            FailureKind.GRPC,
            step.name,
            f"gRPC {code.name} from {step.target}: {details if details else 'null'}",
            code=code,
        ) from exc
    finally:
        metrics.observe_step(
            step.workflow, step.full_method, outcome, time.perf_counter() - started
        )


def _serialize(msg: Message) -> bytes:
    return msg.SerializeToString()
