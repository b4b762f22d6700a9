"""``replay-check`` on a real node (real PostgreSQL, real gRPC step services, workers): runs
parked WAITING with checkpoints are replayed against candidate definitions over HTTP, gRPC and
the CLI. A candidate that renames a checkpointed step lists them; one that appends a step at
the end lists none; bad input is ``invalid-input`` naming the field."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import grpc
import pytest
from google.protobuf import json_format

from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node
from tests.support.worker_proc import wait_for

NAME = "seed-review"


@pytest.fixture
def services():
    with TestServices(max_workers=8) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _verb(node, verb: str, body: dict) -> tuple[int, dict]:
    status, answer, _ = http("POST", f"{node.http.url}/protomolt/actions/{verb}", body)
    return status, answer


def _renamed(workflow: dict) -> dict:
    """``embed`` renamed ``embed_v2`` (and every rule reading it)."""
    text = json.dumps(workflow).replace('"embed"', '"embed_v2"').replace("embed.", "embed_v2.")
    out = json.loads(text)
    assert [s["name"] for s in out["steps"]] == ["tokenize", "embed_v2", "review"]
    return out


def _appended(workflow: dict, target: str) -> dict:
    out = copy.deepcopy(workflow)
    out["steps"].append(
        {
            "name": "archive",
            "target": target,
            "method": "jobs.test.Tokenizer/Tokenize",
            "rules": ["text = input.text"],
        }
    )
    return out


@pytest.fixture
def parked(node, services):
    """Two runs of the stored workflow parked WAITING on ``review`` (tokenize and embed
    checkpointed) and one that ran to COMPLETED under a workflow without the review."""
    workflow = seed_workflow(services.target, review="external", name=NAME)
    status, body, _ = http("PUT", f"{node.http.url}/protomolt/workflows/{NAME}", workflow)
    assert status == 200, body
    jobs = []
    for text in ("alpha beta gamma", "delta epsilon"):
        status, answer = _verb(
            node, "submit-workflow", {"workflowName": NAME, "input": {"text": text}}
        )
        assert status == 200 and answer["ok"], answer
        jobs.append(answer["jobId"])

    def both_parked() -> bool:
        for job in jobs:
            _, got = _verb(node, "get-job", {"jobId": job})
            run = got["job"]
            if run["status"] != "WAITING" or len(run["checkpoints"]) != 2:
                return False
        return True

    wait_for(both_parked, timeout_s=60, what="both runs WAITING on review")
    return workflow, jobs


def test_a_renamed_checkpointed_step_lists_the_parked_runs_on_http(node, services, parked):
    workflow, jobs = parked
    status, answer = _verb(
        node, "replay-check", {"workflowName": NAME, "candidate": _renamed(workflow)}
    )
    assert status == 200, answer
    assert answer["ok"] is True
    assert answer["examined"] == {"live": 2, "finished": 0}
    assert answer["more"] is False
    assert sorted(d["jobId"] for d in answer["drifting"]) == sorted(jobs)
    for row in answer["drifting"]:
        assert row["status"] == "WAITING"
        assert row["outstandingStep"] == "review"
        assert row["storedVersion"] is True
        assert (row["checkpoint"], row["step"], row["rule"]) == (1, "embed", "placement")
        assert "the candidate's step 1 is 'embed_v2'" in row["reason"]
    # an additive change: a step appended after the last one
    status, answer = _verb(
        node,
        "replay-check",
        {"workflowName": NAME, "candidate": _appended(workflow, services.target)},
    )
    assert status == 200 and answer["ok"], answer
    assert answer["examined"] == {"live": 2, "finished": 0}
    assert answer["drifting"] == []
    # read only: the runs are exactly as they were
    for job in jobs:
        _, got = _verb(node, "get-job", {"jobId": job})
        assert got["job"]["status"] == "WAITING"
        assert [c["name"] for c in got["job"]["checkpoints"]] == ["tokenize", "embed"]


def test_a_changed_response_type_is_drift_by_fingerprint(node, services, parked):
    workflow, jobs = parked
    candidate = copy.deepcopy(workflow)
    # the embed step now calls another method (another request and response type)
    candidate["steps"][1]["method"] = "jobs.test.Tokenizer/Tokenize"
    candidate["steps"][1]["rules"] = ["text = tokenize.text"]
    candidate["steps"][2]["rules"] = ["text = input.text"]
    candidate["output"]["rules"] = ["text = input.text"]
    candidate["output"].pop("celRules")
    status, answer = _verb(node, "replay-check", {"workflowName": NAME, "candidate": candidate})
    assert status == 200, answer
    assert sorted(d["jobId"] for d in answer["drifting"]) == sorted(jobs)
    assert {(d["step"], d["rule"]) for d in answer["drifting"]} == {("embed", "fingerprint")}
    assert (
        "checkpoint-mismatch: step 'embed' descriptorSha256 changed"
        in (answer["drifting"][0]["reason"])
    )


def test_replay_check_over_grpc_and_the_cli(node, services, parked, tmp_path):
    workflow, jobs = parked
    request = pb.ReplayCheckRequest(workflow_name=NAME, limit=10)
    json_format.ParseDict(_renamed(workflow), request.candidate)
    with grpc.insecure_channel(node.grpc.target) as channel:
        rpc = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/ReplayCheck",
            request_serializer=pb.ReplayCheckRequest.SerializeToString,
            response_deserializer=pb.ReplayCheckResponse.FromString,
        )
        reply = rpc(request, timeout=30)
        assert reply.ok and reply.examined.live == 2
        assert sorted(d.job_id for d in reply.drifting) == sorted(jobs)
        assert {(d.step, d.rule, d.stored_version) for d in reply.drifting} == {
            ("embed", "placement", True)
        }
        bad = pb.ReplayCheckRequest(workflow_name=NAME, limit=501)
        json_format.ParseDict(workflow, bad.candidate)
        with pytest.raises(grpc.RpcError) as info:
            rpc(bad, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'limit' must be a whole number from 1 to 500" in info.value.details()

    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    cli = [sys.executable, "-m", "protomolt_jobs.host.cli", "workflow", "replay-check", NAME]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(_renamed(workflow)))
    done = subprocess.run(
        [*cli, str(renamed), "--url", node.http.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "2 of the runs (2 live, 0 finished examined) would drift" in done.stdout
    for job in jobs:
        assert f"{job} WAITING: [placement]" in done.stdout
    appended = tmp_path / "appended.json"
    appended.write_text(json.dumps(_appended(workflow, services.target)))
    done = subprocess.run(
        [*cli, str(appended), "--url", node.http.url, "--finished", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no run would drift (2 live, 0 finished examined)" in done.stdout


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        ({"candidate": {}}, "workflowName", "Missing required string field 'workflowName'"),
        ({"workflowName": NAME}, "candidate", "'candidate' must be a workflow definition"),
        ({"workflowName": NAME, "candidate": [1]}, "candidate", "must be a workflow definition"),
        (
            {"workflowName": NAME, "candidate": {"steps": []}},
            "candidate",
            "the candidate does not verify",
        ),
        ({"workflowName": NAME, "candidate": {}, "limit": 0}, "limit", "from 1 to 500"),
        ({"workflowName": NAME, "candidate": {}, "finished": 101}, "finished", "from 0 to 100"),
        ({"workflowName": NAME, "candidate": {}, "limit": "5"}, "limit", "whole number"),
        ({"workflowName": "  ", "candidate": {}}, "workflowName", "must not be blank"),
        ({"workflowName": NAME, "candidate": {}, "jobId": "x"}, "jobId", "Unknown field"),
    ],
)
def test_bad_input_is_invalid_input_naming_the_field(node, body, field, said):
    status, answer = _verb(node, "replay-check", body)
    assert status == 400, answer
    assert answer["error"] == "invalid-input"
    assert answer["details"]["field"] == field
    assert said in answer["message"]
