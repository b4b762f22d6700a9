"""OpenTelemetry traces: one trace per job, a span per segment and per step call.

Off by default, at no cost: until :func:`configure` (the node's ``otlp_endpoint``) or
:func:`use_provider` (a test's in-memory exporter, a host's own provider) is called,
:func:`enabled` is False and the job path does one boolean check, creates no span and sends no
extra metadata.

When on:

- **submit** starts the job's trace with a ``submit <workflow>`` span and stores its W3C
  ``traceparent`` in the row (``workflow_run.trace_context``, written by the insert itself);
- every claim opens a ``segment <workflow>`` span, a child of that stored context, from claim to
  settlement, in whatever process claims it, so every attempt of a job joins the one trace. A row
  without a stored context (submitted while tracing was off) gets a context derived from its job
  id (trace id = the job's uuid), the same in every process;
- every step call is a ``step <name>`` CLIENT span under the segment, and its W3C
  ``traceparent`` goes in the call's gRPC metadata so the step's service joins the trace.

The provider is ours, not the process-global one (``trace.set_tracer_provider`` can be set once
per process and belongs to the embedding application).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "configure",
    "disable",
    "enabled",
    "job_context",
    "segment_span",
    "step_span",
    "submit_trace_context",
    "use_provider",
]

log = logging.getLogger("protomolt_jobs.tracing")

#: Instrumentation scope name of our spans.
SCOPE = "protomolt_jobs"

_tracer: trace.Tracer | None = None
_provider: Any = None
_propagator = TraceContextTextMapPropagator()


def enabled() -> bool:
    """True when spans are recorded (a provider is configured)."""
    return _tracer is not None


def use_provider(provider: Any) -> None:
    """Record spans with ``provider`` (an SDK ``TracerProvider``); None turns tracing off."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer(SCOPE) if provider is not None else None


def configure(endpoint: str, *, service_name: str = "protomolt-jobs") -> None:
    """Export spans to the OTLP/gRPC collector at ``endpoint`` (``http://host:4317``).

    :raises RuntimeError: the OTLP exporter is not installed (the ``otlp`` extra).
    """
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise RuntimeError(
            "node.otlp_endpoint is set but the OTLP exporter is not installed: "
            "pip install 'protomolt-jobs[otlp]'"
        ) from exc
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http:"))
        )
    )
    use_provider(provider)
    log.info(
        "tracing: spans exported to %s",
        endpoint,
        extra={"action": "tracing_configured", "endpoint": endpoint},
    )


def disable() -> None:
    """Stop recording; flush and shut the provider down when it is ours to shut."""
    provider = _provider
    use_provider(None)
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _derived(job_id: uuid.UUID) -> otel_context.Context:
    """A remote parent derived from the job id alone: the same in every process."""
    span_id = int.from_bytes(hashlib.sha256(job_id.bytes).digest()[:8], "big") or 1
    parent = SpanContext(
        trace_id=job_id.int or 1,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())


def job_context(job_id: uuid.UUID, stored: str | None) -> otel_context.Context:
    """The parent context of a job's segment: the stored ``traceparent``, else derived."""
    if stored:
        ctx = _propagator.extract({"traceparent": stored}, context=otel_context.Context())
        if trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx
    return _derived(job_id)


def submit_trace_context(job_id: uuid.UUID, workflow_name: str) -> str | None:
    """Start a job's trace (a ``submit`` span) and return its ``traceparent``; None when off."""
    tracer = _tracer
    if tracer is None:
        return None
    with tracer.start_as_current_span(
        f"submit {workflow_name}",
        kind=SpanKind.PRODUCER,
        attributes={"protomolt.job_id": str(job_id), "protomolt.workflow": workflow_name},
    ):
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def segment_span(job: Any, worker_id: str) -> Iterator[Any]:
    """A ``segment`` span, current while the claimed ``job`` runs (no-op when off).

    :param job: the claimed :class:`~protomolt_jobs.store.records.JobRecord`.
    :yields: the span (or None when off); set ``protomolt.settlement`` on it.
    """
    tracer = _tracer
    if tracer is None:
        yield None
        return
    parent = job_context(job.job_id, getattr(job, "trace_context", None))
    with tracer.start_as_current_span(
        f"segment {job.workflow_name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "protomolt.job_id": str(job.job_id),
            "protomolt.workflow": job.workflow_name,
            "protomolt.attempt": int(job.attempt),
            "protomolt.worker_id": worker_id,
        },
    ) as span:
        yield span


@contextlib.contextmanager
def step_span(step_name: str, full_method: str, target: str) -> Iterator[list[tuple[str, str]]]:
    """A CLIENT span around one step call; yields the gRPC metadata carrying its context.

    Only called when :func:`enabled`. The caller sets the outcome with :func:`step_failed`.
    """
    assert _tracer is not None
    service, _, method = full_method.lstrip("/").partition("/")
    with _tracer.start_as_current_span(
        f"step {step_name}",
        kind=SpanKind.CLIENT,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": method,
            "server.address": target,
            "protomolt.step": step_name,
        },
    ):
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        yield list(carrier.items())


def step_failed(code_name: str, detail: str) -> None:
    """Mark the current step span failed with the gRPC status ``code_name``."""
    span = trace.get_current_span()
    span.set_attribute("rpc.grpc.status_code", code_name)
    span.set_status(Status(StatusCode.ERROR, f"{code_name}: {detail}"[:300]))
