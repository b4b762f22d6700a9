"""The pruner on real PostgreSQL, with a real relay publishing to the broker and real workers
claiming and completing jobs: old PUBLISHED outbox rows and old terminal runs go; no run that
is not terminal and no PENDING outbox row is ever deleted (an AFTER DELETE trigger of the test
records every deleted row's status, so a wrong delete cannot hide)."""

from __future__ import annotations

import logging
import time
import uuid

import psycopg
import pytest

from protomolt_jobs.app import JobsApp
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.maintenance.pruner import PENDING_WARN_ROWS, Pruner
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.support.factories import queued_job
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.kafka import unique_topic
from tests.support.node import wait_for

AUDIT = """
CREATE TABLE pruned_audit (kind text NOT NULL, id text NOT NULL, status text NOT NULL);
CREATE FUNCTION audit_run_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pruned_audit VALUES ('run', OLD.job_id::text, OLD.status);
    RETURN OLD;
END $$;
CREATE FUNCTION audit_outbox_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pruned_audit VALUES ('outbox', OLD.event_id::text, OLD.status);
    RETURN OLD;
END $$;
CREATE TRIGGER audit_run AFTER DELETE ON workflow_run
    FOR EACH ROW EXECUTE FUNCTION audit_run_delete();
CREATE TRIGGER audit_outbox AFTER DELETE ON workflow_run_events_outbox
    FOR EACH ROW EXECUTE FUNCTION audit_outbox_delete();
"""


def _sql(dsn: str, text: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


def test_the_pruner_removes_old_published_rows_and_finished_runs_and_nothing_live(
    fresh_dsn, broker, services
):
    _sql(fresh_dsn, AUDIT)
    config = JobsConfig(
        dsn=fresh_dsn,
        kafka_bootstrap=broker.bootstrap,
        events_topic=unique_topic("prune-ev"),
        worker_count=2,
        poll_interval_ms=100,
        relay_poll_interval_ms=50,
        prune_interval_seconds=0.2,
        outbox_retention_seconds=1.0,
        run_retention_seconds=1.0,
    )
    app = JobsApp.open(config, runtime=Runtime())
    invoke = seed_workflow(services.target, review="invoke", name="prune-invoke")
    external = seed_workflow(services.target, review="external", name="prune-external")
    live: list[str] = []
    try:
        app.start()

        def submit(workflow: dict) -> str:
            outcome = app.submitter.submit(workflow=workflow, input={"text": "prune me"})
            assert outcome.ok, outcome
            return outcome.job_id

        # Live rows that must survive: parked runs, runs queued for later, and an old PENDING
        # outbox row another relay holds (so this relay leaves it PENDING).
        live += [submit(external) for _ in range(3)]
        # Queued for later (inserted with run_after ahead, so no worker can claim them).
        later = [str(uuid.uuid4()) for _ in range(3)]
        for job_id in later:
            _sql(
                fresh_dsn,
                "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, "
                "status, run_after) VALUES (%s, 'later', '{}', '{}', 'QUEUED', "
                "now() + interval '1 hour')",
                (job_id,),
            )
        live += later
        pending_id = str(uuid.uuid4())
        _sql(
            fresh_dsn,
            "INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key, "
            "status, created_at, claimed_until) VALUES (%s, 'ACCEPTED', '\\x00', %s, 'PENDING', "
            "now() - interval '1 day', now() + interval '1 hour')",
            (pending_id, str(uuid.uuid4())),
        )
        # Workers claim and complete jobs while the pruner runs.
        finished = []
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            finished += [submit(invoke) for _ in range(4)]
            time.sleep(0.3)  # paces the workload over ~6 s while the pruner runs; not a wait

        def pruned_everything_old() -> bool:
            old_runs, old_published = _sql(
                fresh_dsn,
                "SELECT (SELECT count(*) FROM workflow_run WHERE status IN "
                "('COMPLETED','FAILED','DEAD') AND completed_at < now() - interval '4 seconds'), "
                "(SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PUBLISHED' "
                "AND published_at < now() - interval '4 seconds')",
            )[0]
            gone = _sql(
                fresh_dsn,
                "SELECT count(*) FROM workflow_run WHERE job_id = ANY(%s::uuid[])",
                (finished,),
            )[0][0]
            return old_runs == 0 and old_published == 0 and gone == 0

        wait_for(pruned_everything_old, timeout_s=60, interval_s=0.2)
    finally:
        app.close()

    audit = _sql(fresh_dsn, "SELECT kind, status, count(*) FROM pruned_audit GROUP BY 1, 2")
    by_kind = {(kind, status): n for kind, status, n in audit}
    assert by_kind.get(("run", "COMPLETED"), 0) >= len(finished)
    assert by_kind.get(("outbox", "PUBLISHED"), 0) > 0
    assert set(by_kind) <= {
        ("run", "COMPLETED"),
        ("run", "FAILED"),
        ("run", "DEAD"),
        ("outbox", "PUBLISHED"),
    }, by_kind
    survivors = _sql(
        fresh_dsn,
        "SELECT job_id::text, status FROM workflow_run WHERE job_id = ANY(%s::uuid[])",
        (live,),
    )
    assert sorted(j for j, _ in survivors) == sorted(live)
    assert {s for _, s in survivors} <= {"WAITING", "QUEUED"}
    assert _sql(
        fresh_dsn,
        "SELECT status FROM workflow_run_events_outbox WHERE event_id = %s",
        (pending_id,),
    ) == [("PENDING",)]


def test_retention_zero_deletes_nothing_and_a_pending_backlog_without_a_broker_warns_once(
    fresh_dsn, caplog
):
    config = JobsConfig(dsn=fresh_dsn, outbox_retention_seconds=0, run_retention_seconds=0)
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        job = queued_job(store)
        _sql(
            fresh_dsn,
            "INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key) "
            "SELECT gen_random_uuid(), 'ACCEPTED', '\\x00', 'k' FROM generate_series(1, %s)",
            (PENDING_WARN_ROWS + 5,),
        )
        _sql(
            fresh_dsn,
            "UPDATE workflow_run SET status = 'COMPLETED', completed_at = now() - interval '400 days'",
        )
        cancelled, paused = str(uuid.uuid4()), str(uuid.uuid4())
        for job_id, status in ((cancelled, "CANCELLED"), (paused, "PAUSED")):
            _sql(
                fresh_dsn,
                # origin: written as our store would (a plain session's row is foreign, kept)
                "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, "
                "status, paused_from, completed_at, updated_at, origin) VALUES (%s, 'old', "
                "'{}', '{}', %s, CASE WHEN %s = 'PAUSED' THEN 'QUEUED' END, "
                "CASE WHEN %s = 'CANCELLED' THEN now() - interval '400 days' END, "
                "now() - interval '400 days', 'protomolt-jobs')",
                (job_id, status, status, status),
            )
        _sql(
            fresh_dsn,
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED', "
            "published_at = now() - interval '400 days' WHERE kafka_key = %s",
            (str(job.job_id),),
        )
        pruner = Pruner(store, config=config)
        with caplog.at_level(logging.WARNING, logger="protomolt_jobs.pruner"):
            assert pruner.run_once().runs == 0
            pruner.run_once()
        warned = [
            r for r in caplog.records if getattr(r, "action", "") == "outbox_pending_without_broker"
        ]
        assert len(warned) == 1
        assert store.job_get(job.job_id) is not None
        assert _sql(fresh_dsn, "SELECT count(*) FROM workflow_run")[0][0] == 3
        assert _sql(fresh_dsn, "SELECT count(*) FROM workflow_run_events_outbox")[0][0] == (
            PENDING_WARN_ROWS + 5 + 1
        )
        # The same rows go once retention is on; the PENDING ones never do.
        on = Pruner(
            store,
            config=JobsConfig(dsn=fresh_dsn, outbox_retention_seconds=60, run_retention_seconds=60),
        )
        result = on.run_once()
        assert (result.runs, result.outbox_rows) == (2, 1)  # the COMPLETED and CANCELLED runs
        assert _sql(fresh_dsn, "SELECT job_id::text, status FROM workflow_run") == [
            (paused, "PAUSED")
        ]
        assert _sql(
            fresh_dsn, "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY 1"
        ) == [("PENDING", PENDING_WARN_ROWS + 5)]
    finally:
        store.close()
