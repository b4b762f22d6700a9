"""``[jobs.queue_preemption]`` (docs/long-steps.md, Preemption): parsed from TOML and the
environment, refused naming the key, and handed by the sweeper to ``job_preempt``."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig, preemption_rule
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.store.records import SweepResult

LIMITS = '{"gpu": {"max_running": 1}}'


def test_a_rule_from_toml_with_its_defaults(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x/y"\nqueues = ["gpu"]\n'
        "[jobs.queue_limits.gpu]\nmax_running = 1\n"
        "[jobs.queue_preemption.gpu]\nmin_priority_gap = 2\nafter_ms = 120000\n"
    )
    jobs = JobsConfig.from_mapping(NodeConfig.load(path, environ={}).section("jobs"))
    assert jobs.queue_preemption == {"gpu": {"min_priority_gap": 2, "after_ms": 120000}}
    assert preemption_rule(jobs.queue_preemption["gpu"]) == {
        "min_priority_gap": 2,
        "after_ms": 120000,
        "min_run_ms": 0,
    }


def test_a_rule_from_the_environment(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text('[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x/y"\n')
    env = {
        "PROTOMOLT_JOBS_QUEUE_LIMITS": LIMITS,
        "PROTOMOLT_JOBS_QUEUE_PREEMPTION": '{"gpu": {"min_run_ms": 5000}}',
    }
    jobs = JobsConfig.from_mapping(NodeConfig.load(path, environ=env).section("jobs"))
    assert jobs.queue_preemption == {"gpu": {"min_run_ms": 5000}}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"gpu": {"min_priority_gap": 0}}', "jobs.queue_preemption.gpu.min_priority_gap"),
        ('{"gpu": {"min_priority_gap": 5}}', "jobs.queue_preemption.gpu.min_priority_gap"),
        ('{"gpu": {"after_ms": -1}}', "jobs.queue_preemption.gpu.after_ms"),
        ('{"gpu": {"after_ms": 1.5}}', "jobs.queue_preemption.gpu.after_ms"),
        ('{"gpu": {"min_run_ms": true}}', "jobs.queue_preemption.gpu.min_run_ms"),
        ('{"gpu": {"wait": 1}}', "jobs.queue_preemption.gpu.wait"),
        ('{"gpu": 3}', "jobs.queue_preemption.gpu"),
        ('{"": {}}', "jobs.queue_preemption"),
        ("not json", "jobs.queue_preemption"),
        ('{"cpu": {"after_ms": 1}}', "jobs.queue_limits.cpu.max_running"),
    ],
)
def test_a_bad_rule_names_the_key(value, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        JobsConfig.from_mapping({"queue_limits": LIMITS, "queue_preemption": value})


class _Store:
    def __init__(self):
        self.calls = []

    def job_sweep_expired(self):
        return SweepResult(0, 0)

    def job_preempt(self, queue, **rule):
        self.calls.append((queue, rule))


def test_each_sweep_pass_runs_each_declared_rule():
    store = _Store()
    config = JobsConfig.from_mapping(
        {
            "worker_id": "w",
            "queue_limits": LIMITS,
            "queue_preemption": '{"gpu": {"min_priority_gap": 2, "after_ms": 1500}}',
        }
    )
    Sweeper(store, config=config).run_once()
    assert store.calls == [
        ("gpu", {"min_gap": 2, "after_s": 1.5, "min_run_s": 0.0, "actor": "sweeper"})
    ]


def test_no_rule_no_preemption_call():
    store = _Store()
    Sweeper(store, config=JobsConfig.from_mapping({"worker_id": "w"})).run_once()
    assert store.calls == []
