"""Authority on a real node (issue 26, build item 1): tokens carry groups and scopes from the
node's configuration; with ``[node.scopes]`` a token holds only what it is granted, on HTTP,
gRPC and the CLI alike, and every refusal naming a job is in that job's history; without it
tokens keep every scope and the node warns at start. Real PostgreSQL, the real HTTP and gRPC
servers on loopback."""

from __future__ import annotations

import json
import logging

import grpc
import pytest
from google.protobuf import struct_pb2

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.factories import parked_job
from tests.support.node import http, start_node_with_file

ROOT = "root-secret"
VIEWER = "viewer-secret"
READER = "reader-secret"
EDITOR = "editor-secret"

SCOPED = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
viewer-1 = "{VIEWER}"
reader-1 = "{READER}"
editor-1 = "{EDITOR}"
[node.groups]
viewer = ["viewer-1"]
reader = ["reader-1"]
editor = ["editor-1"]
[node.scopes]
viewer = ["service-invoke", "schema-read"]
reader = ["service-invoke"]
editor = ["service-invoke", "job-complete", "job-control", "workflow-run"]
"""

SERVICE = "/ai.pipestream.proto.service.v1.ProtoMoltService"


def start(tmp_path, dsn, text):
    return start_node_with_file(tmp_path, dsn, text)


def post(url, verb, body, token):
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def history(url, job_id):
    status, answer, _ = post(url, "job-history", {"jobId": job_id}, ROOT)
    assert status == 200 and answer["ok"], answer
    return answer


def grpc_call(target, method, request, response_cls, token):
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(
            f"{SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return stub(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)


def test_a_viewer_cannot_cancel_pause_or_complete_on_any_door_and_the_refusals_are_history(
    tmp_path, fresh_dsn, store, capsys
):
    job = parked_job(store)  # WAITING on "approve", before the node's workers start
    job_id = str(job.job_id)
    surfaces = start(tmp_path, fresh_dsn, SCOPED)
    try:
        url, target = surfaces.http.url, surfaces.grpc.target

        # HTTP: 403 permission-denied naming the scope, for each of the three.
        for verb, body, scope in [
            ("cancel-job", {"jobId": job_id, "reason": "http"}, "job-control"),
            ("pause-job", {"jobId": job_id}, "job-control"),
            (
                "complete-step",
                {"jobId": job_id, "stepName": "approve", "response": {}},
                "job-complete",
            ),
        ]:
            status, answer, _ = post(url, verb, body, VIEWER)
            assert status == 403, (verb, answer)
            assert answer["error"] == "permission-denied"
            assert f"it needs scope '{scope}'" in answer["message"]
            assert answer["details"]["requiredScope"] == scope

        # gRPC: PERMISSION_DENIED naming the scope.
        for method, request, response_cls, scope in [
            ("CancelJob", pb.CancelJobRequest(job_id=job_id), pb.JobControlResponse, "job-control"),
            ("PauseJob", pb.PauseJobRequest(job_id=job_id), pb.JobControlResponse, "job-control"),
            (
                "CompleteStep",
                pb.CompleteStepRequest(
                    job_id=job_id, step_name="approve", response=struct_pb2.Struct()
                ),
                pb.CompleteStepResponse,
                "job-complete",
            ),
        ]:
            with pytest.raises(grpc.RpcError) as refused:
                grpc_call(target, method, request, response_cls, VIEWER)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, method
            assert refused.value.details().startswith("permission-denied: ")
            assert f"'{scope}'" in refused.value.details()

        # The CLI (it calls HTTP): a non-zero exit naming the scope.
        capsys.readouterr()
        for argv, scope in (
            (["jobs", "cancel", job_id, "--reason", "cli"], "job-control"),
            (["jobs", "pause", job_id], "job-control"),
            (
                ["call", "complete-step", json.dumps({"jobId": job_id, "stepName": "approve"})],
                "job-complete",
            ),
        ):
            assert main([*argv, "--url", url, "--token", VIEWER]) == 1, argv
            err = capsys.readouterr().err
            assert err.startswith("permission-denied: "), err
            assert f"it needs scope '{scope}'" in err, err

        # Nothing changed, and each refusal is a 'denied' row of the job's history.
        assert store.job_get(job.job_id).status == "WAITING"
        answer = history(url, job_id)
        assert answer["integrity"] == "ok"
        denied = [t for t in answer["transitions"] if t["kind"] == "denied"]
        assert len(denied) == 9
        assert {t["actor"] for t in denied} == {"viewer-1"}
        assert {(t["prevStatus"], t["newStatus"]) for t in denied} == {("WAITING", "WAITING")}
        reasons = [t["reason"] for t in denied]
        assert reasons.count("permission-denied: cancel-job needs scope 'job-control'") == 3
        assert reasons.count("permission-denied: pause-job needs scope 'job-control'") == 3
        assert reasons.count("permission-denied: complete-step needs scope 'job-complete'") == 3

        # A reader (service-invoke) reads the job but may not cancel it either.
        status, answer, _ = post(url, "get-job", {"jobId": job_id}, READER)
        assert status == 200 and answer["job"]["status"] == "WAITING"
        status, answer, _ = post(url, "cancel-job", {"jobId": job_id}, READER)
        assert status == 403 and "job-control" in answer["message"]
        # The editor may; the cancel is recorded as the editor's.
        status, answer, _ = post(url, "cancel-job", {"jobId": job_id, "reason": "ok"}, EDITOR)
        assert status == 200 and answer == {"ok": True, "status": "CANCELLED"}
        transitions = history(url, job_id)["transitions"]
        assert [(t["kind"], t["actor"]) for t in transitions[-2:]] == [
            ("denied", "reader-1"),
            ("cancel", "editor-1"),
        ]
    finally:
        surfaces.close()


def test_the_manifest_the_registry_and_unknown_tokens(tmp_path, fresh_dsn):
    surfaces = start(tmp_path, fresh_dsn, SCOPED)
    try:
        url = surfaces.http.url

        def manifest(token):
            status, body, _ = http(
                "GET", f"{url}/protomolt/actions", headers={"Authorization": f"Bearer {token}"}
            )
            assert status == 200
            return {a["name"] for a in body}

        # Each caller's manifest lists only what it may run.
        assert manifest(VIEWER) == {
            "get-job",
            "list-jobs",
            "job-history",
            "explain-job",
            "list-artifacts",
            "get-artifact",
            "lineage",
            "check-workflow",
            "test-workflow",
            "get-workflow",
        }
        assert manifest(READER) == {
            "get-job",
            "list-jobs",
            "job-history",
            "explain-job",
            "list-artifacts",
            "get-artifact",
            "lineage",
        }
        assert "cancel-job" in manifest(EDITOR) and "check-workflow" not in manifest(EDITOR)
        # the operator's artifact changes are job-control: the editor's, not the reader's
        assert {"retract-artifact", "promote-artifact"} <= manifest(EDITOR)
        everything = manifest(ROOT)
        assert {"cancel-job", "check-workflow", "submit-workflow"} <= everything

        # gRPC lists nothing, but its verbs refuse by scope the same way; a wrong token is
        # UNAUTHENTICATED before any scope is considered.
        with pytest.raises(grpc.RpcError) as refused:
            grpc_call(
                surfaces.grpc.target,
                "CancelJob",
                pb.CancelJobRequest(job_id="00000000-0000-4000-8000-000000000000"),
                pb.JobControlResponse,
                VIEWER,
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as refused:
            grpc_call(
                surfaces.grpc.target, "ListJobs", pb.ListJobsRequest(), pb.ListJobsResponse, "w"
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # The registry: reads need schema-read, a PUT workflow-write (nobody here but api).
        definition = {"name": "x", "inputType": "google.protobuf.Struct", "steps": []}
        for token, status_put in ((VIEWER, 403), (EDITOR, 403)):
            status, body, _ = http(
                "PUT",
                f"{url}/protomolt/workflows/x",
                definition,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert status == status_put and body["error"] == "permission-denied", body
            assert "workflow-write" in body["message"]
        status, body, _ = http(
            "GET", f"{url}/protomolt/workflows", headers={"Authorization": f"Bearer {VIEWER}"}
        )
        assert status == 200 and isinstance(body, list)
        status, body, _ = http(
            "GET", f"{url}/protomolt/workflows", headers={"Authorization": f"Bearer {EDITOR}"}
        )
        assert status == 403 and "schema-read" in body["message"]

        # An unknown token is 401 everywhere, whatever its scopes would have been.
        status, body, _ = post(url, "get-job", {"jobId": "x"}, "nope")
        assert status == 401 and body["error"] == "unauthenticated"
    finally:
        surfaces.close()


def test_without_a_scopes_table_named_tokens_keep_every_right_and_the_start_warns(
    tmp_path, fresh_dsn, store, caplog
):
    job = parked_job(store)
    text = f'[node]\napi_token = "{ROOT}"\n[node.tokens]\nalice = "alice-secret"\n'
    with caplog.at_level(logging.WARNING, logger="protomolt_jobs.cli"):
        surfaces = start(tmp_path, fresh_dsn, text)
    try:
        warned = [
            r for r in caplog.records if getattr(r, "action", None) == "scopes_not_configured"
        ]
        assert len(warned) == 1 and "alice" in warned[0].getMessage()
        url = surfaces.http.url
        status, body, _ = http(
            "GET", f"{url}/protomolt/actions", headers={"Authorization": "Bearer alice-secret"}
        )
        assert status == 200 and {"cancel-job", "check-workflow"} <= {a["name"] for a in body}
        status, answer, _ = post(url, "pause-job", {"jobId": str(job.job_id)}, "alice-secret")
        assert status == 200 and (answer["ok"], answer["status"]) == (True, "PAUSED")
        answer = grpc_call(
            surfaces.grpc.target,
            "CancelJob",
            pb.CancelJobRequest(job_id=str(job.job_id)),
            pb.JobControlResponse,
            "alice-secret",
        )
        assert answer.ok and answer.status == "CANCELLED"
        kinds = [(t["kind"], t["actor"]) for t in history(url, str(job.job_id))["transitions"]]
        assert kinds[-2:] == [("pause", "alice"), ("cancel", "alice")]
    finally:
        surfaces.close()
