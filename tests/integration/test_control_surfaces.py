"""The operator verbs on both surfaces and the CLI, with named tokens: the token's name is the
actor in the job's history (issue 15). Real PostgreSQL, the real HTTP and gRPC servers on
loopback."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

from protomolt_jobs.host.catalog import Catalog
from protomolt_jobs.host.cli import main
from protomolt_jobs.host.grpc_service import ProtoMoltGrpcServer
from protomolt_jobs.host.http_route import ActionsHttpServer, principal_of
from protomolt_jobs.host.nodeconfig import ConfigError, NodeConfig
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.workflow import Runtime
from tests.support.factories import claimed_job, queued_job

TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture
def surfaces(store):
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    http = ActionsHttpServer(catalog, port=0, api_token="root-secret", tokens=TOKENS).start()
    rpc = ProtoMoltGrpcServer(catalog, port=0, api_token="root-secret", tokens=TOKENS).start()
    yield http, rpc
    rpc.close()
    http.close()


def _history(store, job_id):
    return [(t.kind, t.actor) for t in store.job_history(job_id).transitions]


def test_principal_of():
    assert principal_of(None, None, {}) == "anonymous"
    assert principal_of("whatever", None, None) == "anonymous"
    assert principal_of("root", "root", TOKENS) == "api"
    assert principal_of("bob-secret", "root", TOKENS) == "bob"
    assert principal_of("nope", "root", TOKENS) is None
    assert principal_of(None, None, TOKENS) is None


def test_http_verbs_record_the_token_name(store, surfaces, capsys):
    http, _ = surfaces
    job = queued_job(store)
    code = main(
        [
            "jobs",
            "pause",
            str(job.job_id),
            "--reason",
            "night",
            "--url",
            http.url,
            "--token",
            "alice-secret",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "status": "PAUSED"}
    assert (
        main(["jobs", "resume", str(job.job_id), "--url", http.url, "--token", "root-secret"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["status"] == "QUEUED"
    assert main(["jobs", "cancel", str(job.job_id), "--url", http.url, "--token", "wrong"]) == 1
    capsys.readouterr()
    assert _history(store, job.job_id)[-2:] == [("pause", "alice"), ("resume", "api")]
    assert main(["jobs", "history", str(job.job_id), "--json", "--url", http.url,
                 "--token", "bob-secret"]) == 0  # fmt: skip
    answer = json.loads(capsys.readouterr().out)
    assert answer["integrity"] == "ok"
    assert [t["kind"] for t in answer["transitions"]] == ["submit", "pause", "resume"]
    assert main(["jobs", "history", str(job.job_id), "--url", http.url,
                 "--token", "bob-secret"]) == 0  # fmt: skip
    assert "integrity ok" in capsys.readouterr().out


def test_cli_retry_and_requeue(store, surfaces, capsys):
    http, _ = surfaces
    dead = claimed_job(store)
    store.job_dead(dead.lease, "GRPC: gave up")
    assert main(["jobs", "requeue", str(dead.job_id), "--url", http.url,
                 "--token", "bob-secret"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out) == {"ok": True, "status": "QUEUED"}
    assert main(["jobs", "retry", str(dead.job_id), "--step", "x", "--url", http.url,
                 "--token", "bob-secret"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["ok"] is False  # QUEUED: nothing to retry
    assert _history(store, dead.job_id)[-1] == ("requeue", "bob")


def test_grpc_verbs_record_the_token_name(store, surfaces):
    _, rpc = surfaces
    job = claimed_job(store)
    with grpc.insecure_channel(rpc.target) as channel:
        cancel = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/CancelJob",
            request_serializer=pb.CancelJobRequest.SerializeToString,
            response_deserializer=pb.JobControlResponse.FromString,
        )
        answer = cancel(
            pb.CancelJobRequest(job_id=str(job.job_id), reason="stop"),
            metadata=(("authorization", "Bearer bob-secret"),),
        )
        assert (answer.ok, answer.status, answer.requested) == (True, "RUNNING", "cancel")
        history = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/JobHistory",
            request_serializer=pb.JobHistoryRequest.SerializeToString,
            response_deserializer=pb.JobHistoryResponse.FromString,
        )
        got = history(
            pb.JobHistoryRequest(job_id=str(job.job_id)), metadata=(("api_token", "root-secret"),)
        )
        assert got.ok and got.integrity == "ok"
        assert [(t.kind, t.actor) for t in got.transitions][-1] == ("cancel-request", "bob")
        assert got.transitions[-1].reason == "stop"
        get = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/GetJob",
            request_serializer=pb.GetJobRequest.SerializeToString,
            response_deserializer=pb.GetJobResponse.FromString,
        )
        doc = get(
            pb.GetJobRequest(job_id=str(job.job_id)), metadata=(("api_token", "root-secret"),)
        )
        assert doc.job.max_attempts == 3 and doc.job.run_after.endswith("Z")
        assert doc.job.control["kind"] == "cancel" and doc.job.control["actor"] == "bob"
        with pytest.raises(grpc.RpcError) as refused:
            cancel(
                pb.CancelJobRequest(job_id=str(uuid.uuid4())),
                metadata=(("api_token", "nope"),),
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_node_tokens_config(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text('[node]\napi_token = "r"\n[node.tokens]\nalice = "a1"\nbob = "b1"\n')
    config = NodeConfig.load(path, environ={})
    assert config.tokens == {"alice": "a1", "bob": "b1"} and config.api_token == "r"
    for body, words in [
        ('[node.tokens]\napi = "x"\n', "not api"),
        ('[node.tokens]\n"Alice Smith" = "x"\n', "principal name"),
        ('[node.tokens]\nalice = ""\n', "non-empty"),
        ('[node.tokens]\nalice = "x"\nbob = "x"\n', "same token"),
        ('[node]\ntokens = "x"\n', "must be a table"),
    ]:
        path.write_text(body)
        with pytest.raises(ConfigError, match=words):
            NodeConfig.load(path, environ={})
