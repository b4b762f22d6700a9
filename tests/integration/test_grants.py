"""Capabilities and grants on a real node (issue 26, build item 5; DESIGN.md section 21): real
PostgreSQL, the node's HTTP surface on loopback with real tokens, the jobs role's workers, and
the ``Steps/Run`` test service on loopback counting calls per step.

A step's ``capabilities`` grant nothing: ``[[jobs.grants]]`` (or a host's ``authorize_step``)
decides after the claim and before the call. A denied step is never called and its run fails
with ``PERMISSION`` on its first attempt (never retried).
"""

from __future__ import annotations

import pytest

from protomolt_jobs.hooks import StepDecision, hookimpl
from tests.support.graphs import graph, step
from tests.support.node import http, node_environ, wait_for

ROOT = "root-secret"
TOKENS = {"ed-1": "ed-1-secret", "intern-viewer": "intern-secret", "chief-1": "chief-secret"}

NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
{chr(10).join(f'{name} = "{secret}"' for name, secret in TOKENS.items())}
[node.groups]
editor = ["ed-1"]
intern = ["intern-viewer"]
chief = ["chief-1"]
[node.scopes]
chief = ["service-invoke", "job-approve"]
editor = ["service-invoke", "workflow-run", "job-approve", "job-complete"]
intern = ["service-invoke", "workflow-run", "job-approve", "job-complete"]

[[jobs.grants]]
capabilities = ["publish:site"]
workflows = ["grants-flow"]
groups = ["editor"]

[[jobs.grants]]
capabilities = ["deploy:prod"]
decision = "needs-approval"
approvers = {{ roles = ["chief"] }}
"""


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


def submit(url, workflow, who):
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": {}}, who)
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def publishing(target, *, graph_run=False, name="grants-flow"):
    publish = step("publish", target, capabilities=["publish:site"])
    if graph_run:
        publish["after"] = ["draft"]
    return graph([step("draft", target), publish], name=name)


def start(tmp_path, dsn, plugins=()):
    from pathlib import Path

    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(NODE)
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", dsn))
    return start_surfaces(compose(config, extra_plugins=plugins), config)


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start(tmp_path, fresh_dsn)
    try:
        yield surfaces
    finally:
        surfaces.close()


def failed(url, job_id):
    return wait_for(lambda: (j := get_job(url, job_id))["status"] == "FAILED" and j)


@pytest.mark.parametrize("graph_run", [False, True], ids=["sequential", "graph"])
def test_an_ungranted_capability_fails_with_permission_and_is_never_retried(
    node, services, graph_run
):
    url = node.http.url
    job_id = submit(url, publishing(services.target, graph_run=graph_run), "intern-viewer")
    job = failed(url, job_id)
    assert job["error"] == (
        "PERMISSION: capability publish:site is not granted to workflow 'grants-flow' "
        "submitted by intern-viewer (decision jobs.grants:none)"
    )
    assert job["attempt"] == 1  # not retried (max_attempts is 3)
    assert services.step_calls("draft") == 1
    assert services.step_calls("publish") == 0  # the denied step is never called
    if graph_run:
        entry = next(c for c in job["checkpoints"] if c["name"] == "publish")
        assert entry["failed"]["kind"] == "PERMISSION"
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    assert history["integrity"] == "ok"
    last = history["transitions"][-1]
    assert (last["kind"], last["newStatus"], last["step"]) == ("fail", "FAILED", "publish")
    assert last["reason"] == job["error"]


def test_a_granted_capability_runs_and_its_decision_is_in_the_checkpoint(node, services):
    url = node.http.url
    job_id = submit(url, publishing(services.target), "ed-1")
    done = wait_for(lambda: (j := get_job(url, job_id))["status"] == "COMPLETED" and j)
    assert services.step_calls("publish") == 1
    entry = next(c for c in done["checkpoints"] if c["name"] == "publish")
    assert entry["grant"] == {
        "decision": "allow",
        "reason": "granted by jobs.grants[0]",
        "decisionId": "jobs.grants[0]",
        "capabilities": ["publish:site"],
    }
    # a step without capabilities carries no grant
    assert "grant" not in next(c for c in done["checkpoints"] if c["name"] == "draft")


def test_the_grant_is_scoped_to_its_workflows(node, services):
    url = node.http.url
    job_id = submit(url, publishing(services.target, name="other-flow"), "ed-1")
    job = failed(url, job_id)
    assert job["error"].startswith(
        "PERMISSION: capability publish:site is not granted to "
        "workflow 'other-flow' submitted by ed-1"
    )
    assert services.step_calls("publish") == 0


class Engine:
    """A policy engine behind ``protomolt_authorize_step``: denies ``publish:site`` for
    ed-1 (the node's grants would allow it), has no opinion otherwise."""

    def __init__(self):
        self.asked = []

    @hookimpl
    def protomolt_authorize_step(self, job, step, capabilities):
        self.asked.append((job["workflowName"], job["submittedBy"], step, capabilities))
        if job["submittedBy"] == "ed-1":
            return StepDecision("deny", "frozen for the release", "opa:7f3a")
        return None


def test_a_host_hook_decides_before_the_grants(tmp_path, fresh_dsn, services):
    engine = Engine()
    surfaces = start(tmp_path, fresh_dsn, plugins=[engine])
    try:
        url = surfaces.http.url
        job_id = submit(url, publishing(services.target), "ed-1")
        job = failed(url, job_id)
        assert job["error"] == "PERMISSION: frozen for the release (decision opa:7f3a)"
        assert services.step_calls("publish") == 0
        assert engine.asked == [("grants-flow", "ed-1", "publish", ("publish:site",))]
    finally:
        surfaces.close()


def test_a_denied_external_step_records_no_intent(node, services, fresh_dsn):
    """The check runs before the intent of an ``effect: external`` step: a denied one leaves
    none (nothing for reconcile-step to ask about: it never ran)."""
    from protomolt_jobs.store import JobStore

    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("publish", services.target, capabilities=["publish:site"], effect="external"),
        ],
        name="grants-flow",
    )
    job_id = submit(url, workflow, "intern-viewer")
    job = failed(url, job_id)
    assert job["error"].startswith("PERMISSION: capability publish:site is not granted")
    assert services.step_calls("publish") == 0
    store = JobStore.open(fresh_dsn, max_size=1)
    try:
        row = store.job_get(job_id)
        assert row is not None and not row.effect_intents
    finally:
        store.close()
    # the same workflow granted: the intent is recorded, then the call made
    job_id = submit(url, workflow, "ed-1")
    wait_for(lambda: get_job(url, job_id)["status"] == "COMPLETED")
    assert services.step_calls("publish") == 1


def test_a_granted_graph_step_stores_its_grant(node, services):
    url = node.http.url
    job_id = submit(url, publishing(services.target, graph_run=True), "ed-1")
    done = wait_for(lambda: (j := get_job(url, job_id))["status"] == "COMPLETED" and j)
    entry = next(c for c in done["checkpoints"] if c["name"] == "publish")
    assert entry["grant"]["decisionId"] == "jobs.grants[0]"
    assert services.step_calls("publish") == 1


def deploying(target):
    return graph(
        [step("draft", target), step("deploy", target, capabilities=["deploy:prod"])],
        name="deploy-flow",
    )


def waiting_on_gate(url, job_id):
    return wait_for(
        lambda: (
            (j := get_job(url, job_id))["status"] == "WAITING"
            and j.get("phase") == "waiting_approval"
            and j
        )
    )


def vote(url, job_id, who, decision):
    body = {"jobId": job_id, "stepName": "deploy", "decision": decision}
    return post(url, "approve-step", body, who)


def test_a_needs_approval_grant_opens_a_gate_that_once_accepted_lets_the_step_run(node, services):
    url = node.http.url
    job_id = submit(url, deploying(services.target), "ed-1")
    job = waiting_on_gate(url, job_id)
    assert job["outstandingStep"] == "deploy"
    assert services.step_calls("draft") == 1 and services.step_calls("deploy") == 0
    # only the grant's approvers vote: ed-1 is not one (and submitted the run)
    status, answer, _ = vote(url, job_id, "ed-1", "accept")
    assert status == 403, answer
    status, answer, _ = vote(url, job_id, "chief-1", "maybe")
    assert status == 400 and "takes accept, reject" in str(answer), answer
    status, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert status == 200 and answer["decided"] is True and answer["decision"] == "accept", answer
    done = wait_for(lambda: (j := get_job(url, job_id))["status"] == "COMPLETED" and j)
    assert services.step_calls("deploy") == 1
    assert services.step_calls("draft") == 1  # replayed, not called again
    entry = next(c for c in done["checkpoints"] if c["name"] == "deploy")
    assert entry["grant"]["decision"] == "allow"
    assert entry["grant"]["decisionId"].startswith("gate:")
    assert "the gate decided accept (chief-1)" in entry["grant"]["reason"]
    _, history, _ = post(url, "job-history", {"jobId": job_id}, "root")
    assert history["integrity"] == "ok"
    kinds = [(t["kind"], t["actor"]) for t in history["transitions"]]
    assert ("vote", "chief-1") in kinds and ("decision", "chief-1") in kinds
    assert ("denied", "ed-1") in kinds


def test_a_rejected_grant_gate_fails_the_step_with_permission_uncalled(node, services):
    url = node.http.url
    job_id = submit(url, deploying(services.target), "ed-1")
    waiting_on_gate(url, job_id)
    _, answer, _ = vote(url, job_id, "chief-1", "reject")
    assert answer["decided"] is True and answer["decision"] == "reject", answer
    job = failed(url, job_id)
    assert job["error"].startswith(
        "PERMISSION: jobs.grants[1] grants it with an approval; the "
        "gate decided reject (chief-1) (decision gate:"
    )
    assert job["attempt"] == 1
    assert services.step_calls("deploy") == 0
