"""Scheduling pieces without services: the field parsers, the budget object, the cost meter,
and the [jobs] keys (queues, queue_limits, fairness_weights) from TOML and the environment."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.runs import scheduling
from protomolt_jobs.worker.budget import BudgetExceeded, CostMeter


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT3S", 3.0), ("PT1H30M", 5400.0), ("P1DT2H", 93600.0), ("P2W", 1209600.0), ("pt0.5s", 0.5)],
)
def test_durations(text, seconds):
    assert scheduling.parse_duration_s("budget.deadline", text) == seconds


@pytest.mark.parametrize("text", ["P", "PT", "3S", "P1M", "P1Y", "PT0S", "P1DT", 3, None, "P400D"])
def test_bad_durations_name_the_field(text):
    with pytest.raises(scheduling.FieldError) as err:
        scheduling.parse_duration_s("budget.deadline", text)
    assert err.value.field == "budget.deadline"


def test_resolve_precedence_submit_then_workflow_then_default():
    definition = {"scheduling": {"priority": 2, "queue": "gpu"}}
    got = scheduling.resolve(definition, {"queue": "cpu", "dedupKey": " k "})
    assert got == scheduling.Scheduling(
        priority=2, queue="cpu", fairness_key="default", dedup_key="k"
    )
    assert scheduling.resolve({}, {}) == scheduling.Scheduling()


def test_resolve_names_the_workflow_field():
    with pytest.raises(scheduling.FieldError) as err:
        scheduling.resolve({"scheduling": {"queue": ""}}, {})
    assert err.value.field == "scheduling.queue"
    with pytest.raises(scheduling.FieldError) as err:
        scheduling.resolve({"scheduling": {"lane": "x"}}, {})
    assert err.value.field == "scheduling.lane"


def test_budget_pause_waits_for_the_paused_status():
    with pytest.raises(scheduling.FieldError, match="PAUSED"):
        scheduling.parse_budget(
            {"budget": {"maxCost": 1, "onExceeded": "pause"}}, pause_supported=False
        )
    got = scheduling.parse_budget(
        {"budget": {"maxCost": 1, "onExceeded": "pause"}}, pause_supported=True
    )
    assert got.on_exceeded == "pause"


def test_cost_meter_stops_before_the_step_that_would_overrun():
    meter = CostMeter.for_definition(
        {"budget": {"maxCost": 10}, "steps": [{"name": f"s{i}", "cost": "4"} for i in range(4)]}
    )
    meter.add({"name": "s0", "skipped": False, "response": {}})
    meter.check("s0")
    meter.add({"name": "s1", "skipped": False, "response": {}})
    with pytest.raises(BudgetExceeded, match="budget.maxCost 10 exceeded: 8 spent after step 's1'"):
        meter.check("s1")


def test_cost_meter_reads_the_response_and_skips_cost_nothing():
    meter = CostMeter.for_definition(
        {"budget": {"maxCost": 100}, "steps": [{"name": "a", "cost": "response.n * 2"}]}
    )
    assert meter.add({"name": "a", "skipped": False, "response": {"n": 5}}) == 10.0
    assert meter.add({"name": "a", "skipped": True}) == 0.0
    with pytest.raises(BudgetExceeded, match="step 'a' cost"):
        meter.add({"name": "a", "skipped": False, "response": {"n": "x"}})
    assert CostMeter.for_definition({"steps": []}) is None


def test_jobs_keys_from_toml(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x/y"\nqueues = ["default", "gpu"]\n'
        "[jobs.queue_limits.gpu]\nmax_running = 2\nmax_starts_per_second = 5\n"
        "[jobs.fairness_weights]\nteam-a = 2\n"
    )
    jobs = JobsConfig.from_mapping(NodeConfig.load(path, environ={}).section("jobs"))
    assert jobs.queues == ("default", "gpu")
    assert jobs.queue_limits == {"gpu": {"max_running": 2, "max_starts_per_second": 5}}
    assert jobs.fairness_weights == {"team-a": 2}


def test_jobs_keys_from_the_environment(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text('[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x/y"\n')
    env = {
        "PROTOMOLT_JOBS_QUEUES": "default, gpu",
        "PROTOMOLT_JOBS_QUEUE_LIMITS": '{"gpu": {"max_running": 2}}',
        "PROTOMOLT_JOBS_FAIRNESS_WEIGHTS": '{"t": 0.5}',
    }
    jobs = JobsConfig.from_mapping(NodeConfig.load(path, environ=env).section("jobs"))
    assert jobs.queues == ("default", "gpu")
    assert jobs.queue_limits == {"gpu": {"max_running": 2}}
    assert jobs.fairness_weights == {"t": 0.5}


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("queues", "[]", "jobs.queues"),
        ("queues", "a,a", "jobs.queues"),
        ("queue_limits", '{"gpu": {"max_running": 0}}', "jobs.queue_limits.gpu.max_running"),
        ("queue_limits", '{"gpu": {"cap": 1}}', "jobs.queue_limits.gpu.cap"),
        ("queue_limits", "not json", "jobs.queue_limits"),
        ("queue_limits", '{"gpu": {"max_starts_per_second": -1}}', "max_starts_per_second"),
        ("fairness_weights", '{"t": 0}', "jobs.fairness_weights.t"),
    ],
)
def test_bad_jobs_keys_name_the_key(key, value, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        JobsConfig.from_mapping({key: value})
