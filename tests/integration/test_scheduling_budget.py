"""Run budgets on real PostgreSQL with a worker process: the whole-run deadline (swept with the
database clock, waits included) and the cost ceiling (metered at checkpoint boundaries)."""

from __future__ import annotations

import time

import pytest

from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.workflow.types import Runtime
from tests.support.grpc_servers import schema_for
from tests.support.worker_proc import WorkerProcess, wait_for

_FAST = {
    "poll_interval_ms": 100,
    "sweep_interval_ms": 200,
    "lease_seconds": 30,
    "worker_count": 2,
    "pool_max_size": 4,
}


@pytest.fixture
def submitter(store):
    return Submitter(store, None, Runtime(), 3)


def tokenize_step(name: str, target: str, **extra) -> dict:
    return {
        "name": name,
        "target": target,
        "method": "jobs.test.Tokenizer/Tokenize",
        "rules": ["text = input.text"],
        **extra,
    }


def workflow(target: str, steps: list[dict], budget: dict) -> dict:
    return {
        "name": "budgeted",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "steps": steps,
        "budget": budget,
    }


def test_a_deadline_ends_a_run_parked_waiting_at_about_the_deadline(
    fresh_dsn, services, store, submitter
):
    definition = workflow(
        services.target,
        [
            tokenize_step("first", services.target),
            tokenize_step("approve", services.target, completion="external"),
        ],
        {"deadline": "PT3S"},
    )
    with WorkerProcess(fresh_dsn, worker_id="budget-a", **_FAST):
        submitted = time.monotonic()
        outcome = submitter.submit(workflow=definition, input={"text": "slow approval"})
        assert outcome.ok, outcome
        wait_for(lambda: store.job_get(outcome.job_id).status == "WAITING", timeout_s=30)
        wait_for(lambda: store.job_get(outcome.job_id).status == "FAILED", timeout_s=30)
        ended = time.monotonic() - submitted
    row = store.job_get(outcome.job_id)
    assert 2.9 <= ended <= 5.0, ended
    assert "budget.deadline PT3S exceeded" in row.error, row.error
    assert "parked on step approve" in row.error
    assert row.outstanding_step is None and row.completed_at is not None
    assert (row.completed_at - row.created_at).total_seconds() >= 3.0
    events = [o.event_type for o in store.outbox_for_job(outcome.job_id)]
    assert events[-1] == "FAILED"


def test_a_cost_ceiling_stops_the_run_before_the_step_that_would_overrun(
    fresh_dsn, services, store, submitter
):
    steps = [tokenize_step(f"s{i}", services.target, cost="4") for i in range(1, 5)]
    definition = workflow(services.target, steps, {"maxCost": 10})
    with WorkerProcess(fresh_dsn, worker_id="budget-b", **_FAST):
        outcome = submitter.submit(workflow=definition, input={"text": "four steps"})
        assert outcome.ok, outcome
        wait_for(lambda: store.job_get(outcome.job_id).status == "FAILED", timeout_s=30)
    row = store.job_get(outcome.job_id)
    assert [c["name"] for c in row.checkpoints] == ["s1", "s2"]
    assert services.calls("Tokenize") == 2
    assert "budget.maxCost 10 exceeded" in row.error, row.error


def test_a_cost_over_the_response_is_metered(fresh_dsn, services, store, submitter):
    # "a b c" tokenizes to count 3: cost 3 per step, ceiling 7: s1 (3), s2 (6), stop (6+3 > 7).
    steps = [tokenize_step(f"s{i}", services.target, cost="response.count") for i in range(1, 4)]
    definition = workflow(services.target, steps, {"maxCost": 7, "onExceeded": "fail"})
    with WorkerProcess(fresh_dsn, worker_id="budget-c", **_FAST):
        outcome = submitter.submit(workflow=definition, input={"text": "a b c"})
        wait_for(lambda: store.job_get(outcome.job_id).status == "FAILED", timeout_s=30)
    assert [c["name"] for c in store.job_get(outcome.job_id).checkpoints] == ["s1", "s2"]


def test_a_run_within_budget_completes(fresh_dsn, services, store, submitter):
    steps = [tokenize_step(f"s{i}", services.target, cost="4") for i in range(1, 3)]
    definition = workflow(services.target, steps, {"maxCost": 10, "deadline": "PT1M"})
    with WorkerProcess(fresh_dsn, worker_id="budget-d", **_FAST):
        outcome = submitter.submit(workflow=definition, input={"text": "fits"})
        wait_for(lambda: store.job_get(outcome.job_id).status == "COMPLETED", timeout_s=30)
    assert store.job_get(outcome.job_id).deadline_at is not None


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"deadline": "3 seconds"}, "budget.deadline"),
        ({"deadline": "P1M"}, "budget.deadline"),
        ({"maxCost": 0}, "budget.maxCost"),
        ({"maxCost": 5, "onExceeded": "explode"}, "budget.onExceeded"),
        ({}, "budget"),
    ],
)
def test_bad_budgets_are_refused_naming_the_field(services, store, submitter, budget, field):
    definition = workflow(services.target, [tokenize_step("s1", services.target)], budget)
    outcome = submitter.submit(workflow=definition, input={"text": "x"})
    assert not outcome.ok
    assert outcome.reason == "invalid-definition"
    assert outcome.field == field
    assert store.job_list() == []


def test_an_unknown_budget_key_is_invalid_input_naming_its_path(services, store, submitter):
    # Unknown keys anywhere in a definition are refused at the door (workflow/keys.py).
    definition = workflow(services.target, [tokenize_step("s1", services.target)], {"ceiling": 5})
    outcome = submitter.submit(workflow=definition, input={"text": "x"})
    assert (outcome.ok, outcome.reason) == (False, "invalid-input")
    assert (outcome.field, outcome.path) == ("workflow", "budget.ceiling")
    assert "unknown key 'ceiling' at budget.ceiling" in outcome.error
    assert store.job_list() == []


def test_a_cost_that_does_not_compile_is_refused(services, store, submitter):
    steps = [tokenize_step("s1", services.target, cost="response.count +")]
    outcome = submitter.submit(
        workflow=workflow(services.target, steps, {"maxCost": 5}), input={"text": "x"}
    )
    assert not outcome.ok and outcome.field == "steps[0].cost"


def _history(store, job_id):
    return [
        (t.kind, t.new_status, t.actor, t.reason) for t in store.job_history(job_id).transitions
    ]


def test_a_deadline_with_pause_pauses_a_parked_run_at_about_the_deadline_and_resume_grants_a_fresh_window(
    fresh_dsn, services, store, submitter
):
    definition = workflow(
        services.target,
        [
            tokenize_step("first", services.target),
            tokenize_step("approve", services.target, completion="external"),
        ],
        {"deadline": "PT3S", "onExceeded": "pause"},
    )
    with WorkerProcess(fresh_dsn, worker_id="budget-p", **_FAST):
        submitted = time.monotonic()
        outcome = submitter.submit(workflow=definition, input={"text": "slow approval"})
        assert outcome.ok, outcome
        wait_for(lambda: store.job_get(outcome.job_id).status == "WAITING", timeout_s=30)
        wait_for(lambda: store.job_get(outcome.job_id).status == "PAUSED", timeout_s=30)
        ended = time.monotonic() - submitted
        row = store.job_get(outcome.job_id)
        assert 2.9 <= ended <= 5.0, ended
        assert "budget.deadline PT3S exceeded" in row.error, row.error
        assert "parked on step approve" in row.error
        assert row.outstanding_step == "approve" and row.completed_at is None
        kind, status, actor, reason = _history(store, outcome.job_id)[-1]
        assert (kind, status, actor) == ("budget", "PAUSED", "sweeper")
        assert "budget.deadline PT3S exceeded" in reason
        events = store.outbox_for_job(outcome.job_id)
        assert events[-1].event_type == "PAUSED"
        old_deadline = row.deadline_at

        # Resume: back to WAITING on the same step, with a fresh PT3S window from the resume
        # (a deadline already past would pause it again at once).
        resumed = store.job_resume(outcome.job_id, actor="ops")
        assert resumed.changed and resumed.status == "WAITING"
        row = store.job_get(outcome.job_id)
        assert row.deadline_at > old_deadline
        # ... and the sweeper pauses it again when that window is spent too.
        wait_for(lambda: store.job_get(outcome.job_id).status == "PAUSED", timeout_s=30)
        assert [h[:3] for h in _history(store, outcome.job_id)].count(
            ("budget", "PAUSED", "sweeper")
        ) == 2


def test_a_deadline_with_pause_asks_a_running_run_to_pause_at_its_next_checkpoint(
    fresh_dsn, services, store, submitter
):
    services.set_delay("Tokenize", 1.5)
    steps = [tokenize_step(f"s{i}", services.target) for i in range(1, 5)]
    definition = workflow(services.target, steps, {"deadline": "PT2S", "onExceeded": "pause"})
    with WorkerProcess(fresh_dsn, worker_id="budget-r", **_FAST):
        outcome = submitter.submit(workflow=definition, input={"text": "long"})
        wait_for(lambda: store.job_get(outcome.job_id).status == "PAUSED", timeout_s=30)
    row = store.job_get(outcome.job_id)
    assert 1 <= len(row.checkpoints) < 4
    history = _history(store, outcome.job_id)
    assert ("pause-request", "RUNNING", "sweeper") in [h[:3] for h in history]
    kind, status, actor, reason = history[-1]
    assert (kind, status, actor) == ("pause", "PAUSED", "sweeper")
    assert "budget.deadline PT2S exceeded" in reason


def test_a_cost_ceiling_with_pause_pauses_before_the_third_step_and_resume_grants_another(
    fresh_dsn, services, store, submitter
):
    steps = [tokenize_step(f"s{i}", services.target, cost="4") for i in range(1, 7)]
    definition = workflow(services.target, steps, {"maxCost": 10, "onExceeded": "pause"})
    with WorkerProcess(fresh_dsn, worker_id="budget-q", **_FAST):
        outcome = submitter.submit(workflow=definition, input={"text": "six steps"})
        assert outcome.ok, outcome
        wait_for(lambda: store.job_get(outcome.job_id).status == "PAUSED", timeout_s=30)
        row = store.job_get(outcome.job_id)
        assert [c["name"] for c in row.checkpoints] == ["s1", "s2"]
        assert services.calls("Tokenize") == 2
        assert "budget.maxCost 10 exceeded" in row.error, row.error
        kind, status, actor, reason = _history(store, outcome.job_id)[-1]
        assert (kind, status, actor) == ("budget", "PAUSED", "worker:budget-q")
        assert "budget.maxCost 10 exceeded" in reason
        assert store.outbox_for_job(outcome.job_id)[-1].event_type == "PAUSED"

        # Resume grants one more maxCost (ceiling 20): s3, s4, s5 run (spent 20; after s4,
        # 16 + 4 <= 20), then 20 + 4 > 20 pauses again.
        assert store.job_resume(outcome.job_id, actor="ops").status == "QUEUED"
        wait_for(
            lambda: (
                len(store.job_get(outcome.job_id).checkpoints) == 5
                and store.job_get(outcome.job_id).status == "PAUSED"
            ),
            timeout_s=30,
        )
        assert services.calls("Tokenize") == 5
        assert store.job_resume(outcome.job_id, actor="ops").status == "QUEUED"
        wait_for(lambda: store.job_get(outcome.job_id).status == "COMPLETED", timeout_s=30)
    assert services.calls("Tokenize") == 6
