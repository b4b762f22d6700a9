"""The recovery verbs of step effects on the HTTP surface through the CLI (issue #17): the
token's name is the actor in the history. Real PostgreSQL, the real HTTP server on loopback."""

from __future__ import annotations

import json

import pytest

from protomolt_jobs.host.catalog import Catalog
from protomolt_jobs.host.cli import main
from protomolt_jobs.host.http_route import ActionsHttpServer
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import enqueue, event_types

TOKENS = {"alice": "alice-secret"}


@pytest.fixture
def http(store):
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    server = ActionsHttpServer(catalog, port=0, api_token="root", tokens=TOKENS).start()
    yield server
    server.close()


def recovery_required(store, step="tokenize"):
    job = enqueue(store, seed_workflow("127.0.0.1:9", review="invoke"), {"text": "a"})
    claimed = store.job_claim("w-1", 30.0)
    assert claimed is not None and claimed.job_id == job.job_id
    status = store.job_recovery_required(claimed.lease, step, "nothing proves it")
    assert status == "RECOVERY_REQUIRED"
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step, row.error) == (
        "RECOVERY_REQUIRED",
        step,
        "nothing proves it",
    )
    assert row.lease_owner is None and row.lease_token is None
    assert event_types(store, job.job_id)[-1] == ("RECOVERY_REQUIRED", step)
    return job.job_id


def test_cli_reconcile_done_over_http_records_the_token_name(store, http, capsys):
    jid = recovery_required(store)
    args = ["--url", http.url, "--token", "alice-secret"]
    code = main(
        ["jobs", "reconcile", str(jid), "--step", "tokenize", "--outcome", "done",
         "--response", '{"ids": ["5"], "text": "a", "count": 1}', "--reason", "seen"] + args
    )  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "status": "QUEUED"}
    row = store.job_get(jid)
    assert row.status == "QUEUED" and row.error is None and row.outstanding_step is None
    entry = row.checkpoints[0]
    assert entry["name"] == "tokenize" and entry["response"]["ids"] == ["5"]
    assert entry["receipt"] == {"reconciledBy": "alice"} and "at" in entry
    last = store.job_history(jid).transitions[-1]
    assert (last.kind, last.actor, last.reason, last.step) == (
        "reconcile-step",
        "alice",
        "seen",
        "tokenize",
    )
    # not RECOVERY_REQUIRED any more: both verbs answer ok: false naming the status
    assert main(["jobs", "migrate", str(jid), "--step", "tokenize", "--action", "keep"] + args) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is False and answer["status"] == "QUEUED"
    assert "accepts only a RECOVERY_REQUIRED run" in answer["error"]


def test_bad_reconcile_input_is_invalid_input_and_changes_nothing(store, http, capsys):
    jid = recovery_required(store)
    args = ["--url", http.url, "--token", "alice-secret"]
    code = main(["jobs", "reconcile", str(jid), "--step", "tokenize", "--outcome", "done"] + args)
    assert code != 0
    assert "'response' is required" in capsys.readouterr().err
    code = main(["jobs", "reconcile", str(jid), "--step", "nope", "--outcome", "not-done"] + args)
    assert code != 0
    assert "no step named 'nope'" in capsys.readouterr().err
    assert store.job_get(jid).status == "RECOVERY_REQUIRED"


def test_only_the_step_the_run_waits_on_can_be_reconciled(store, http, capsys):
    jid = recovery_required(store)
    args = ["--url", http.url, "--token", "alice-secret"]
    assert (
        main(["jobs", "reconcile", str(jid), "--step", "embed", "--outcome", "not-done"] + args)
        == 0
    )
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is False and answer["outstandingStep"] == "tokenize"
    assert "waits on step 'tokenize', not 'embed'" in answer["error"]
    row = store.job_get(jid)
    assert row.status == "RECOVERY_REQUIRED" and row.checkpoints == []


def test_two_operators_reconciling_at_once_exactly_one_wins(store):
    """Two reconcile-step calls on the same RECOVERY_REQUIRED run at the same moment (done and
    not-done): exactly one changes the row; the other's answer is ok: false naming the status
    the run is in now (no longer RECOVERY_REQUIRED); one transition, one checkpoint at most."""
    import threading

    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    for _ in range(3):  # a few rounds: the two calls interleave differently
        jid = str(recovery_required(store))
        barrier = threading.Barrier(2)
        answers: dict[str, dict] = {}

        def reconcile(outcome: str, jid: str = jid, barrier=barrier, answers=answers) -> None:
            body = {"jobId": jid, "stepName": "tokenize", "outcome": outcome}
            if outcome == "done":
                body["response"] = {"ids": ["5"], "text": "a", "count": 1}
            barrier.wait()
            answers[outcome] = catalog.execute("reconcile-step", body)

        threads = [threading.Thread(target=reconcile, args=(o,)) for o in ("done", "not-done")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        won = [o for o, a in answers.items() if a["ok"]]
        assert len(won) == 1, answers
        lost = answers[next(o for o in answers if o not in won)]
        assert lost["ok"] is False and lost["status"] == "QUEUED", lost
        row = store.job_get(jid)
        assert row.status == "QUEUED"
        assert len(row.checkpoints) == (1 if won == ["done"] else 0)
        kinds = [t.kind for t in store.job_history(jid).transitions]
        assert kinds.count("reconcile-step") == 1, kinds
        # leave no QUEUED run for the next round's claim
        assert catalog.execute("cancel-job", {"jobId": jid})["status"] == "CANCELLED"


def test_cancel_of_a_recovery_required_run_and_verbs_after_it(store):
    """cancel-job takes a RECOVERY_REQUIRED run (CANCELLED, no lease); reconcile-step and
    migrate-checkpoint are then refused naming CANCELLED; retry-step after a reconcile is
    refused while the run is QUEUED, naming the status."""
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    jid = str(recovery_required(store))
    assert catalog.execute("cancel-job", {"jobId": jid, "reason": "give up"})["status"] == (
        "CANCELLED"
    )
    row = store.job_get(jid)
    assert row.status == "CANCELLED" and row.lease_owner is None
    for verb, body in (
        ("reconcile-step", {"outcome": "not-done"}),
        ("migrate-checkpoint", {"action": "discard"}),
    ):
        answer = catalog.execute(verb, {"jobId": jid, "stepName": "tokenize", **body})
        assert answer["ok"] is False and answer["status"] == "CANCELLED", answer
        assert "accepts only a RECOVERY_REQUIRED run" in answer["error"]
    other = str(recovery_required(store))
    body = {"jobId": other, "stepName": "tokenize", "outcome": "not-done"}
    assert catalog.execute("reconcile-step", body) == {"ok": True, "status": "QUEUED"}
    answer = catalog.execute("retry-step", {"jobId": other, "stepName": "tokenize"})
    assert answer["ok"] is False and answer["status"] == "QUEUED", answer
    assert store.job_get(other).status == "QUEUED"
