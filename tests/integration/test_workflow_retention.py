"""A workflow's own ``retention`` on real PostgreSQL, a real broker, real workers and real gRPC
services: the pruner deletes a 1-day workflow's runs (with their history and outbox rows) and
keeps a 365-day one's, by the database clock; a workflow without the key is pruned by the
node-wide setting as before; a retention outside the node's bounds is refused at PUT and at
submit naming the bound; docs/workflows.md's *Retention* example is stored as written."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import psycopg
import pytest

from protomolt_jobs.app import JobsApp
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.kafka import unique_topic
from tests.support.node import http, node_environ, start_node
from tests.support.worker_proc import wait_for

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
DAY = 86_400.0


def _sql(dsn: str, text: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


def _counts(dsn: str, ids: list[str]) -> tuple[int, int, int]:
    """``(runs, transition rows, outbox rows)`` of the runs ``ids``."""
    runs = _sql(dsn, "SELECT count(*) FROM workflow_run WHERE job_id::text = ANY(%s)", (ids,))
    log = _sql(
        dsn, "SELECT count(*) FROM workflow_run_transition WHERE job_id::text = ANY(%s)", (ids,)
    )
    out = _sql(
        dsn, "SELECT count(*) FROM workflow_run_events_outbox WHERE kafka_key = ANY(%s)", (ids,)
    )
    return runs[0][0], log[0][0], out[0][0]


@pytest.fixture
def services():
    with TestServices(max_workers=8) as s:
        yield s


def test_the_pruner_honours_each_workflows_retention_by_the_database_clock(
    fresh_dsn, broker, services
):
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=unique_topic("retention-ev"),
        worker_count=2,
        poll_interval_ms=100,
        relay_poll_interval_ms=50,
        # the node-wide settings: a run without a workflow retention goes after 1 day
        run_retention_seconds=DAY,
        outbox_retention_seconds=7 * DAY,
        prune_interval_seconds=3600.0,  # the test runs the passes itself
    )
    app = JobsApp.open(config, runtime=Runtime())
    short = {**seed_workflow(services.target, review="invoke", name="keep-1d"), "retention": "P1D"}
    long = {
        **seed_workflow(services.target, review="invoke", name="keep-365d"),
        "retention": {"completed": "P365D", "failed": "P365D"},
    }
    plain = seed_workflow(services.target, review="invoke", name="keep-node")
    ids: dict[str, list[str]] = {"short": [], "long": [], "plain": []}
    try:
        app.start()
        for kind, workflow in (("short", short), ("long", long), ("plain", plain)):
            for _ in range(3):
                outcome = app.submitter.submit(workflow=workflow, input={"text": "kept?"})
                assert outcome.ok, outcome
                ids[kind].append(outcome.job_id)
        every = [i for v in ids.values() for i in v]

        def settled_and_published() -> bool:
            done = _sql(
                fresh_dsn,
                "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED' "
                "AND job_id::text = ANY(%s)",
                (every,),
            )[0][0]
            pending = _sql(
                fresh_dsn,
                "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED' "
                "AND kafka_key = ANY(%s)",
                (every,),
            )[0][0]
            return done == len(every) and pending == 0

        wait_for(settled_and_published, timeout_s=60, what="every run COMPLETED and published")
    finally:
        app.close()
    stamped = dict(
        _sql(
            fresh_dsn,
            "SELECT workflow_name, retention::text FROM workflow_run WHERE job_id::text = ANY(%s)",
            (every,),
        )
    )
    assert json.loads(stamped["keep-1d"])["COMPLETED"] == DAY
    # the statuses the 365-day object leaves out keep the node's setting, stamped at submit
    assert json.loads(stamped["keep-365d"]) == {
        "COMPLETED": 365 * DAY,
        "FAILED": 365 * DAY,
        "CANCELLED": DAY,
        "DEAD": DAY,
    }
    assert stamped["keep-node"] is None  # no key: nothing stored, the node-wide setting applies

    before = {kind: _counts(fresh_dsn, v) for kind, v in ids.items()}
    before_each = {job: _counts(fresh_dsn, [job]) for job in every}
    for kind, (runs, log, out) in before.items():
        assert runs == 3 and log > 0 and out > 0, (kind, before)

    store = JobStore.open(fresh_dsn, max_size=2)
    pruner = Pruner(store, config=config)
    # Nothing is old yet: a pass deletes nothing.
    assert pruner.run_once().runs == 0
    # Every run finished two days ago, by the database clock (its events with it).
    _sql(
        fresh_dsn,
        "UPDATE workflow_run SET completed_at = completed_at - interval '2 days', "
        "updated_at = updated_at - interval '2 days', created_at = created_at - interval '2 days' "
        "WHERE job_id::text = ANY(%s)",
        (every,),
    )
    _sql(
        fresh_dsn,
        "UPDATE workflow_run_events_outbox SET created_at = created_at - interval '2 days', "
        "published_at = published_at - interval '2 days' WHERE kafka_key = ANY(%s)",
        (every,),
    )
    # One event of the second 1-day run is still owed to the broker (PENDING); the third
    # 1-day run and its events were written by another writer (origin NULL: a Java node's).
    short_ok, short_pending, short_foreign = ids["short"]
    _sql(
        fresh_dsn,
        "UPDATE workflow_run_events_outbox SET status = 'PENDING', published_at = NULL "
        "WHERE event_id = (SELECT event_id FROM workflow_run_events_outbox WHERE kafka_key = %s "
        "ORDER BY seq LIMIT 1)",
        (short_pending,),
    )
    _sql(
        fresh_dsn, "UPDATE workflow_run SET origin = NULL WHERE job_id::text = %s", (short_foreign,)
    )
    _sql(
        fresh_dsn,
        "UPDATE workflow_run_events_outbox SET origin = NULL WHERE kafka_key = %s",
        (short_foreign,),
    )
    result = pruner.run_once()
    assert result.retained_runs == 2
    assert result.runs == 5  # two 1-day runs, and the three without a retention
    # The 1-day workflow: the runs, their transition log and their outbox rows are gone ...
    assert _counts(fresh_dsn, [short_ok]) == (0, 0, 0)
    # ... but for an event not yet published, which the relay still owes (never pruned) ...
    assert _counts(fresh_dsn, [short_pending]) == (0, 0, 1)
    assert _sql(
        fresh_dsn,
        "SELECT status FROM workflow_run_events_outbox WHERE kafka_key = %s",
        (short_pending,),
    ) == [("PENDING",)]
    # ... and a foreign writer's run, left alone as before (jobs.prune_foreign_rows = false).
    assert _counts(fresh_dsn, [short_foreign]) == before_each[short_foreign]
    # The 365-day workflow: everything kept, though the node-wide retention (1 day) has passed.
    assert _counts(fresh_dsn, ids["long"]) == before["long"]
    # Without the key, exactly as before: the node-wide statement deleted the runs (and their
    # log), and their PUBLISHED outbox rows wait for the outbox retention (7 days).
    assert _counts(fresh_dsn, ids["plain"]) == (0, 0, before["plain"][2])
    assert pruner.run_once().runs == 0
    # With jobs.prune_foreign_rows the foreign 1-day run goes too (the 365-day ones stay).
    foreign = Pruner(store, config=dataclasses.replace(config, prune_foreign_rows=True))
    assert foreign.run_once().retained_runs == 1
    assert _counts(fresh_dsn, [short_foreign]) == (0, 0, 0)
    assert _counts(fresh_dsn, ids["long"]) == before["long"]
    store.close()


def _guide_example() -> dict:
    text = GUIDE.read_text(encoding="utf-8")
    match = re.search(r"<!-- retention example[^>]*-->\n```json\n(.*?)```", text, re.DOTALL)
    assert match is not None, "docs/workflows.md lost its Retention example"
    return json.loads(match.group(1))


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(
        node_environ(tmp_path / "data", fresh_dsn, workflow_retention_min_seconds="43200")
    )
    yield surfaces
    surfaces.close()


def test_the_guides_example_is_stored_and_get_shows_the_effective_retention(node):
    example = _guide_example()
    url = f"{node.http.url}/protomolt/workflows/nightly-digest"
    status, body, _ = http("PUT", url, example)
    assert status == 200 and (body["name"], body["version"]) == ("nightly-digest", 1)
    status, stored, headers = http("GET", url)
    assert status == 200 and stored == example  # the stored definition, verbatim
    shown = json.loads(headers["Protomolt-Retention"])  # header names are case-insensitive
    assert shown["completed"] == {"seconds": DAY, "source": "workflow"}
    assert shown["dead"] == {"seconds": 90 * DAY, "source": "workflow"}
    # get-workflow answers the same object
    status, got, _ = http(
        "POST",
        f"{node.http.url}/protomolt/actions/get-workflow",
        {"workflowName": "nightly-digest"},
    )
    assert status == 200 and got["retention"] == shown, got


def test_a_retention_outside_the_nodes_bounds_is_refused_at_put_naming_the_bound(node):
    example = {**_guide_example(), "retention": {"completed": "PT1H", "failed": "P30D"}}
    url = f"{node.http.url}/protomolt/workflows/too-short"
    status, body, _ = http("PUT", url, example)
    assert status == 422 and body["error"] == "does-not-verify"
    (finding,) = body["findings"]
    assert finding["kind"] == "retention"
    assert "'retention.completed' (1h) is below the node's minimum retention" in finding["error"]
    assert "jobs.workflow_retention_min_seconds = 43200" in finding["error"]
    assert http("GET", url)[0] == 404  # nothing stored
    too_long = {**_guide_example(), "retention": "P4000D"}
    status, body, _ = http("PUT", url, too_long)
    assert status == 422
    assert "jobs.workflow_retention_max_seconds" in body["findings"][0]["error"]
    malformed = {**_guide_example(), "retention": {"completed": "tomorrow"}}
    status, body, _ = http("PUT", url, malformed)
    assert status == 422 and "'retention.completed' must be a positive duration" in body["message"]


def test_submit_refuses_a_retention_outside_the_bounds_with_invalid_input(node):
    example = {**_guide_example(), "retention": "PT2H"}
    status, body, _ = http(
        "POST",
        f"{node.http.url}/protomolt/actions/submit-workflow",
        {"workflow": example, "input": {"day": "2026-12-07"}},
    )
    assert status == 400, body
    assert body["error"] == "invalid-input"
    assert body["details"]["field"] == "workflow"
    assert body["details"]["path"] == "retention"
    assert "jobs.workflow_retention_min_seconds = 43200" in body["message"]
