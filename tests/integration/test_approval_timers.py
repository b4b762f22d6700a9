"""Approval timers (docs/approvals.md *Expiry and escalation*) from the database clock, with the
worker and the sweeper in another process (``python -m protomolt_jobs.worker`` serving the
``approvals`` queue with a 200 ms sweep); the node (whose own sweeper does not pass during
the test and whose workers serve only ``default``) answers the votes on HTTP with real tokens.
The steps around the gate call the ``Steps/Run`` service on loopback."""

from __future__ import annotations

import pytest

from tests.support.graphs import graph, step
from tests.support.node import http, start_node_with_file, wait_for
from tests.support.worker_proc import WorkerProcess

ROOT = "root-secret"
TOKENS = {"ed-2": "ed-2-secret", "ed-3": "ed-3-secret", "chief-1": "chief-1-secret"}
NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
ed-2 = "ed-2-secret"
ed-3 = "ed-3-secret"
chief-1 = "chief-1-secret"
[node.groups]
editor = ["ed-2", "ed-3"]
chief = ["chief-1"]
[node.scopes]
editor = ["service-invoke", "job-approve"]
chief = ["service-invoke", "job-approve"]
"""


def timed_workflow(target: str, **timers) -> dict:
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
                    "decisions": ["accept", "reject"],
                    "end": {"reject": "fail"},
                    **timers,
                },
            },
            step("publish", target, after=[{"step": "review", "on": "decision:accept"}]),
        ],
        name="timed",
    )


def post(url, verb, body, who="root"):
    token = ROOT if who == "root" else TOKENS[who]
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def get_job(url, job_id):
    return post(url, "get-job", {"jobId": job_id})[1]["job"]


def kinds(url, job_id):
    answer = post(url, "job-history", {"jobId": job_id})[1]
    assert answer["integrity"] == "ok"
    return [(t["kind"], t["actor"]) for t in answer["transitions"]]


def vote(url, job_id, who, decision):
    return post(
        url, "approve-step", {"jobId": job_id, "stepName": "review", "decision": decision}, who
    )


@pytest.fixture
def node(tmp_path, fresh_dsn):
    # The node's sweeper would first pass after an hour; its workers serve 'default' only.
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE, sweep_interval_ms=3_600_000)
    try:
        yield surfaces
    finally:
        surfaces.close()


@pytest.fixture
def worker(fresh_dsn, node):
    proc = WorkerProcess(
        fresh_dsn, worker_id="timers", sweeper=True, sweep_interval_ms=200, queues="approvals"
    ).start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait_exit(15)
        proc.close()


def submit(url, workflow):
    status, answer, _ = post(
        url, "submit-workflow", {"workflow": workflow, "input": {}, "queue": "approvals"}
    )
    assert status == 200 and answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: get_job(url, job_id).get("phase") == "waiting_approval", timeout_s=30)
    return job_id


def test_an_escalation_lets_the_chief_vote_and_emits_its_event(node, worker, services, store):
    url = node.http.url
    workflow = timed_workflow(
        services.target, escalate=[{"after": "PT2S", "addRoles": ["chief"]}], expires="PT60S"
    )
    job_id = submit(url, workflow)
    status, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert status == 403 and "not an approver" in answer["message"], answer  # not yet
    wait_for(lambda: ("escalate", "sweeper") in kinds(url, job_id), timeout_s=30)
    events = [e.event_type for e in store.outbox_for_job(job_id)]
    assert "APPROVAL_ESCALATED" in events
    # The escalation widened who may vote; it did not lower the quorum (2).
    status, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert status == 200 and answer["decided"] is False and answer["needed"] == 2, answer
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["decided"] is True and answer["decision"] == "accept"
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED", timeout_s=30)
    assert services.step_calls("publish") == 1


def test_an_expiry_never_accepts_it_rejects_with_the_votes_so_far(node, worker, services):
    url = node.http.url
    job_id = submit(url, timed_workflow(services.target, expires="PT2S", onExpire="reject"))
    _, answer, _ = vote(url, job_id, "ed-2", "accept")
    assert answer["tally"] == {"accept": 1}
    failed = wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j, timeout_s=30)
    assert failed["error"] == "APPROVAL: approval step 'review' decided 'reject'"
    review = next(c for c in failed["checkpoints"] if c["name"] == "review")
    assert review["decision"] == "reject" and review["expired"] is True
    assert review["tally"] == {"accept": 1}
    assert ("decision", "sweeper") in kinds(url, job_id)
    assert services.step_calls("publish") == 0
    # A vote after the expiry: already decided.
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["ok"] is False and answer["error"] == "already-decided"


def test_an_expiry_can_pause_and_a_resume_waits_again(node, worker, services):
    url = node.http.url
    job_id = submit(url, timed_workflow(services.target, expires="PT1S", onExpire="pause"))
    paused = wait_for(lambda: (j := get_job(url, job_id))["status"] == "PAUSED" and j, timeout_s=30)
    assert paused["outstandingStep"] == "review"
    assert ("expire", "sweeper") in kinds(url, job_id)
    status, answer, _ = post(url, "resume-job", {"jobId": job_id})
    assert status == 200 and answer["ok"], answer
    job = get_job(url, job_id)
    assert job["status"] == "WAITING" and job["phase"] == "waiting_approval"
    vote(url, job_id, "ed-2", "accept")
    _, answer, _ = vote(url, job_id, "ed-3", "accept")
    assert answer["decided"] is True
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED", timeout_s=30)


def looped_review(target: str) -> dict:
    """draft -> review (approval, expires in 3 s, an expiry rejects) -> replan on 'fix', which
    loops back to draft: the review opens again in iteration 1."""
    return graph(
        [
            step("draft", target),
            {
                "name": "review",
                "after": ["draft"],
                "completion": "approval",
                "approval": {
                    "approvers": {"roles": ["editor"]},
                    "decisions": ["accept", "fix", "reject"],
                    "end": {"reject": "fail"},
                    "expires": "PT3S",
                    "onExpire": "reject",
                },
            },
            step(
                "replan",
                target,
                after=[{"step": "review", "on": "decision:fix"}],
                loop={"to": "draft", "max": 2, "onExhausted": "fail"},
            ),
            step("publish", target, after=[{"step": "review", "on": "decision:accept"}]),
        ],
        name="looped-review",
    )


def test_an_expiry_inside_a_loop_body_records_the_iteration_it_decided(
    node, worker, services, store
):
    url = node.http.url
    job_id = submit(url, looped_review(services.target))
    _, answer, _ = vote(url, job_id, "ed-2", "fix")
    assert answer["decided"] is True and answer["decision"] == "fix", answer
    # iteration 1: draft again, the review opens again, and this time nobody votes
    wait_for(lambda: services.step_calls("draft") == 2, timeout_s=30)
    failed = wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j, timeout_s=30)
    assert failed["error"] == "APPROVAL: approval step 'review' decided 'reject'"
    assert any(actor == "sweeper" for _, actor in kinds(url, job_id))
    reviews = [c for c in store.job_get(job_id).checkpoints if c["name"] == "review"]
    assert [(c.get("iteration", 0), c["decision"]) for c in reviews] == [(0, "fix"), (1, "reject")]
    # the reject ended the run: replan ran once (after the fix), publish never
    assert services.step_calls("replan") == 1 and services.step_calls("publish") == 0
