"""OpenTelemetry: one trace per job (submit, segment, a span per step), the W3C traceparent in
every step call's metadata, one trace across attempts; the SDK's in-memory exporter stands in
for a collector. A real node, real PostgreSQL, real gRPC step servers."""

from __future__ import annotations

import threading

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from protomolt_jobs.telemetry import tracing
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for


@pytest.fixture
def exporter():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.disable()


class MetadataRecorder:
    """Wraps a TestServices method: records each call's ``traceparent``, then answers as usual."""

    def __init__(self, services: TestServices, method: str) -> None:
        self.seen: list[str | None] = []
        self._lock = threading.Lock()
        default = getattr(services, f"_do_{method.lower()}")

        def handler(request, context):
            metadata = dict(context.invocation_metadata())
            with self._lock:
                self.seen.append(metadata.get("traceparent"))
            return default(request, context)

        services.set_handler(method, handler)


def _submit(url: str, flow: dict, text: str) -> str:
    status, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/submit-workflow",
        {"workflow": flow, "input": {"text": text}},
    )
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def _status(url: str, job_id: str) -> str:
    return http("POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id})[1]["job"]["status"]


def _trace_id_of(traceparent: str) -> int:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and len(span_id) == 16 and int(flags, 16) & 1  # sampled
    return int(trace_id, 16)


def test_a_three_step_job_is_one_trace_and_the_step_servers_join_it(tmp_path, fresh_dsn, exporter):
    with TestServices(max_workers=8) as services:
        recorders = {m: MetadataRecorder(services, m) for m in ("Tokenize", "Embed", "Review")}
        surfaces = start_node(node_environ(tmp_path, fresh_dsn))
        try:
            url = surfaces.http.url
            job_id = _submit(url, seed_workflow(services.target, review="invoke"), "trace me")
            wait_for(lambda: _status(url, job_id) == "COMPLETED", timeout_s=60)
        finally:
            surfaces.close()

    def ours(span):
        return span.attributes.get("protomolt.job_id") == job_id

    spans = exporter.get_finished_spans()
    segment = [s for s in spans if s.name.startswith("segment ") and ours(s)]
    assert len(segment) == 1, [s.name for s in spans]
    trace_id = segment[0].context.trace_id
    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    steps = sorted((s for s in in_trace if s.name.startswith("step ")), key=lambda s: s.start_time)
    assert [s.name for s in steps] == ["step tokenize", "step embed", "step review"]
    assert all(s.parent.span_id == segment[0].context.span_id for s in steps)
    assert [s.attributes["rpc.method"] for s in steps] == ["Tokenize", "Embed", "Review"]
    submit = [s for s in in_trace if s.name.startswith("submit ")]
    assert len(submit) == 1 and segment[0].parent.span_id == submit[0].context.span_id
    assert segment[0].attributes["protomolt.settlement"] == "completed"
    # Each step server got a traceparent of this trace, naming its own step span.
    for method, span in zip(("Tokenize", "Embed", "Review"), steps, strict=True):
        (traceparent,) = recorders[method].seen
        assert traceparent is not None
        assert _trace_id_of(traceparent) == trace_id
        assert int(traceparent.split("-")[2], 16) == span.context.span_id


def test_a_retried_job_keeps_one_trace_across_attempts(tmp_path, fresh_dsn, exporter):
    with TestServices(max_workers=8) as services:
        services.fail_next("Embed", 1, grpc.StatusCode.UNAVAILABLE, "down for a moment")
        surfaces = start_node(node_environ(tmp_path, fresh_dsn))
        try:
            url = surfaces.http.url
            job_id = _submit(url, seed_workflow(services.target, review="invoke"), "again")
            wait_for(lambda: _status(url, job_id) == "COMPLETED", timeout_s=60)
        finally:
            surfaces.close()
    segments = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("segment ") and s.attributes.get("protomolt.job_id") == job_id
    ]
    assert [s.attributes["protomolt.settlement"] for s in segments] == ["retried", "completed"]
    assert len({s.context.trace_id for s in segments}) == 1
    failed = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "step embed" and s.context.trace_id == segments[0].context.trace_id
    ]
    assert [s.attributes.get("rpc.grpc.status_code") for s in failed] == ["UNAVAILABLE", None]


def test_tracing_off_sends_no_traceparent(tmp_path, fresh_dsn):
    assert not tracing.enabled()
    with TestServices(max_workers=8) as services:
        recorder = MetadataRecorder(services, "Tokenize")
        surfaces = start_node(node_environ(tmp_path, fresh_dsn))
        try:
            url = surfaces.http.url
            job_id = _submit(url, seed_workflow(services.target, review="invoke"), "quiet")
            wait_for(lambda: _status(url, job_id) == "COMPLETED", timeout_s=60)
        finally:
            surfaces.close()
    assert recorder.seen == [None]
