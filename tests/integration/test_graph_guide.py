"""docs/workflows.md's graph examples, as written: the protos and workflows come from the doc
(blocks marked ``<!-- graph-example: ... -->``), are compiled and verified, the shown
simulation is what ``check-workflow`` answers, and both workflows run against real gRPC
servers on loopback (every ``host:port`` target of the doc pointed at them)."""

from __future__ import annotations

import base64
import json
from concurrent import futures

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from protomolt_jobs.verbs.workflow import CheckWorkflowAction
from protomolt_jobs.workflow import (
    Parked,
    Runtime,
    WorkflowExecutionError,
    parse_workflow,
    run_segment,
)
from tests.support.guides import DOCS, compile_protos, doc_blocks

GUIDE = DOCS / "workflows.md"


def _blocks() -> dict[str, str]:
    return doc_blocks(GUIDE, "graph-example")


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = _blocks()
    assert set(found) == {
        "proto site/v1/site.proto",
        "proto site/v1/links.proto",
        "workflow release",
        "workflow links",
        "simulation release technical",
    }
    return found


@pytest.fixture(scope="module")
def descriptor_set(blocks) -> bytes:
    return compile_protos(
        {d.split(" ", 1)[1]: body for d, body in blocks.items() if d.startswith("proto ")}
    )


class SiteServer:
    """Every service of the doc's schema on one loopback server; ``behaviour[method]`` is
    ``(request, context) -> dict`` (the response as proto3 JSON)."""

    def __init__(self, fds: bytes, behaviour: dict) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        for f in descriptor_pb2.FileDescriptorSet.FromString(fds).file:
            self.pool.Add(f)
        self.behaviour = behaviour
        self.calls: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        handlers = []
        for fname in ("site/v1/site.proto", "site/v1/links.proto"):
            for service in self.pool.FindFileByName(fname).services_by_name.values():
                methods = {}
                for m in service.methods:
                    req = message_factory.GetMessageClass(m.input_type)
                    resp = message_factory.GetMessageClass(m.output_type)
                    methods[m.name] = grpc.unary_unary_rpc_method_handler(
                        self._handler(f"{service.name}/{m.name}", resp),
                        request_deserializer=req.FromString,
                        response_serializer=resp.SerializeToString,
                    )
                handlers.append(grpc.method_handlers_generic_handler(service.full_name, methods))
        self.server.add_generic_rpc_handlers(tuple(handlers))
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _handler(self, name, resp_cls):
        from google.protobuf import json_format

        def handle(request, context):
            self.calls.append(name)
            answer = self.behaviour.get(name, lambda r, c: {})(request, context)
            return json_format.ParseDict(answer, resp_cls())

        return handle

    def stop(self):
        self.server.stop(0.5).wait(5)


def _workflow(blocks, name, fds: bytes, target: str) -> dict:
    wf = json.loads(blocks[f"workflow {name}"])
    wf["schema"]["descriptorSetBase64"] = base64.b64encode(fds).decode()
    for s in wf["steps"]:
        if "target" in s:
            s["target"] = target
    return wf


def test_the_release_graph_verifies_and_simulates_as_the_doc_says(blocks, descriptor_set):
    wf = _workflow(blocks, "release", descriptor_set, "127.0.0.1:9")
    answer = CheckWorkflowAction(Runtime()).execute({"workflow": wf, "simulate": True})
    assert answer["findings"] == []
    by = {s["step"]: s for s in answer["simulation"]["ifFails"]}
    assert by["technical"] == json.loads(blocks["simulation release technical"])
    assert answer["simulation"]["allSucceed"]["status"] == "COMPLETED"


def test_the_release_graph_runs_to_the_review_and_completes(blocks, descriptor_set):
    server = SiteServer(
        descriptor_set,
        {
            "Validator/Validate": lambda r, c: {"ok": True},
            "Builder/Build": lambda r, c: {"page": r.page, "uri": f"s3://site/{r.page}"},
            "TechnicalValidator/Check": lambda r, c: {"ok": True},
            "DomainValidator/Check": lambda r, c: {"ok": True},
            "Joiner/Join": lambda r, c: {
                "ok": r.technical.ok and r.domain.ok,
                "artifact": {"page": r.artifact.page, "uri": r.artifact.uri},
            },
            "Previews/Publish": lambda r, c: {"url": f"https://preview/{r.page}"},
        },
    )
    try:
        runtime = Runtime()
        wf = parse_workflow(_workflow(blocks, "release", descriptor_set, server.target), runtime)
        entries: list[dict] = []
        outcome = run_segment(
            wf, {"page": "home", "body": "hi"}, [], entries.append, runtime=runtime
        )
        assert isinstance(outcome, Parked) and outcome.step == "review"
        assert [e["name"] for e in entries][:2] == ["validate", "build"]
        by = {e["name"]: e for e in entries}
        assert by["preview"]["response"] == {"url": "https://preview/home"}
        assert by["file_issue"]["reason"].startswith("no upstream edge matched")
        # complete-step's entry, then the next segment completes
        entries.append({"name": "review", "skipped": False, "response": {"approved": True}})
        done = run_segment(
            wf, {"page": "home", "body": "hi"}, entries, lambda e: None, runtime=runtime
        )
        assert done.report["status"] == "COMPLETED"
        assert done.output_json == {"approved": True, "note": ""}
        assert "Previews/Unpublish" not in server.calls
    finally:
        server.stop()


def test_a_failed_release_unpublishes_the_preview(blocks, descriptor_set):
    server = SiteServer(
        descriptor_set,
        {
            "Validator/Validate": lambda r, c: {"ok": True},
            "Builder/Build": lambda r, c: {"page": r.page, "uri": "u"},
            "TechnicalValidator/Check": lambda r, c: {"ok": True},
            "DomainValidator/Check": lambda r, c: {"ok": True},
            "Joiner/Join": lambda r, c: {"ok": True, "artifact": {"page": r.artifact.page}},
            "Previews/Publish": lambda r, c: {"url": "https://preview/x"},
            "Previews/Unpublish": lambda r, c: {"url": r.url},
        },
    )
    try:
        runtime = Runtime()
        wf = parse_workflow(_workflow(blocks, "release", descriptor_set, server.target), runtime)
        prior: list[dict] = []
        run_segment(wf, {"page": "x"}, [], prior.append, runtime=runtime)
        # a stored failure of the review, handled by nothing: the next segment fails the run
        prior.append(
            {
                "name": "review",
                "skipped": False,
                "failed": {"kind": "EXTERNAL", "message": "rejected"},
            }
        )
        more: list[dict] = []
        with pytest.raises(WorkflowExecutionError) as info:
            run_segment(wf, {"page": "x"}, prior, more.append, runtime=runtime)
        assert info.value.message == "rejected"
        assert [e["name"] for e in more] == ["unpublish"]
        assert more[0]["response"] == {"url": "https://preview/x"}
        assert server.calls.count("Previews/Unpublish") == 1
    finally:
        server.stop()


def test_the_link_fan_out_collects_what_answered_in_index_order(blocks, descriptor_set):
    def check(request, context):
        if request.index == 2:
            context.abort(grpc.StatusCode.NOT_FOUND, "gone")
        return {"url": request.url, "status": 200}

    server = SiteServer(descriptor_set, {"LinkChecker/Check": check})
    try:
        runtime = Runtime()
        wf = parse_workflow(_workflow(blocks, "links", descriptor_set, server.target), runtime)
        links = [{"url": f"https://x/{i}", "index": i} for i in range(6)]
        outcome = run_segment(
            wf, {"name": "home", "links": links}, [], lambda e: None, runtime=runtime
        )
        assert [r["url"] for r in outcome.output_json["results"]] == [
            f"https://x/{i}" for i in (0, 1, 3, 4, 5)
        ]
        assert server.calls.count("LinkChecker/Check") == 6
    finally:
        server.stop()
