"""Approval steps in the definition (docs/approvals.md *The approval object*, *Decisions and
edges*): each malformed key refused naming it, the verifier's approval findings, and the graph
decisions over decision edges. No services: nothing here calls a step."""

from __future__ import annotations

import copy

import pytest

from protomolt_jobs.workflow import Runtime, WorkflowParseError, parse_workflow, verify
from protomolt_jobs.workflow.approval import approver_refusal, sequential_failure
from protomolt_jobs.workflow.graph import NOT_TAKEN, GraphState, simulate
from tests.support.graphs import graph, step

T = "127.0.0.1:9"


def review(**approval) -> dict:
    spec = {"approvers": {"roles": ["editor"]}, **approval}
    return {"name": "review", "after": ["draft"], "completion": "approval", "approval": spec}


def flow(review_step: dict, *more: dict) -> dict:
    return graph([step("draft", T), review_step, *more])


def branches() -> list[dict]:
    return [
        step("publish", T, after=[{"step": "review", "on": "decision:accept"}]),
        step("rework", T, after=[{"step": "review", "on": "decision:fix"}]),
    ]


def parse(obj: dict):
    return parse_workflow(obj, Runtime())


def test_a_complete_approval_graph_verifies_and_simulates_accept():
    wf = parse(
        flow(
            review(
                quorum=2,
                decisions=["accept", "fix", "reject"],
                veto=["reject"],
                end={"reject": "fail"},
            ),
            *branches(),
        )
    )
    assert verify(wf) == []
    spec = wf.step("review").approval
    assert (spec.quorum, spec.decisions, spec.veto) == (2, ("accept", "fix", "reject"), ("reject",))
    assert wf.step("review").parks and not wf.step("review").external
    sim = simulate(wf)["allSucceed"]
    assert sim["status"] == "COMPLETED"
    assert sim["skipped"] == [{"step": "rework", "reason": f"{NOT_TAKEN}review decided accept"}]


@pytest.mark.parametrize(
    ("approval", "message"),
    [
        ({"approvers": []}, "'approval.approvers' must be an object"),
        ({"approvers": {"groups": ["x"]}}, "'approval.approvers' must be an object"),
        ({"approvers": {}}, "names no role and no principal"),
        ({"approvers": {"roles": [""]}}, "'approval.approvers.roles' must be an array"),
        ({"approvers": {"principals": ["a"]}, "quorum": 2}, "'approval.quorum' 2 exceeds the 1"),
        ({"approvers": {"roles": ["e"]}, "quorum": 0}, "'approval.quorum' must be a whole number"),
        ({"approvers": {"roles": ["e"]}, "quorum": True}, "'approval.quorum' must be a whole"),
        ({"approvers": {"roles": ["e"]}, "decisions": ["a b"]}, "'approval.decisions': 'a b'"),
        ({"approvers": {"roles": ["e"]}, "veto": ["nope"]}, "'approval.veto' names 'nope'"),
        ({"approvers": {"roles": ["e"]}, "end": {"nope": "fail"}}, "'approval.end' names 'nope'"),
        ({"approvers": {"roles": ["e"]}, "end": {"reject": "accept"}}, "'approval.end.reject'"),
        ({"approvers": {"roles": ["e"]}, "distinctFrom": ["review"]}, "names the step itself"),
        ({"approvers": {"roles": ["e"]}, "expiry": "P1D"}, "unknown key(s) expiry"),
    ],
)
def test_a_malformed_approval_key_is_refused_naming_it(approval, message):
    obj = flow({"name": "review", "completion": "approval", "approval": approval})
    with pytest.raises(WorkflowParseError) as refused:
        parse(obj)
    assert message in str(refused.value)
    assert refused.value.step == "review"


def test_an_approval_step_makes_no_call_and_approval_needs_the_completion():
    with pytest.raises(WorkflowParseError, match="makes no call"):
        parse(flow({**review(), "target": T, "method": "jobs.test.Steps/Run"}))
    with pytest.raises(WorkflowParseError, match="'approval' is only for a step with completion"):
        parse(flow({**step("review", T), "approval": {"approvers": {"roles": ["e"]}}}))
    with pytest.raises(WorkflowParseError, match="needs an 'approval' object"):
        parse(flow({"name": "review", "completion": "approval"}))


def test_a_declared_decision_without_edge_or_end_is_a_finding_naming_it():
    obj = flow(review(decisions=["accept", "fix", "reject"]), branches()[0])
    findings = verify(parse(obj))
    assert [(f.step, f.kind) for f in findings] == [("review", "approval")] * 2
    assert "decision 'fix' has no edge" in findings[0].error
    assert "decision 'reject' has no edge" in findings[1].error
    # an end covers a decision; on: done covers all of them
    assert verify(parse(flow(review(end={"reject": "fail"}), branches()[0]))) == []
    done = step("log", T, after=[{"step": "review", "on": "done"}])
    assert verify(parse(flow(review(decisions=["accept", "fix"]), done))) == []


def test_decision_edges_must_name_an_approval_step_and_a_declared_decision():
    obj = flow(
        review(end={"reject": "fail"}),
        step("a", T, after=[{"step": "review", "on": "decision:maybe"}]),
        step("b", T, after=[{"step": "draft", "on": "decision:accept"}]),
    )
    errors = {f.step: f.error for f in verify(parse(obj))}
    assert "decision 'maybe' is not one of accept, reject" in errors["a"]
    assert "'draft' is not one" in errors["b"]
    with pytest.raises(WorkflowParseError, match="'decision:<name>'"):
        parse(flow(review(), step("c", T, after=[{"step": "review", "on": "decision:"}])))


def test_distinct_from_names_approval_steps_only():
    obj = flow(review(distinctFrom=["draft"], end={"reject": "fail"}))
    assert [f.error for f in verify(parse(obj))] == [
        "approval.distinctFrom names 'draft', which is not an approval step"
    ]


def test_a_sequential_approval_step_needs_no_edges():
    obj = graph(
        [step("draft", T), {k: v for k, v in review().items() if k != "after"}, step("publish", T)]
    )
    wf = parse(obj)
    assert not wf.graph and verify(wf) == []
    review_step = wf.step("review")
    assert sequential_failure(review_step, "accept") is None
    assert "decided 'reject'" in sequential_failure(review_step, "reject").message
    ended = copy.deepcopy(obj)
    ended["steps"][1]["approval"]["end"] = {"reject": "complete"}
    assert sequential_failure(parse(ended).step("review"), "reject") is None


def test_who_may_vote():
    spec_step = parse(
        flow(
            review(end={"reject": "fail"})
            | {"approval": {"approvers": {"roles": ["editor"], "principals": ["carol"]}}}
        )
    ).step("review")
    assert approver_refusal(spec_step, "carol", []) is None
    assert approver_refusal(spec_step, "bob", ["editor"]) is None
    assert approver_refusal(spec_step, "mallory", ["intern"]) == (
        "'mallory' is not an approver of step 'review' (approvers: role 'editor', "
        "principal 'carol')"
    )


def test_a_skip_behind_a_branch_not_taken_is_not_taken_too():
    obj = flow(
        review(decisions=["accept", "fix"]),
        *branches(),
        step("announce", T, after=["publish"]),
    )
    wf = parse(obj)
    state = GraphState(wf)
    state.ended("draft", "succeeded")
    state.ended("review", "succeeded", "", "fix")
    start, skip = state.next()
    assert [s.name for s in start] == ["rework"]
    for s, reason in skip:
        state.ended(s.name, "skipped", reason)
    _, skip = state.next()
    assert [(s.name, r) for s, r in skip] == [("announce", f"{NOT_TAKEN}review decided fix")]
    state.ended("announce", "skipped", skip[0][1])
    state.ended("rework", "succeeded")
    assert state.verdict()[0] is True


def test_timers_parse_and_never_accept():
    wf = parse(
        flow(
            review(
                end={"reject": "fail"},
                expires="P3D",
                onExpire="reject",
                escalate=[
                    {"after": "PT24H", "addRoles": ["chief-editor"]},
                    {"after": "PT1H", "addPrincipals": ["carol"]},
                ],
            ),
            branches()[0],
        )
    )
    spec = wf.step("review").approval
    assert spec.expires_s == 3 * 86400 and spec.on_expire == "reject"
    assert spec.escalate == ((3600.0, (), ("carol",)), (86400.0, ("chief-editor",), ()))
    from protomolt_jobs.workflow.approval import timers_of

    assert [(t["kind"], t["afterS"]) for t in timers_of(wf.step("review"))] == [
        ("escalate", 3600.0),
        ("escalate", 86400.0),
        ("expire", 259200.0),
    ]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"expires": "3 days"}, "'approval.expires' must be a positive ISO-8601 duration"),
        ({"expires": "PT0S"}, "'approval.expires' must be a positive ISO-8601 duration"),
        ({"expires": "P1D", "onExpire": "accept"}, "an expiry never accepts"),
        ({"onExpire": "fail"}, "'approval.onExpire' needs 'approval.expires'"),
        ({"escalate": {"after": "PT1H"}}, "'approval.escalate' must be an array"),
        ({"escalate": [{"after": "PT1H"}]}, "'approval.escalate[0]' adds no role"),
        ({"escalate": [{"after": "soon", "addRoles": ["c"]}]}, "escalate[0]'.after must be"),
        (
            {"escalate": [{"after": "PT1H", "addRoles": ["c"], "lowerQuorum": 1}]},
            "must be an object",
        ),
        (
            {"expires": "PT1H", "escalate": [{"after": "PT2H", "addRoles": ["c"]}]},
            "is not before 'approval.expires'",
        ),
    ],
)
def test_malformed_timers_are_refused_naming_the_key(keys, message):
    with pytest.raises(WorkflowParseError) as refused:
        parse(flow(review(end={"reject": "fail"}, **keys)))
    assert message in str(refused.value)


def test_on_expire_reject_needs_a_reject_decision():
    with pytest.raises(WorkflowParseError, match="not a declared decision"):
        parse(flow(review(decisions=["accept", "fix"], expires="P1D")))
