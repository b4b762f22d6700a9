"""The registry's file store at its boundary: names with a trailing newline, stored files that
Python's JSON parser refuses with something other than a decode error."""

from __future__ import annotations

import pytest

from protomolt_jobs.host.http_route import ActionsHttpServer
from protomolt_jobs.host.registry import CorruptWorkflow, WorkflowStore, workflow_routes
from tests.support.node import http, stub_catalog


@pytest.mark.parametrize("name", ["nl\n", "a\nb", "ok\r\n"])
def test_a_name_with_a_newline_is_refused_and_never_a_file(tmp_path, name):
    store = WorkflowStore(tmp_path)
    with pytest.raises(ValueError, match="workflow names match"):
        store.put(name, {"name": "x"})
    assert list(tmp_path.iterdir()) == []
    assert store.read_text(name) is None


def test_a_stored_file_with_a_newline_in_its_stem_is_not_listed(tmp_path):
    (tmp_path / "nl\n.json").write_text("{}")
    assert WorkflowStore(tmp_path).names() == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"n": ' + "1" * 5000 + "}", "is not valid JSON"),  # over the int digit limit
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested deeper"),
    ],
)
def test_a_file_the_parser_refuses_is_corrupt_not_a_500(tmp_path, text, reason):
    store = WorkflowStore(tmp_path / "workflows")
    (store.directory / "huge.json").write_text(text)
    with pytest.raises(CorruptWorkflow, match=reason):
        store.workflow("huge")
    catalog, _ = stub_catalog()
    srv = ActionsHttpServer(catalog, port=0, routes=workflow_routes(store)).start()
    try:
        status, body, _ = http("GET", f"{srv.url}/protomolt/workflows/huge")
    finally:
        srv.close()
    assert status == 500
    assert body["error"] == "workflow-corrupt"
    assert "huge" in body["message"]
