"""Step effects across a worker crash (issue #17): real worker processes killed at a named
crash point between an external step's intent and its checkpoint, real PostgreSQL, gRPC
servers that count calls and record the idempotency key each call carried."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.grpc_servers import TestServices, message_class, schema_for
from tests.support.worker_proc import (
    CRASH_EXIT_CODE,
    WorkerProcess,
    enqueue,
    event_types,
    wait_for,
)

_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 1,
    "pool_max_size": 4,
}
KEY = "x-protomolt-idempotency-key"


def charge_workflow(target: str, *, effect: str | None, verify: bool) -> dict[str, Any]:
    """prepare (Tokenize) -> charge (Steps/Run, the step under test) -> finish (Embed)."""
    charge: dict[str, Any] = {
        "name": "charge",
        "target": target,
        "method": "jobs.test.Steps/Run",
        "rules": ["step = input.text"],
    }
    if effect is not None:
        charge["effect"] = effect
    if verify:
        charge["verify"] = {
            "method": "jobs.test.ReviewDesk/Review",
            "rules": ["text = input.text"],
            "found": "response.approved",
            "receipt": "{'note': response.note}",
        }
    return {
        "name": "charge-flow",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "steps": [
            {
                "name": "prepare",
                "target": target,
                "method": "jobs.test.Tokenizer/Tokenize",
                "rules": ["text = input.text"],
            },
            charge,
            {
                "name": "finish",
                "target": target,
                "method": "jobs.test.Embedder/Embed",
                "rules": ["ids = prepare.ids", "text = prepare.text"],
            },
        ],
    }


def probe_answers(services: TestServices, approved: bool, note: str) -> None:
    def review(request, context):
        out = message_class("jobs.test.Review")()
        out.approved = approved
        out.note = note
        return out

    services.set_handler("Review", review)


def crash_then_resume(store, dsn, services, workflow, *, point="before_checkpoint:charge"):
    """Run the job on a worker that dies at ``point``; return (job, resumed worker)."""
    job = enqueue(store, workflow, {"text": "pay"})
    a = WorkerProcess(dsn, worker_id="proc-a", crash_at=point, **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
    finally:
        a.close()
    row = store.job_get(job.job_id)
    assert row.status == "RUNNING"
    assert [c["name"] for c in row.checkpoints] == ["prepare"]
    b = WorkerProcess(dsn, worker_id="proc-b", **_FAST)
    b.start()
    return job, b


def test_external_step_whose_probe_finds_the_effect_is_not_called_again(store, fresh_dsn, services):
    probe_answers(services, True, "receipt-42")
    wf = charge_workflow(services.target, effect="external", verify=True)
    job, b = crash_then_resume(store, fresh_dsn, services, wf)
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    row = store.job_get(job.job_id)
    assert services.calls("Run") == 1, "the external step was called again"
    assert services.calls("Review") == 1
    charge = row.checkpoints[1]
    assert charge["name"] == "charge" and charge["skipped"] is False
    assert charge["receipt"] == {"note": "receipt-42"}
    assert charge["attempt"] == 2 and "at" in charge
    assert row.effect_intents and row.effect_intents["charge"]["key"] == f"{job.job_id}:charge:0"
    # the probe carried the step's key too
    assert services.metadata("Review")[0][KEY] == f"{job.job_id}:charge:0"
    assert [c["name"] for c in row.checkpoints] == ["prepare", "charge", "finish"]


def test_external_step_whose_probe_finds_nothing_is_called_exactly_once_more(
    store, fresh_dsn, services
):
    probe_answers(services, False, "nothing here")
    wf = charge_workflow(services.target, effect="external", verify=True)
    job, b = crash_then_resume(store, fresh_dsn, services, wf)
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.calls("Run") == 2
    assert services.calls("Review") == 1
    keys = [m[KEY] for m in services.metadata("Run")]
    assert keys == [f"{job.job_id}:charge:0"] * 2
    charge = store.job_get(job.job_id).checkpoints[1]
    assert charge["receipt"] == {"idempotencyKey": f"{job.job_id}:charge:0"}


def test_external_step_without_verify_waits_as_recovery_required(store, fresh_dsn, services):
    wf = charge_workflow(services.target, effect="external", verify=False)
    job, b = crash_then_resume(store, fresh_dsn, services, wf)
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "RECOVERY_REQUIRED", timeout_s=60)
    finally:
        b.close()
    row = store.job_get(job.job_id)
    assert row.outstanding_step == "charge"
    assert "no 'verify' probe" in row.error
    assert row.lease_owner is None and row.lease_token is None
    assert services.calls("Run") == 1
    kinds = event_types(store, job.job_id)
    assert kinds.count(("RECOVERY_REQUIRED", "charge")) == 1


def test_idempotent_step_is_called_again_with_the_same_key(store, fresh_dsn, services):
    wf = charge_workflow(services.target, effect=None, verify=False)
    job, b = crash_then_resume(store, fresh_dsn, services, wf)
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.calls("Run") == 2
    keys = [m[KEY] for m in services.metadata("Run")]
    assert keys == [f"{job.job_id}:charge:0"] * 2
    row = store.job_get(job.job_id)
    assert row.effect_intents is None, "an idempotent step wrote an intent"
    charge = row.checkpoints[1]
    assert "receipt" not in charge
    assert charge["descriptorSha256"] and charge["definitionSha256"] and charge["requestSha256"]


# -- reconcile-step ------------------------------------------------------------------------------


@pytest.fixture
def verbs(store):
    from protomolt_jobs.host.catalog import Caller, Catalog
    from protomolt_jobs.runs.submitter import Submitter
    from protomolt_jobs.verbs import JobsBackend, jobs_actions
    from protomolt_jobs.workflow import Runtime

    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)

    def call(verb, body, *, principal="alice"):
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


def recovery_required(store, fresh_dsn, services):
    wf = charge_workflow(services.target, effect="external", verify=False)
    job, b = crash_then_resume(store, fresh_dsn, services, wf)
    wait_for(lambda: store.job_get(job.job_id).status == "RECOVERY_REQUIRED", timeout_s=60)
    return job, b


def test_reconcile_done_completes_without_calling_the_step(store, fresh_dsn, services, verbs):
    job, b = recovery_required(store, fresh_dsn, services)
    try:
        jid = str(job.job_id)
        # the response is checked like complete-step's: a wrong shape changes nothing
        with pytest.raises(Exception, match="not valid proto3 JSON for jobs.test.StepReply"):
            verbs(
                "reconcile-step",
                {"jobId": jid, "stepName": "charge", "outcome": "done", "response": {"step": 5}},
            )
        assert store.job_get(job.job_id).status == "RECOVERY_REQUIRED"
        answer = verbs(
            "reconcile-step",
            {
                "jobId": jid,
                "stepName": "charge",
                "outcome": "done",
                "response": {"step": "charged-by-hand"},
                "reason": "the ledger shows it",
            },
            principal="bob",
        )
        assert answer == {"ok": True, "status": "QUEUED"}
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.calls("Run") == 1, "the reconciled step was called"
    row = store.job_get(job.job_id)
    charge = row.checkpoints[1]
    assert charge["response"]["step"] == "charged-by-hand"
    assert charge["receipt"] == {"reconciledBy": "bob"}
    history = store.job_history(job.job_id).transitions
    reconciled = [t for t in history if t.kind == "reconcile-step"]
    assert len(reconciled) == 1
    assert reconciled[0].actor == "bob" and reconciled[0].reason == "the ledger shows it"
    assert reconciled[0].step == "charge"
    # a second reconcile is refused, naming the status
    again = verbs("reconcile-step", {"jobId": jid, "stepName": "charge", "outcome": "not-done"})
    assert again["ok"] is False and again["status"] == "COMPLETED"
    assert "accepts only a RECOVERY_REQUIRED run" in again["error"]


def test_reconcile_not_done_calls_the_step_once(store, fresh_dsn, services, verbs):
    job, b = recovery_required(store, fresh_dsn, services)
    try:
        answer = verbs(
            "reconcile-step",
            {"jobId": str(job.job_id), "stepName": "charge", "outcome": "not-done"},
        )
        assert answer == {"ok": True, "status": "QUEUED"}
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.calls("Run") == 2
    keys = [m[KEY] for m in services.metadata("Run")]
    assert keys == [f"{job.job_id}:charge:0"] * 2
    kinds = [t.kind for t in store.job_history(job.job_id).transitions]
    assert kinds.count("reconcile-step") == 1 and kinds.count("recovery-required") == 1


def test_retry_step_grows_the_generation_of_the_key(store, fresh_dsn, services, verbs):
    from protomolt_jobs.worker import Worker
    from protomolt_jobs.workflow import Runtime
    from tests.support.worker_proc import jobs_config

    worker = Worker(store, runtime=Runtime(), config=jobs_config(fresh_dsn), dsn=fresh_dsn)
    job = enqueue(store, charge_workflow(services.target, effect=None, verify=False), {"text": "x"})
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "COMPLETED"
    answer = verbs("retry-step", {"jobId": str(job.job_id), "stepName": "charge"})
    assert answer["ok"] is True
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED"
    assert row.step_generations == {"charge": 1}
    assert [m[KEY] for m in services.metadata("Run")] == [
        f"{job.job_id}:charge:0",
        f"{job.job_id}:charge:1",
    ]
    # the other steps' keys did not move: finish ran again after charge, still generation 0
    assert [m[KEY] for m in services.metadata("Embed")] == [f"{job.job_id}:finish:0"] * 2
    shown = verbs("get-job", {"jobId": str(job.job_id)})["job"]
    assert shown["stepGenerations"] == {"charge": 1}


def test_a_crash_right_after_the_intent_asks_the_probe_and_calls_once(store, fresh_dsn, services):
    """Killed after the intent committed and before the call: the probe finds nothing, the
    step is called exactly once in all, with the intent's key."""
    probe_answers(services, False, "nothing here")
    wf = charge_workflow(services.target, effect="external", verify=True)
    job, b = crash_then_resume(store, fresh_dsn, services, wf, point="after_intent:charge")
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    assert services.calls("Review") == 1
    assert services.calls("Run") == 1
    assert services.metadata("Run")[0][KEY] == f"{job.job_id}:charge:0"
    kinds = [t.kind for t in store.job_history(job.job_id).transitions]
    assert kinds.count("intent") == 1, kinds  # the resumed run found it: no second intent


def test_a_crash_after_the_intent_with_the_probe_unreachable_waits_as_recovery_required(
    store, fresh_dsn, services
):
    """Killed after the intent; the verify probe's server cannot be reached: the run waits as
    RECOVERY_REQUIRED naming the step (no retry loop, not DEAD), the step is never called."""
    wf = charge_workflow(services.target, effect="external", verify=True)
    wf["steps"][1]["verify"]["target"] = "127.0.0.1:9"  # discard port: nothing answers
    job, b = crash_then_resume(store, fresh_dsn, services, wf, point="after_intent:charge")
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "RECOVERY_REQUIRED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert row.outstanding_step == "charge" and row.lease_owner is None
        assert "verify probe failed" in row.error, row.error
        attempt = row.attempt
        # it stays there (no lease, no further attempt) for several leases while the worker
        # keeps polling: a retry loop or a sweep would move it within one lease
        deadline = time.monotonic() + 3 * _FAST["lease_seconds"]
        while time.monotonic() < deadline:
            now = store.job_get(job.job_id)
            assert (now.status, now.attempt) == ("RECOVERY_REQUIRED", attempt)
            assert b.alive()
            time.sleep(0.2)
    finally:
        b.close()
    assert services.calls("Run") == 0
    assert event_types(store, job.job_id).count(("RECOVERY_REQUIRED", "charge")) == 1


def test_cancel_then_retry_of_another_step_keeps_the_unproven_intent(
    store, fresh_dsn, services, verbs
):
    """A RECOVERY_REQUIRED run is cancelled, then an operator retries a step other than the
    unproven one: the intent of the external step must survive, so the resumed run does not
    call it blindly (it waits as RECOVERY_REQUIRED again)."""
    job, b = recovery_required(store, fresh_dsn, services)
    try:
        jid = str(job.job_id)
        assert verbs("cancel-job", {"jobId": jid})["status"] == "CANCELLED"
        assert store.job_get(job.job_id).effect_intents.get("charge") is not None
        answer = verbs("retry-step", {"jobId": jid, "stepName": "finish"})
        assert answer["ok"] is True, answer
        assert store.job_get(job.job_id).effect_intents.get("charge") is not None
        wait_for(
            lambda: (
                store.job_get(job.job_id).status
                in ("RECOVERY_REQUIRED", "COMPLETED", "FAILED", "DEAD")
            ),
            timeout_s=60,
        )
        row = store.job_get(job.job_id)
        assert (row.status, row.outstanding_step) == ("RECOVERY_REQUIRED", "charge")
        # the operator's word on that step (retry-step charge) does call it, with the key it
        # had (issue 27: an external step named by retry-step keeps its idempotency key unless
        # the operator asks for a new one, so the adapter can answer with its first answer)
        assert verbs("cancel-job", {"jobId": jid})["status"] == "CANCELLED"
        assert verbs("retry-step", {"jobId": jid, "stepName": "charge"})["ok"] is True
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
    finally:
        b.close()
    keys = [m[KEY] for m in services.metadata("Run")]
    assert keys == [f"{job.job_id}:charge:0", f"{job.job_id}:charge:0"], keys


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("found", "((", "found: Invalid CEL expression"),
        ("found", "response.note", "found: a filter must be a boolean expression"),
        ("found", "response.nope", "found:"),
        ("receipt", "((", "receipt: Invalid CEL expression"),
        ("rules", ["nope = input.text"], "rules: target: no field 'nope'"),
    ],
)
def test_a_broken_verify_probe_is_refused_at_submit(store, services, verbs, key, value, said):
    """A probe that could never decide (bad CEL, a non-boolean found, a rule for a field the
    probe's request lacks) is refused at submit (invalid-definition naming the step), not found
    out after a crash (where it would send the run to RECOVERY_REQUIRED); nothing is written."""
    wf = charge_workflow(services.target, effect="external", verify=True)
    wf["steps"][1]["verify"][key] = value
    answer = verbs("submit-workflow", {"workflow": wf, "input": {"text": "pay"}})
    assert answer["ok"] is False, answer
    assert "[verify]" in answer["error"] and said in answer["error"], answer
    assert store.job_claim("w-x", 5.0) is None
    good = charge_workflow(services.target, effect="external", verify=True)
    assert verbs("submit-workflow", {"workflow": good, "input": {"text": "pay"}})["ok"] is True


def test_a_crash_after_the_intent_on_the_last_attempt_is_recovery_required_not_dead(
    store, fresh_dsn, services
):
    """The worker dies after the intent on the job's last attempt: the sweeper finds the
    lease expired with no attempts left. An unproven external effect is not a dead letter:
    the run waits as RECOVERY_REQUIRED naming the step (one event), and the step is never
    called."""
    wf = charge_workflow(services.target, effect="external", verify=False)
    job = enqueue(store, wf, {"text": "pay"}, max_attempts=1)
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at="after_intent:charge", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
    finally:
        a.close()
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    b.start()
    try:
        wait_for(lambda: store.job_get(job.job_id).status != "RUNNING", timeout_s=60)
    finally:
        b.close()
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step) == ("RECOVERY_REQUIRED", "charge"), row.error
    assert row.lease_owner is None and "no attempts left" in row.error
    assert services.calls("Run") == 0
    assert event_types(store, job.job_id).count(("RECOVERY_REQUIRED", "charge")) == 1
    assert ("DEAD", "") not in event_types(store, job.job_id)


def test_an_external_call_that_may_have_happened_on_the_last_attempt_is_not_dead(
    store, fresh_dsn, services
):
    """The external step's call runs past its deadline (the server may have acted) on the
    job's last attempt: the effect is unproven, so the run waits as RECOVERY_REQUIRED naming
    the step, not DEAD."""
    services.set_delay("Run", 1.5)
    wf = charge_workflow(services.target, effect="external", verify=False)
    wf["steps"][1]["deadlineMs"] = 300
    job = enqueue(store, wf, {"text": "pay"}, max_attempts=1)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_FAST)
    b.start()
    try:
        wait_for(
            lambda: store.job_get(job.job_id).status not in ("QUEUED", "RUNNING"), timeout_s=60
        )
    finally:
        b.close()
    row = store.job_get(job.job_id)
    assert (row.status, row.outstanding_step) == ("RECOVERY_REQUIRED", "charge"), row.error
    assert "call failed on the last attempt" in row.error and "DEADLINE" in row.error
    assert row.lease_owner is None
    assert services.calls("Run") == 1
    assert event_types(store, job.job_id).count(("RECOVERY_REQUIRED", "charge")) == 1
    assert "DEAD" not in [kind for kind, _ in event_types(store, job.job_id)]
