"""workflow/testing: the ``tests`` key's parsing (every error names its path) and the in-process
run's events (crash points, pause/resume/cancel, the clock), parks (external, approval votes),
gates, loops (``name#k``), retries and coverage, all on the real engine with the mock transport.
Nothing here opens a connection: every target is a port nothing listens on."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.verbs import CheckWorkflowAction, TestWorkflowAction
from protomolt_jobs.workflow import Runtime, keys, parse_workflow
from protomolt_jobs.workflow.testing.cases import CaseError, parse_cases

PROTO = """syntax = "proto3";
package t.v1;
message In { string id = 1; bool go = 2; }
message Out { string id = 1; bool ok = 2; }
service S {
  rpc A(In) returns (Out);
  rpc B(In) returns (Out);
  rpc C(In) returns (Out);
}
"""
TARGET = "127.0.0.1:9"
OK = {"response": {"ok": True}}


def _step(name: str, method: str = "A", **extra: Any) -> dict[str, Any]:
    return {"name": name, "target": TARGET, "method": f"t.v1.S/{method}", **extra}


def _wf(steps: list[dict[str, Any]], tests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "t",
        "schema": {"sources": {"t/v1/t.proto": PROTO}, "root": "t/v1/t.proto"},
        "inputType": "t.v1.In",
        "steps": steps,
        "tests": tests,
    }


def _case(name: str = "c", **extra: Any) -> dict[str, Any]:
    return {"name": name, "input": {"id": "x"}, **extra}


def _run(wf: dict[str, Any]) -> dict[str, Any]:
    return TestWorkflowAction(Runtime(), max_attempts=3, backoff_base_s=1.0).execute(
        {"workflow": wf}
    )


def _only(wf: dict[str, Any]) -> dict[str, Any]:
    answer = _run(wf)
    [case] = answer["cases"]
    return case


SEQ = [_step("a"), _step("b", "B"), _step("c", "C")]
ALL_OK = {"a": OK, "b": OK, "c": OK}


# -- parsing: every error names its path ------------------------------------------------------


@pytest.mark.parametrize(
    ("tests", "path"),
    [
        ("all", "tests"),
        ([{"input": {}}], "tests[0].name"),
        ([_case(), _case()], "tests[1].name"),
        ([_case(inputs={})], "tests[0].inputs"),
        ([_case(input={"nope": 1})], "tests[0].input"),
        ([_case(mocks={"zz": OK})], "tests[0].mocks.zz"),
        ([_case(mocks={"a": [OK, {"respons": {}}]})], "tests[0].mocks.a[1].respons"),
        ([_case(mocks={"a": {"response": {"okk": True}}})], "tests[0].mocks.a[0].response"),
        ([_case(mocks={"a": {"status": {"code": "NOPE"}}})], "tests[0].mocks.a[0].status.code"),
        ([_case(mocks={"a": {"status": {"code": "OK"}}})], "tests[0].mocks.a[0].status.code"),
        (
            [_case(mocks={"a": {"response": {}, "status": {"code": "INTERNAL"}}})],
            "tests[0].mocks.a[0]",
        ),
        ([_case(mocks={"a": {"response": {}, "delayMs": -1}})], "tests[0].mocks.a[0].delayMs"),
        ([_case(mocks={"a": {"votes": []}})], "tests[0].mocks.a[0].votes"),
        ([_case(events=[{"crash": "after_checkpoint"}])], "tests[0].events[0].after"),
        ([_case(events=[{"after": "a", "crash": "mid"}])], "tests[0].events[0].crash"),
        ([_case(events=[{"action": "stop"}])], "tests[0].events[0].action"),
        ([_case(events=[{"advanceMs": 0}])], "tests[0].events[0].advanceMs"),
        ([_case(events=[{"after": "zz", "advanceMs": 1}])], "tests[0].events[0].after"),
        ([_case(expect={"status": "DONE"})], "tests[0].expect.status"),
        ([_case(expect={"path": "a"})], "tests[0].expect.path"),
        ([_case(expect={"calls": {"a": -1}})], "tests[0].expect.calls.a"),
        ([_case(expect={"calls": {"zz": 1}})], "tests[0].expect.calls.zz"),
        ([_case(expect={"skipped": {"a": 1}})], "tests[0].expect.skipped.a"),
        ([_case(expect={"stat": "COMPLETED"})], "tests[0].expect.stat"),
    ],
)
def test_every_bad_tests_value_names_its_path(tests, path):
    wf = _wf(SEQ, tests)
    compiled = parse_workflow(wf, Runtime())
    with pytest.raises(CaseError) as err:
        parse_cases(compiled, tests)
    assert err.value.path == path, err.value.message
    with pytest.raises(InvalidInput) as refused:
        _run(wf)
    assert refused.value.details == {"field": "workflow", "path": path}
    [finding] = CheckWorkflowAction(Runtime()).execute({"workflow": wf})["findings"]
    # a key the keys table knows the object of is an unknown-key finding (with a suggestion)
    unknown = path.rsplit(".", 1)[-1] in ("inputs", "stat")
    assert finding["kind"] == ("unknown-key" if unknown else "tests"), finding
    assert path in finding["error"], finding


def test_the_tests_keys_are_known_and_a_misspelt_one_is_an_unknown_key():
    wf = _wf(SEQ, [_case(mocks=ALL_OK, expect={"status": "COMPLETED"})])
    assert list(keys.unknown_keys(wf)) == []
    wf["tests"][0]["expct"] = {}
    [unknown] = list(keys.unknown_keys(wf))
    assert unknown.path == "tests[0].expct" and unknown.suggestion == "expect"


def test_a_definition_without_tests_is_not_ok():
    wf = _wf(SEQ, [])
    assert _run(wf) == {
        "ok": False,
        "error": "the workflow has no tests: give 'tests' in the definition or in the request",
    }


# -- the in-process run ---------------------------------------------------------------------


#: The crash and operator-action fixtures; tests/integration/test_workflow_tests_parity.py
#: plays the same ones on PostgreSQL through real workers.
CRASH_BEFORE = _case(
    "before",
    mocks={"a": OK, "b": [OK, OK], "c": OK},
    events=[{"after": "b", "crash": "before_checkpoint"}],
    expect={"status": "COMPLETED", "path": ["a", "b", "c"], "calls": {"a": 1, "b": 2}},
)
CRASH_AFTER = _case(
    "after",
    mocks=ALL_OK,
    events=[{"after": "b", "crash": "after_checkpoint"}],
    expect={"status": "COMPLETED", "path": ["a", "b", "c"], "calls": {"a": 1, "b": 1}},
)
PAUSED = _case(
    "paused",
    mocks=ALL_OK,
    events=[{"after": "a", "action": "pause"}],
    expect={"status": "PAUSED", "path": ["a"], "calls": {"b": 0}},
)
RESUMED = _case(
    "resumed",
    mocks=ALL_OK,
    events=[{"after": "a", "action": "pause"}, {"advanceMs": 60000}, {"action": "resume"}],
    expect={"status": "COMPLETED", "path": ["a", "b", "c"]},
)
CANCELLED = _case(
    "cancelled",
    mocks=ALL_OK,
    events=[{"after": "b", "action": "cancel"}],
    expect={"status": "CANCELLED", "path": ["a", "b"]},
)
DEAD = _case(
    "dead",
    mocks={"a": [{"status": {"code": "UNAVAILABLE"}}] * 3},
    expect={"status": "DEAD", "errorKind": "GRPC", "failedStep": "a", "calls": {"a": 3}},
)
FAILED = _case(
    "failed",
    mocks={"a": OK, "b": {"status": {"code": "NOT_FOUND", "message": "gone"}}},
    expect={"status": "FAILED", "errorKind": "GRPC", "failedStep": "b", "path": ["a"]},
)


def test_a_crash_before_the_checkpoint_calls_the_step_again_and_after_it_does_not():
    answer = _run(_wf(SEQ, [CRASH_BEFORE, CRASH_AFTER]))
    assert answer["ok"] is True, answer
    assert [c["actual"]["attempts"] for c in answer["cases"]] == [2, 2]


def test_pause_resume_and_cancel_apply_at_the_named_checkpoint():
    answer = _run(_wf(SEQ, [PAUSED, RESUMED, CANCELLED]))
    assert answer["ok"] is True, answer
    assert answer["cases"][1]["actual"]["clockMs"] == 60000


#: A call slower than its step's deadline, then one in time (with its steps).
DELAY_STEPS = [_step("a", deadlineMs=100), _step("b", "B")]
DELAYED = _case(
    "delayed",
    mocks={"a": [{"response": {}, "delayMs": 500}, {"response": {}, "delayMs": 50}], "b": OK},
    expect={"status": "COMPLETED", "calls": {"a": 2}},
)
#: A false gate: its step skipped (with its steps).
GATE_STEPS = [_step("a"), _step("b", "B", when="input.go"), _step("c", "C")]
GATE_SKIPPED = _case(
    "gate", mocks={"a": OK, "c": OK}, expect={"path": ["a", "c"], "skipped": {"b": ""}}
)
#: A graph with a bounded loop: check fails once, fix runs, the loop repeats (with its steps).
LOOP_STEPS = [
    _step("build"),
    _step("check", "B", after=["build"]),
    _step(
        "fix",
        "C",
        after=[{"step": "check", "on": "failure"}],
        loop={"to": "build", "max": 2},
    ),
    _step("publish", after=["check"]),
]
LOOPED = _case(
    "looped",
    mocks={
        "build": [OK, OK],
        "check": [{"status": {"code": "FAILED_PRECONDITION", "message": "not yet"}}, OK],
        "fix": OK,
        "publish": OK,
    },
    expect={
        "status": "COMPLETED",
        "path": ["build#0", "check#0", "fix#0", "build#1", "check#1", "publish"],
        "calls": {"build": 2, "check": 2, "fix": 1},
    },
)


def test_a_delay_past_the_deadline_is_deadline_exceeded_and_retried():
    got = _only(_wf(DELAY_STEPS, [DELAYED]))
    assert got["passed"] is True, got
    assert got["actual"]["clockMs"] == 500 + 1000 + 50  # delays and one 1 s backoff


def test_retries_exhausted_are_dead_and_a_permanent_failure_is_failed():
    answer = _run(_wf(SEQ, [DEAD, FAILED]))
    assert answer["ok"] is True, answer


def test_a_false_gate_is_skipped_and_coverage_says_its_other_way_was_not_reached():
    steps, case = GATE_STEPS, GATE_SKIPPED
    answer = _run(_wf(steps, [case]))
    assert answer["ok"] is True, answer
    assert answer["coverage"]["decisions"] == ["b: ran"]
    wrong = copy.deepcopy(case)
    wrong["expect"]["skipped"] = {}
    got = _only(_wf(steps, [wrong]))
    assert got["difference"] == "skipped: 'b' was skipped (), not expected"


#: An external step and an approval step of quorum 2 (with their steps): decided by the votes,
#: and one vote short (WAITING).
PARK_STEPS = [
    _step("a"),
    {"name": "ext", "target": TARGET, "method": "t.v1.S/B", "completion": "external"},
    {
        "name": "review",
        "completion": "approval",
        "approval": {"approvers": {"principals": ["al", "bo"]}, "quorum": 2},
    },
    _step("c", "C"),
]
DECIDED = _case(
    "decided",
    mocks={
        "a": OK,
        "ext": {"response": {"id": "e"}},
        "review": {
            "votes": [
                {"principal": "al", "decision": "accept"},
                {"principal": "al", "decision": "accept"},
                {"principal": "bo", "decision": "accept"},
            ]
        },
        "c": OK,
    },
    expect={"status": "COMPLETED", "path": ["a", "ext", "review", "c"]},
)
VOTE_SHORT = _case(
    "waiting",
    mocks={
        "a": OK,
        "ext": {"response": {"id": "e"}},
        "review": {"votes": [{"principal": "al", "decision": "accept"}]},
    },
    expect={"status": "WAITING", "path": ["a", "ext"], "calls": {"c": 0}},
)
#: A park's answer gives the run its attempts back (with its steps).
ATTEMPTS_STEPS = [
    _step("a"),
    {"name": "ext", "target": TARGET, "method": "t.v1.S/B", "completion": "external"},
    _step("c", "C"),
]
ATTEMPTS_BACK = _case(
    "attempts back",
    mocks={
        "a": [{"status": {"code": "UNAVAILABLE"}}, OK],
        "ext": {"response": {"id": "e"}},
        "c": [{"status": {"code": "UNAVAILABLE"}}] * 3,
    },
    expect={"status": "DEAD", "failedStep": "c", "calls": {"a": 2, "c": 3}},
)


def test_external_and_approval_parks_are_answered_by_their_mocks():
    steps, decided, waiting = PARK_STEPS, DECIDED, VOTE_SHORT
    answer = _run(_wf(steps, [decided, waiting]))
    assert answer["ok"] is True, answer
    assert answer["coverage"]["decisions"] == ["review: reject"]


def test_a_loop_body_is_on_the_path_by_iteration_and_coverage_tracks_the_loop():
    steps, case = LOOP_STEPS, LOOPED
    answer = _run(_wf(steps, [case]))
    assert answer["ok"] is True, answer
    assert answer["coverage"]["loopExits"] == ["fix: exhausted"]
    assert answer["coverage"]["failureEdges"] == []
    # a case where check passes at once: the loop is left without repeating
    once = _case(
        "once",
        mocks={"build": OK, "check": OK, "publish": OK},
        expect={"path": ["build#0", "check#0", "publish"]},
    )
    answer = _run(_wf(steps, [once]))
    assert answer["ok"] is True, answer
    assert answer["coverage"]["loopExits"] == ["fix: repeated", "fix: exhausted"]
    assert answer["coverage"]["failureEdges"] == ["check -> fix"]


def test_a_definitions_tests_are_not_part_of_its_fingerprint():
    from protomolt_jobs.workflow.effects import fingerprint

    with_tests = _wf(SEQ, [_case(mocks=ALL_OK)])
    without = {k: v for k, v in with_tests.items() if k != "tests"}
    other = copy.deepcopy(with_tests)
    other["tests"][0]["name"] = "renamed"
    prints = [fingerprint(parse_workflow(d, Runtime())) for d in (with_tests, without, other)]
    assert prints[0].definition_sha256 == prints[1].definition_sha256
    assert prints[2].definition_sha256 == prints[1].definition_sha256
    changed = copy.deepcopy(without)
    changed["steps"][0]["deadlineMs"] = 5
    assert fingerprint(parse_workflow(changed, Runtime())).definition_sha256 != (
        prints[1].definition_sha256
    )


def test_a_parks_answer_gives_the_run_its_attempts_back():
    steps, case = ATTEMPTS_STEPS, ATTEMPTS_BACK
    got = _only(_wf(steps, [case]))
    assert got["passed"] is True, got
    assert got["actual"]["attempts"] == 2 + 3  # claims: a's two, then c's three after the park
