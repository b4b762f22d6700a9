"""Policy floors (docs/approvals.md *Policy floors*; ``workflow/floors.py``): the configuration
refused naming the key, selection by step, workflow and capabilities (read from the raw
definition), the order a step must keep (quorum, approvers with escalations, vetoes), the meet
of several floors and the policy hash. No services: nothing here calls a step."""

from __future__ import annotations

import pytest

from protomolt_jobs.app import node_floors
from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow.floors import (
    FloorError,
    compile_floors,
    findings,
    policy_sha256,
    requirement,
    selecting,
)
from tests.support.graphs import graph, step

T = "127.0.0.1:9"
FLOOR = {
    "name": "desk",
    "when": "step == 'review'",
    "quorum": 2,
    "approvers": {"roles": ["editor", "chief"]},
}


def review(**approval) -> dict:
    spec = {"approvers": {"roles": ["editor"]}, "quorum": 2, **approval}
    return {"name": "review", "after": ["draft"], "completion": "approval", "approval": spec}


def parsed(*steps: dict, name: str = "newsroom"):
    obj = graph([step("draft", T), *steps])
    obj["name"] = name
    return parse_workflow(obj, Runtime())


def kinds_and_errors(wf, floors) -> list[tuple[str, str, str]]:
    return [(f.step, f.kind, f.error) for f in findings(wf, floors)]


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"when": "true"}, "jobs.approval_floors[0].name"),
        ({"name": "a"}, "jobs.approval_floors[0].when"),
        ({"name": "a", "when": "step =="}, "jobs.approval_floors[0].when"),
        ({"name": "a", "when": "true", "quorum": 0}, "jobs.approval_floors[0].quorum"),
        ({"name": "a", "when": "true", "quorum": True}, "jobs.approval_floors[0].quorum"),
        ({"name": "a", "when": "true", "approvers": {}}, "jobs.approval_floors[0].approvers"),
        (
            {"name": "a", "when": "true", "approvers": {"roles": [""]}},
            "jobs.approval_floors[0].approvers.roles",
        ),
        ({"name": "a", "when": "true", "veto": "reject"}, "jobs.approval_floors[0].veto"),
        ({"name": "a", "when": "true", "quorom": 2}, "jobs.approval_floors[0].quorom"),
    ],
)
def test_a_malformed_floor_is_refused_naming_its_key(table, key):
    with pytest.raises(FloorError) as caught:
        compile_floors([table])
    assert caught.value.key == key and str(caught.value).startswith(key)
    config = JobsConfig.from_mapping({"approval_floors": [table]})
    with pytest.raises(ConfigError, match=r"^" + key.replace("[", r"\[").replace("]", r"\]")):
        node_floors(config)


def test_two_floors_may_not_share_a_name_and_json_text_is_read():
    with pytest.raises(FloorError, match=r"approval_floors\[1\]\.name"):
        compile_floors([{"name": "a", "when": "true"}, {"name": "a", "when": "false"}])
    config = JobsConfig.from_mapping({"approval_floors": '[{"name": "a", "when": "true"}]'})
    assert [f.name for f in node_floors(config)] == ["a"]
    with pytest.raises(ConfigError, match="jobs.approval_floors"):
        JobsConfig.from_mapping({"approval_floors": "[1]"})


def test_a_step_at_least_as_strict_passes_and_a_weaker_one_names_the_rule():
    floors = compile_floors([FLOOR])
    assert findings(parsed(review(quorum=3, veto=["reject"])), floors) == []
    assert kinds_and_errors(parsed(review(quorum=1)), floors) == [
        (
            "review",
            "weakens_policy",
            (
                "policy floor 'desk' (when: step == 'review'): approval.quorum 1 is below the "
                "floor's quorum 2"
            ),
        )
    ]
    wider = review(escalate=[{"after": "PT1H", "addPrincipals": ["mallory"]}])
    assert (
        "principal 'mallory', outside the floor's approvers"
        in findings(parsed(wider), floors)[0].error
    )
    vetoed = review(veto=["accept"])
    assert "lets one vote decide accept" in findings(parsed(vetoed), floors)[0].error


def test_a_selected_step_that_is_no_approval_step_must_become_one():
    floors = compile_floors([{"name": "all-publish", "when": "step == 'draft'", "quorum": 2}])
    [finding] = findings(parsed(), floors)
    assert finding.step == "draft" and finding.kind == "weakens_policy"
    assert "must be an approval step" in finding.error and "quorum >= 2" in finding.error


def test_capabilities_and_workflow_select_from_the_raw_definition():
    floors = compile_floors(
        [
            {
                "name": "publishing",
                "when": "capabilities.exists(c, c.startsWith('publish:'))",
                "quorum": 2,
            },
            {"name": "other-desk", "when": "workflow == 'sports'", "quorum": 5},
        ]
    )
    wf = parsed({**step("publish", T, after=["draft"]), "capabilities": ["publish:site"]})
    assert [f.name for f in selecting(floors, wf, wf.step("publish"))] == ["publishing"]
    assert selecting(floors, wf, wf.step("draft")) == ()
    sports = parsed(name="sports")
    assert [f.name for f in selecting(floors, sports, sports.step("draft"))] == ["other-desk"]


def test_a_selector_that_fails_selects_the_step():
    floors = compile_floors([{"name": "odd", "when": "capabilities[3] == 'x'"}])
    wf = parsed()
    assert [f.name for f in selecting(floors, wf, wf.step("draft"))] == ["odd"]


def test_the_meet_takes_the_greatest_quorum_common_vetoes_and_every_approver_bound():
    floors = compile_floors(
        [
            FLOOR,
            {
                "name": "chiefs",
                "when": "true",
                "quorum": 3,
                "approvers": {"roles": ["chief"]},
                "veto": [],
            },
        ]
    )
    need = requirement(floors)
    assert need is not None
    assert (need.rules, need.quorum, need.veto) == (("desk", "chiefs"), 3, frozenset())
    assert need.approver_refusal("ed-1", ["editor"]) == (
        "'ed-1' is not within the approvers of policy floor 'chiefs' (role 'chief')"
    )
    assert need.approver_refusal("c-1", ["chief"]) is None
    assert requirement(()) is None


def test_the_policy_hash_is_over_the_canonical_floors_in_name_order():
    a, b = compile_floors([FLOOR, {"name": "a", "when": "true"}])
    assert policy_sha256([a, b]) == policy_sha256([b, a])
    assert policy_sha256([a]) != policy_sha256(compile_floors([{**FLOOR, "quorum": 3}]))
    assert len(policy_sha256([a])) == 64
