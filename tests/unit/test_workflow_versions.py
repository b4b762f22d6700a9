"""The registry's version records (``host/workflow_versions.py``): numbered per PUT, read back
by a new store on the same directory, a crash between the record and the definition's
replacement leaves the previous version current, and a hand-copied file has no version."""

from __future__ import annotations

import json

from protomolt_jobs.hooks.contract import WorkflowVersions
from protomolt_jobs.host.registry import WorkflowStore
from protomolt_jobs.host.workflow_versions import VERSIONS_DIR, summary_of_tests

ANSWER = {
    "ok": False,
    "passed": 1,
    "failed": 1,
    "cases": [
        {"name": "a", "passed": True, "actual": {"status": "COMPLETED"}},
        {"name": "b", "passed": False, "difference": "status: x", "step": "s", "actual": {}},
    ],
    "coverage": {},
}


def test_each_put_is_a_version_with_its_result_and_a_new_store_reads_them(tmp_path):
    store = WorkflowStore(tmp_path)
    assert isinstance(store, WorkflowVersions)
    first = summary_of_tests(ANSWER, by="ann", via="put")
    assert store.put("flow", {"name": "v1"}, by="ann", test=first) == 1
    assert store.put("flow", {"name": "v2"}, by="bob") == 2
    assert store.names() == ["flow"]  # the records are not workflows

    again = WorkflowStore(tmp_path)  # a restart
    current = again.stored("flow")
    assert current is not None
    assert (current["version"], current["latestVersion"], current["current"]) == (2, 2, True)
    assert (current["definition"], current["storedBy"], current["lastTest"]) == (
        {"name": "v2"},
        "bob",
        None,
    )
    old = again.stored("flow", 1)
    assert old is not None and old["definition"] == {"name": "v1"} and old["current"] is False
    assert old["lastTest"]["cases"] == [
        {"name": "a", "passed": True},
        {"name": "b", "passed": False, "difference": "status: x", "step": "s"},
    ]
    assert (old["lastTest"]["passed"], old["lastTest"]["failed"]) == (1, 1)
    assert again.stored("flow", 3) is None and again.stored("other") is None

    assert again.record_test("flow", 2, {"ok": True, "cases": []}, by="cy", via="test-workflow")
    assert WorkflowStore(tmp_path).stored("flow")["lastTest"]["by"] == "cy"
    assert again.record_test("flow", 9, ANSWER, by="cy", via="test-workflow") is False

    # the same text again (a role storing its workflow at each start) keeps the number
    assert again.put("flow", {"name": "v2"}, by="dan") == 2
    assert again.put("flow", {"name": "v2"}, by="dan", test=first) == 2
    assert again.stored("flow")["lastTest"] == first
    assert again.versions.numbers("flow") == [1, 2]
    # ... but the text of an older version is a new one
    assert again.put("flow", {"name": "v1"}) == 3


def test_a_crash_before_the_definition_is_replaced_keeps_the_previous_version_current(tmp_path):
    store = WorkflowStore(tmp_path)
    store.put("flow", {"name": "v1"})
    # the record of version 2 was written, the definition's file never replaced
    store.versions.add("flow", json.dumps({"name": "v2"}), by="x", test=None)
    current = store.stored("flow")
    assert current is not None
    assert (current["version"], current["latestVersion"]) == (1, 2)
    assert current["definition"] == {"name": "v1"}


def test_a_file_copied_in_by_hand_has_no_version(tmp_path):
    (tmp_path / "flow.json").write_text('{"name": "by-hand"}', encoding="utf-8")
    store = WorkflowStore(tmp_path)
    current = store.stored("flow")
    assert current is not None
    assert (current["version"], current["lastTest"], current["current"]) == (None, None, False)
    assert (tmp_path / VERSIONS_DIR).exists() is False
    assert store.put("flow", {"name": "v1"}) == 1


def test_a_long_last_test_header_leaves_its_cases_to_get_workflow():
    from protomolt_jobs.host.registry import LAST_TEST_HEADER_MAX, _last_test_header

    cases = [{"name": f"case {i}", "passed": False, "difference": "x" * 200} for i in range(40)]
    tested = {"ok": False, "passed": 0, "failed": 40, "cases": cases, "at": "t", "by": "b"}
    header = json.loads(_last_test_header(tested))
    assert header == {
        "ok": False,
        "passed": 0,
        "failed": 40,
        "at": "t",
        "by": "b",
        "truncated": True,
    }
    short = {**tested, "cases": cases[:1]}
    assert json.loads(_last_test_header(short)) == short
    assert len(_last_test_header(tested)) < LAST_TEST_HEADER_MAX
