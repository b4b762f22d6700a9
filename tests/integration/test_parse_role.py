"""The parse role on a node: in-process ParseService, its statuses, and parse-document as a job."""

from __future__ import annotations

import base64

import grpc
import pytest

from protomolt_jobs.host.parse import MAX_DOCUMENT_BYTES, METHOD, TARGET
from protomolt_jobs.pb.ai.pipestream.proto.parse.v1 import parse_pb2
from tests.support.node import node_environ, start_node, wait_for


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _parse(node, request, timeout=10):
    channel = node.node.channels.channel(TARGET, False)
    call = channel.unary_unary(
        f"/{METHOD}",
        request_serializer=parse_pb2.ParseDocumentRequest.SerializeToString,
        response_deserializer=parse_pb2.ParseDocumentResponse.FromString,
    )
    return call(request, timeout=timeout)


def test_parse_service_is_reachable_in_process(node):
    got = _parse(node, parse_pb2.ParseDocumentRequest(text="# Hi\n\nthere you are", name="x.md"))
    assert (got.title, got.word_count, got.mime_type) == ("Hi", 4, "text/markdown")


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (parse_pb2.ParseDocumentRequest(content=b"\x00\x01\x02"), grpc.StatusCode.INVALID_ARGUMENT),
        (parse_pb2.ParseDocumentRequest(content=b"\xc3\x28"), grpc.StatusCode.INVALID_ARGUMENT),
        (
            parse_pb2.ParseDocumentRequest(text="w " * (MAX_DOCUMENT_BYTES // 2 + 1)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
    ],
)
def test_refusals_arrive_as_statuses(node, request_, code):
    with pytest.raises(grpc.RpcError) as info:
        _parse(node, request_)
    assert info.value.code() == code


def test_parse_document_descriptor_is_in_the_type_pool(node):
    pool = node.node.type_pool.pool
    assert pool.FindServiceByName("ai.pipestream.proto.parse.v1.ParseService")


def test_parse_document_runs_as_a_job_by_name(node):
    catalog = node.node.catalog
    answer = catalog.execute(
        "submit-workflow",
        {
            "workflowName": "parse-document",
            "input": {"text": "Title line\n\nTwo words.", "name": "note.txt"},
        },
    )
    assert answer["ok"] is True, answer
    job = wait_for(
        lambda: (
            (j := catalog.execute("get-job", {"jobId": answer["jobId"]})["job"])["status"]
            in ("COMPLETED", "FAILED", "DEAD")
            and j
        )
    )
    assert job["status"] == "COMPLETED", job
    assert job["result"]["title"] == "Title line"
    assert job["result"]["wordCount"] == 4


def test_review_document_parks_on_review_until_complete_step(node):
    """The shipped workflow a node can park on: parse, then a human review."""
    catalog = node.node.catalog

    def job(job_id):
        return catalog.execute("get-job", {"jobId": job_id})["job"]

    answer = catalog.execute(
        "submit-workflow",
        {
            "workflowName": "review-document",
            "input": {"text": "# Plan\n\nShip it.", "name": "p.md"},
        },
    )
    assert answer["ok"] is True, answer
    parked = wait_for(lambda: (j := job(answer["jobId"]))["status"] == "WAITING" and j)
    assert parked["outstandingStep"] == "review"
    assert [c["name"] for c in parked["checkpoints"]] == ["parse"]
    done = catalog.execute(
        "complete-step",
        {
            "jobId": answer["jobId"],
            "stepName": "review",
            "response": {"approved": True, "note": "fine"},
        },
    )
    assert done == {"ok": True, "status": "QUEUED"}
    finished = wait_for(
        lambda: (j := job(answer["jobId"]))["status"] in ("COMPLETED", "FAILED", "DEAD") and j
    )
    assert finished["status"] == "COMPLETED", finished
    assert finished["result"] == {
        "name": "p.md",
        "title": "Plan",
        "wordCount": 3,  # headings count: "Plan", "Ship", "it."
        "approved": True,
        "note": "fine",
    }


def test_content_bytes_ride_in_base64_and_binary_fails_the_job_with_the_parser_status(node):
    catalog = node.node.catalog
    good = catalog.execute(
        "submit-workflow",
        {
            "workflowName": "parse-document",
            "input": {
                "content": base64.b64encode(b"# Bytes\n\nok").decode(),
                "mimeType": "text/markdown",
            },
        },
    )
    answer = catalog.execute(
        "submit-workflow",
        {
            "workflowName": "parse-document",
            "input": {"content": base64.b64encode(b"\x00\xff binary").decode(), "name": "b.bin"},
        },
    )
    assert good["ok"] is True and answer["ok"] is True, (good, answer)
    done = wait_for(
        lambda: (
            (j := catalog.execute("get-job", {"jobId": good["jobId"]})["job"])["status"]
            == "COMPLETED"
            and j
        )
    )
    assert done["result"]["title"] == "Bytes"
    assert answer["ok"] is True, answer
    job = wait_for(
        lambda: (
            (j := catalog.execute("get-job", {"jobId": answer["jobId"]})["job"])["status"]
            in ("COMPLETED", "FAILED", "DEAD")
            and j
        ),
        timeout_s=60,
    )
    assert job["status"] in ("FAILED", "DEAD")
    assert "INVALID_ARGUMENT" in job["error"]
