"""Breaker tests for issue 26 (authority and approvals): real PostgreSQL, a real node over HTTP
and gRPC with real tokens, an identity hook and an authorize_step hook as plugins, and the
``Steps/Run`` test service on loopback. Each test asserts the RIGHT behaviour: a pass is a hole
not found, a failure a bug report.

Found and fixed since (the tests assert the fixed behaviour): a step covered by two
needs-approval grants got only the first grant's approvers and quorum (worker/grants.py); a
grant gate's decision survived retry-step, so an accepted gate re-ran its step without a new
approval and a rejected one could never be tried again (queries.sql grant_gate_decision)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from protomolt_jobs.hooks import hookimpl
from protomolt_jobs.hooks.contract import Identity
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.graphs import graph, step
from tests.support.node import http, node_environ, wait_for

ROOT = "root-secret"
TOKENS = {
    "ed-1": "ed-1-secret",
    "ed-2": "ed-2-secret",
    "ed-3": "ed-3-secret",
    "multi": "multi-secret",  # in editor and intern
    "rv-1": "rv-1-secret",  # group reviewer: an approver role, but no job-approve scope
    "loner": "loner-secret",  # in no group; scopes granted to the principal itself
    "intern-viewer": "intern-secret",
    "chief-1": "chief-secret",
    "alpha-1": "alpha-token-1",  # identity hook: principal alpha, group editor
    "alpha-2": "alpha-token-2",  # identity hook: principal alpha again
}

NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
ed-1 = "ed-1-secret"
ed-2 = "ed-2-secret"
ed-3 = "ed-3-secret"
multi = "multi-secret"
rv-1 = "rv-1-secret"
loner = "loner-secret"
intern-viewer = "intern-secret"
chief-1 = "chief-secret"
[node.groups]
editor = ["ed-1", "ed-2", "ed-3", "multi"]
intern = ["intern-viewer", "multi"]
reviewer = ["rv-1"]
chief = ["chief-1"]
[node.scopes]
editor = ["service-invoke", "workflow-run", "job-approve", "job-complete"]
intern = ["service-invoke"]
reviewer = ["service-invoke", "workflow-run"]
chief = ["service-invoke", "job-approve", "workflow-run"]
loner = ["service-invoke", "workflow-run", "job-approve"]

[[jobs.grants]]
capabilities = ["publish:site"]
workflows = ["other-flow"]
groups = ["editor"]

[[jobs.grants]]
capabilities = ["deploy:prod"]
decision = "needs-approval"
approvers = {{ roles = ["chief"] }}

[[jobs.grants]]
capabilities = ["deploy:prod"]
decision = "needs-approval"
approvers = {{ roles = ["editor"] }}
quorum = 2

[[jobs.grants]]
capabilities = ["hook:boom", "hook:junk"]

[[jobs.approval_floors]]
name = "ship-floor"
when = "step == 'ship'"
quorum = 2
approvers = {{ roles = ["editor"] }}
"""

SERVICE = "/ai.pipestream.proto.service.v1.ProtoMoltService"


class Identities:
    """An identity hook: two tokens of one principal ``alpha`` (group editor)."""

    @hookimpl
    def protomolt_resolve_identity(self, token):
        if token in ("alpha-token-1", "alpha-token-2"):
            return Identity("alpha", frozenset({"editor"}))
        return None


class BrokenIdentity:
    """An identity hook that raises for one token and answers a reserved principal for another."""

    @hookimpl
    def protomolt_resolve_identity(self, token):
        if token == "boom-token":
            raise RuntimeError("directory down")
        if token == "sweeper-token":
            return Identity("sweeper", frozenset({"editor"}))
        if token == "bad-name-token":
            return Identity("Bad Name\x00", frozenset({"editor"}))
        return None


class Authorizer:
    """An authorize_step hook: raises for ``hook:boom``, answers junk for ``hook:junk``."""

    @hookimpl
    def protomolt_authorize_step(self, job, step, capabilities):
        if "hook:boom" in capabilities:
            raise RuntimeError("policy engine down")
        if "hook:junk" in capabilities:
            return "allow"  # not a StepDecision: must never count as a grant
        return None


def start(tmp_path, dsn, **jobs):
    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(NODE)
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", dsn, **jobs))
    return start_surfaces(compose(config, extra_plugins=[Identities(), Authorizer()]), config)


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start(tmp_path, fresh_dsn, sweep_interval_ms=100, max_attempts=2)
    try:
        yield surfaces
    finally:
        surfaces.close()


def post(url, verb, body, who):
    token = ROOT if who == "root" else TOKENS[who]
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def get_job(url, job_id):
    status, answer, _ = post(url, "get-job", {"jobId": job_id}, "root")
    assert status == 200, answer
    return answer["job"]


def history(url, job_id):
    status, answer, _ = post(url, "job-history", {"jobId": job_id}, "root")
    assert status == 200 and answer["ok"], answer
    return answer


def submit(url, workflow, who="ed-1"):
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, who)
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def review_step(**approval):
    spec = {"approvers": {"roles": ["editor"]}, "quorum": 2, "end": {"reject": "fail"}}
    spec.update(approval)
    return {"name": "review", "after": ["draft"], "completion": "approval", "approval": spec}


def review_flow(target, name="brk-review", **approval):
    return graph(
        [
            step("draft", target),
            review_step(**approval),
            step("publish", target, after=[{"step": "review", "on": "decision:accept"}]),
        ],
        name=name,
    )


def waiting(url, job_id, step_name="review"):
    return wait_for(
        lambda: (
            (j := get_job(url, job_id))["status"] == "WAITING"
            and j.get("phase") == "waiting_approval"
            and j.get("outstandingStep") == step_name
            and j
        ),
        timeout_s=30,
    )


def vote(url, job_id, who, decision, step_name="review", **extra):
    body = {"jobId": job_id, "stepName": step_name, "decision": decision, **extra}
    return post(url, "approve-step", body, who)


def race(*calls):
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(run, c) for c in calls]]


def grpc_approve(target, request, token):
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(
            f"{SERVICE}/ApproveStep",
            request_serializer=pb.ApproveStepRequest.SerializeToString,
            response_deserializer=pb.ApproveStepResponse.FromString,
        )
        return stub(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)


# --- bad input at every new door ------------------------------------------------------------


def test_bad_input_at_approve_step_is_invalid_input_naming_the_field(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target))
    waiting(url, job_id)
    cases = [
        ({"jobId": 7, "stepName": "review", "decision": "accept"}, "jobId"),
        ({"jobId": "not-a-uuid", "stepName": "review", "decision": "accept"}, "jobId"),
        ({"jobId": job_id, "stepName": ["review"], "decision": "accept"}, "stepName"),
        ({"jobId": job_id, "stepName": "review", "decision": {"a": 1}}, "decision"),
        ({"jobId": job_id, "stepName": "review", "decision": "accept", "comment": 5}, "comment"),
        (
            {"jobId": job_id, "stepName": "review", "decision": "accept", "comment": "x" * 2001},
            "comment",
        ),
        (
            {"jobId": job_id, "stepName": "review", "decision": "accept", "comment": "a\x00b"},
            "comment",
        ),
        ({"jobId": job_id, "stepName": "rev\x00iew", "decision": "accept"}, "stepName"),
        ({"jobId": job_id, "stepName": "review", "decision": "acc\x00ept"}, "decision"),
        ({"jobId": job_id, "stepName": "review", "decision": "maybe"}, "decision"),
        ({"jobId": job_id, "stepName": "nope", "decision": "accept"}, "stepName"),
        ({"jobId": job_id, "stepName": "draft", "decision": "accept"}, "stepName"),
        ({"jobId": job_id, "stepName": "review"}, "decision"),
        ({"stepName": "review", "decision": "accept"}, "jobId"),
    ]
    for body, field in cases:
        status, answer, _ = post(url, "approve-step", body, "ed-2")
        assert status == 400, (body, status, answer)
        assert answer["error"] == "invalid-input", (body, answer)
        assert answer["details"]["field"] == field, (body, answer)
    # an unknown field: invalid-input, never a 500
    status, answer, _ = post(
        url,
        "approve-step",
        {"jobId": job_id, "stepName": "review", "decision": "accept", "bogus": 1},
        "ed-2",
    )
    assert status == 400 and answer["error"] == "invalid-input", answer
    # a job that does not exist: not a 500
    status, answer, _ = vote(url, "00000000-0000-4000-8000-000000000000", "ed-2", "accept")
    assert status in (200, 404) and status != 500, answer
    # a raw body that is not JSON / not an object
    status, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/approve-step",
        raw=b"[1,2]",
        headers={"Authorization": f"Bearer {TOKENS['ed-2']}"},
    )
    assert status == 400, answer
    # gRPC: NUL in the comment and an unknown decision are INVALID_ARGUMENT
    for request in (
        pb.ApproveStepRequest(
            job_id=job_id, step_name="review", decision="accept", comment="a\x00b"
        ),
        pb.ApproveStepRequest(job_id=job_id, step_name="review", decision="maybe"),
        pb.ApproveStepRequest(job_id=job_id, step_name="draft", decision="accept"),
        pb.ApproveStepRequest(job_id="x", step_name="review", decision="accept"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            grpc_approve(node.grpc.target, request, TOKENS["ed-2"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
    # nothing was counted by any of it
    assert get_job(url, job_id)["status"] == "WAITING"
    kinds = [t["kind"] for t in history(url, job_id)["transitions"]]
    assert "vote" not in kinds
    # a whitespace comment is no comment; a 2000-char one is fine
    status, answer, _ = vote(url, job_id, "ed-2", "accept", comment="y" * 2000)
    assert status == 200 and answer["ok"] and answer["tally"] == {"accept": 1}, answer
    # a finished job: ok false, never a 500
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["decided"] is True
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")
    status, answer, _ = vote(url, job_id, "multi", "reject")
    assert status == 200 and answer["ok"] is False, answer
    assert answer["error"] in ("already-decided", "not-open"), answer
    assert history(url, job_id)["integrity"] == "ok"


# --- who is the caller ----------------------------------------------------------------------


def test_the_same_principal_with_a_second_token_may_not_approve_its_own_run(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target), who="alpha-1")
    waiting(url, job_id)
    status, answer, _ = vote(url, job_id, "alpha-2", "accept")
    assert status == 200 and answer["ok"] is False and answer["error"] == "self-approval", answer
    status, answer, _ = vote(url, job_id, "alpha-1", "accept")
    assert answer["ok"] is False and answer["error"] == "self-approval", answer
    denied = [t for t in history(url, job_id)["transitions"] if t["kind"] == "denied"]
    assert [t["actor"] for t in denied] == ["alpha", "alpha"]


def test_one_principal_two_tokens_counts_once(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target), who="ed-1")
    waiting(url, job_id)
    _, a1, _ = vote(url, job_id, "alpha-1", "accept")
    _, a2, _ = vote(url, job_id, "alpha-2", "accept")
    assert a1["ok"] and a1["tally"] == {"accept": 1}, a1
    assert a2["ok"] and a2["decided"] is False and a2["tally"] == {"accept": 1}, a2
    assert get_job(url, job_id)["status"] == "WAITING"


def test_group_membership_scopes_and_the_api_token(node, services):
    url = node.http.url
    job_id = submit(
        url,
        review_flow(
            services.target, approvers={"roles": ["editor", "reviewer"], "principals": ["loner"]}
        ),
    )
    waiting(url, job_id)
    # a principal in several groups: editor makes it an approver, intern takes nothing away
    status, answer, _ = vote(url, job_id, "multi", "accept")
    assert status == 200 and answer["ok"] and answer["tally"] == {"accept": 1}, answer
    # an approver role without the job-approve scope: 403 naming the scope, recorded
    status, answer, _ = vote(url, job_id, "rv-1", "accept")
    assert status == 403 and answer["error"] == "permission-denied", answer
    assert "job-approve" in answer["message"]
    # a group-less token that is not listed: denied; listed as a principal: counts
    status, answer, _ = vote(url, job_id, "intern-viewer", "accept")
    assert status == 403, answer
    # the api token: full rights but no approver unless listed
    status, answer, _ = vote(url, job_id, "root", "accept")
    assert status == 403 and answer["error"] == "permission-denied", answer
    status, answer, _ = vote(url, job_id, "loner", "reject")
    assert status == 200 and answer["ok"], answer
    # reject is a veto by default? (no veto declared: counts as one of two)
    assert answer["tally"] == {"accept": 1, "reject": 1} and answer["decided"] is False, answer
    h = history(url, job_id)
    assert h["integrity"] == "ok"
    denied = {t["actor"] for t in h["transitions"] if t["kind"] == "denied"}
    assert denied == {"rv-1", "intern-viewer", "api"}, denied


def test_without_a_scopes_table_a_non_approver_still_may_not_vote(tmp_path, fresh_dsn, services):
    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    text = NODE.split("[node.scopes]")[0]
    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(text)
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", fresh_dsn))
    surfaces = start_surfaces(compose(config), config)
    try:
        url = surfaces.http.url
        job_id = submit(url, review_flow(services.target))
        waiting(url, job_id)
        status, answer, _ = vote(url, job_id, "intern-viewer", "accept")
        assert status == 403 and answer["error"] == "permission-denied", answer
        status, answer, _ = vote(url, job_id, "rv-1", "accept")  # reviewer: not an approver
        assert status == 403, answer
        status, answer, _ = vote(url, job_id, "ed-2", "accept")
        assert status == 200 and answer["ok"], answer
    finally:
        surfaces.close()


# --- races ----------------------------------------------------------------------------------


def test_votes_racing_expiry_end_one_way(node, services, fresh_dsn):
    """quorum 2, ed-2 voted; ed-3's deciding accept races the expiry (onExpire reject)."""
    import psycopg

    url = node.http.url
    outcomes = {"vote": 0, "expiry": 0}
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        for offset_ms in (-30, 0, 30, 60, 90, 120, 250):
            job_id = submit(url, review_flow(services.target, expires="PT2S", onExpire="reject"))
            waiting(url, job_id)
            _, first, _ = vote(url, job_id, "ed-2", "accept")
            assert first["ok"] and first["tally"] == {"accept": 1}, first

            def near_expiry(j=job_id, offset_ms=offset_ms):
                row = conn.execute(
                    "SELECT wake_at IS NULL OR clock_timestamp() >= wake_at + make_interval("
                    "secs => %s / 1000.0) FROM workflow_run WHERE job_id = %s",
                    (offset_ms, j),
                ).fetchone()
                return row[0]

            wait_for(near_expiry, timeout_s=10, interval_s=0.005)
            _, answer, _ = vote(url, job_id, "ed-3", "accept")
            final = wait_for(
                lambda j=job_id: (x := get_job(url, j))["status"] in ("COMPLETED", "FAILED") and x,
                timeout_s=30,
            )
            h = history(url, job_id)
            assert h["integrity"] == "ok"
            decisions = [t for t in h["transitions"] if t["kind"] == "decision"]
            assert len(decisions) == 1, decisions
            if answer["ok"] and answer.get("decided"):
                assert final["status"] == "COMPLETED", final
                assert decisions[0]["actor"] == "ed-3"
                outcomes["vote"] += 1
            else:
                assert answer["ok"] is False, answer
                assert answer["error"] in ("already-decided", "not-open"), answer
                if answer["error"] == "already-decided":
                    assert answer["decision"] == "reject", answer
                assert final["status"] == "FAILED", final
                assert decisions[0]["actor"] == "sweeper"
                outcomes["expiry"] += 1
    print("expiry races:", outcomes)


def test_escalation_racing_a_vote_is_consistent(node, services, fresh_dsn):
    import psycopg

    url = node.http.url
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        for offset_ms in (-20, 40, 90, 200):
            job_id = submit(
                url,
                review_flow(
                    services.target,
                    quorum=1,
                    escalate=[{"after": "PT1S", "addRoles": ["chief"]}],
                    expires="PT60S",
                ),
            )
            waiting(url, job_id)
            (at,) = conn.execute(
                "SELECT wake_at FROM workflow_run WHERE job_id = %s", (job_id,)
            ).fetchone()
            wait_for(
                lambda at=at, offset_ms=offset_ms: conn.execute(
                    "SELECT clock_timestamp() >= %s + make_interval(secs => %s / 1000.0)",
                    (at, offset_ms),
                ).fetchone()[0],
                timeout_s=10,
                interval_s=0.005,
            )
            status, answer, _ = vote(url, job_id, "chief-1", "accept")
            transitions = history(url, job_id)["transitions"]
            kinds = [(t["kind"], t["actor"]) for t in transitions]
            if status == 200 and answer["ok"]:
                # counted only once the escalation is recorded, before the vote
                assert ("escalate", "sweeper") in kinds, kinds
                assert kinds.index(("escalate", "sweeper")) < kinds.index(("vote", "chief-1"))
            else:
                assert status == 403, answer
                assert ("denied", "chief-1") in kinds
                wait_for(
                    lambda j=job_id: (
                        ("escalate", "sweeper")
                        in [(t["kind"], t["actor"]) for t in history(url, j)["transitions"]]
                    )
                )
                status, answer, _ = vote(url, job_id, "chief-1", "accept")
                assert status == 200 and answer["decided"] is True, answer
            wait_for(lambda j=job_id: get_job(url, j)["status"] == "COMPLETED")
            assert history(url, job_id)["integrity"] == "ok"


def test_a_vote_racing_retry_step_never_counts_the_old_opening(node, services):
    url = node.http.url
    for _ in range(5):
        job_id = submit(url, review_flow(services.target))
        waiting(url, job_id)
        _, first, _ = vote(url, job_id, "ed-2", "accept")
        assert first["tally"] == {"accept": 1}
        status, paused, _ = post(url, "pause-job", {"jobId": job_id}, "root")
        assert status == 200 and paused["ok"], paused
        (vs, answer, _), (rs, retried, _) = race(
            lambda j=job_id: vote(url, j, "ed-3", "accept"),
            lambda j=job_id: post(url, "retry-step", {"jobId": j, "stepName": "review"}, "root"),
        )
        assert rs == 200 and retried["ok"], retried
        assert vs == 200, answer
        # the old opening's vote (ed-2) may never make ed-3's accept decisive
        if answer["ok"]:
            assert answer["decided"] is False and answer["tally"] == {"accept": 1}, answer
        else:
            assert answer["error"] == "not-open", answer
        waiting(url, job_id)
        job = get_job(url, job_id)
        assert not [c for c in job["checkpoints"] if c["name"] == "review"], job
        _, again, _ = vote(url, job_id, "ed-2", "accept")
        assert again["ok"], again
        assert again["tally"]["accept"] == (2 if answer["ok"] else 1), again
        assert history(url, job_id)["integrity"] == "ok"
        post(url, "cancel-job", {"jobId": job_id}, "root")


def test_a_cancel_racing_the_deciding_vote_few(node, services):
    url = node.http.url
    for _ in range(5):
        job_id = submit(url, review_flow(services.target))
        waiting(url, job_id)
        vote(url, job_id, "ed-2", "accept")
        answer, (cs, cancel, _) = race(
            lambda j=job_id: vote(url, j, "ed-3", "accept")[1],
            lambda j=job_id: post(url, "cancel-job", {"jobId": j}, "root"),
        )
        assert cs == 200 and cancel["ok"], cancel
        h = history(url, job_id)
        assert h["integrity"] == "ok"
        kinds = [t["kind"] for t in h["transitions"]]
        if answer["ok"]:
            assert answer["decided"] and kinds.count("decision") == 1
        else:
            assert answer["error"] == "not-open" and "decision" not in kinds, answer


# --- floors ---------------------------------------------------------------------------------


def test_a_floor_selecting_a_non_approval_step_refuses_the_definition(node, services):
    url = node.http.url
    workflow = graph([step("draft", services.target), step("ship", services.target)], name="f1")
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, "ed-1")
    assert status == 400 and answer["error"] == "invalid-input", answer
    assert answer["message"].startswith("weakens_policy:") and "ship-floor" in answer["message"]


def test_an_escalation_widening_approvers_beyond_the_floor_is_refused(node, services):
    url = node.http.url
    ship = {
        "name": "ship",
        "after": ["draft"],
        "completion": "approval",
        "approval": {
            "approvers": {"roles": ["editor"]},
            "quorum": 2,
            "end": {"reject": "fail"},
            "escalate": [{"after": "PT1S", "addRoles": ["intern"]}],
            "expires": "PT60S",
        },
    }
    workflow = graph([step("draft", services.target), ship], name="f2")
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, "ed-1")
    assert status == 400 and "weakens_policy" in answer["message"], answer
    # escalating by principal (a member of the floor's role) is not within it either
    ship["approval"]["escalate"] = [{"after": "PT1S", "addPrincipals": ["chief-1"]}]
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, "ed-1")
    assert status == 400 and "weakens_policy" in answer["message"], answer
    # a veto of accept weakens it too
    ship["approval"].pop("escalate")
    ship["approval"]["veto"] = ["accept"]
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, "ed-1")
    assert status == 400 and "weakens_policy" in answer["message"], answer
    # the legal one runs and the floor's quorum binds
    ship["approval"].pop("veto")
    ship["approval"].pop("expires")
    job_id = submit(url, workflow)
    waiting(url, job_id, "ship")
    _, answer, _ = vote(url, job_id, "ed-2", "accept", step_name="ship")
    assert answer["ok"] and answer["decided"] is False and answer["needed"] == 2, answer
    assert answer["policy"] == ["ship-floor"]


# --- grants ---------------------------------------------------------------------------------


def test_a_capability_granted_only_to_another_workflow_is_denied_uncalled(node, services):
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("publish", services.target, capabilities=["publish:site"]),
        ],
        name="brk-flow",
    )
    job_id = submit(url, workflow, "ed-1")
    job = wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j)
    assert job["error"].startswith("PERMISSION: capability publish:site is not granted"), job
    assert job["attempt"] == 1
    assert services.step_calls("publish") == 0


@pytest.mark.parametrize("capability", ["hook:boom", "hook:junk"])
def test_a_hook_that_raises_or_answers_junk_never_grants(node, services, capability):
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("publish", services.target, capabilities=[capability]),
        ],
        name="hook-flow",
    )
    job_id = submit(url, workflow, "ed-1")
    job = wait_for(
        lambda: (j := get_job(url, job_id))["status"] in ("FAILED", "DEAD", "COMPLETED") and j,
        timeout_s=60,
    )
    assert job["status"] in ("FAILED", "DEAD"), job
    assert "grant check of step 'publish' failed" in job["error"], job
    assert services.step_calls("publish") == 0
    assert history(url, job_id)["integrity"] == "ok"


def test_a_needs_approval_gate_in_a_graph_run_parks_on_the_gate(node, services):
    """A graph run opens the grant gate too (tests/integration/test_grant_gates.py plays it
    whole): the step is not called and the run waits for approval on it."""
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, capabilities=["deploy:prod"], after=["draft"]),
        ],
        name="deploy-graph",
    )
    job_id = submit(url, workflow, "ed-1")
    job = waiting(url, job_id, "deploy")
    assert job["phase"] == "waiting_approval" and job["attempt"] == 1, job
    assert services.step_calls("deploy") == 0


def test_two_needs_approval_grants_join_approvers_and_take_the_largest_quorum(node, services):
    """docs/configuration.md: a step covered by needs-approval entries parks on a gate with
    'their approvers joined, the largest quorum'. Two entries cover deploy:prod: chief (quorum
    1) and editor (quorum 2): the gate needs 2 votes of chief or editor."""
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, capabilities=["deploy:prod"]),
        ],
        name="deploy-seq",
    )
    job_id = submit(url, workflow, "chief-1")
    waiting(url, job_id, "deploy")
    # an editor is an approver of the joined gate
    status, answer, _ = vote(url, job_id, "ed-2", "accept", step_name="deploy")
    assert status == 200 and answer["ok"], answer
    assert answer["needed"] == 2 and answer["decided"] is False, answer


def test_a_grant_gate_vote_while_the_run_waits_on_another_step_is_not_open(node, services):
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            {
                "name": "review",
                "completion": "approval",
                "approval": {"approvers": {"roles": ["editor"]}},
            },
            step("deploy", services.target, capabilities=["deploy:prod"]),
        ],
        name="deploy-seq2",
    )
    job_id = submit(url, workflow, "ed-1")
    waiting(url, job_id, "review")
    status, answer, _ = vote(url, job_id, "chief-1", "accept", step_name="deploy")
    assert status == 200 and answer["ok"] is False and answer["error"] == "not-open", answer
    assert get_job(url, job_id)["outstandingStep"] == "review"
    assert history(url, job_id)["integrity"] == "ok"


# --- refusals that name a job, at the doors -------------------------------------------------


@pytest.mark.parametrize(
    "job_id",
    [None, 5, {"a": 1}, "not-a-uuid", "a\x00b", "00000000-0000-4000-8000-000000000000"],
    ids=["absent", "int", "object", "not-uuid", "nul", "unknown"],
)
def test_a_scope_refusal_with_a_malformed_job_id_is_a_403_never_a_500(node, job_id):
    url = node.http.url
    body = {"stepName": "review", "decision": "accept"}
    if job_id is not None:
        body["jobId"] = job_id
    # intern-viewer has no job-approve; rv-1 has no job-control
    status, answer, _ = post(url, "approve-step", body, "intern-viewer")
    assert status == 403 and answer["error"] == "permission-denied", answer
    status, answer, _ = post(url, "cancel-job", {"jobId": job_id}, "rv-1")
    assert status == 403 and answer["error"] == "permission-denied", answer


def test_the_dashboard_vote_form_with_bad_fields_is_not_a_500(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target))
    waiting(url, job_id)

    def form(raw):
        status, body, _ = http(
            "POST",
            f"{url}/ui/jobs/{job_id}/approve",
            raw=raw,
            headers={
                "Cookie": f"protomolt_token={TOKENS['ed-2']}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        return status, body

    for raw in (
        b"stepName=review&decision=accept&comment=a%00b",
        b"stepName=review&decision=maybe",
        b"stepName=draft&decision=accept",
        b"stepName=review",
        b"stepName=review&decision=accept&comment=" + b"x" * 2500,
        b"\xff\xfe",
    ):
        status, _ = form(raw)
        assert status in (400, 422), (raw[:60], status)
    bad = form(b"stepName=review&decision=accept")
    assert bad[0] == 200
    assert history(url, job_id)["integrity"] == "ok"


def test_a_paused_expiry_keeps_votes_and_reopens_on_resume(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target, expires="PT1S", onExpire="pause"))
    waiting(url, job_id)
    _, first, _ = vote(url, job_id, "ed-2", "accept")
    assert first["ok"] and first["tally"] == {"accept": 1}
    wait_for(lambda: get_job(url, job_id)["status"] == "PAUSED")
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["ok"] is False and answer["error"] == "not-open", answer
    status, resumed, _ = post(url, "resume-job", {"jobId": job_id}, "root")
    assert status == 200 and resumed["ok"], resumed
    waiting(url, job_id)
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["ok"] and answer["decided"] is True and answer["tally"] == {"accept": 2}, answer
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")
    assert history(url, job_id)["integrity"] == "ok"


def test_a_grant_gate_decision_does_not_carry_over_a_retry_step(node, services):
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, capabilities=["deploy:prod"]),
            {
                "name": "hold",
                "completion": "approval",
                "approval": {"approvers": {"roles": ["editor"]}},
            },
        ],
        name="deploy-seq3",
    )
    job_id = submit(url, workflow, "ed-1")
    waiting(url, job_id, "deploy")
    # the two deploy:prod grants' gate: chief or editor approvers, quorum 2 (the largest)
    vote(url, job_id, "chief-1", "accept", step_name="deploy")
    _, answer, _ = vote(url, job_id, "ed-2", "accept", step_name="deploy")
    assert answer["decided"] is True, answer
    waiting(url, job_id, "hold")
    assert services.step_calls("deploy") == 1
    post(url, "pause-job", {"jobId": job_id}, "root")
    wait_for(lambda: get_job(url, job_id)["status"] == "PAUSED")
    status, retried, _ = post(url, "retry-step", {"jobId": job_id, "stepName": "deploy"}, "root")
    assert status == 200 and retried["ok"], retried
    # the step's gate opens again: the old accept is no grant for the new opening
    wait_for(
        lambda: get_job(url, job_id)["status"] not in ("QUEUED", "RUNNING", "PAUSED"), timeout_s=30
    )
    job = get_job(url, job_id)
    calls = services.step_calls("deploy")
    assert calls == 1, f"retry-step re-ran the gated step on the old gate decision ({calls} calls)"
    assert (job["status"], job.get("outstandingStep")) == ("WAITING", "deploy"), job
    assert services.step_calls("deploy") == 1
    assert history(url, job_id)["integrity"] == "ok"


def test_retry_step_after_a_rejected_grant_gate_opens_a_new_gate(node, services):
    """A gate rejected once: retry-step (the operator's way to try again) must open a new gate,
    not fail the step again for ever on the old reject."""
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, capabilities=["deploy:prod"]),
        ],
        name="deploy-seq4",
    )
    job_id = submit(url, workflow, "ed-1")
    waiting(url, job_id, "deploy")
    vote(url, job_id, "chief-1", "reject", step_name="deploy")
    _, answer, _ = vote(url, job_id, "ed-2", "reject", step_name="deploy")
    assert answer["decided"] is True, answer
    wait_for(lambda: get_job(url, job_id)["status"] == "FAILED")
    status, retried, _ = post(url, "retry-step", {"jobId": job_id, "stepName": "deploy"}, "root")
    assert status == 200 and retried["ok"], retried
    job = wait_for(
        lambda: (j := get_job(url, job_id))["status"] not in ("QUEUED", "RUNNING") and j,
        timeout_s=30,
    )
    assert (job["status"], job.get("outstandingStep")) == ("WAITING", "deploy"), (
        job["status"],
        job.get("error"),
    )
    assert services.step_calls("deploy") == 0


def test_two_tokens_of_one_principal_voting_at_once_count_once(node, services):
    url = node.http.url
    for _ in range(10):
        job_id = submit(url, review_flow(services.target), who="ed-1")
        waiting(url, job_id)
        answers = race(
            lambda j=job_id: vote(url, j, "alpha-1", "accept")[1],
            lambda j=job_id: vote(url, j, "alpha-2", "accept")[1],
        )
        assert all(a.get("ok") for a in answers), answers
        assert not any(a["decided"] for a in answers), answers
        assert get_job(url, job_id)["status"] == "WAITING"
        kinds = [t["kind"] for t in history(url, job_id)["transitions"]]
        assert kinds.count("vote") == 1 and "decision" not in kinds, kinds
        post(url, "cancel-job", {"jobId": job_id}, "root")


def test_an_accept_and_a_veto_at_once_decide_once(node, services):
    url = node.http.url
    for _ in range(10):
        job_id = submit(url, review_flow(services.target, veto=["reject"]), who="ed-1")
        waiting(url, job_id)
        vote(url, job_id, "ed-2", "accept")
        a, b = race(
            lambda j=job_id: vote(url, j, "ed-3", "accept")[1],
            lambda j=job_id: vote(url, j, "multi", "reject")[1],
        )
        decided = [x for x in (a, b) if x.get("ok") and x.get("decided")]
        assert len(decided) == 1, (a, b)
        loser = b if decided[0] is a else a
        assert loser.get("ok") is False and loser["error"] in ("already-decided", "not-open"), loser
        kinds = [t["kind"] for t in history(url, job_id)["transitions"]]
        assert kinds.count("decision") == 1
        final = wait_for(
            lambda j=job_id: (x := get_job(url, j))["status"] in ("COMPLETED", "FAILED") and x
        )
        assert final["status"] == ("COMPLETED" if decided[0]["decision"] == "accept" else "FAILED")


def test_the_inbox_offers_no_vote_to_an_approver_without_job_approve(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target, approvers={"roles": ["editor", "reviewer"]}))
    waiting(url, job_id)
    status, body, _ = http(
        "GET", f"{url}/ui/jobs/{job_id}", headers={"Cookie": f"protomolt_token={TOKENS['rv-1']}"}
    )
    assert status == 200 and 'id="approve-form"' not in body.decode()
    status, body, _ = http(
        "GET", f"{url}/ui/inbox", headers={"Cookie": f"protomolt_token={TOKENS['rv-1']}"}
    )
    assert status in (200, 403) and job_id not in body.decode()


def test_a_failing_or_lying_identity_hook_is_401_never_500_nor_a_reserved_actor(
    tmp_path, fresh_dsn, services
):
    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(NODE)
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", fresh_dsn))
    surfaces = start_surfaces(compose(config, extra_plugins=[BrokenIdentity()]), config)
    try:
        url = surfaces.http.url
        job_id = submit(url, review_flow(services.target))
        waiting(url, job_id)
        for token in ("boom-token", "sweeper-token", "bad-name-token"):
            status, answer, _ = http(
                "POST",
                f"{url}/protomolt/actions/approve-step",
                {"jobId": job_id, "stepName": "review", "decision": "accept"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert status == 401, (token, status, answer)
            with pytest.raises(grpc.RpcError) as refused:
                grpc_approve(
                    surfaces.grpc.target,
                    pb.ApproveStepRequest(job_id=job_id, step_name="review", decision="accept"),
                    token,
                )
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
        kinds = [(t["kind"], t["actor"]) for t in history(url, job_id)["transitions"]]
        assert not [k for k in kinds if k[0] == "vote"], kinds
    finally:
        surfaces.close()


def test_a_floor_whose_when_fails_selects_the_step(tmp_path, fresh_dsn, services):
    """A floor 'when' that errors at evaluation selects the step (fail closed): a workflow
    with a plain step is then refused as weakening it."""
    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    text = NODE.split("[[jobs.grants]]")[0] + (
        '\n[[jobs.approval_floors]]\nname = "broken"\n'
        "when = \"capabilities[3] == 'x'\"\nquorum = 2\n"
    )
    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(text)
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", fresh_dsn))
    surfaces = start_surfaces(compose(config), config)
    try:
        url = surfaces.http.url
        workflow = graph([step("draft", services.target)], name="plain")
        status, answer, _ = post(
            url, "submit-workflow", {"workflow": workflow, "input": {}}, "ed-1"
        )
        assert status == 400 and "weakens_policy" in answer["message"], answer
        assert "broken" in answer["message"]
    finally:
        surfaces.close()


def test_retry_step_of_an_earlier_step_clears_the_votes_of_the_old_opening(node, services):
    url = node.http.url
    job_id = submit(url, review_flow(services.target))
    waiting(url, job_id)
    _, first, _ = vote(url, job_id, "ed-2", "accept")
    assert first["tally"] == {"accept": 1}
    post(url, "pause-job", {"jobId": job_id}, "root")
    wait_for(lambda: get_job(url, job_id)["status"] == "PAUSED")
    status, retried, _ = post(url, "retry-step", {"jobId": job_id, "stepName": "draft"}, "root")
    assert status == 200 and retried["ok"], retried
    waiting(url, job_id)
    assert services.step_calls("draft") == 2
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["ok"] and answer["decided"] is False and answer["tally"] == {"accept": 1}, answer
    assert history(url, job_id)["integrity"] == "ok"
