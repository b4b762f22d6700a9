"""End to end: a node booted from ``protomolt.toml`` with roles registry (the test role) and
jobs, a real database, the real worker and real gRPC servers; everything through the verbs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import protomolt_jobs.role as jobs_module
from protomolt_jobs.errors import Unavailable
from protomolt_jobs.host.composer import compose
from protomolt_jobs.host.nodeconfig import NodeConfig
from tests.support import pg
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.roles import MemoryRepository, fresh_plugin_manager, registry_plugin

VERBS = [
    "submit-workflow",
    "get-job",
    "list-jobs",
    "complete-step",
    "cancel-job",
    "pause-job",
    "resume-job",
    "retry-step",
    "reconcile-step",
    "migrate-checkpoint",
    "requeue-job",
    "job-history",
    "approve-step",
    "extend-loop",
    "report-progress",
    "explain-job",
    "supply-input",
    "list-artifacts",
    "get-artifact",
    "lineage",
    "retract-artifact",
    "promote-artifact",
]


def wait_for(condition: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def backends(dsn: str) -> int:
    dbname = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(pg.BASE_DSN) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
        ).fetchone()[0]


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


def write_config(tmp_path, dsn: str | None, extra: str = "") -> NodeConfig:
    jobs = ""
    if dsn is not None:
        jobs = f"""
[jobs]
{extra}dsn = "{dsn}"
worker_count = 2
lease_seconds = 10
poll_interval_ms = 200
backoff_base_seconds = 0.2
sweep_interval_ms = 500
shutdown_grace_seconds = 2
pool_max_size = 4
"""
    path = tmp_path / "protomolt.toml"
    path.write_text(f'[node]\nroles = ["registry", "jobs"]\ndata_dir = "data"\n{jobs}')
    return NodeConfig.load(path, environ={})


def boot(config: NodeConfig, repository: MemoryRepository):
    return compose(
        config,
        plugin_manager=fresh_plugin_manager(),
        extra_plugins=[registry_plugin(repository), jobs_module],
    )


def test_node_runs_jobs_through_the_verbs_and_closes_clean(tmp_path, fresh_dsn, services):
    repository = MemoryRepository(
        {
            "seed-review": seed_workflow(services.target),
            "seed-auto": seed_workflow(services.target, review="invoke", name="seed-auto"),
        }
    )
    threads_before = set(threading.enumerate())
    node = boot(write_config(tmp_path, fresh_dsn), repository)
    node.start()
    call = node.catalog.execute
    try:
        assert node.catalog.names() == [
            *VERBS,
            "run-workflow",
            "check-workflow",
            "replay-check",
            "test-workflow",
            "get-workflow",
        ]

        def job(job_id: str) -> dict:
            answer = call("get-job", {"jobId": job_id})
            assert answer["ok"] is True
            return answer["job"]

        # A job that runs straight to COMPLETED.
        auto = call("submit-workflow", {"workflowName": "seed-auto", "input": {"text": "a b c"}})
        assert auto["ok"] is True
        done = wait_for(
            lambda: (j := job(auto["jobId"]))["status"] == "COMPLETED" and j,
            what="seed-auto to complete",
        )
        assert done["verdict"] and done["result"]["approved"] is True
        assert [c["name"] for c in done["checkpoints"]] == ["tokenize", "embed", "review"]
        assert done["completedAt"].endswith("Z")

        # A job that parks on its external review, resumed by complete-step.
        parked = call(
            "submit-workflow", {"workflowName": "seed-review", "input": {"text": "x y z w"}}
        )
        waiting = wait_for(
            lambda: (j := job(parked["jobId"]))["status"] == "WAITING" and j,
            what="seed-review to park",
        )
        assert waiting["outstandingStep"] == "review"
        body = {
            "jobId": parked["jobId"],
            "stepName": "review",
            "response": {"approved": True, "note": "fine"},
        }
        assert call("complete-step", body) == {"ok": True, "status": "QUEUED"}
        second = call("complete-step", body)
        assert second["ok"] is True
        completed = wait_for(
            lambda: (j := job(parked["jobId"]))["status"] == "COMPLETED" and j,
            what="the resumed job to complete",
        )
        assert [c["name"] for c in completed["checkpoints"]].count("review") == 1
        assert completed["result"]["note"] == "fine"
        again = call("complete-step", body)
        assert again == {"ok": True, "status": "COMPLETED"}

        # A response that breaks the step's rules: FAILED as a verdict.
        rejected = call("submit-workflow", {"workflowName": "seed-review", "input": {"text": "q"}})
        wait_for(lambda: job(rejected["jobId"])["status"] == "WAITING", what="second park")
        answer = call(
            "complete-step",
            {"jobId": rejected["jobId"], "stepName": "review", "response": {"approved": False}},
        )
        assert answer["ok"] is False and answer["status"] == "FAILED"
        failed = job(rejected["jobId"])
        assert failed["status"] == "FAILED"
        assert failed["error"].startswith("VALIDATION: ")

        listed = call("list-jobs", {"status": "COMPLETED"})["jobs"]
        assert {j["jobId"] for j in listed} == {auto["jobId"], parked["jobId"]}
    finally:
        node.close()

    # Nothing left behind: no thread, no connection.
    def new_threads() -> list[threading.Thread]:
        # The test gRPC server's pool threads start lazily and belong to the fixture.
        return [
            t
            for t in threading.enumerate()
            if t not in threads_before and t.is_alive() and not t.name.startswith("jobs-test")
        ]

    assert [t.name for t in new_threads() if not t.daemon] == []
    wait_for(lambda: not new_threads(), 10, f"threads to end: {[t.name for t in new_threads()]}")
    wait_for(lambda: backends(fresh_dsn) == 0, 10, "the database connections to close")
    with pytest.raises(Unavailable):
        call("get-job", {"jobId": parked["jobId"]})


def test_unconfigured_node_answers_unavailable(tmp_path, services):
    node = boot(write_config(tmp_path, None), MemoryRepository())
    with node:
        for verb in VERBS:
            with pytest.raises(
                Unavailable, match="set jobs.dsn in protomolt.toml or PROTOMOLT_JOBS_DSN"
            ):
                node.catalog.execute(verb, {})


def test_kafka_lanes_start_with_a_broker_and_stop_with_the_node(tmp_path, fresh_dsn, broker):
    from tests.support.kafka import unique_topic

    events, requests = unique_topic("events"), unique_topic("requests")
    extra = (
        f'[jobs]\nkafka_bootstrap = "{broker.bootstrap}"\n'
        f'events_topic = "{events}"\nrequest_topic = "{requests}"\n'
    )
    config = write_config(tmp_path, fresh_dsn, extra=extra.replace("[jobs]\n", ""))
    threads_before = set(threading.enumerate())
    node = boot(config, MemoryRepository({"seed-review": seed_workflow("127.0.0.1:1")}))
    node.start()
    try:
        mount = node.mount("jobs")
        assert [name for name, _ in mount.components] == [
            "sweeper",
            "pruner",
            "relay",
            "request_consumer",
            "worker",
        ]
        answer = node.catalog.execute(
            "submit-workflow", {"workflowName": "seed-review", "input": {"text": "x"}}
        )
        store = mount.store
        wait_for(
            lambda: any(
                row.event_type == "ACCEPTED" and row.status == "PUBLISHED"
                for row in store.outbox_for_job(answer["jobId"])
            ),
            30,
            "the ACCEPTED event to be published",
        )
    finally:
        node.close()
    assert mount.components == [] and mount.store is None
    leftover = [t for t in threading.enumerate() if t not in threads_before and not t.daemon]
    assert leftover == []
    wait_for(lambda: backends(fresh_dsn) == 0, 10, "the database connections to close")
