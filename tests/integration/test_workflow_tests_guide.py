"""docs/workflows.md's *Tests in the definition* example, as written (blocks marked
``<!-- tests-example: ... -->``): its three cases pass on ``test-workflow``; one changed mock
fails exactly that case naming the step; an unmocked step fails naming it and no connection
is opened; bad ``tests`` are ``invalid-input`` naming the field on HTTP, gRPC and the CLI; and
parity: each case run as a job on PostgreSQL through a real worker, against a real gRPC
service answering with the case's mocks, ends with the same path, calls, report and status."""

from __future__ import annotations

import copy
import json
import logging
import re
import select
import socket
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.verbs import TestWorkflowAction
from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow.testing.cases import parse_cases
from protomolt_jobs.workflow.testing.harness import path_of, run_case
from tests.support.mock_steps import MockedSteps
from tests.support.node import http, start_node_with_file, wait_for

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
_BLOCK = re.compile(
    r"<!-- tests-example: (?P<directive>[^>]*?) -->\n```[^\n]*\n(?P<body>.*?)```", re.DOTALL
)
NODE = '[node]\napi_token = "root-token"\n'
ROOT = "root-token"
TERMINAL = {"COMPLETED", "FAILED", "DEAD", "CANCELLED", "RECOVERY_REQUIRED"}


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    text = GUIDE.read_text(encoding="utf-8")
    found = {m.group("directive").strip(): m.group("body") for m in _BLOCK.finditer(text)}
    assert set(found) == {"workflow order", "output order", "output order-changed"}
    return found


@pytest.fixture
def wf(blocks) -> dict:
    return json.loads(blocks["workflow order"])


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        yield surfaces
    finally:
        surfaces.close()


def _cli(argv: list[str]) -> int:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return main(argv)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _post(url, verb, body):
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {ROOT}"},
    )


def _changed(wf: dict) -> dict:
    """The doc's change: the retried case's second ``charge`` mock fails too."""
    changed = copy.deepcopy(wf)
    changed["tests"][1]["mocks"]["charge"][1] = {"status": {"code": "UNAVAILABLE"}}
    return changed


# -- the three cases --------------------------------------------------------------------------


def test_the_guides_three_cases_pass_as_written(wf):
    answer = TestWorkflowAction(Runtime()).execute({"workflow": wf})
    assert answer["ok"] is True, answer
    assert (answer["passed"], answer["failed"]) == (3, 0)
    by_name = {c["name"]: c for c in answer["cases"]}
    assert by_name["charge retried once"]["actual"]["attempts"] == 2
    assert by_name["charge retried once"]["actual"]["clockMs"] == 5000  # one 5 s backoff
    assert by_name["ship refused, charge refunded"]["actual"]["errorKind"] == "GRPC"
    assert answer["coverage"] == {
        "decisions": [],
        "failureEdges": [],
        "loopExits": [],
        "escalations": [],
    }


def test_one_changed_mock_fails_exactly_that_case_naming_the_step(wf):
    answer = TestWorkflowAction(Runtime()).execute({"workflow": _changed(wf)})
    assert answer["ok"] is False and (answer["passed"], answer["failed"]) == (2, 1)
    failed = [c for c in answer["cases"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["charge retried once"]
    assert failed[0]["step"] == "charge"
    assert failed[0]["difference"] == (
        "unmocked: step 'charge' was called 3 times; its mocks answer 2"
    )
    # another change: the happy path's ship refused; the run fails and compensates, and the
    # happy path has no mock for the compensation: fail closed, naming it
    other = copy.deepcopy(wf)
    other["tests"][0]["mocks"]["ship"] = {"status": {"code": "INVALID_ARGUMENT", "message": "no"}}
    answer = TestWorkflowAction(Runtime()).execute({"workflow": other})
    failed = [c for c in answer["cases"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["happy path"]
    assert failed[0]["step"] == "refund"
    assert failed[0]["difference"] == "unmocked: step 'refund' was called and has no mock"
    # with the refund mocked too, the difference is the status, naming the failing step
    other["tests"][0]["mocks"]["refund"] = {"response": {"ok": True}}
    answer = TestWorkflowAction(Runtime()).execute({"workflow": other})
    failed = [c for c in answer["cases"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["happy path"]
    assert failed[0]["step"] == "ship"
    assert failed[0]["difference"].startswith(
        "status: expected COMPLETED, got FAILED (GRPC: gRPC INVALID_ARGUMENT from 127.0.0.1:9"
    ), failed[0]
    # and a changed expectation: the path's first difference is named
    third = copy.deepcopy(wf)
    third["tests"][2]["expect"]["path"] = ["reserve", "charge", "refund"]
    answer = TestWorkflowAction(Runtime()).execute({"workflow": third})
    failed = [c for c in answer["cases"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["ship refused, charge refunded"]
    assert failed[0]["difference"] == (
        "path: expected ['reserve', 'charge', 'refund'], got ['reserve', 'charge', 'ship', "
        "'refund']; first difference at 2: expected refund, got ship"
    )


class _Listener:
    """A TCP listener on loopback that counts the connections it is offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.target = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def accepted(self) -> int:
        n = 0
        while select.select([self.sock], [], [], 0)[0]:
            conn, _ = self.sock.accept()
            conn.close()
            n += 1
        return n

    def close(self) -> None:
        self.sock.close()


def test_an_unmocked_step_fails_naming_it_and_opens_no_connection(wf, monkeypatch):
    listener = _Listener()
    connects: list[object] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def counting_connect(self, address):
        connects.append(address)
        return real_connect(self, address)

    def counting_connect_ex(self, address):
        connects.append(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", counting_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", counting_connect_ex)
    try:
        unmocked = copy.deepcopy(wf)
        for i, step in enumerate(unmocked["steps"]):
            # half the steps at a port that refuses, half at one that would accept
            step["target"] = listener.target if i % 2 else "127.0.0.1:9"
        del unmocked["tests"][0]["mocks"]["ship"]
        answer = TestWorkflowAction(Runtime()).execute({"workflow": unmocked})
        assert answer["ok"] is False
        failed = [c for c in answer["cases"] if not c["passed"]]
        assert [c["name"] for c in failed] == ["happy path"]
        assert failed[0]["step"] == "ship"
        assert failed[0]["difference"] == "unmocked: step 'ship' was called and has no mock"
        assert failed[0]["actual"]["calls"] == {"reserve": 1, "charge": 1}
        assert connects == []
        assert listener.accepted() == 0
    finally:
        listener.close()


def test_a_bad_mock_is_a_finding_naming_case_step_and_index(wf):
    from protomolt_jobs.verbs import CheckWorkflowAction

    bad = copy.deepcopy(wf)
    bad["tests"][1]["mocks"]["charge"][1] = {"response": {"chargeID": "c-2"}}
    answer = CheckWorkflowAction(Runtime()).execute({"workflow": bad})
    assert answer["ok"] is False
    [finding] = answer["findings"]
    assert finding["kind"] == "tests" and finding["step"] == "charge"
    assert finding["error"].startswith("tests[1].mocks.charge[1].response: not shop.v1.Charged:"), (
        finding
    )
    assert "chargeID" in finding["error"]
    assert CheckWorkflowAction(Runtime()).execute({"workflow": wf}) == {
        "ok": True,
        "findings": [],
    }


# -- every door -------------------------------------------------------------------------------


def test_cli_output_is_the_guides_and_bad_tests_are_invalid_input_on_every_door(
    node, wf, blocks, tmp_path, capsys
):
    url = node.http.url
    path = tmp_path / "order.json"
    path.write_text(json.dumps(wf), encoding="utf-8")
    capsys.readouterr()
    code = _cli(["workflow", "test", str(path), "--url", url, "--token", ROOT])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.replace(str(path), "order.json") == blocks["output order"]
    path.write_text(json.dumps(_changed(wf)), encoding="utf-8")
    code = _cli(["workflow", "test", str(path), "--url", url, "--token", ROOT])
    out = capsys.readouterr().out
    assert code == 1
    assert out.replace(str(path), "order.json") == blocks["output order-changed"]

    # HTTP: tests given in the request, and tests inside the definition
    status, answer, _ = _post(url, "test-workflow", {"workflow": wf, "tests": "all"})
    assert status == 400 and answer["error"] == "invalid-input", answer
    assert answer["details"]["field"] == "tests"
    bad_case = [{"name": "x", "mocks": {"charge": [{"respons": {}}]}}]
    status, answer, _ = _post(url, "test-workflow", {"workflow": wf, "tests": bad_case})
    assert status == 400 and answer["details"] == {
        "field": "tests",
        "path": "tests[0].mocks.charge[0].respons",
    }, answer
    inside = copy.deepcopy(wf)
    inside["tests"][2]["expect"]["status"] = "DONE"
    status, answer, _ = _post(url, "test-workflow", {"workflow": inside})
    assert status == 400 and answer["details"] == {
        "field": "workflow",
        "path": "tests[2].expect.status",
    }, answer
    status, answer, _ = _post(url, "test-workflow", {"workflow": wf, "test": []})
    assert status == 400 and answer["error"] == "invalid-input", answer

    # the registry's PUT checks the tests (check-workflow): a bad one is refused, naming it;
    # a stored workflow is tested by name, and its stored tests' errors name workflowName
    put = f"{url}/protomolt/workflows/order"
    auth = {"Authorization": f"Bearer {ROOT}"}
    status, answer, _ = http("PUT", put, inside, headers=auth)
    assert status == 422 and answer["error"] == "does-not-verify", answer
    assert [(f["kind"], f["error"].split(":", 1)[0]) for f in answer["findings"]] == [
        ("tests", "tests[2].expect.status")
    ]
    status, answer, _ = http("PUT", put, wf, headers=auth)
    assert status == 200, answer
    status, answer, _ = _post(url, "test-workflow", {"workflowName": "order"})
    assert status == 200 and answer["ok"] is True and answer["passed"] == 3, answer
    status, answer, _ = _post(url, "test-workflow", {"workflowName": "order", "tests": [{}]})
    assert status == 400 and answer["details"] == {"field": "tests", "path": "tests[0].name"}

    # gRPC TestWorkflow
    with grpc.insecure_channel(node.grpc.target) as channel:
        call = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/TestWorkflow",
            request_serializer=pb.TestWorkflowRequest.SerializeToString,
            response_deserializer=pb.TestWorkflowResponse.FromString,
        )
        auth = (("authorization", f"Bearer {ROOT}"),)
        workflow = struct_pb2.Struct()
        workflow.update(wf)
        answer_pb = call(pb.TestWorkflowRequest(workflow=workflow), metadata=auth)
        assert answer_pb.ok is True and answer_pb.passed == 3 and answer_pb.failed == 0
        assert [json_format.MessageToDict(c)["name"] for c in answer_pb.cases] == [
            "happy path",
            "charge retried once",
            "ship refused, charge refunded",
        ]
        tests = struct_pb2.ListValue()
        tests.extend(bad_case)
        with pytest.raises(grpc.RpcError) as refused:
            call(pb.TestWorkflowRequest(workflow=workflow, tests=tests), metadata=auth)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("invalid-input: tests[0].mocks.charge[0]")

    # CLI: a file whose tests are bad
    path.write_text(json.dumps(inside), encoding="utf-8")
    code = _cli(["workflow", "test", str(path), "--url", url, "--token", ROOT])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err
    assert "invalid-input: tests[2].expect.status: must be one of" in captured.err


# -- parity with a real worker on PostgreSQL -----------------------------------------------------


def test_each_case_ends_the_same_on_postgresql_through_a_real_worker(node, wf):
    url = node.http.url
    compiled = parse_workflow(wf, Runtime())
    shop = MockedSteps(compiled)
    try:
        real = copy.deepcopy(wf)
        for step in real["steps"]:
            step["target"] = shop.target
        real_compiled = parse_workflow(real, Runtime())
        cases = parse_cases(real_compiled, real["tests"])
        # the node's jobs.max_attempts and jobs.backoff_base_seconds (node_environ's 0.2 s)
        for case, raw in zip(cases, real["tests"], strict=True):
            local = run_case(real_compiled, case, max_attempts=3, backoff_base_s=0.2)
            shop.reset(raw)
            status, answer, _ = _post(
                url, "submit-workflow", {"workflow": real, "input": raw["input"]}
            )
            assert status == 200 and answer["ok"], answer
            job_id = answer["jobId"]

            def settled(job_id=job_id):
                _, got, _ = _post(url, "get-job", {"jobId": job_id})
                return got["job"] if got["job"]["status"] in TERMINAL else None

            job = wait_for(settled, timeout_s=60)
            assert job["status"] == local.status, (case.name, job, local)
            assert path_of(real_compiled, job["checkpoints"]) == path_of(
                real_compiled, local.checkpoints
            ), case.name
            assert dict(shop.calls) == local.calls, case.name
            # the report's rows, order and criterion; the stored report adds what only a
            # database knows (durations, operator actions) and counts the claims
            report = job["report"]
            assert {k: report[k] for k in local.report} == local.report, case.name
            assert report["claims"] == local.attempts, case.name
            if local.error is not None:
                assert job["error"] == local.error, case.name
    finally:
        shop.stop()
