"""Grant gates (docs/approvals.md, *Capabilities and grants*; issue 26 build item 5): a
``needs-approval`` grant parks the run on the step's gate in sequential AND graph runs, the
gate's votes decide the grant, its timers fire from the database clock, the dashboard's inbox
lists it, and a grant by group matches the groups an identity hook returned at submit.

Real PostgreSQL, the node's HTTP surface on loopback with real tokens, the jobs role's workers
(and, for the timers, a worker process with its sweeper), and the ``Steps/Run`` test service on
loopback counting calls per step.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from protomolt_jobs.hooks import Identity, hookimpl
from tests.support.graphs import graph, step
from tests.support.node import http, node_environ, wait_for
from tests.support.worker_proc import WorkerProcess

ROOT = "root-secret"
TOKENS = {
    "ed-1": "ed-1-secret",
    "writer-1": "writer-1-secret",
    "chief-1": "chief-1-secret",
    "chief-2": "chief-2-secret",
    "oncall-1": "hook-oncall-secret",  # known to the identity hook only
}
#: The grants, also handed to the timer test's worker process (``--set grants=...``).
GRANTS = [
    {
        "capabilities": ["deploy:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
    },
    {
        "capabilities": ["release:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
        "quorum": 2,
    },
    {"capabilities": ["ops:restart"], "groups": ["ops"]},
]
TIMED_GRANTS = {
    "escalate": {
        "capabilities": ["deploy:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
        "escalate": [{"after": "PT2S", "addRoles": ["writer"]}],
        "expires": "PT120S",
    },
    "reject": {
        "capabilities": ["deploy:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
        "expires": "PT2S",
    },
    "fail": {
        "capabilities": ["deploy:prod"],
        "decision": "needs-approval",
        "approvers": {"roles": ["chief"]},
        "expires": "PT2S",
        "onExpire": "fail",
    },
}


def node_file(grants: list[dict]) -> str:
    tokens = "\n".join(f'{n} = "{s}"' for n, s in TOKENS.items() if n != "oncall-1")
    return f"""
[node]
api_token = "{ROOT}"
[node.tokens]
{tokens}
[node.groups]
editor = ["ed-1"]
writer = ["writer-1"]
chief = ["chief-1", "chief-2"]
[node.scopes]
editor = ["service-invoke", "workflow-run", "job-approve"]
writer = ["service-invoke", "workflow-run", "job-approve"]
chief = ["service-invoke", "job-approve"]
""" + "".join(_grant_toml(g) for g in grants)


def _grant_toml(grant: dict) -> str:
    lines = ["", "[[jobs.grants]]"]
    for key, value in grant.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            items = ", ".join(
                "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in item.items()) + " }"
                for item in value
            )
            lines.append(f"{key} = [{items}]")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


class OnCallDirectory:
    """An identity hook: ``hook-oncall-secret`` is ``oncall-1`` in groups ``writer`` and
    ``ops``; ``ops`` is in no ``[node.groups]`` entry (only the hook knows it)."""

    @hookimpl
    def protomolt_resolve_identity(self, token):
        if token == TOKENS["oncall-1"]:
            return Identity("oncall-1", frozenset({"writer", "ops"}))
        return None


def start(tmp_path, dsn, grants=GRANTS, plugins=(), **jobs):
    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    path = Path(tmp_path) / "protomolt.toml"
    path.write_text(node_file(grants))
    config = NodeConfig.load(path, node_environ(Path(tmp_path) / "data", dsn, **jobs))
    return start_surfaces(compose(config, extra_plugins=list(plugins)), config)


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start(tmp_path, fresh_dsn, plugins=[OnCallDirectory()])
    try:
        yield surfaces
    finally:
        surfaces.close()


def post(url, verb, body, who="root"):
    token = ROOT if who == "root" else TOKENS[who]
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def get_job(url, job_id):
    status, answer, _ = post(url, "get-job", {"jobId": job_id})
    assert status == 200, answer
    return answer["job"]


def history(url, job_id):
    _, answer, _ = post(url, "job-history", {"jobId": job_id})
    assert answer["integrity"] == "ok"
    return answer["transitions"]


def submit(url, workflow, who="ed-1", **extra):
    status, answer, _ = post(
        url, "submit-workflow", {"workflow": workflow, "input": {}, **extra}, who
    )
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def vote(url, job_id, who, decision, step_name="deploy"):
    body = {"jobId": job_id, "stepName": step_name, "decision": decision}
    return post(url, "approve-step", body, who)


def waiting_on_gate(url, job_id, step_name="deploy", timeout_s=30.0):
    return wait_for(
        lambda: (
            (j := get_job(url, job_id))["status"] == "WAITING"
            and j.get("phase") == "waiting_approval"
            and j.get("outstandingStep") == step_name
            and j
        ),
        timeout_s=timeout_s,
    )


def ended(url, job_id, status, timeout_s=30.0):
    return wait_for(
        lambda: (j := get_job(url, job_id))["status"] == status and j, timeout_s=timeout_s
    )


def deploy_graph(target, *, side_ms=1500, **keys):
    """draft -> (deploy [deploy:prod] || side, which sleeps) ; notify after deploy."""
    return graph(
        [
            step("draft", target),
            step("deploy", target, after=["draft"], capabilities=["deploy:prod"]),
            step("side", target, after=["draft"], sleep_ms=side_ms),
            step("notify", target, after=["deploy"]),
        ],
        name="deploy-graph",
        **keys,
    )


# -- 1. a graph run opens the gate ----------------------------------------------------------


def test_a_graph_run_parks_on_the_grant_gate_and_accept_lets_the_step_run(node, services):
    url = node.http.url
    job_id = submit(url, deploy_graph(services.target))
    job = waiting_on_gate(url, job_id)
    # The branch in flight (side) finished and was checkpointed before the park; the gated
    # step was not called, nor anything behind it.
    names = [c["name"] for c in job["checkpoints"]]
    assert names == ["draft", "side"], names
    assert services.step_calls("side") == 1
    assert services.step_calls("deploy") == 0 and services.step_calls("notify") == 0
    # complete-step cannot answer a grant gate (the step is not external)
    status, answer, _ = post(
        url, "complete-step", {"jobId": job_id, "stepName": "deploy", "response": {}}
    )
    assert status == 200 and answer["ok"] is False, answer
    assert get_job(url, job_id)["status"] == "WAITING"
    # Only the grant's approvers vote; the decisions are accept and reject.
    status, answer, _ = vote(url, job_id, "writer-1", "accept")
    assert status == 403 and "not an approver of this grant gate" in answer["message"], answer
    status, answer, _ = vote(url, job_id, "chief-1", "maybe")
    assert status == 400 and "takes accept, reject" in str(answer), answer
    status, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert status == 200 and answer["decided"] is True and answer["decision"] == "accept", answer
    done = ended(url, job_id, "COMPLETED")
    assert services.step_calls("deploy") == 1 and services.step_calls("notify") == 1
    # draft and side replayed, not called again
    assert services.step_calls("draft") == 1 and services.step_calls("side") == 1
    entry = next(c for c in done["checkpoints"] if c["name"] == "deploy")
    assert entry["grant"]["decision"] == "allow"
    assert entry["grant"]["decisionId"].startswith("gate:")
    assert "the gate decided accept (chief-1)" in entry["grant"]["reason"]
    kinds = [(t["kind"], t["actor"], t.get("step")) for t in history(url, job_id)]
    assert ("vote", "chief-1", "deploy") in kinds and ("decision", "chief-1", "deploy") in kinds
    assert any(k == "denied" and a == "writer-1" for k, a, _ in kinds), kinds


def test_a_rejected_graph_gate_fails_the_step_and_its_failure_edge_runs(node, services):
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, after=["draft"], capabilities=["deploy:prod"]),
            step("rollback", services.target, after=[{"step": "deploy", "on": "failure"}]),
        ],
        name="deploy-graph",
        completion={"require": ["rollback"]},
    )
    job_id = submit(url, workflow)
    waiting_on_gate(url, job_id)
    _, answer, _ = vote(url, job_id, "chief-1", "reject")
    assert answer["decided"] is True and answer["decision"] == "reject", answer
    done = ended(url, job_id, "COMPLETED")
    deploy = next(c for c in done["checkpoints"] if c["name"] == "deploy")
    assert deploy["failed"]["kind"] == "PERMISSION"
    assert "the gate decided reject (chief-1)" in deploy["failed"]["message"]
    assert services.step_calls("deploy") == 0  # never called
    assert services.step_calls("rollback") == 1  # the failure edge applies


def test_a_vote_after_the_gate_decided_and_the_run_ended_names_the_gates_decision(node, services):
    """Found by the breaker: a vote on a grant gate whose step then ran (or failed by the
    gate) answered ``already-decided`` with ``decision: null``, as if nothing were decided."""
    url = node.http.url
    accepted = submit(url, deploy_graph(services.target, side_ms=0))
    waiting_on_gate(url, accepted)
    _, answer, _ = vote(url, accepted, "chief-1", "accept")
    assert answer["decided"] is True, answer
    ended(url, accepted, "COMPLETED")
    status, answer, _ = vote(url, accepted, "chief-2", "reject")
    assert status == 200 and answer["ok"] is False, answer
    assert answer["error"] == "already-decided" and answer["decision"] == "accept", answer
    rejected = submit(
        url,
        graph(
            [
                step("draft", services.target),
                step("deploy", services.target, after=["draft"], capabilities=["deploy:prod"]),
            ],
            name="deploy-graph",
        ),
    )
    waiting_on_gate(url, rejected)
    _, answer, _ = vote(url, rejected, "chief-1", "reject")
    assert answer["decided"] is True, answer
    ended(url, rejected, "FAILED")
    status, answer, _ = vote(url, rejected, "chief-2", "accept")
    assert status == 200 and answer["ok"] is False, answer
    assert answer["error"] == "already-decided" and answer["decision"] == "reject", answer
    assert services.step_calls("deploy") == 1  # the accepted run's, never the rejected one


def test_a_vote_after_the_gate_decided_while_its_step_runs_is_already_decided(node, services):
    """Found by the breaker: between a grant gate's decision and the step's checkpoint (the
    run QUEUED, then RUNNING the step), a late vote answered ``not-open``, where an approval
    step's late voter is told ``already-decided`` with the decision."""
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step(
                "deploy",
                services.target,
                after=["draft"],
                capabilities=["deploy:prod"],
                sleep_ms=10_000,
            ),
        ],
        name="deploy-graph",
    )
    job_id = submit(url, workflow)
    waiting_on_gate(url, job_id)
    _, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert answer["decided"] is True, answer
    wait_for(lambda: services.step_calls("deploy") == 1)  # in flight for 10 s, not checkpointed
    status, answer, _ = vote(url, job_id, "chief-2", "reject")
    assert status == 200 and answer["ok"] is False, answer
    assert answer["error"] == "already-decided" and answer["decision"] == "accept", answer
    assert answer["status"] == "RUNNING", answer
    ended(url, job_id, "COMPLETED")


def test_an_unhandled_rejected_graph_gate_fails_the_run_once_and_compensates(node, services):
    url = node.http.url
    t = services.target
    workflow = graph(
        [
            step("reserve", t, compensate="release"),
            step("deploy", t, after=["reserve"], capabilities=["deploy:prod"]),
            step("release", t),
        ],
        name="deploy-graph",
    )
    job_id = submit(url, workflow)
    waiting_on_gate(url, job_id)
    vote(url, job_id, "chief-1", "reject")
    failed = ended(url, job_id, "FAILED")
    assert failed["error"].startswith(
        "PERMISSION: jobs.grants[0] grants it with an approval; the gate decided reject (chief-1)"
    )
    assert failed["attempt"] == 1  # never retried
    assert services.step_calls("deploy") == 0
    assert services.step_calls("release") == 1  # compensation ran
    assert [c["name"] for c in failed["checkpoints"]] == ["reserve", "deploy", "release"]


def test_a_sequential_run_parks_on_the_gate_and_accept_lets_the_step_run(node, services):
    """The acceptance line for a sequential run (no graph key): the gate, then the step."""
    url = node.http.url
    workflow = graph(
        [
            step("draft", services.target),
            step("deploy", services.target, capabilities=["deploy:prod"]),
        ],
        name="deploy-seq",
    )
    job_id = submit(url, workflow)
    job = waiting_on_gate(url, job_id)
    assert [c["name"] for c in job["checkpoints"]] == ["draft"]
    assert services.step_calls("deploy") == 0
    vote(url, job_id, "chief-2", "accept")
    done = ended(url, job_id, "COMPLETED")
    assert services.step_calls("deploy") == 1
    entry = next(c for c in done["checkpoints"] if c["name"] == "deploy")
    assert "the gate decided accept (chief-2)" in entry["grant"]["reason"]


# -- 4. groups from the identity hook --------------------------------------------------------


def test_a_grant_by_group_matches_a_group_the_identity_hook_returned_at_submit(
    node, services, fresh_dsn
):
    from protomolt_jobs.store import JobStore

    url = node.http.url
    workflow = graph(
        [step("restart", services.target, capabilities=["ops:restart"])], name="ops-flow"
    )
    # oncall-1 exists only in the hook, in group ops (no [node.groups] entry names it)
    job_id = submit(url, workflow, who="oncall-1")
    done = ended(url, job_id, "COMPLETED")
    assert done["checkpoints"][0]["grant"]["decisionId"] == "jobs.grants[2]"
    assert services.step_calls("restart") == 1
    store = JobStore.open(fresh_dsn, max_size=1)
    try:
        row = store.job_get(job_id)
        assert row.submitted_by == "oncall-1"
        assert row.submitted_groups == ["ops", "writer"]
        # writer-1 is in [node.groups] writer, not in ops: the grant does not apply
        other = submit(url, workflow, who="writer-1")
        failed = ended(url, other, "FAILED")
        assert failed["error"].startswith(
            "PERMISSION: capability ops:restart is not granted to workflow 'ops-flow' "
            "submitted by writer-1"
        )
        assert store.job_get(other).submitted_groups == ["writer"]
    finally:
        store.close()
    assert services.step_calls("restart") == 1


# -- the races ------------------------------------------------------------------------------

RACES = 20


def _race(*calls):
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(run, c) for c in calls]]


def _release_graph(target):
    return graph(
        [
            step("draft", target),
            step("release", target, after=["draft"], capabilities=["release:prod"]),
        ],
        name="release-graph",
    )


def _waiting_many(url, target, n):
    ids = [submit(url, _release_graph(target)) for _ in range(n)]
    for job_id in ids:
        waiting_on_gate(url, job_id, "release", timeout_s=120)
    return ids


def test_twenty_races_of_two_deciding_votes_on_a_grant_gate_decide_once(node, services):
    url = node.http.url
    for job_id in _waiting_many(url, services.target, RACES):
        answers = _race(
            lambda j=job_id: vote(url, j, "chief-1", "accept", "release")[1],
            lambda j=job_id: vote(url, j, "chief-2", "accept", "release")[1],
        )
        assert all(a["ok"] for a in answers), answers
        assert sorted(a["decided"] for a in answers) == [False, True], answers
        winner = next(a for a in answers if a["decided"])
        assert winner["tally"] == {"accept": 2} and winner["needed"] == 2
        assert [t["kind"] for t in history(url, job_id)].count("decision") == 1
    wait_for(lambda: services.step_calls("release") == RACES, timeout_s=120)


def test_twenty_races_of_a_cancel_and_the_deciding_grant_vote_end_one_way(node, services):
    url = node.http.url
    decided = cancelled_first = 0
    for job_id in _waiting_many(url, services.target, RACES):
        _, first, _ = vote(url, job_id, "chief-1", "accept", "release")
        assert first["tally"] == {"accept": 1} and first["decided"] is False, first
        answer, (cancel_status, cancel, _) = _race(
            lambda j=job_id: vote(url, j, "chief-2", "accept", "release")[1],
            lambda j=job_id: post(url, "cancel-job", {"jobId": j, "reason": "race"}),
        )
        assert cancel_status == 200, cancel
        kinds = [t["kind"] for t in history(url, job_id)]
        if answer["ok"]:
            assert answer["decided"] is True and answer["decision"] == "accept"
            assert kinds.count("decision") == 1
            if cancel["ok"]:
                stop = next(i for i, k in enumerate(kinds) if k in ("cancel", "cancel-request"))
                assert kinds.index("decision") < stop
            else:
                # The worker ran the granted step and finished before the cancel arrived.
                assert cancel["status"] == "COMPLETED", cancel
                assert "cancel" not in kinds
            decided += 1
        else:
            assert cancel["ok"], cancel
            assert answer["error"] == "not-open" and answer["status"] == "CANCELLED", answer
            assert "decision" not in kinds and kinds.count("cancel") == 1
            cancelled_first += 1
        ended(url, job_id, "CANCELLED" if cancel["ok"] else "COMPLETED")
    assert decided + cancelled_first == RACES
    print(f"grant gate cancel races: vote decided {decided}, cancel first {cancelled_first}")


# -- 2. timers ------------------------------------------------------------------------------


@pytest.fixture
def timed(request, tmp_path, fresh_dsn):
    """A node whose grant (``TIMED_GRANTS[param]``) has timers, answering votes on HTTP (its
    own sweeper does not pass during the test; its workers serve ``default`` only), and a
    worker process with the same grants and a 200 ms sweeper serving ``gates``."""
    grant = TIMED_GRANTS[request.param]
    surfaces = start(tmp_path, fresh_dsn, grants=[grant], sweep_interval_ms=3_600_000)
    proc = WorkerProcess(
        fresh_dsn,
        worker_id="gates",
        sweeper=True,
        sweep_interval_ms=200,
        queues="gates",
        grants=json.dumps([grant]),
    ).start()
    try:
        yield surfaces
    finally:
        proc.terminate()
        proc.wait_exit(15)
        proc.close()
        surfaces.close()


@pytest.mark.parametrize("timed", ["escalate"], indirect=True)
def test_a_grant_gate_escalation_lets_the_writer_vote_and_emits_its_event(timed, services, store):
    url = timed.http.url
    job_id = submit(url, deploy_graph(services.target, side_ms=0), queue="gates")
    waiting_on_gate(url, job_id)
    status, answer, _ = vote(url, job_id, "writer-1", "accept")
    assert status == 403 and "not an approver" in answer["message"], answer  # not yet
    wait_for(
        lambda: ("escalate", "sweeper") in [(t["kind"], t["actor"]) for t in history(url, job_id)],
        timeout_s=30,
    )
    assert "APPROVAL_ESCALATED" in [e.event_type for e in store.outbox_for_job(job_id)]
    # The escalation widened who may vote (the quorum stays 1): writer-1's accept decides.
    status, answer, _ = vote(url, job_id, "writer-1", "accept")
    assert status == 200 and answer["decided"] is True, answer
    ended(url, job_id, "COMPLETED", timeout_s=30)
    assert services.step_calls("deploy") == 1


@pytest.mark.parametrize("graph_run", [True, False], ids=["graph", "sequential"])
@pytest.mark.parametrize("timed", ["reject"], indirect=True)
def test_a_grant_gate_expiry_rejects_and_never_accepts(timed, services, graph_run):
    url = timed.http.url
    t = services.target
    workflow = (
        deploy_graph(t, side_ms=0)
        if graph_run
        else graph([step("draft", t), step("deploy", t, capabilities=["deploy:prod"])])
    )
    job_id = submit(url, workflow, queue="gates")
    waiting_on_gate(url, job_id)
    failed = ended(url, job_id, "FAILED", timeout_s=30)
    assert failed["error"].startswith("PERMISSION: jobs.grants[0] grants it with an approval; ")
    assert "the gate decided reject (sweeper)" in failed["error"]
    assert failed["attempt"] == 1  # never retried
    assert services.step_calls("deploy") == 0
    kinds = [(t["kind"], t["actor"], t.get("reason")) for t in history(url, job_id)]
    assert ("decision", "sweeper", "expired: decided reject") in kinds
    # A vote after the expiry changes nothing: the gate decided reject (in a graph run the
    # step's failed entry used it; a sequential run failed with no entry, its decision unused)
    _, answer, _ = vote(url, job_id, "chief-1", "accept")
    assert answer["ok"] is False and answer["error"] == "already-decided", answer
    assert answer["decision"] == "reject", answer


@pytest.mark.parametrize("timed", ["fail"], indirect=True)
def test_a_grant_gate_expiry_can_fail_the_run(timed, services):
    url = timed.http.url
    job_id = submit(url, deploy_graph(services.target, side_ms=0), queue="gates")
    waiting_on_gate(url, job_id)
    failed = ended(url, job_id, "FAILED", timeout_s=30)
    assert failed["error"] == (
        "PERMISSION: the grant gate of step 'deploy' expired (decision jobs.grants[0])"
    )
    assert ("expire", "sweeper") in [(t["kind"], t["actor"]) for t in history(url, job_id)]
    assert services.step_calls("deploy") == 0


# -- 3. the dashboard's inbox ---------------------------------------------------------------


@pytest.fixture
def browser():
    """Headless Chromium (Debian's, ``tests/support/browser.py``); fails without it."""
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tests.support.browser import browser_paths, require_browser

    chromium, chromedriver = browser_paths()
    require_browser(chromium, chromedriver)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="pmj-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _in_page(driver, css, text=""):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def found():
        try:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            return elements[0] if elements and text in elements[0].text else None
        except StaleElementReferenceException:
            return None

    return wait_for(found, timeout_s=20)


def _sign_in(driver, url, who):
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui/login")
    _in_page(driver, "#login-form")
    driver.find_element(By.ID, "token").send_keys(TOKENS[who])
    driver.find_element(By.ID, "login-submit").click()
    wait_for(lambda: "/ui/login" not in driver.current_url, timeout_s=20)


def test_the_inbox_lists_a_grant_gate_for_its_approvers_and_votes_from_it(node, services, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = node.http.url
    job_id = submit(url, _release_graph(services.target))
    waiting_on_gate(url, job_id, "release")
    row_css = f'#approvals tr[data-job-id="{job_id}"]'

    # writer-1 holds job-approve but is no approver of the gate: not in its inbox
    _sign_in(browser, url, "writer-1")
    browser.get(f"{url}/ui/inbox")
    _in_page(browser, "h1", "Inbox")
    assert job_id not in browser.page_source

    # chief-1 sees the gate (quorum 2 from jobs.grants[1]) and votes from the inbox
    _sign_in(browser, url, "chief-1")
    browser.get(f"{url}/ui/inbox")
    row = _in_page(browser, row_css, "grant gate (jobs.grants[1])")
    assert "release" in row.text and "accept 0/2" in row.text, row.text
    Select(row.find_element(By.NAME, "decision")).select_by_value("accept")
    row.find_element(By.NAME, "comment").send_keys("ship it")
    row.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _in_page(browser, "p.message", "vote counted: accept 1/2")
    assert get_job(url, job_id)["status"] == "WAITING"

    # chief-2 sees the vote so far and decides
    _sign_in(browser, url, "chief-2")
    browser.get(f"{url}/ui/inbox")
    row = _in_page(browser, row_css, "chief-1: accept")
    assert "accept 1/2" in row.text, row.text
    Select(row.find_element(By.NAME, "decision")).select_by_value("accept")
    row.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _in_page(browser, "p.message", "decided: accept")
    ended(url, job_id, "COMPLETED")
    assert services.step_calls("release") == 1
    kinds = [(t["kind"], t["actor"]) for t in history(url, job_id)]
    assert ("vote", "chief-1") in kinds and ("decision", "chief-2") in kinds
    # decided: no longer in the inbox
    browser.get(f"{url}/ui/inbox")
    _in_page(browser, "h1", "Inbox")
    assert job_id not in browser.page_source


# -- the store: one decision grants one run of the step --------------------------------------


@pytest.mark.parametrize("used_by", ["grant", "failed"])
def test_a_gate_decision_grants_one_run_of_the_step_and_groups_are_recorded(store, used_by):
    """Through the real store: the groups given at submit are recorded; a decided gate is read
    back until a checkpoint entry of the step used it (ran under it, or failed by it), so a
    later run of the step (a loop's next iteration) needs a gate of its own."""
    from tests.support.factories import claimed_job

    claimed = claimed_job(store, groups=("ops", "writer", "ops"))
    job_id = claimed.job_id
    assert store.job_submitted_groups(job_id) == ("ops", "writer")
    assert store.job_get(job_id).submitted_groups == ["ops", "writer"]
    assert store.job_park_approval(claimed.lease, "deploy", ()) == "WAITING"
    assert store.grant_gate_decision(job_id, "deploy") is None  # open, not decided
    outcome = store.approval_vote(
        job_id,
        "deploy",
        principal="chief-1",
        groups=["chief"],
        decision="accept",
        comment=None,
        quorum=1,
        veto=(),
        distinct_from=(),
        entry=lambda *a: {},
        grant_gate=True,
    )
    assert outcome.result == "decided" and outcome.status == "QUEUED"
    decision, actor, seq = store.grant_gate_decision(job_id, "deploy")
    assert (decision, actor) == ("accept", "chief-1")
    assert store.job_get(job_id).checkpoints == []  # a grant gate's decision stores no entry
    again = store.job_claim("worker-b", 60.0)
    assert again is not None and again.job_id == job_id
    # not used yet (a transient failure of the call keeps it)
    assert store.grant_gate_decision(job_id, "deploy") == (decision, actor, seq)
    entry = (
        {"name": "deploy", "skipped": False, "response": {}, "grant": {"decisionId": f"gate:{seq}"}}
        if used_by == "grant"
        else {
            "name": "deploy",
            "skipped": False,
            "failed": {"kind": "PERMISSION", "message": f"no (decision gate:{seq})"},
        }
    )
    store.job_checkpoint(again.lease, entry)
    assert store.grant_gate_decision(job_id, "deploy") is None


def test_a_submit_without_groups_records_none(store):
    from tests.support.factories import queued_job

    job = queued_job(store)
    assert store.job_submitted_groups(job.job_id) is None
    assert store.job_get(job.job_id).submitted_groups is None
