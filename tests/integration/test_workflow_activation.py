"""The activation gate (``jobs.require_workflow_tests``) and ``get-workflow``, on a real node:
PUT runs the definition's tests and records the result of each stored version beside it (it
survives a restart); with the gate on a failing or missing ``tests`` refuses the PUT naming the
case and stores nothing; with it off the PUT stores and the failing result is shown on GET's
headers, ``get-workflow`` (HTTP, gRPC, CLI) and ``workflow put``'s output. Uses the guide's
*Tests in the definition* example as written."""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.node import http, start_node_with_file

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
_BLOCK = re.compile(r"<!-- tests-example: workflow order -->\n```json\n(?P<body>.*?)```", re.DOTALL)
NODE = '[node]\napi_token = "root-token"\n'
ROOT = "root-token"
AUTH = {"Authorization": f"Bearer {ROOT}"}
FAILING_CASE = "charge retried once"
FAILING_DIFF = "unmocked: step 'charge' was called 3 times; its mocks answer 2"


@pytest.fixture
def wf() -> dict:
    return json.loads(_BLOCK.search(GUIDE.read_text(encoding="utf-8")).group("body"))


def _failing(wf: dict) -> dict:
    """The guide's change: the retried case's second ``charge`` mock fails too."""
    changed = copy.deepcopy(wf)
    changed["tests"][1]["mocks"]["charge"][1] = {"status": {"code": "UNAVAILABLE"}}
    return changed


def _start(tmp_path, dsn, **jobs):
    return start_node_with_file(tmp_path, dsn, NODE, **jobs)


def _put(url: str, name: str, body: dict):
    return http("PUT", f"{url}/protomolt/workflows/{name}", body, headers=AUTH)


def _get(url: str, name: str):
    return http("GET", f"{url}/protomolt/workflows/{name}", headers=AUTH)


def _verb(url: str, verb: str, body: dict):
    status, answer, _ = http("POST", f"{url}/protomolt/actions/{verb}", body, headers=AUTH)
    return status, answer


def _cli(argv: list[str]) -> int:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return main(argv)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _cases(result: dict) -> dict[str, bool]:
    return {c["name"]: c["passed"] for c in result["cases"]}


# -- the gate off (the default) ----------------------------------------------------------------


def test_with_the_gate_off_a_failing_put_is_stored_and_its_result_is_shown_everywhere(
    tmp_path, fresh_dsn, wf, capsys
):
    node = _start(tmp_path, fresh_dsn)
    try:
        url = node.http.url
        status, body, _ = _put(url, "order", _failing(wf))
        assert status == 200, body
        assert body["name"] == "order" and body["version"] == 1
        tests = body["tests"]
        assert (tests["ok"], tests["passed"], tests["failed"]) == (False, 2, 1)
        [failed] = [c for c in tests["cases"] if not c["passed"]]
        assert failed == {
            "name": FAILING_CASE,
            "passed": False,
            "difference": FAILING_DIFF,
            "step": "charge",
        }
        assert (tests["by"], tests["via"]) == ("api", "put")

        # GET: the body is upstream's verbatim definition; version and result in headers
        status, stored, headers = _get(url, "order")
        assert status == 200 and stored == _failing(wf)
        assert headers["Protomolt-Version"] == "1"
        shown = json.loads(headers["Protomolt-Last-Test"])
        assert shown["ok"] is False and _cases(shown)[FAILING_CASE] is False
        assert shown["at"] == tests["at"]

        # get-workflow: definition, version, retention (check-workflow's object), last test
        status, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert status == 200 and got["ok"] is True, got
        assert got["definition"] == _failing(wf)
        assert (got["version"], got["latestVersion"], got["current"]) == (1, 1, True)
        assert got["storedBy"] == "api"
        assert got["lastTest"] == tests
        assert set(got["retention"]) == {"completed", "failed", "cancelled", "dead"}
        assert got["retention"]["completed"] == {"seconds": 2592000.0, "source": "node"}

        # a second version that passes; the first keeps its own result
        status, body, _ = _put(url, "order", wf)
        assert status == 200 and body["version"] == 2 and body["tests"]["ok"] is True
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert (got["version"], got["latestVersion"], got["current"]) == (2, 2, True)
        assert got["definition"] == wf and got["lastTest"]["ok"] is True
        _, first = _verb(url, "get-workflow", {"workflowName": "order", "version": 1})
        assert (first["version"], first["current"]) == (1, False)
        assert first["definition"] == _failing(wf)
        assert _cases(first["lastTest"])[FAILING_CASE] is False

        # test-workflow by name re-records the current version's result, by its caller
        status, ran = _verb(url, "test-workflow", {"workflowName": "order"})
        assert status == 200 and ran["ok"] is True
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert got["lastTest"]["via"] == "test-workflow" and got["lastTest"]["by"] == "api"
        # ... but not with tests given in the request (they are not the version's)
        _verb(url, "test-workflow", {"workflowName": "order", "tests": _failing(wf)["tests"]})
        _, again = _verb(url, "get-workflow", {"workflowName": "order"})
        assert again["lastTest"] == got["lastTest"]

        # the CLI: get prints the version, retention and the last result
        capsys.readouterr()
        code = _cli(["workflow", "get", "order", "--version", "1", "--url", url, "--token", ROOT])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "order: version 1 (not current; latest 2), stored " in out
        assert "retention: completed 30d (node), failed 30d (node)" in out
        assert f"  FAIL  {FAILING_CASE}: {FAILING_DIFF}" in out
        assert "tests: 2 passed, 1 failed" in out
        code = _cli(["workflow", "get", "order", "--json", "--url", url, "--token", ROOT])
        assert code == 0 and json.loads(capsys.readouterr().out)["version"] == 2
        code = _cli(["workflow", "get", "nope", "--url", url, "--token", ROOT])
        assert code == 1 and "No stored workflow named 'nope'" in capsys.readouterr().out

        # the CLI's put prints the stored version and the result
        path = tmp_path / "order.json"
        path.write_text(json.dumps(_failing(wf)), encoding="utf-8")
        code = _cli(["workflow", "put", "order", str(path), "--url", url, "--token", ROOT])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "stored workflow 'order' as version 3" in out
        assert f"  FAIL  {FAILING_CASE}: {FAILING_DIFF}" in out
    finally:
        node.close()

    # a restart: the versions and their results are read back from the data directory
    node = _start(tmp_path, fresh_dsn)
    try:
        url = node.http.url
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert (got["version"], got["lastTest"]["ok"]) == (3, False)
        _, second = _verb(url, "get-workflow", {"workflowName": "order", "version": 2})
        assert second["lastTest"]["via"] == "test-workflow"
        assert _get(url, "order")[2]["Protomolt-Version"] == "3"
    finally:
        node.close()


def test_get_workflow_shows_the_retention_check_workflow_answers(tmp_path, fresh_dsn, wf):
    node = _start(tmp_path, fresh_dsn)
    try:
        url = node.http.url
        kept = copy.deepcopy(wf)
        kept["retention"] = {"completed": "P1D", "failed": "P30D"}
        status, body, _ = _put(url, "kept", kept)
        assert status == 200, body
        _, checked = _verb(url, "check-workflow", {"workflow": kept})
        _, got = _verb(url, "get-workflow", {"workflowName": "kept"})
        assert got["retention"] == checked["retention"]
        assert got["retention"]["completed"] == {"seconds": 86400.0, "source": "workflow"}
        assert json.loads(_get(url, "kept")[2]["Protomolt-Retention"]) == got["retention"]
    finally:
        node.close()


# -- the gate on ---------------------------------------------------------------------------------


def test_with_the_gate_on_a_failing_or_untested_put_is_refused_naming_the_case(
    tmp_path, fresh_dsn, wf, capsys
):
    node = _start(tmp_path, fresh_dsn, require_workflow_tests="true")
    try:
        url = node.http.url
        status, body, _ = _put(url, "order", _failing(wf))
        assert status == 422, body
        assert (body["error"], body["error_code"]) == ("tests-failed", 42203)
        assert body["message"] == (
            "Workflow 'order' is refused: jobs.require_workflow_tests is on and test case "
            f"'{FAILING_CASE}' fails (step 'charge'): {FAILING_DIFF}"
        )
        assert _cases(body["tests"]) == {
            "happy path": True,
            FAILING_CASE: False,
            "ship refused, charge refunded": True,
        }
        # nothing is stored: no definition, no version record
        assert _get(url, "order")[0] == 404
        assert list((tmp_path / "data").rglob("*order*")) == []
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert got == {"ok": False, "error": "No stored workflow named 'order'"}

        untested = {k: v for k, v in wf.items() if k != "tests"}
        status, body, _ = _put(url, "order", untested)
        assert status == 422 and body["error"] == "tests-failed", body
        assert body["message"] == (
            "Workflow 'order' is refused: jobs.require_workflow_tests is on and it has no "
            "tests; add 'tests' cases to the definition (docs/workflows.md, Tests in the "
            "definition)"
        )
        assert _get(url, "order")[0] == 404

        # a passing definition is stored; a failing next version leaves it as it was
        status, body, _ = _put(url, "order", wf)
        assert status == 200 and body["version"] == 1 and body["tests"]["ok"] is True
        status, body, _ = _put(url, "order", _failing(wf))
        assert status == 422
        status, stored, headers = _get(url, "order")
        assert stored == wf and headers["Protomolt-Version"] == "1"
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert (got["version"], got["latestVersion"], got["lastTest"]["ok"]) == (1, 1, True)

        # the CLI's put: refused, naming the case, exit 1
        path = tmp_path / "order.json"
        path.write_text(json.dumps(_failing(wf)), encoding="utf-8")
        capsys.readouterr()
        code = _cli(["workflow", "put", "order", str(path), "--url", url, "--token", ROOT])
        captured = capsys.readouterr()
        assert code == 1
        assert f"test case '{FAILING_CASE}' fails (step 'charge'): {FAILING_DIFF}" in (captured.err)
        assert f"  FAIL  {FAILING_CASE}: {FAILING_DIFF}" in captured.out
        assert _get(url, "order")[2]["Protomolt-Version"] == "1"
    finally:
        node.close()


# -- get-workflow's doors refuse bad input --------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "workflowName"),
        ({"workflowName": 3}, "workflowName"),
        ({"workflowName": "  "}, "workflowName"),
        ({"workflowName": "order", "version": 0}, "version"),
        ({"workflowName": "order", "version": "1"}, "version"),
        ({"workflowName": "order", "version": 1.5}, "version"),
        ({"workflowName": "order", "version": True}, "version"),
        ({"workflowName": "order", "versions": 1}, "versions"),
    ],
)
def test_get_workflow_refuses_bad_input_naming_the_field(tmp_path, fresh_dsn, body, field):
    node = _start(tmp_path, fresh_dsn)
    try:
        status, answer = _verb(node.http.url, "get-workflow", body)
        assert status == 400 and answer["error"] == "invalid-input", answer
        assert answer["details"]["field"] == field
    finally:
        node.close()


def test_get_workflow_over_grpc_and_its_refusals(tmp_path, fresh_dsn, wf, capsys):
    node = _start(tmp_path, fresh_dsn)
    try:
        url = node.http.url
        assert _put(url, "order", _failing(wf))[0] == 200
        with grpc.insecure_channel(node.grpc.target) as channel:
            call = channel.unary_unary(
                "/ai.pipestream.proto.service.v1.ProtoMoltService/GetWorkflow",
                request_serializer=pb.GetWorkflowRequest.SerializeToString,
                response_deserializer=pb.GetWorkflowResponse.FromString,
            )
            meta = (("authorization", f"Bearer {ROOT}"),)
            got = call(pb.GetWorkflowRequest(workflow_name="order"), metadata=meta)
            assert got.ok and got.version == 1 and got.current
            assert json_format.MessageToDict(got.definition) == _failing(wf)
            last = json_format.MessageToDict(got.last_test)
            assert _cases(last)[FAILING_CASE] is False
            assert json_format.MessageToDict(got.retention)["dead"]["source"] == "node"
            missing = call(pb.GetWorkflowRequest(workflow_name="nope"), metadata=meta)
            assert not missing.ok and missing.error == "No stored workflow named 'nope'"
            gone = call(pb.GetWorkflowRequest(workflow_name="order", version=7), metadata=meta)
            assert gone.error == "No stored workflow named 'order' with version 7"
            for request, field in (
                (pb.GetWorkflowRequest(), "workflowName"),
                (pb.GetWorkflowRequest(workflow_name="order", version=-1), "version"),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, metadata=meta)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details().startswith("invalid-input: ")
                assert f"'{field}'" in refused.value.details()
        capsys.readouterr()
        code = _cli(["workflow", "get", "order", "--version", "0", "--url", url, "--token", ROOT])
        captured = capsys.readouterr()
        assert code == 2 and "invalid-input" in captured.err and "Traceback" not in captured.err
    finally:
        node.close()


SCOPED_NODE = """
[node]
api_token = "root-token"
[node.tokens]
viewer-1 = "viewer-token"
[node.groups]
viewer = ["viewer-1"]
[node.scopes]
viewer = ["schema-read"]
"""


def test_a_schema_read_caller_runs_the_stored_tests_but_records_nothing(tmp_path, fresh_dsn, wf):
    """test-workflow runs under schema-read; recording a stored version's result changes what
    get-workflow and the dashboard show, so only a caller who may store the workflow
    (workflow-write) records it (breaker finding, issue 30)."""
    node = start_node_with_file(tmp_path, fresh_dsn, SCOPED_NODE)
    try:
        url = node.http.url
        status, body, _ = _put(url, "order", _failing(wf))
        assert status == 200 and body["version"] == 1 and body["tests"]["ok"] is False
        viewer = {"Authorization": "Bearer viewer-token"}
        status, ran, _ = http(
            "POST",
            f"{url}/protomolt/actions/test-workflow",
            {"workflowName": "order"},
            headers=viewer,
        )
        assert status == 200 and ran["ok"] is False
        status, got, _ = http(
            "POST",
            f"{url}/protomolt/actions/get-workflow",
            {"workflowName": "order"},
            headers=viewer,
        )
        assert status == 200
        assert (got["lastTest"]["via"], got["lastTest"]["by"]) == ("put", "api")
        # the api token holds every scope: its run is recorded
        status, ran = _verb(url, "test-workflow", {"workflowName": "order"})
        assert status == 200
        _, got = _verb(url, "get-workflow", {"workflowName": "order"})
        assert (got["lastTest"]["via"], got["lastTest"]["by"]) == ("test-workflow", "api")
    finally:
        node.close()
