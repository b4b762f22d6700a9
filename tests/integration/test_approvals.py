"""Approval steps and approve-step on a real node (issue 26, build items 2 and 3): real
PostgreSQL, the node's HTTP and gRPC surfaces on loopback with real tokens, the jobs role's
workers, and the ``Steps/Run`` test service on loopback for the steps around the gate.

The workflow is docs/approvals.md's: ``draft`` -> ``review`` (two editors of three must
accept; ``fix`` sends the draft to ``rework``; one ``reject`` vetoes and fails the run) ->
``publish``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.graphs import graph, step
from tests.support.node import http, start_node_with_file, wait_for

ROOT = "root-secret"
TOKENS = {
    "ed-1": "ed-1-secret",
    "ed-2": "ed-2-secret",
    "ed-3": "ed-3-secret",
    "intern-viewer": "intern-secret",
}

NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
{chr(10).join(f'{name} = "{secret}"' for name, secret in TOKENS.items())}
[node.groups]
editor = ["ed-1", "ed-2", "ed-3"]
intern = ["intern-viewer"]
[node.scopes]
editor = ["service-invoke", "workflow-run", "job-approve", "job-complete"]
intern = ["service-invoke", "job-approve", "job-complete"]
"""

SERVICE = "/ai.pipestream.proto.service.v1.ProtoMoltService"


def review_workflow(target: str) -> dict:
    return graph(
        [
            step("draft", target),
            {
                "name": "review",
                "after": ["draft"],
                "completion": "approval",
                "approval": {
                    "approvers": {"roles": ["editor"]},
                    "quorum": 2,
                    "decisions": ["accept", "fix", "reject"],
                    "veto": ["reject"],
                    "end": {"reject": "fail"},
                },
            },
            step("publish", target, after=[{"step": "review", "on": "decision:accept"}]),
            step("rework", target, after=[{"step": "review", "on": "decision:fix"}]),
        ],
        name="review-flow",
    )


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


def submit(url, workflow, who="ed-1"):
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, who)
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def waiting_on_review(url, job_id):
    return wait_for(
        lambda: (
            (job := get_job(url, job_id))["status"] == "WAITING"
            and job.get("phase") == "waiting_approval"
            and job
        ),
        timeout_s=30,
    )


def vote(url, job_id, who, decision, **extra):
    body = {"jobId": job_id, "stepName": "review", "decision": decision, **extra}
    return post(url, "approve-step", body, who)


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        yield surfaces
    finally:
        surfaces.close()


def test_quorum_two_of_three_duplicate_self_approval_and_the_accept_edge(node, services):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    job = waiting_on_review(url, job_id)
    assert job["outstandingStep"] == "review"
    assert services.step_calls("draft") == 1

    # The submitter (ed-1) may not vote on its own run.
    status, answer, _ = vote(url, job_id, "ed-1", "accept")
    assert status == 200 and answer["ok"] is False and answer["error"] == "self-approval", answer

    # One accept: still waiting, tally 1 of 2.
    status, answer, _ = vote(url, job_id, "ed-2", "accept", comment="looks right")
    assert status == 200, answer
    assert answer == {
        "ok": True,
        "decided": False,
        "tally": {"accept": 1},
        "needed": 2,
        "status": "WAITING",
    }
    # The same principal again: counted once.
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["ok"] is True and answer["decided"] is False
    assert answer["tally"] == {"accept": 1}
    assert get_job(url, job_id)["phase"] == "waiting_approval"

    # A second principal's accept decides: the run goes on through the accept edge.
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer == {
        "ok": True,
        "decided": True,
        "decision": "accept",
        "tally": {"accept": 2},
        "needed": 2,
        "status": "QUEUED",
    }
    done = wait_for(lambda: (j := get_job(url, job_id))["status"] == "COMPLETED" and j)
    assert services.step_calls("publish") == 1
    assert services.step_calls("rework") == 0
    entry = next(c for c in done["checkpoints"] if c["name"] == "review")
    assert entry["decision"] == "accept"
    assert entry["tally"] == {"accept": 2}
    assert [v["principal"] for v in entry["voters"]] == ["ed-2", "ed-3"]
    assert entry["voters"][0]["comment"] == "looks right"
    # What the approvers saw: the checkpoints before the decision (draft's), hashed.
    seen = [c for c in done["checkpoints"] if c["name"] == "draft"]
    canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert entry["seenSha256"] == hashlib.sha256(canonical.encode()).hexdigest()

    # A late vote: already decided.
    _, answer, _ = vote(url, job_id, "ed-2", "reject")
    assert answer["ok"] is False and answer["error"] == "already-decided"
    assert answer["decision"] == "accept"

    # Votes and the decision are rows of the hash-chained history.
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    assert history["integrity"] == "ok"
    kinds = [(t["kind"], t["actor"]) for t in history["transitions"]]
    assert ("vote", "ed-2") in kinds and ("vote", "ed-3") in kinds
    assert ("decision", "ed-3") in kinds
    assert sum(1 for k, _ in kinds if k == "vote") == 2  # the duplicate inserted nothing
    assert ("denied", "ed-1") in kinds  # the self-approval refusal
    # The final report lists the votes and the decision with the operator actions.
    actions = [(a["kind"], a["actor"]) for a in get_job(url, job_id)["report"]["operatorActions"]]
    assert actions == [("vote", "ed-2"), ("vote", "ed-3"), ("decision", "ed-3")]


def test_a_fix_decision_takes_the_fix_edge(node, services):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)
    vote(url, job_id, "ed-2", "fix")
    _, answer, _ = vote(url, job_id, "ed-3", "fix")
    assert answer["decided"] is True and answer["decision"] == "fix"
    done = wait_for(lambda: (j := get_job(url, job_id))["status"] == "COMPLETED" and j)
    assert services.step_calls("rework") == 1
    assert services.step_calls("publish") == 0
    report = {s["name"]: s for s in done["report"]["steps"]}
    assert report["publish"]["status"] == "skipped"
    assert report["publish"]["reason"] == "branch not taken: review decided fix"

    # retry-step opens the step again: the earlier opening's votes do not count.
    status, answer, _ = post(url, "retry-step", {"jobId": job_id, "stepName": "review"}, "root")
    assert status == 200 and answer["ok"], answer
    waiting_on_review(url, job_id)
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["ok"] and answer["decided"] is False and answer["tally"] == {"accept": 1}
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["decided"] is True and answer["decision"] == "accept"
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")
    assert services.step_calls("publish") == 1 and services.step_calls("rework") == 1


def test_one_reject_vetoes_and_fails_the_run(node, services):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)
    _, answer, _ = vote(url, job_id, "ed-2", "reject")
    assert answer["decided"] is True and answer["decision"] == "reject"
    assert answer["tally"] == {"reject": 1}
    failed = wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j)
    assert "approval step 'review' decided 'reject'" in failed["error"]
    assert services.step_calls("publish") == 0 and services.step_calls("rework") == 0
    report = {s["name"]: s for s in failed["report"]["steps"]}
    assert report["review"]["status"] == "failed"
    assert report["review"]["reason"] == "approval step 'review' decided 'reject'"


def test_a_token_without_the_approver_role_is_denied_on_approve_and_complete(node, services):
    url, target = node.http.url, node.grpc.target
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)

    status, answer, _ = vote(url, job_id, "intern-viewer", "accept")
    assert status == 403 and answer["error"] == "permission-denied", answer
    assert "'intern-viewer' is not an approver of step 'review'" in answer["message"]
    status, answer, _ = post(
        url,
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"decision": "accept"}},
        "intern-viewer",
    )
    assert status == 403 and answer["error"] == "permission-denied", answer
    # An approver is pointed to approve-step.
    status, answer, _ = post(
        url, "complete-step", {"jobId": job_id, "stepName": "review", "response": {}}, "ed-2"
    )
    assert status == 200 and answer["ok"] is False and "approve-step" in answer["error"]

    # gRPC: ApproveStep refuses the intern as well, and counts an editor's vote.
    with grpc.insecure_channel(target) as channel:
        approve = channel.unary_unary(
            f"{SERVICE}/ApproveStep",
            request_serializer=pb.ApproveStepRequest.SerializeToString,
            response_deserializer=pb.ApproveStepResponse.FromString,
        )
        request = pb.ApproveStepRequest(job_id=job_id, step_name="review", decision="accept")
        with pytest.raises(grpc.RpcError) as refused:
            approve(request, metadata=(("authorization", "Bearer intern-secret"),), timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        answer = approve(request, metadata=(("authorization", "Bearer ed-2-secret"),), timeout=10)
        assert answer.ok and not answer.decided and dict(answer.tally) == {"accept": 1}
        assert answer.needed == 2
        get = channel.unary_unary(
            f"{SERVICE}/GetJob",
            request_serializer=pb.GetJobRequest.SerializeToString,
            response_deserializer=pb.GetJobResponse.FromString,
        )
        job = get(pb.GetJobRequest(job_id=job_id), metadata=(("authorization", f"Bearer {ROOT}"),))
        assert job.job.phase == "waiting_approval" and job.job.outstanding_step == "review"

    # Nothing changed; every refusal is a 'denied' row of the history.
    assert get_job(url, job_id)["status"] == "WAITING"
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    denied = [t for t in history["transitions"] if t["kind"] == "denied"]
    assert len(denied) == 3 and {t["actor"] for t in denied} == {"intern-viewer"}


def test_the_cli_votes(node, services, capsys):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)
    argv = ["jobs", "approve", job_id, "--step", "review", "--decision", "accept"]
    assert main([*argv, "--comment", "ok", "--url", url, "--token", TOKENS["ed-2"]]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is True and answer["tally"] == {"accept": 1} and answer["needed"] == 2
    assert main([*argv, "--url", url, "--token", TOKENS["intern-viewer"]]) == 1
    assert capsys.readouterr().err.startswith("permission-denied: ")


def test_unknown_decision_and_early_votes(node, services):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)
    status, answer, _ = vote(url, job_id, "ed-2", "maybe")
    assert status == 400 and answer["error"] == "invalid-input", answer
    assert answer["details"]["field"] == "decision"
    # A cancelled run is not open for votes.
    post(url, "cancel-job", {"jobId": job_id}, "root")
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["ok"] is False and answer["error"] == "not-open"
    assert answer["status"] == "CANCELLED"


RACES = 50


def _race(*calls):
    """Run ``calls`` at once (a barrier releases them together); their answers, in order."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(run, c) for c in calls]]


def _submit_many(url, target, n):
    ids = [submit(url, review_workflow(target)) for _ in range(n)]
    wait_for(
        lambda: all((j := get_job(url, i))["status"] == "WAITING" and j.get("phase") for i in ids),
        timeout_s=120,
    )
    return ids


def _kinds(url, job_id):
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    assert history["integrity"] == "ok"
    return [t["kind"] for t in history["transitions"]]


def test_fifty_races_of_two_deciding_votes_decide_once(node, services):
    url = node.http.url
    for job_id in _submit_many(url, services.target, RACES):
        answers = _race(
            lambda j=job_id: vote(url, j, "ed-2", "accept")[1],
            lambda j=job_id: vote(url, j, "ed-3", "accept")[1],
        )
        assert all(a["ok"] for a in answers), answers
        assert sorted(a["decided"] for a in answers) == [False, True], answers
        winner = next(a for a in answers if a["decided"])
        assert winner["tally"] == {"accept": 2} and winner["status"] == "QUEUED"
        assert _kinds(url, job_id).count("decision") == 1
    # Every run went on once, through the accept edge.
    wait_for(lambda: services.step_calls("publish") == RACES, timeout_s=120)
    assert services.step_calls("rework") == 0


def test_fifty_races_of_a_cancel_and_the_deciding_vote_end_one_way(node, services):
    url = node.http.url
    ids = _submit_many(url, services.target, RACES)
    decided = cancelled_first = 0
    for job_id in ids:
        _, first, _ = vote(url, job_id, "ed-2", "accept")
        assert first["tally"] == {"accept": 1}
        answer, (cancel_status, cancel, _) = _race(
            lambda j=job_id: vote(url, j, "ed-3", "accept")[1],
            lambda j=job_id: post(url, "cancel-job", {"jobId": j, "reason": "race"}, "root"),
        )
        assert cancel_status == 200, cancel
        kinds = _kinds(url, job_id)
        job = get_job(url, job_id)
        review = [c for c in job["checkpoints"] if c["name"] == "review"]
        if answer["ok"]:
            # The vote won: decided once, checkpointed; the cancel came after the decision.
            assert answer["decided"] is True and answer["decision"] == "accept"
            assert len(review) == 1 and review[0]["decision"] == "accept"
            assert kinds.count("decision") == 1
            if cancel["ok"]:
                # The cancel found the run queued again (cancel) or already claimed (a request
                # the worker honours at its next boundary, cancel-request): after the decision.
                stop = next(i for i, k in enumerate(kinds) if k in ("cancel", "cancel-request"))
                assert kinds.index("decision") < stop
            else:
                # The worker finished the run before the cancel arrived: the cancel says so.
                assert cancel["status"] == "COMPLETED", cancel
                assert job["status"] == "COMPLETED" and "cancel" not in kinds
            decided += 1
        else:
            # The cancel won: the vote found the run closed; no decision anywhere.
            assert cancel["ok"], cancel
            assert answer["error"] == "not-open" and answer["status"] == "CANCELLED", answer
            assert review == [] and "decision" not in kinds
            assert kinds.count("cancel") == 1
            cancelled_first += 1
    assert decided + cancelled_first == RACES
    print(f"cancel races: the vote decided {decided}, the cancel came first {cancelled_first}")


def test_a_sequential_workflow_goes_on_after_accept_and_distinct_from_holds(node, services):
    url, target = node.http.url, services.target
    legal = {
        "name": "legal",
        "completion": "approval",
        "approval": {"approvers": {"principals": ["ed-2", "ed-3"]}},
    }
    review = {
        "name": "review",
        "completion": "approval",
        "approval": {"approvers": {"roles": ["editor"]}, "distinctFrom": ["legal"]},
    }
    workflow = graph([step("draft", target), legal, review, step("publish", target)], name="seq")
    job_id = submit(url, workflow)
    wait_for(lambda: get_job(url, job_id).get("outstandingStep") == "legal")
    _, answer, _ = post(
        url, "approve-step", {"jobId": job_id, "stepName": "legal", "decision": "accept"}, "ed-2"
    )
    assert answer["decided"] is True  # quorum 1 by default
    waiting_on_review(url, job_id)
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["ok"] is False and answer["error"] == "distinct-from", answer
    assert "voted on step 'legal'" in answer["message"]
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    denied = [t for t in history["transitions"] if t["kind"] == "denied"]
    assert [t["actor"] for t in denied] == ["ed-2"] and "distinct-from" in denied[0]["reason"]
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["decided"] is True
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")
    assert services.step_calls("publish") == 1


def test_a_sequential_workflow_fails_on_reject(node, services):
    url, target = node.http.url, services.target
    review = {
        "name": "review",
        "completion": "approval",
        "approval": {"approvers": {"roles": ["editor"]}},
    }
    job_id = submit(url, graph([step("draft", target), review, step("publish", target)]))
    waiting_on_review(url, job_id)
    _, answer, _ = vote(url, job_id, "ed-3", "reject")
    assert answer["decided"] is True and answer["decision"] == "reject"
    failed = wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j)
    assert failed["error"] == "APPROVAL: approval step 'review' decided 'reject'"
    assert services.step_calls("publish") == 0


def test_the_dashboard_inbox_lists_approvals_by_the_viewers_groups_and_votes(node, services):
    url = node.http.url
    job_id = submit(url, review_workflow(services.target))
    waiting_on_review(url, job_id)
    vote(url, job_id, "ed-2", "accept", comment="fine by me")

    def page(path, who, method="GET", form=b""):
        headers = {"Cookie": f"protomolt_token={TOKENS[who]}"}
        if method == "POST":
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        status, body, _ = http(method, f"{url}{path}", raw=form or None, headers=headers)
        return status, body.decode()

    # An editor sees the approval with the votes so far and a vote form.
    status, body = page("/ui/inbox", "ed-3")
    assert status == 200 and 'id="approvals"' in body and f'data-job-id="{job_id}"' in body
    assert "accept 1/2" in body and "ed-2: accept" in body
    # The intern is in no approver group: the approval is not in its inbox.
    status, body = page("/ui/inbox", "intern-viewer")
    assert status == 200 and job_id not in body
    # The job page shows the wait, the votes and (for an approver) the form.
    status, body = page(f"/ui/jobs/{job_id}", "ed-3")
    assert status == 200 and 'id="approval"' in body and "fine by me" in body
    assert 'id="approve-form"' in body and 'id="complete-form"' not in body
    status, body = page(f"/ui/jobs/{job_id}", "intern-viewer")
    assert status == 200 and 'id="approval"' in body and 'id="approve-form"' not in body
    # A forged vote of the intern is refused; an editor's vote decides.
    status, body = page(
        f"/ui/jobs/{job_id}/approve", "intern-viewer", "POST", b"stepName=review&decision=accept"
    )
    assert status == 403 and "permission-denied" in body
    status, body = page(
        f"/ui/jobs/{job_id}/approve", "ed-3", "POST", b"stepName=review&decision=accept&comment=ok"
    )
    assert status == 200 and "decided: accept" in body, body
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")


def test_the_dashboard_offers_no_vote_form_to_the_runs_submitter(node, services):
    """Found by the breaker: the inbox and the job page offered the vote form to the run's
    submitter (an editor), whose every vote approve-step refuses as self-approval."""
    url = node.http.url
    job_id = submit(url, review_workflow(services.target), who="ed-1")
    waiting_on_review(url, job_id)

    def page(path, who):
        status, body, _ = http(
            "GET", f"{url}{path}", headers={"Cookie": f"protomolt_token={TOKENS[who]}"}
        )
        return status, body.decode()

    # Another editor may vote: the approval is in its inbox, with the form on the job page.
    status, body = page("/ui/inbox", "ed-2")
    assert status == 200 and f'data-job-id="{job_id}"' in body
    status, body = page(f"/ui/jobs/{job_id}", "ed-2")
    assert status == 200 and 'id="approve-form"' in body
    # The submitter, an editor too, may not: no entry in its inbox, no form on the page.
    status, body = page("/ui/inbox", "ed-1")
    assert status == 200 and f'data-job-id="{job_id}"' not in body
    status, body = page(f"/ui/jobs/{job_id}", "ed-1")
    assert status == 200 and 'id="approval"' in body and 'id="approve-form"' not in body
    # approve-step agrees: the submitter's vote is self-approval.
    status, answer, _ = vote(url, job_id, "ed-1", "accept")
    assert status == 200 and answer["error"] == "self-approval", answer
