"""Capabilities and grants without a database: the step key, ``[[jobs.grants]]`` parsing (errors
name the key), the ``[[jobs.grants]]`` decision and the engine's check (DESIGN.md section 21)."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig, parse_grants
from protomolt_jobs.hooks.contract import StepDecision
from protomolt_jobs.worker.grants import DENY_ID, GrantPolicy
from protomolt_jobs.workflow.step_run import GrantGate, authorize
from protomolt_jobs.workflow.types import FailureKind, Step, WorkflowExecutionError


def _step(capabilities=("publish:site",)):
    return Step(
        index=0, name="publish", target="t", tls=False, method=None, method_name="",
        input_type=None, output_type=None, when="", rules=(), cel_rules=(), validate=False,
        deadline_ms=0, completion="", capabilities=tuple(capabilities),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ({"grants": "nope"}, "jobs.grants must be a JSON object"),
        ({"grants": [{"workflows": ["a"]}]}, "jobs.grants[0].capabilities must be a non-empty"),
        ({"grants": [{"capabilities": []}]}, "jobs.grants[0].capabilities must be a non-empty"),
        ({"grants": [{"capabilities": ["a b"]}]}, "jobs.grants[0].capabilities must be"),
        ({"grants": [{"capabilities": ["a"], "groupz": ["x"]}]}, "unknown key jobs.grants[0].groupz"),
        ({"grants": [{"capabilities": ["a"], "decision": "yes"}]}, "jobs.grants[0].decision must"),
        ({"grants": [{"capabilities": ["a"], "quorum": 2}]}, "jobs.grants[0].quorum is for"),
        ({"grants": [{"capabilities": ["a"]}, 3]}, "jobs.grants[1] must be a table"),
        (
            {"grants": [{"capabilities": ["a"], "decision": "needs-approval"}]},
            "jobs.grants[0].approvers must be a table",
        ),
        (
            {"grants": [{"capabilities": ["a"], "decision": "needs-approval",
                         "approvers": {"roles": ["editor"]}, "quorum": 0}]},
            "jobs.grants[0].quorum must be a whole number from 1 to 100",
        ),
        (
            {"grants": [{"capabilities": ["a"], "decision": "needs-approval",
                         "approvers": {"roles": "editor"}}]},
            "jobs.grants[0].approvers.roles must be a list",
        ),
    ],
)  # fmt: skip
def test_malformed_grants_are_config_errors_naming_the_key(raw, text):
    with pytest.raises(ConfigError) as exc:
        JobsConfig.from_mapping(raw)
    assert text in str(exc.value)


def test_grants_parse_from_toml_tables_and_json_text():
    config = JobsConfig.from_mapping(
        {"grants": '[{"capabilities": ["publish:site"], "workflows": ["w"], "groups": ["ed"]}]'}
    )
    (grant,) = config.grants
    assert grant.rule == "jobs.grants[0]" and grant.decision == "allow"
    assert grant.capabilities == {"publish:site"} and grant.workflows == {"w"}
    assert JobsConfig.from_mapping({}).grants == ()


def _decide(grants, workflow="w", submitter="ed-1", capabilities=("publish:site",)):
    policy = GrantPolicy(
        parse_grants(grants), groups_of=lambda p: frozenset({"editor"} if p == "ed-1" else ())
    )
    job = {"workflowName": workflow, "submittedBy": submitter}
    return policy.from_grants(job, capabilities)


def test_every_capability_needs_a_grant_that_applies():
    grants = [
        {"capabilities": ["publish:site"], "workflows": ["w"], "groups": ["editor"]},
        {"capabilities": ["read:db"], "principals": ["intern"]},
    ]
    assert _decide(grants) == StepDecision("allow", "granted by jobs.grants[0]", "jobs.grants[0]")
    denied = _decide(grants, submitter="intern")
    assert denied.decision == "deny" and denied.decision_id == DENY_ID
    assert "capability publish:site is not granted to workflow 'w' submitted by intern" in (
        denied.reason
    )
    assert _decide(grants, workflow="other").decision == "deny"
    assert _decide(grants, submitter=None).reason.endswith("with no recorded submitter")
    both = _decide(grants, capabilities=("publish:site", "read:db"))
    assert both.decision == "deny" and "capability read:db" in both.reason
    # a grant naming no submitter applies to every submitter, a recorded one or not
    gated = [{"capabilities": ["publish:site"], "decision": "needs-approval",
              "approvers": {"roles": ["chief"]}, "quorum": 2}]  # fmt: skip
    asked = _decide(gated + grants[1:])
    assert (asked.decision, asked.decision_id) == ("needs-approval", "jobs.grants[0]")
    # an allow grant wins over a needs-approval one for the same capability
    assert _decide(gated + grants).decision == "allow"
    open_grant = [{"capabilities": ["publish:site"]}]
    assert _decide(open_grant, submitter=None).decision == "allow"
    assert _decide([], submitter="ed-1").decision == "deny"


def test_an_authorizer_answers_first_and_none_falls_through_to_the_grants():
    class Hook:
        def __init__(self, answer):
            self.answer = answer

        def authorize_step(self, job, step, capabilities):
            return self.answer

    grants = parse_grants([{"capabilities": ["publish:site"]}])
    job = {"workflowName": "w", "submittedBy": "x"}
    no_opinion = GrantPolicy(grants, authorizers=[Hook(None)])
    assert no_opinion.decide(job, "publish", ("publish:site",)).decision == "allow"
    deny = StepDecision("deny", "frozen", "opa:1")
    assert GrantPolicy(grants, authorizers=[Hook(deny)]).decide(job, "s", ("a",)) is deny
    with pytest.raises(TypeError):
        GrantPolicy(grants, authorizers=[Hook("allow")]).decide(job, "s", ("a",))


def test_the_engine_check_costs_nothing_without_capabilities_and_names_the_decision():
    calls = []

    def check(step):
        calls.append(step.name)
        return StepDecision("allow", "ok", "r1")

    assert authorize(_step(()), check) is None and calls == []
    assert authorize(_step(), None) is None
    assert authorize(_step(), check) == {
        "decision": "allow",
        "reason": "ok",
        "decisionId": "r1",
        "capabilities": ["publish:site"],
    }
    with pytest.raises(WorkflowExecutionError) as exc:
        authorize(_step(), lambda s: StepDecision("deny", "no", "r2"))
    assert exc.value.kind is FailureKind.PERMISSION and not exc.value.retryable
    assert exc.value.detail == "PERMISSION: no (decision r2)"
    with pytest.raises(WorkflowExecutionError) as exc:
        authorize(_step(), lambda s: StepDecision("needs-approval", "gated", "r3"))
    assert exc.value.kind is FailureKind.PERMISSION
    assert "a compensation step cannot wait for one" in exc.value.message
    with pytest.raises(GrantGate) as gate:
        authorize(_step(), lambda s: StepDecision("needs-approval", "gated", "r3"), can_park=True)
    assert (gate.value.parked.step, gate.value.parked.wait_kind) == ("publish", "approval")
    with pytest.raises(WorkflowExecutionError) as exc:
        authorize(_step(), lambda s: 1 / 0)
    assert exc.value.kind is FailureKind.WORKFLOW and exc.value.retryable


@pytest.mark.parametrize("bad", ["publish", ("x", "y"), "", None])
def test_step_decision_refuses_what_it_cannot_record(bad):
    with pytest.raises(ValueError):
        if isinstance(bad, tuple):
            StepDecision("allow", "r", "x" * 201)
        elif bad is None:
            StepDecision("allow", "r", "  ")
        else:
            StepDecision(bad, "r", "id")


def _workflow(**keys):
    from tests.support.grpc_servers import seed_workflow

    wf = seed_workflow("127.0.0.1:9", review="invoke")
    wf["steps"][1].update(keys)
    return wf


def test_the_capabilities_key_parses_sorted_and_unique_onto_the_step():
    from protomolt_jobs.workflow import Runtime, parse_workflow, verify

    wf = parse_workflow(_workflow(capabilities=["b:x", "a", "b:x"]), Runtime())
    assert [s.capabilities for s in wf.steps] == [(), ("a", "b:x"), ()]
    assert verify(wf) == []


@pytest.mark.parametrize("bad", ["publish:site", [1], ["has space"], [""], {"a": 1}])
def test_a_malformed_capabilities_key_is_a_parse_error_naming_the_step(bad):
    from protomolt_jobs.workflow import Runtime, WorkflowParseError, parse_workflow

    with pytest.raises(WorkflowParseError, match="'capabilities' must be a list") as info:
        parse_workflow(_workflow(capabilities=bad), Runtime())
    assert info.value.step == "embed"


def test_a_synchronous_run_refuses_a_capability_step_before_any_call():
    from protomolt_jobs.workflow import Runtime, parse_workflow
    from protomolt_jobs.workflow.runner import CANNOT_GRANT, run

    wf = parse_workflow(_workflow(capabilities=["publish:site"]), Runtime())
    with pytest.raises(WorkflowExecutionError) as exc:
        run(wf, {"text": "a"}, runtime=Runtime())  # 127.0.0.1:9 would refuse a call
    assert exc.value.kind is FailureKind.PERMISSION and exc.value.message == CANNOT_GRANT
    assert exc.value.step == "embed"


def test_a_gate_nobody_may_decide_is_a_denial_and_a_decided_gate_is_the_grant():
    import types

    class Hook:
        def authorize_step(self, job, step, capabilities):
            return StepDecision("needs-approval", "ask a human", "opa:9")

    job = types.SimpleNamespace(job_id="j", workflow_name="w", submitted_by="x", attempt=1)
    asked = []

    def gate(job_id, step):
        asked.append((job_id, step))

    # no [[jobs.grants]] needs-approval entry names approvers: denied, the store not asked
    check = GrantPolicy((), authorizers=[Hook()]).check_for(job, {}, gate)
    denied = check(_step())
    assert denied.decision == "deny" and "no [[jobs.grants]] needs-approval" in denied.reason
    assert asked == []
    gated = parse_grants(
        [{"capabilities": ["publish:site"], "decision": "needs-approval",
          "approvers": {"principals": ["boss"]}}]
    )  # fmt: skip
    policy = GrantPolicy(gated)
    assert policy.check_for(job, {}, gate)(_step()).decision == "needs-approval"
    assert asked == [("j", "publish")]
    accepted = policy.check_for(job, {}, lambda j, s: ("accept", "boss", 12))(_step())
    assert (accepted.decision, accepted.decision_id) == ("allow", "gate:12")
    rejected = policy.check_for(job, {}, lambda j, s: ("reject", "boss", 13))(_step())
    assert rejected.decision == "deny" and "the gate decided reject (boss)" in rejected.reason
