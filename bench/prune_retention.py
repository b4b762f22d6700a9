"""What one pruner pass costs with workflow retentions (issue 30 item 6, migration 0020).

``python -m bench.prune_retention [--rows 200000]`` builds a fresh database with ``--rows``
terminal runs (3 PUBLISHED outbox rows each), finished 2 days ago by the database clock:

- a quarter under a 1-day workflow retention (due: the pass deletes them, with their events);
- a quarter under a 365-day one (kept: the pass must not walk them);
- half without a retention, under a 30-day node-wide setting (kept, as before the key).

It prints the time of a pass that has work (at most 20 batches of 500 of each kind) and of the
passes after it, once everything due is gone, and the plans of the two run statements. Numbers
depend on the machine; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import time

import psycopg

from bench.pgdb import BenchDatabase
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.migrate import migrate
from protomolt_jobs.store.queries import QUERIES

SEED = """
SET protomolt_jobs.session = 'bench';
INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,
                          created_at, updated_at, completed_at, retention)
SELECT gen_random_uuid(),
       CASE WHEN i %% 4 = 0 THEN 'short' WHEN i %% 4 = 1 THEN 'long' ELSE 'plain' END,
       '{"steps": []}', '{}', 'COMPLETED',
       now() - interval '2 days' - i * interval '1 ms' - interval '1 second',
       now() - interval '2 days' - i * interval '1 ms',
       now() - interval '2 days' - i * interval '1 ms',
       CASE WHEN i %% 4 = 0 THEN '{"COMPLETED": 86400}'::jsonb
            WHEN i %% 4 = 1 THEN '{"COMPLETED": 31536000}'::jsonb END
  FROM generate_series(1, %(rows)s) AS i;
INSERT INTO workflow_run_events_outbox (event_id, event_type, kafka_key, status, created_at,
                                        published_at, workflow_name, attempt, status_after)
SELECT gen_random_uuid(), 'STEP_CHECKPOINT', r.job_id::text, 'PUBLISHED',
       r.completed_at - (k * interval '1 ms'), r.completed_at, r.workflow_name, 1, 'RUNNING'
  FROM workflow_run AS r CROSS JOIN generate_series(0, 2) AS k;
ANALYZE workflow_run;
ANALYZE workflow_run_events_outbox;
"""


def _plan(dsn: str, name: str, params: dict) -> str:
    with psycopg.connect(dsn, autocommit=False) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + QUERIES[name], params).fetchall()
        conn.rollback()  # EXPLAIN ANALYZE runs the DELETE: keep the rows
    return "\n".join(r[0] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    with BenchDatabase("prune") as db:
        migrate(db.dsn)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            conn.execute(SEED.replace("%(rows)s", str(int(args.rows))).replace("%%", "%"))
            print(
                f"seeded {args.rows} runs, {3 * args.rows} outbox rows "
                f"in {time.perf_counter() - t0:.1f} s"
            )
        print("-- job_prune_retention (one batch of 500), plan:")
        print(_plan(db.dsn, "job_prune_retention", {"limit": 500, "foreign_rows": False}))
        print("-- job_prune_terminal (one batch of 500, 30 days), plan:")
        print(
            _plan(
                db.dsn,
                "job_prune_terminal",
                {"limit": 500, "foreign_rows": False, "retention_s": 30 * 86_400.0},
            )
        )
        config = JobsConfig(dsn=db.dsn, run_retention_seconds=30 * 86_400.0)
        store = JobStore.open(db.dsn, max_size=2)
        try:
            pruner = Pruner(store, config=config)
            for n in range(1, 100):
                t0 = time.perf_counter()
                result = pruner.run_once()
                ms = (time.perf_counter() - t0) * 1000
                print(
                    f"pass {n}: {ms:.1f} ms, {result.retained_runs} runs under their workflow "
                    f"retention, {result.runs - result.retained_runs} under the node's, "
                    f"{result.outbox_rows} outbox rows"
                )
                if result.runs == 0:
                    break
            for n in range(3):
                t0 = time.perf_counter()
                pruner.run_once()
                t1 = time.perf_counter()
                store.job_prune_retention(500)
                t2 = time.perf_counter()
                store.outbox_prune_published(7 * 86_400.0, 500)
                t3 = time.perf_counter()
                print(
                    f"idle pass: {(t1 - t0) * 1000:.1f} ms (of which job_prune_retention "
                    f"{(t2 - t1) * 1000:.1f} ms, outbox_prune_published {(t3 - t2) * 1000:.1f} ms)"
                )
        finally:
            store.close()
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            left = conn.execute(
                "SELECT workflow_name, count(*) FROM workflow_run GROUP BY 1 ORDER BY 1"
            ).fetchall()
            print("runs left:", dict(left))


if __name__ == "__main__":
    main()
