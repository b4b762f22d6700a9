"""The artifact verbs through every door of a real node (real PostgreSQL, the HTTP route, the
gRPC service, the CLI as a subprocess): answers, and ``invalid-input`` naming the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from protomolt_jobs.host.grpc_service import RPCS, SERVICE_NAME
from tests.support.graphs import graph, step
from tests.support.node import http, node_environ, start_node, wait_for

CLI = [sys.executable, "-m", "protomolt_jobs.host.cli"]


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    try:
        yield surfaces
    finally:
        surfaces.close()


def _post(url, verb, body):
    return http("POST", f"{url}/protomolt/actions/{verb}", body)


def _rpc(target, rpc, body):
    _, req_cls, resp_cls = RPCS[rpc]
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(
            f"/{SERVICE_NAME}/{rpc}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return stub(req_cls(**body), timeout=10)


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    return subprocess.run(
        [*CLI, *args], check=False, env=env, capture_output=True, text=True, timeout=60
    )


def _completed_job(url, services) -> str:
    wf = graph(
        [step("a", services.target), step("b", services.target, reads=["a"], validates=["a"])],
        name="two",
    )
    status, answer, _ = _post(url, "submit-workflow", {"workflow": wf, "input": {"text": "x"}})
    assert status == 200 and answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: _post(url, "get-job", {"jobId": job_id})[1]["job"]["status"] == "COMPLETED")
    return job_id


def test_every_door_answers_and_refuses_naming_the_field(node, services):
    url, target = node.http.url, node.grpc.target
    job_id = _completed_job(url, services)

    # HTTP
    status, listed, _ = _post(url, "list-artifacts", {"jobId": job_id})
    assert status == 200 and [a["step"] for a in listed["artifacts"]] == ["a", "b"]
    first, last = listed["artifacts"][0]["artifactId"], listed["artifacts"][1]["artifactId"]
    status, walk, _ = _post(url, "lineage", {"artifactId": last, "direction": "up"})
    assert status == 200 and [n["artifactId"] for n in walk["nodes"]] == [first, last]
    for verb, body, field in [
        ("list-artifacts", {"jobId": "nope"}, "jobId"),
        ("get-artifact", {"artifactId": "nope"}, "artifactId"),
        ("lineage", {"artifactId": last, "depth": 0}, "depth"),
        ("lineage", {"artifactId": last, "direction": 1}, "direction"),
        ("lineage", {"artifactId": last, "colour": "red"}, "colour"),
        ("retract-artifact", {"artifactId": last, "reason": 7}, "reason"),
        ("retract-artifact", {"reason": "x"}, "artifactId"),
        ("promote-artifact", {"artifactId": last}, "reason"),
        ("promote-artifact", {"artifactId": last, "reason": ""}, "reason"),
        ("promote-artifact", {"reason": "x"}, "artifactId"),
    ]:
        status, answer, _ = _post(url, verb, body)
        assert (status, answer["error"], answer["details"]["field"]) == (
            400,
            "invalid-input",
            field,
        ), (verb, body, answer)

    # gRPC
    answer = _rpc(target, "ListArtifacts", {"job_id": job_id})
    assert answer.ok and [a["step"] for a in answer.artifacts] == ["a", "b"]
    got = _rpc(target, "GetArtifact", {"artifact_id": first})
    assert got.ok and got.artifact["artifactId"] == first
    walk = _rpc(target, "Lineage", {"artifact_id": first, "direction": "down", "depth": 1})
    assert walk.ok and [(getattr(e, "from"), e.to) for e in walk.edges] == [(first, last)]
    with pytest.raises(grpc.RpcError) as info:
        _rpc(target, "Lineage", {"artifact_id": first, "depth": 99})
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailers = dict(err.trailing_metadata())
    assert trailers["protomolt-error"] == "invalid-input"
    assert json.loads(trailers["protomolt-error-details-bin"]) == {"field": "depth"}

    # CLI
    done = _cli("jobs", "artifacts", job_id, "--url", url)
    assert done.returncode == 0, done.stderr
    assert [a["step"] for a in json.loads(done.stdout)["artifacts"]] == ["a", "b"]
    done = _cli("jobs", "lineage", last, "--direction", "up", "--url", url)
    assert done.returncode == 0 and len(json.loads(done.stdout)["nodes"]) == 2
    done = _cli("jobs", "artifact", first, "--url", url)
    assert done.returncode == 0 and json.loads(done.stdout)["artifact"]["step"] == "a"
    refused = _cli("jobs", "lineage", last, "--depth", "0", "--url", url)
    assert refused.returncode == 2 and "depth" in refused.stderr
    # promote-artifact: gRPC promotes the verified first artifact, the CLI is refused the
    # draft one (naming its state) and needs --reason
    with pytest.raises(grpc.RpcError) as info:
        _rpc(target, "PromoteArtifact", {"artifact_id": first})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailers = dict(info.value.trailing_metadata())
    assert json.loads(trailers["protomolt-error-details-bin"]) == {"field": "reason"}
    promoted = _rpc(target, "PromoteArtifact", {"artifact_id": first, "reason": "signed off"})
    assert (promoted.ok, promoted.state, promoted.changed) == (True, "promoted", True)
    done = _cli("jobs", "promote", last, "--reason", "ship it", "--url", url)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["ok"], answer["state"], answer["errorKind"]) == (False, "draft", "not-verified")
    refused = _cli("jobs", "promote", last, "--url", url)
    assert refused.returncode == 2 and "--reason" in refused.stderr
    status, got, _ = _post(url, "get-artifact", {"artifactId": first})
    assert got["artifact"]["state"] == "promoted"
    assert got["artifact"]["transitions"][-1]["reason"] == "signed off"

    done = _cli("jobs", "retract", first, "--reason", "wrong input file", "--url", url)
    assert done.returncode == 0 and json.loads(done.stdout)["changed"] is True, done.stderr
    again = _rpc(target, "RetractArtifact", {"artifact_id": first, "reason": "again"})
    assert again.ok and again.state == "retracted" and again.changed is False
    status, got, _ = _post(url, "get-artifact", {"artifactId": first})
    assert got["artifact"]["state"] == "retracted"
    assert got["artifact"]["transitions"][-1]["reason"] == "wrong input file"
