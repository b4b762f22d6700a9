"""The action catalog: registration, manifest, execute path and error codes."""

from __future__ import annotations

import logging

import pytest

from protomolt_jobs.errors import (
    InternalError,
    InvalidInput,
    PermissionDenied,
    Unavailable,
    UnknownAction,
)
from protomolt_jobs.host.catalog import Caller, Catalog


class Echo:
    def __init__(self, name="echo", scope="service-invoke", behaviour=None):
        self.name = name
        self.description = "Echo the input."
        self.scope = scope
        self.input_schema = {"type": "object"}
        self._behaviour = behaviour

    def execute(self, input):
        if self._behaviour is not None:
            return self._behaviour(input)
        return {"ok": True, "echo": input}


def test_register_and_execute_in_order():
    cat = Catalog()
    cat.register(Echo("b-verb"))
    cat.register(Echo("a-verb", scope="workflow-run"))
    assert cat.names() == ["b-verb", "a-verb"]
    assert cat.execute("a-verb", {"x": 1}) == {"ok": True, "echo": {"x": 1}}
    manifest = cat.manifest()
    assert [m["name"] for m in manifest] == ["b-verb", "a-verb"]
    assert manifest[1] == {
        "name": "a-verb",
        "description": "Echo the input.",
        "scope": "workflow-run",
        "inputSchema": {"type": "object"},
    }


def test_duplicate_name_refused():
    cat = Catalog()
    cat.register(Echo())
    with pytest.raises(ValueError, match="Action 'echo' is already registered"):
        cat.register(Echo())


@pytest.mark.parametrize("bad", ["", "Echo", "echo_verb", "-echo", None, 3])
def test_bad_names_refused(bad):
    with pytest.raises(ValueError, match="kebab-case"):
        Catalog().register(Echo(bad))


def test_not_an_action_refused():
    with pytest.raises(ValueError, match="is not an Action: it has no 'name'"):
        Catalog().register(object())


def test_unknown_action_lists_available():
    cat = Catalog()
    cat.register(Echo("get-job"))
    cat.register(Echo("list-jobs"))
    with pytest.raises(UnknownAction) as info:
        cat.execute("nope", {})
    err = info.value
    assert err.code == "unknown-action"
    assert err.message == "Unknown action 'nope'. Available actions: get-job, list-jobs"
    assert err.details == {"action": "nope", "available": ["get-job", "list-jobs"]}
    assert err.to_json()["error"] == "unknown-action"


@pytest.mark.parametrize("bad_input", [None, [], "x", 1, True])
def test_input_must_be_object(bad_input):
    cat = Catalog()
    cat.register(Echo())
    with pytest.raises(InvalidInput, match=r"Input must be a JSON object \(at ''\)"):
        cat.execute("echo", bad_input)


def test_scope_checked_for_restricted_callers():
    cat = Catalog()
    cat.register(Echo("submit-workflow", scope="workflow-run"))
    cat.register(Echo("get-job", scope="service-invoke"))
    reader = Caller("reader", frozenset({"service-invoke"}))
    assert cat.execute("get-job", {}, caller=reader)["ok"] is True
    with pytest.raises(PermissionDenied) as info:
        cat.execute("submit-workflow", {}, caller=reader)
    assert info.value.details == {
        "action": "submit-workflow",
        "caller": "reader",
        "requiredScope": "workflow-run",
    }
    assert [m["name"] for m in cat.manifest(reader)] == ["get-job"]


def test_action_errors_pass_through():
    def boom(_):
        raise Unavailable("not configured")

    cat = Catalog()
    cat.register(Echo(behaviour=boom))
    with pytest.raises(Unavailable, match="not configured"):
        cat.execute("echo", {})


def test_unexpected_exception_becomes_internal_error(caplog):
    def boom(_):
        raise KeyError("secret-internal-detail")

    cat = Catalog()
    cat.register(Echo(behaviour=boom))
    with (
        caplog.at_level(logging.ERROR, logger="protomolt_jobs.catalog"),
        pytest.raises(InternalError) as info,
    ):
        cat.execute("echo", {})
    assert "secret-internal-detail" not in info.value.message
    assert "KeyError" in info.value.message
    records = [r for r in caplog.records if getattr(r, "action", None) == "action_internal_error"]
    assert records and records[0].exc_info is not None


def test_non_object_answer_is_internal_error():
    cat = Catalog()
    cat.register(Echo(behaviour=lambda _: ["not", "an", "object"]))
    with pytest.raises(InternalError):
        cat.execute("echo", {})
