"""Breaker: ``serve --processes N`` children must serve the node's queues, with its limits."""

from __future__ import annotations

import argparse

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.role import JobsModule
from protomolt_jobs.worker import __main__ as worker_main
from protomolt_jobs.worker import processes


def test_worker_processes_get_the_nodes_queues_limits_and_weights(monkeypatch):
    captured: dict = {}

    class FakeGroup:
        def __init__(self, count, *, args, worker_id, env):
            captured["args"] = list(args)

        def start(self):
            return []

    monkeypatch.setattr(processes, "WorkerProcesses", FakeGroup)
    settings = {
        "dsn": "postgresql://127.0.0.1:1/none",
        "worker_id": "node",
        "queues": ["emails", "reports"],
        "queue_limits": {"reports": {"max_running": 2}},
        "fairness_weights": {"tenant-a": 3},
    }
    JobsModule().spawn_processes(settings, 2)
    sets = [v for k, v in zip(captured["args"], captured["args"][1:]) if k == "--set"]
    child = JobsConfig.from_mapping(
        worker_main._settings({}, argparse.Namespace(set=sets, dsn=None))
        | {"dsn": "postgresql://127.0.0.1:1/none"}
    )
    node = JobsConfig.from_mapping(settings)
    assert child.queues == node.queues == ("emails", "reports")
    assert child.queue_limits == node.queue_limits
    assert child.fairness_weights == node.fairness_weights
