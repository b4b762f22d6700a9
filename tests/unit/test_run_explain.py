"""runs/explain.py's account of a live run, without a database: what holds the run (timer,
queue cap, queue rate, claim, pause, budget), the undecided steps of a sequential run with
their blockers, and a finished run's empty account."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from typing import Any

import pytest

from protomolt_jobs.runs.explain import explain
from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.workflow import Runtime, parse_workflow
from tests.support.graphs import METHOD
from tests.support.grpc_servers import schema_for

NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
TARGET = "127.0.0.1:9"


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    definition = {
        "name": "w",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "inputs": {"lang": {"owner": "team:data"}},
        "steps": [
            {"name": "a", "target": TARGET, "method": METHOD, "rules": ["seen += input.text"]},
            {"name": "b", "target": TARGET, "method": METHOD, "owner": "team:b"},
            {"name": "c", "target": TARGET, "method": METHOD, "rules": ["seen += input.lang"]},
        ],
    }
    return StoredRun(definition, parse_workflow(definition, Runtime()))


def job(**kw: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "job_id": "j",
        "status": "QUEUED",
        "wait_kind": None,
        "outstanding_step": None,
        "checkpoints": [],
        "error": None,
        "run_after": NOW - datetime.timedelta(seconds=1),
        "queue": "reports",
        "input": {"text": "t"},
    }
    return SimpleNamespace(**(base | kw))


def account(stored: StoredRun, run: SimpleNamespace, cap: Any = None) -> dict[str, Any]:
    return explain(run, stored, approval=lambda s: None, queue_cap=lambda q: cap, now=NOW)


def test_a_due_queued_run_waits_for_a_claim_a_cap_or_the_queue_rate(stored):
    assert account(stored, job())["run"] == [{"kind": "claim", "queue": "reports"}]
    full = {"max_running": 2, "running": 2, "max_starts_per_second": None, "next_start_at": None}
    assert account(stored, job(), full)["run"] == [
        {"kind": "queue-cap", "queue": "reports", "maxRunning": 2, "running": 2}
    ]
    later = NOW + datetime.timedelta(seconds=3)
    rated = {
        "max_running": None,
        "running": 0,
        "max_starts_per_second": 0.5,
        "next_start_at": later,
    }
    assert account(stored, job(), rated)["run"] == [
        {"kind": "queue-rate", "queue": "reports", "at": later.isoformat()}
    ]
    timer = account(stored, job(run_after=later))["run"]
    assert timer == [{"kind": "timer", "at": later.isoformat()}]


def test_the_undecided_steps_their_blockers_and_missing_inputs(stored):
    run = job(checkpoints=[{"name": "a", "skipped": False, "response": {"step": "a"}}])
    body = account(stored, run)
    steps = {s["name"]: s for s in body["steps"]}
    assert set(steps) == {"b", "c"}  # a is decided
    assert steps["b"]["owner"] == "team:b" and steps["b"]["blockedBy"] == []
    assert steps["b"]["waitingOn"] == [{"kind": "claim", "queue": "reports"}]  # the frontier
    assert steps["c"]["blockedBy"] == [{"step": "b", "state": "not-reached"}]
    assert steps["c"]["waitingOn"] == []  # the run's reasons go to the frontier only
    assert steps["c"]["missingInputs"] == [
        {"path": "lang", "owner": "team:data", "required": True, "declared": True}
    ]
    assert body["inputs"] == [
        {"path": "lang", "owner": "team:data", "required": True, "present": False}
    ]


def test_a_paused_run_says_why_and_a_finished_run_has_nothing_undecided(stored):
    paused = account(stored, job(status="PAUSED", error="BUDGET: maxCost 4 spent"))
    assert paused["run"] == [{"kind": "budget", "detail": "BUDGET: maxCost 4 spent"}]
    assert paused["steps"][0]["waitingOn"] == paused["run"]
    done = account(stored, job(status="COMPLETED"))
    assert done["steps"] == [] and done["run"] == []
