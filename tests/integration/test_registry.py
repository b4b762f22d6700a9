"""The registry role: file storage, loud corruption, and the /protomolt/workflows routes."""

from __future__ import annotations

import json

import pytest

from protomolt_jobs.host.registry import CorruptWorkflow, WorkflowStore
from tests.support.grpc_servers import seed_workflow
from tests.support.node import http, node_environ, start_node


class TestStore:
    def test_put_read_list(self, tmp_path):
        store = WorkflowStore(tmp_path / "workflows")
        store.put("b-flow", {"name": "b"})
        store.put("a.flow_1", {"name": "a", "n": [1, 2]})
        assert store.names() == ["a.flow_1", "b-flow"]
        assert store.workflow("a.flow_1") == {"name": "a", "n": [1, 2]}
        assert store.workflow("missing") is None
        assert (tmp_path / "workflows" / "b-flow.json").is_file()
        store.put("b-flow", {"name": "b2"})
        assert store.workflow("b-flow") == {"name": "b2"}
        assert not list((tmp_path / "workflows").glob("*.tmp"))

    @pytest.mark.parametrize("name", ["", "Upper", "../etc", "a/b", "-lead", "x" * 201, ".hidden"])
    def test_bad_names_are_refused_on_put_and_absent_on_read(self, tmp_path, name):
        store = WorkflowStore(tmp_path)
        with pytest.raises(ValueError, match="workflow names match"):
            store.put(name, {})
        assert store.workflow(name) is None

    @pytest.mark.parametrize(
        ("text", "reason"),
        [("{not json", "is not valid JSON"), ("[1, 2]", "is not a JSON object"), ('"x"', "object")],
    )
    def test_a_corrupt_file_is_a_loud_error_not_absent(self, tmp_path, text, reason):
        store = WorkflowStore(tmp_path)
        (tmp_path / "broken.json").write_text(text)
        with pytest.raises(CorruptWorkflow, match=reason) as info:
            store.workflow("broken")
        assert "broken" in str(info.value)
        assert store.names() == ["broken"]


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _url(node, path):
    return f"{node.http.url}{path}"


def test_parse_role_stored_parse_document_at_wire(node):
    status, names, _ = http("GET", _url(node, "/protomolt/workflows"))
    assert status == 200
    assert "parse-document" in names


def test_put_then_get_and_list(node):
    wf = seed_workflow("127.0.0.1:1")
    status, body, _ = http("PUT", _url(node, "/protomolt/workflows/seed-review"), wf)
    assert status == 200 and (body["name"], body["version"]) == ("seed-review", 1)
    # no tests: stored (the gate is off by default) with the result saying so
    assert body["tests"]["ok"] is False and body["tests"]["cases"] == []
    assert body["tests"]["error"].startswith("the workflow has no tests")
    status, stored, hdrs = http("GET", _url(node, "/protomolt/workflows/seed-review"))
    assert status == 200 and stored == wf
    assert hdrs["Content-Type"] == "application/json"
    assert "seed-review" in http("GET", _url(node, "/protomolt/workflows"))[1]


def test_put_of_a_workflow_that_does_not_verify_is_refused_with_findings(node):
    wf = seed_workflow("127.0.0.1:1")
    wf["steps"][0]["rules"].append("nosuchfield = input.text")
    wf["steps"][1]["rules"].append("ids = input.nosuch")
    status, body, _ = http("PUT", _url(node, "/protomolt/workflows/bad-flow"), wf)
    assert status == 422
    assert body["error"] == "does-not-verify"
    assert body["error_code"] == 42202  # upstream's code for a workflow that does not verify
    assert body["message"].startswith("Workflow 'bad-flow' does not verify (")
    steps = {f["step"] for f in body["findings"]}
    assert {"tokenize", "embed"} <= steps
    assert all({"step", "kind", "error"} <= set(f) for f in body["findings"])
    assert http("GET", _url(node, "/protomolt/workflows/bad-flow"))[0] == 404
    assert not (node.node.config.data_dir / "workflows" / "bad-flow.json").exists()


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/protomolt/workflows/Bad%20Name", b"{}"),
        ("/protomolt/workflows/ok-name", b"[1]"),
        ("/protomolt/workflows/ok-name", b"{oops"),
    ],
)
def test_bad_puts_are_422_invalid_input_with_upstreams_42201(node, path, raw):
    """As upstream's registry answers a bad name or a body that is not a workflow object."""
    got, body, _ = http("PUT", _url(node, path), raw=raw)
    assert (got, body["error"], body["error_code"]) == (422, "invalid-input", 42201)


def test_get_of_an_unknown_workflow_is_404_with_upstreams_40401(node):
    status, body, _ = http("GET", _url(node, "/protomolt/workflows/nope"))
    assert (status, body["error"], body["error_code"]) == (404, "not-found", 40401)
    assert body["message"] == "Workflow not found: nope"


def test_a_corrupt_stored_workflow_fails_submit_by_name_loudly(node):
    path = node.node.config.data_dir / "workflows" / "seed-review.json"
    path.write_text('{"name": "seed-review", "steps": [')
    status, answer, _ = http(
        "POST",
        _url(node, "/protomolt/actions/submit-workflow"),
        {"workflowName": "seed-review", "input": {"text": "a b"}},
    )
    assert status == 200
    assert answer["ok"] is False
    assert "seed-review" in answer["error"]
    assert "not valid JSON" in answer["error"]
    assert "No stored workflow" not in answer["error"]
    status, body, _ = http("GET", _url(node, "/protomolt/workflows/seed-review"))
    assert (status, body["error"], body["error_code"]) == (500, "workflow-corrupt", 50001)
    # the node still lists it: corrupt is not absent
    assert "seed-review" in http("GET", _url(node, "/protomolt/workflows"))[1]


def test_put_without_check_workflow_is_refused_not_stored_unchecked(tmp_path):
    surfaces = start_node(node_environ(tmp_path / "data", None, roles="registry"))
    try:
        status, body, _ = http(
            "PUT", f"{surfaces.http.url}/protomolt/workflows/wf", seed_workflow("127.0.0.1:1")
        )
        assert (status, body["error"]) == (503, "unavailable")
        assert not (tmp_path / "data" / "workflows" / "wf.json").exists()
    finally:
        surfaces.close()


def test_stored_json_is_served_verbatim(node):
    path = node.node.config.data_dir / "workflows" / "hand-made.json"
    text = '{"b": 1,   "a": [ 2 ]}\n'
    path.write_text(text)
    status, body, _ = http("GET", _url(node, "/protomolt/workflows/hand-made"))
    assert status == 200 and body == json.loads(text)
