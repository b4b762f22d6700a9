"""Adopting a database made by upstream's Flyway migration, and a mixed fleet on it (#20).

The database is created with ``tests/support/upstream_v1.sql`` (upstream's V1 schema, from the
reference); "Java workers" are upstream's JDBC statement texts (``tests/support/upstream_jdbc``)
on a plain connection, next to our store, worker and sweeper on the same tables.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from protomolt_jobs.errors import LeaseLost
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.migrate import MigrationError, migrate, migration_files
from tests.integration.test_role import boot, wait_for, write_config
from tests.support import pg
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.roles import MemoryRepository
from tests.support.upstream_jdbc import (
    MARK_COMPLETED,
    MARK_FAILED,
    REQUEUE,
    REQUEUE_EXPIRED,
    SAVE_CHECKPOINT,
    UPSTREAM_V1_SQL,
    JavaWorker,
    now,
)


def q(dsn: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


@pytest.fixture
def upstream_dsn(empty_dsn):
    """A database exactly as upstream's V1 leaves it (plus Flyway's history of it)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(UPSTREAM_V1_SQL)
        conn.execute(
            "CREATE TABLE flyway_schema_history (installed_rank INT PRIMARY KEY, "
            "version TEXT, script TEXT NOT NULL, checksum INT, success BOOLEAN NOT NULL)"
        )
        conn.execute(
            "INSERT INTO flyway_schema_history VALUES (1, '1', 'V1__workflow_runs.sql', 42, true)"
        )
    return empty_dsn


@pytest.fixture
def adopted_dsn(upstream_dsn):
    migrate(upstream_dsn)
    return upstream_dsn


def _schema(dsn: str) -> tuple[list[tuple], list[tuple]]:
    columns = q(
        dsn,
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = 'public' "
        "AND table_name LIKE 'workflow_run%%' ORDER BY 1, 2",
    )
    indexes = q(
        dsn,
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
        "AND tablename LIKE 'workflow_run%%' ORDER BY 1",
    )
    return columns, indexes


def test_upstream_database_is_adopted_to_exactly_our_schema(upstream_dsn):
    java = JavaWorker(upstream_dsn)
    try:  # a job and its ACCEPTED event written by the Java node before adoption
        before = java.insert({"name": "x"}, {"text": "t"}, "wf-before")
    finally:
        java.close()

    applied = migrate(upstream_dsn)
    files = [f.filename for f in migration_files()]
    assert applied[0] == "0007_adopt_upstream_v1.sql"
    assert sorted(applied) == sorted(f for f in files if f != "0001_workflow_run.sql")
    history = q(upstream_dsn, "SELECT version, name FROM protomolt_jobs_schema_history ORDER BY 1")
    assert history[0] == ("0001", "workflow_run (adopted from upstream V1__workflow_runs.sql)")
    assert [v for v, _ in history] == [f.version for f in migration_files()]
    assert migrate(upstream_dsn) == []  # recorded: the next start is a no-op
    # Flyway's history is untouched (a Java node still starts against this database).
    assert q(upstream_dsn, "SELECT version, script FROM flyway_schema_history") == [
        ("1", "V1__workflow_runs.sql")
    ]

    # The same columns, defaults and indexes as a database our migrations made.
    fresh_name = pg.new_name("pmjt_fresh")
    fresh = pg.create_database(fresh_name)
    try:
        migrate(fresh)
        assert _schema(upstream_dsn) == _schema(fresh)
    finally:
        pg.drop_database(fresh_name)

    # The Java node's rows survive; its PENDING event got a place in the relay's order.
    assert q(upstream_dsn, "SELECT status FROM workflow_run WHERE job_id = %s", (before,)) == [
        ("QUEUED",)
    ]
    assert q(upstream_dsn, "SELECT seq, status FROM workflow_run_events_outbox") == [(1, "PENDING")]


def test_tables_in_another_shape_are_refused_not_altered(empty_dsn):
    q(empty_dsn, "CREATE TABLE workflow_run (job_id UUID PRIMARY KEY, status TEXT)")
    with pytest.raises(MigrationError, match="not upstream's V1__workflow_runs.sql schema"):
        migrate(empty_dsn)
    assert q(empty_dsn, "SELECT to_regclass('workflow_run_events_outbox') IS NULL") == [(True,)]


def test_a_job_inserted_by_upstream_sql_runs_on_our_worker_beside_a_java_worker(
    tmp_path, adopted_dsn, services
):
    wf = seed_workflow(services.target, review="invoke")
    java = JavaWorker(adopted_dsn)
    ours = java.insert(wf, {"text": "hello brave new world"}, "seed-review")
    stop = threading.Event()
    java_done: list[str] = []

    def java_loop() -> None:
        loop = JavaWorker(adopted_dsn, "java-2")
        try:
            while not stop.is_set():
                row = loop.claim()
                if row is None:
                    time.sleep(0.02)
                    continue
                result = json.dumps({"by": "java"})
                assert loop.run(MARK_COMPLETED, result, "java", row["job_id"]) == 1
                java_done.append(str(row["job_id"]))
        finally:
            loop.close()

    node = boot(write_config(tmp_path, adopted_dsn), MemoryRepository())
    thread = threading.Thread(target=java_loop, daemon=True)
    node.start()
    try:
        store = node.mount("jobs").store
        # The job upstream's SQL inserted: claimed, run and completed by our worker.
        done = wait_for(
            lambda: (j := store.job_get(ours)).status == "COMPLETED" and j,
            60,
            "the upstream-inserted job to complete",
        )
        assert done.attempt == 1 and done.verdict.startswith("3 steps, output ")
        assert [c["name"] for c in done.checkpoints] == ["tokenize", "embed", "review"]
        events = [r.event_type for r in store.outbox_for_job(ours)]
        assert events[0] == "ACCEPTED" and events[-1] == "COMPLETED"  # the Java ACCEPTED first

        # A mixed fleet: a Java worker (upstream's claim and markCompleted) and our node take
        # more jobs from one table; each job runs exactly once.
        more = [java.insert(wf, {"text": f"job {i}"}, "seed-review") for i in range(12)]
        thread.start()
        wait_for(
            lambda: all(store.job_get(j).status == "COMPLETED" for j in more),
            60,
            "every job to complete",
        )
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)
        node.close()
        java.close()
    rows = {
        str(r[0]): r[1:]
        for r in q(adopted_dsn, "SELECT job_id, attempt, verdict, result FROM workflow_run")
    }
    assert all(attempt == 1 for attempt, _, _ in rows.values())  # nobody ran a job twice
    ran_by_us = [j for j in more if rows[j][1] != "java"]
    assert sorted(ran_by_us + java_done) == sorted(more)
    for j in ran_by_us:
        assert rows[j][1].startswith("3 steps, output ")
    assert q(adopted_dsn, "SELECT count(*) FROM workflow_run_events_outbox WHERE seq IS NULL") == [
        (0,)
    ]


def test_a_java_claim_swept_and_reclaimed_is_safe_under_our_fence(adopted_dsn):
    java = JavaWorker(adopted_dsn, "java-1")
    store = JobStore.open(adopted_dsn, max_size=2)
    try:
        job_id = java.insert({"name": "w"}, {"text": "t"}, "wf")
        # A Java worker claims it with a lease that has already run out (it stalled).
        row = java.claim(lease=timedelta(seconds=-1))
        assert str(row["job_id"]) == job_id
        got = store.job_get(job_id)
        assert (got.status, got.lease_owner, got.lease_token, got.attempt) == (
            "RUNNING",
            "java-1",
            None,
            1,
        )
        assert store.job_claim("ours", 30.0) is None  # not ours to take while RUNNING

        # Our sweeper recovers it; our worker claims it with a token.
        assert store.job_sweep_expired().requeued == 1
        job = store.job_claim("ours", 30.0)
        assert str(job.job_id) == job_id and job.lease_token is not None and job.attempt == 2

        # The stalled Java worker wakes up and writes, by job_id only: every write is held off.
        stale_checkpoints = json.dumps([{"name": "a", "skipped": False, "response": {}}])
        assert java.run(SAVE_CHECKPOINT, stale_checkpoints, job_id) == 0
        assert java.run(MARK_COMPLETED, json.dumps({"by": "java"}), "java", job_id) == 0
        assert java.run(MARK_FAILED, "GRPC: stale", job_id) == 0
        assert java.run(REQUEUE, now(), job_id) == 0
        assert java.run(REQUEUE_EXPIRED) == 0  # our lease is live
        held = store.job_get(job_id)
        assert (held.status, held.lease_owner, held.checkpoints) == ("RUNNING", "ours", [])

        # Our fenced writes go through.
        store.job_checkpoint(job.lease, {"name": "a", "skipped": False, "response": {"x": 1}})
        store.job_complete(job.lease, {"ok": True}, "1 steps, output x.Y")
        done = store.job_get(job_id)
        assert (done.status, done.result, done.lease_token) == ("COMPLETED", {"ok": True}, None)
        # A terminal row is not a Java worker's to change either.
        assert java.run(MARK_FAILED, "late", job_id) == 0
        assert store.job_get(job_id).status == "COMPLETED"
    finally:
        store.close()
        java.close()


def test_java_sweep_of_our_expired_lease_fences_our_stale_worker(adopted_dsn):
    java = JavaWorker(adopted_dsn, "java-1")
    store = JobStore.open(adopted_dsn, max_size=2)
    try:
        job_id = java.insert({"name": "w"}, {"text": "t"}, "wf")
        job = store.job_claim("ours", 30.0)
        assert str(job.job_id) == job_id
        # Our worker stalls past its lease; upstream's sweep takes the row back.
        with psycopg.connect(adopted_dsn, autocommit=True) as conn:
            conn.execute("SET protomolt_jobs.session = 'test'")
            conn.execute(
                "UPDATE workflow_run SET lease_until = now() - interval '1 second' "
                "WHERE job_id = %s",
                (job_id,),
            )
        assert java.run(REQUEUE_EXPIRED) == 1
        swept = store.job_get(job_id)
        assert (swept.status, swept.lease_owner, swept.lease_token) == ("QUEUED", None, None)
        # A Java worker claims it: no token of ours survives.
        assert str(java.claim()["job_id"]) == job_id
        assert store.job_get(job_id).lease_token is None
        # Our stale worker's fenced write finds nothing to write.
        with pytest.raises(LeaseLost):
            store.job_checkpoint(job.lease, {"name": "a", "skipped": False, "response": {}})
        # The Java worker's own writes on its own claim go through, as upstream's always did.
        assert java.run(MARK_COMPLETED, json.dumps({"by": "java"}), "java", job_id) == 1
    finally:
        store.close()
        java.close()


def _age_everything(dsn: str) -> None:
    """Every run finished 40 days ago and every outbox row published 10 days ago (an operator
    session: the foreign-writer fence holds other sessions off finished runs)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET protomolt_jobs.session = 'operator'")
        conn.execute(
            "UPDATE workflow_run SET completed_at = now() - interval '40 days' "
            "WHERE status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')"
        )
        conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED', "
            "published_at = now() - interval '10 days'"
        )


def test_the_pruner_leaves_the_java_nodes_rows_alone_and_deletes_ours(upstream_dsn):
    from protomolt_jobs.config import JobsConfig
    from protomolt_jobs.maintenance.pruner import Pruner
    from tests.support.factories import claimed_job

    java = JavaWorker(upstream_dsn, "java-1")
    try:
        # Written by the Java node before adoption: unprovable, so kept (origin NULL).
        before = java.insert({"name": "x"}, {"text": "t"}, "wf-before")
        assert str(java.claim()["job_id"]) == before
        assert java.run(MARK_COMPLETED, json.dumps({"by": "java"}), "java", before) == 1
    finally:
        java.close()
    migrate(upstream_dsn)
    java = JavaWorker(upstream_dsn, "java-1")
    store = JobStore.open(upstream_dsn, max_size=2)
    try:
        # A Java run after adoption, completed by the Java worker, and one our worker ran.
        java_run = java.insert({"name": "x"}, {"text": "t"}, "wf-java")
        assert str(java.claim()["job_id"]) == java_run
        assert java.run(MARK_COMPLETED, json.dumps({"by": "java"}), "java", java_run) == 1
        java_ours_ran = java.insert({"name": "x"}, {"text": "t"}, "wf-java")
        lease = store.job_claim("ours", 60.0).lease
        assert str(lease.job_id) == java_ours_ran
        store.job_complete(lease, result={"by": "ours"}, verdict="done")
        # Our runs: completed and failed.
        ours_done = claimed_job(store, worker_id="ours")
        store.job_complete(ours_done.lease, result={}, verdict="done")
        ours_failed = claimed_job(store, worker_id="ours")
        store.job_fail(ours_failed.lease, "VALIDATION: bad", step="first")
        ours = {str(ours_done.job_id), str(ours_failed.job_id)}
        java_rows = {before, java_run, java_ours_ran}

        origins = dict(q(upstream_dsn, "SELECT job_id::text, origin FROM workflow_run"))
        assert origins == {**dict.fromkeys(java_rows), **dict.fromkeys(ours, "protomolt-jobs")}
        java_events = {
            r[0]
            for r in q(
                upstream_dsn,
                "SELECT event_id::text FROM workflow_run_events_outbox WHERE origin IS NULL",
            )
        }
        # The Java node's ACCEPTED events (its submits write them); every other row is ours.
        assert len(java_events) == 3
        ours_events = q(
            upstream_dsn,
            "SELECT count(*) FROM workflow_run_events_outbox WHERE origin = 'protomolt-jobs'",
        )[0][0]
        assert ours_events > 0

        _age_everything(upstream_dsn)
        config = JobsConfig(dsn=upstream_dsn, worker_id="pruner-test")
        result = Pruner(store, config=config).run_once()
        assert (result.runs, result.outbox_rows) == (len(ours), ours_events)
        left = {r[0] for r in q(upstream_dsn, "SELECT job_id::text FROM workflow_run")}
        assert left == java_rows
        left_events = {
            r[0] for r in q(upstream_dsn, "SELECT event_id::text FROM workflow_run_events_outbox")
        }
        assert left_events == java_events
        # A second pass finds nothing more; configured otherwise, the Java rows go too.
        assert Pruner(store, config=config).run_once() == type(result)(0, 0)
        every = JobsConfig(dsn=upstream_dsn, worker_id="pruner-test", prune_foreign_rows=True)
        result = Pruner(store, config=every).run_once()
        assert (result.runs, result.outbox_rows) == (len(java_rows), len(java_events))
        assert q(upstream_dsn, "SELECT count(*) FROM workflow_run")[0][0] == 0
    finally:
        store.close()
        java.close()


def test_rows_of_a_database_our_migrations_made_are_ours_and_the_default_needs_no_trigger(
    fresh_dsn,
):
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        from tests.support.factories import queued_job

        job = queued_job(store)
        assert q(fresh_dsn, "SELECT origin FROM workflow_run WHERE job_id = %s", (job.job_id,)) == [
            ("protomolt-jobs",)
        ]
        assert q(fresh_dsn, "SELECT DISTINCT origin FROM workflow_run_events_outbox") == [
            ("protomolt-jobs",)
        ]
    finally:
        store.close()
    # A session without the setting (a foreign writer) inserts rows that are not ours.
    q(
        fresh_dsn,
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status) "
        "VALUES (gen_random_uuid(), 'java', '{}', '{}', 'QUEUED')",
    )
    assert q(fresh_dsn, "SELECT count(*) FROM workflow_run WHERE origin IS NULL") == [(1,)]
    # origin is a column default, not a trigger (nothing more runs per insert)
    triggers = q(
        fresh_dsn,
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN "
        "('workflow_run'::regclass, 'workflow_run_events_outbox'::regclass) "
        "AND (tgtype & 4) <> 0",  # INSERT triggers
    )
    assert [t for (t,) in triggers if "origin" in t] == []
