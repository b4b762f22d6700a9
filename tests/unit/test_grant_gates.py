"""Grant gates without a database: the timer keys of ``[[jobs.grants]]`` (errors name the
key), joining several grants into one gate, who may vote (escalations widen it), the park's
timers, and what a run without capability steps costs (nothing: no read, no call)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig, parse_grants
from protomolt_jobs.runs.grant_gates import gate_of
from protomolt_jobs.worker.grants import GateDecision, GrantPolicy
from protomolt_jobs.workflow.step_run import GrantGate, authorize
from protomolt_jobs.workflow.types import APPROVAL, Step


def _step(capabilities=("deploy:prod",)):
    return Step(
        index=0, name="deploy", target="t", tls=False, method=None, method_name="",
        input_type=None, output_type=None, when="", rules=(), cel_rules=(), validate=False,
        deadline_ms=0, completion="", capabilities=tuple(capabilities),
    )  # fmt: skip


def _gated(**keys):
    return {
        "capabilities": ["deploy:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
        **keys,
    }


@pytest.mark.parametrize(
    ("keys", "text"),
    [
        ({"expires": "soon"}, "jobs.grants[0].expires must be a positive ISO-8601 duration"),
        ({"expires": "PT0S"}, "jobs.grants[0].expires must be a positive ISO-8601 duration"),
        ({"onExpire": "reject"}, "jobs.grants[0].onExpire needs jobs.grants[0].expires"),
        (
            {"expires": "PT1H", "onExpire": "accept"},
            "jobs.grants[0].onExpire must be reject, fail or pause (an expiry never accepts)",
        ),
        ({"escalate": {"after": "PT1H"}}, "jobs.grants[0].escalate must be a list of tables"),
        (
            {"escalate": [{"after": "PT1H", "addRoles": ["x"], "when": 1}]},
            "jobs.grants[0].escalate[0] must be a table",
        ),
        ({"escalate": [{"after": "1h", "addRoles": ["x"]}]}, "escalate[0].after must be"),
        ({"escalate": [{"after": "PT1H"}]}, "jobs.grants[0].escalate[0] adds no role"),
        (
            {"escalate": [{"after": "PT1H", "addRoles": ["no good"]}]},
            "jobs.grants[0].escalate[0].addRoles must be a list of names",
        ),
        (
            {"expires": "PT1H", "escalate": [{"after": "PT2H", "addRoles": ["x"]}]},
            "jobs.grants[0].escalate[0].after is not before jobs.grants[0].expires",
        ),
    ],
)
def test_malformed_gate_timers_are_config_errors_naming_the_key(keys, text):
    with pytest.raises(ConfigError) as exc:
        parse_grants([_gated(**keys)])
    assert text in str(exc.value)


@pytest.mark.parametrize("key", ["expires", "onExpire", "escalate"])
def test_timer_keys_are_for_needs_approval_grants_only(key):
    with pytest.raises(
        ConfigError, match=rf"jobs.grants\[0\].{key} is for decision needs-approval"
    ):
        parse_grants([{"capabilities": ["a"], key: "PT1H"}])


def test_grant_timers_parse_from_json_text():
    config = JobsConfig.from_mapping(
        {
            "grants": '[{"capabilities": ["deploy:prod"], "decision": "needs-approval", '
            '"approvers": {"roles": ["chief"]}, "expires": "P2D", "onExpire": "pause", '
            '"escalate": [{"after": "PT4H", "addRoles": ["cto"], "addPrincipals": ["ann"]}]}]'
        }
    )
    (grant,) = config.grants
    assert (grant.expires_s, grant.on_expire) == (172_800.0, "pause")
    assert grant.escalate == ((14_400.0, ("cto",), ("ann",)),)


def test_several_grants_join_into_one_gate_with_the_earliest_expiry():
    grants = parse_grants(
        [
            _gated(
                expires="PT10M", onExpire="fail", escalate=[{"after": "PT5M", "addRoles": ["a"]}]
            ),
            _gated(
                approvers={"principals": ["ann"]},
                quorum=2,
                expires="PT2M",
                escalate=[{"after": "PT1M", "addPrincipals": ["bob"]}],
            ),
            {"capabilities": ["deploy:prod"]},  # an allow: never part of a gate
        ]
    )
    gate = gate_of(grants, ["jobs.grants[0]", "jobs.grants[1]", "jobs.grants[2]"])
    assert gate.rules == ("jobs.grants[0]", "jobs.grants[1]")
    assert gate.roles == {"chief"} and gate.principals == {"ann"} and gate.quorum == 2
    assert (gate.expires_s, gate.on_expire) == (120.0, "reject")
    timers = gate.timers("deploy")
    assert [(t["kind"], t["afterS"]) for t in timers] == [
        ("escalate", 60.0),
        ("escalate", 300.0),
        ("expire", 120.0),
    ]
    assert all(t["gate"] == "grant" for t in timers)
    assert timers[-1]["error"] == (
        "PERMISSION: the grant gate of step 'deploy' expired (decision jobs.grants[0],jobs.grants[1])"
    )
    # who may vote: the approvers, then those a fired escalation added
    assert gate.refusal("ann", []) is None and gate.refusal("carl", ["chief"]) is None
    assert "not an approver of this grant gate" in gate.refusal("bob", ["writer"])
    fired = [dict(timers[0], fired=True), dict(timers[1])]
    assert gate.refusal("bob", ["writer"], fired) is None
    assert gate.refusal("dan", ["a"], fired) is not None  # not fired yet


def _job(**kw):
    return SimpleNamespace(job_id="j1", workflow_name="w", submitted_by="ed", attempt=1, **kw)


def test_an_open_gate_parks_with_its_timers_and_reads_the_groups_once():
    grants = parse_grants(
        [_gated(expires="PT1H"), {"capabilities": ["ops:restart"], "groups": ["ops"]}]
    )
    reads = []

    def recorded():
        reads.append(1)
        return ("ops",)

    check = GrantPolicy(grants).check_for(_job(), {}, lambda job_id, step: None, recorded)
    # a step without capabilities asks nothing: no read of the groups, no decision
    assert authorize(_step(()), check, can_park=True) is None
    assert reads == []
    with pytest.raises(GrantGate) as gate:
        authorize(_step(), check, can_park=True)
    assert gate.value.parked.wait_kind == APPROVAL and gate.value.parked.step == "deploy"
    assert [t["kind"] for t in gate.value.parked.timers] == ["expire"]
    decision = check(_step())
    assert isinstance(decision, GateDecision) and decision.decision == "needs-approval"
    # the recorded groups (an identity hook's 'ops') grant ops:restart; read once per segment
    assert authorize(_step(("ops:restart",)), check)["decisionId"] == "jobs.grants[1]"
    assert reads == [1]


def test_without_recorded_groups_a_grant_by_group_does_not_apply():
    grants = parse_grants([{"capabilities": ["ops:restart"], "groups": ["ops"]}])
    check = GrantPolicy(grants).check_for(_job(), {}, None, lambda: None)
    assert check(_step(("ops:restart",))).decision == "deny"


def test_the_groups_are_not_read_when_no_grant_names_a_group_and_no_hook_asks():
    grants = parse_grants([{"capabilities": ["deploy:prod"], "workflows": ["w"]}])

    def recorded():
        raise AssertionError("read the recorded groups for nothing")

    check = GrantPolicy(grants).check_for(_job(), {}, None, recorded)
    assert authorize(_step(), check)["decisionId"] == "jobs.grants[0]"
