"""The migration runner on real PostgreSQL: apply, re-apply, concurrency, refusals, indexes."""

from __future__ import annotations

import shutil
import threading
import time
import uuid

import psycopg
import pytest

from protomolt_jobs.store.migrate import MigrationError, migrate, migration_files, migrations_dir


def q(dsn: str, sql: str, params: dict | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def backends(dsn: str) -> int:
    """Backends connected to ``dsn``'s database besides this query's, once the count is 0 or
    after 5 s: a client's close returns before its server process has left
    pg_stat_activity, so a connection just closed may still be counted for a moment."""
    deadline = time.monotonic() + 5.0
    while True:
        n = _backends(dsn)
        if n == 0 or time.monotonic() >= deadline:
            return n
        time.sleep(0.02)


def _backends(dsn: str) -> int:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    return q(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %(d)s AND pid <> pg_backend_pid()",
        {"d": dbname},
    )[0][0]


def test_fresh_apply_creates_the_tables_and_records_history(empty_dsn):
    applied = migrate(empty_dsn)
    assert applied == [f.filename for f in migration_files()]
    assert applied[0] == "0001_workflow_run.sql"
    tables = {
        r[0] for r in q(empty_dsn, "SELECT tablename FROM pg_tables WHERE schemaname='public'")
    }
    assert {
        "workflow_run",
        "workflow_run_events_outbox",
        "workflow_run_rejects",
        "protomolt_jobs_schema_history",
    } <= tables
    history = q(empty_dsn, "SELECT version, name, checksum FROM protomolt_jobs_schema_history")
    files = migration_files()
    assert sorted((v, n, c) for v, n, c in history) == [
        (f.version, f.name, f.checksum) for f in files
    ]
    # it closed its connection: a template copy of this database must be possible
    assert backends(empty_dsn) == 0


def test_reapply_is_a_no_op(empty_dsn):
    migrate(empty_dsn)
    before = q(empty_dsn, "SELECT version, applied_at FROM protomolt_jobs_schema_history")
    assert migrate(empty_dsn) == []
    assert q(empty_dsn, "SELECT version, applied_at FROM protomolt_jobs_schema_history") == before


def test_two_concurrent_runners_apply_each_file_once(empty_dsn):
    barrier = threading.Barrier(2)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(migrate(empty_dsn))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    every = [f.filename for f in migration_files()]
    assert sorted(results, key=len) == [[], every]
    assert q(empty_dsn, "SELECT count(*) FROM protomolt_jobs_schema_history")[0][0] == len(every)


def test_an_existing_connection_is_left_open(empty_dsn):
    with psycopg.connect(empty_dsn) as conn:
        assert migrate(conn) == [f.filename for f in migration_files()]
        assert not conn.closed
        assert conn.autocommit is False
        assert conn.execute("SELECT count(*) FROM workflow_run").fetchone()[0] == 0


def test_check_constraints_refuse_unknown_statuses(fresh_dsn):
    with pytest.raises(psycopg.errors.CheckViolation, match="chk_workflow_run_status"):
        q(
            fresh_dsn,
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status) "
            "VALUES (%(id)s, 'w', '{}', '{}', 'SLEEPING')",
            {"id": uuid.uuid4()},
        )
    with pytest.raises(
        psycopg.errors.CheckViolation, match="chk_workflow_run_events_outbox_status"
    ):
        q(
            fresh_dsn,
            "INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key, status)"
            " VALUES (%(id)s, 'ACCEPTED', '\\x00', 'k', 'LOST')",
            {"id": uuid.uuid4()},
        )


def test_reference_defaults_hold(fresh_dsn):
    job_id = uuid.uuid4()
    q(
        fresh_dsn,
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status) "
        "VALUES (%(id)s, 'w', '{}', '{}', 'QUEUED')",
        {"id": job_id},
    )
    row = q(
        fresh_dsn,
        "SELECT attempt, max_attempts, checkpoints, run_after <= now(), created_at IS NOT NULL"
        " FROM workflow_run WHERE job_id = %(id)s",
        {"id": job_id},
    )[0]
    assert row == (0, 3, [], True, True)


def test_the_claim_sweep_and_outbox_indexes_exist(fresh_dsn):
    rows = q(fresh_dsn, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname='public'")
    defs = dict(rows)
    # 0003 replaced 0001's (created_at, job_id) claim index with the scheduling order.
    assert "idx_workflow_run_claim" not in defs
    assert "WHERE (status = 'QUEUED'::text)" in defs["idx_workflow_run_claim_sched"]
    assert (
        "(queue, priority, fairness_pass, created_at, job_id)"
        in defs["idx_workflow_run_claim_sched"]
    )
    assert "WHERE (status = 'RUNNING'::text)" in defs["idx_workflow_run_sweep"]
    assert "(lease_until)" in defs["idx_workflow_run_sweep"]
    assert "WHERE (status = 'PENDING'::text)" in defs["idx_workflow_run_events_outbox_pending"]
    assert "UNIQUE" in defs["uq_workflow_run_events_outbox_seq"]


def test_a_changed_applied_file_is_a_loud_error(empty_dsn, tmp_path):
    shutil.copytree(migrations_dir(), tmp_path / "m")
    assert migrate(empty_dsn, directory=tmp_path / "m")[0] == "0001_workflow_run.sql"
    path = tmp_path / "m" / "0001_workflow_run.sql"
    path.write_text(path.read_text() + "\n-- edited after release\n")
    (tmp_path / "m" / "9990_more.sql").write_text("CREATE TABLE should_not_exist (x int);")
    with pytest.raises(MigrationError, match="0001_workflow_run.sql was changed"):
        migrate(empty_dsn, directory=tmp_path / "m")
    assert q(empty_dsn, "SELECT to_regclass('should_not_exist') IS NULL")[0][0] is True
    assert backends(empty_dsn) == 0


def test_a_new_file_applies_and_a_failing_file_rolls_back(empty_dsn, tmp_path):
    shutil.copytree(migrations_dir(), tmp_path / "m")
    migrate(empty_dsn, directory=tmp_path / "m")
    (tmp_path / "m" / "9990_extra.sql").write_text("CREATE TABLE extra_one (x int);")
    (tmp_path / "m" / "9991_broken.sql").write_text(
        "CREATE TABLE extra_two (x int);\nSELECT * FROM no_such_table;"
    )
    with pytest.raises(MigrationError, match="9991_broken.sql failed"):
        migrate(empty_dsn, directory=tmp_path / "m")
    versions = [
        r[0] for r in q(empty_dsn, "SELECT version FROM protomolt_jobs_schema_history ORDER BY 1")
    ]
    assert versions == [f.version for f in migration_files()] + ["9990"]
    assert q(
        empty_dsn, "SELECT to_regclass('extra_one') IS NOT NULL, to_regclass('extra_two') IS NULL"
    )[0] == (True, True)


def test_a_malformed_file_name_is_refused(tmp_path):
    (tmp_path / "1_oops.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="1_oops.sql"):
        migration_files(tmp_path)


def test_unreachable_database_is_a_store_error():
    from protomolt_jobs.errors import StoreError

    with pytest.raises(StoreError, match="cannot connect"):
        migrate("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")


def test_checkpoint_updates_of_full_size_runs_stay_hot(fresh_dsn):
    """Migration 0018: workflow_run's fillfactor leaves room on each page, so an update that
    changes only unindexed columns (a checkpoint) of a full-size run (~1.7 KB) is HOT. At the
    default fillfactor 100, four such rows fill a page and most of these updates are not."""
    from protomolt_jobs.store.queries import QUERIES

    definition = {"name": "hot", "steps": [], "pad": "d" * 1500}
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        for _ in range(12):
            conn.execute(
                QUERIES["job_insert"],
                {
                    "job_id": uuid.uuid4(),
                    "workflow_name": "hot",
                    "workflow_definition": psycopg.types.json.Jsonb(definition),
                    "input": psycopg.types.json.Jsonb({"text": "x"}),
                    "status": "QUEUED",
                    "max_attempts": 3,
                    "error": None,
                    "trace_context": None,
                    "priority": 3,
                    "queue": "default",
                    "fairness_key": "default",
                    "stride": 1.0,
                    "dedup_key": None,
                    "deadline_s": None,
                    "actor": "test",
                    "groups": None,
                    "retention": None,
                },
            )
        conn.execute(
            'UPDATE workflow_run SET checkpoints = checkpoints || \'[{"name": "s0"}]\'::jsonb'
        )
        conn.execute("SELECT pg_stat_force_next_flush()")
        upd, hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'workflow_run'"
        ).fetchone()
    assert upd == 12
    assert hot == 12
