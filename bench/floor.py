"""The SQL floor (issue 33 item 2): a three-step job's exact statements through ``pgbench``.

One pgbench "transaction" is one job, each statement in autocommit as the store sends it,
``-M prepared`` (psycopg prepares a query from its fifth run on; the store's texts are short
enough to be prepared):

1. ``SELECT gen_random_uuid() AS job_id \\gset`` (the job id; the client makes it in the product,
   pgbench cannot, so this one trivial statement is the floor's own);
2. ``job_insert`` (the submit: the row, its ACCEPTED event, the NOTIFY);
3. ``job_claim_one_queue`` (``\\gset c_``: the lease the next statements are fenced with);
4. ``job_checkpoint`` for ``s0`` and ``s1``;
5. ``job_complete_with_checkpoint`` for ``s2`` (the worker folds the last checkpoint into the
   completion, so a three-step job has three checkpoint writes in these three statements).

The text of each is :data:`protomolt_jobs.store.queries.QUERIES`' (the SQL of
``store/queries.sql`` as sent), with ``%(name)s`` turned into pgbench's ``:name`` and the
parameters a no-op job passes bound through ``-D`` (``None`` ones as ``NULL``). The queue
starts with a backlog so every claim finds a job; jobs/s is pgbench's transactions per second
(each one a COMPLETED job, checked against the table).

Variants, each on a fresh database of the benchmark's own cluster (``--own-cluster`` is
implied: the floor always runs on one, with the statement and CPU probe of
:mod:`bench.dbprobe` over each run):

- ``shipped``: every migration applied, triggers and indexes as shipped;
- ``no-trigger``: without the transition triggers (no history row, no hash);
- ``essential-indexes``: without the indexes no statement of the floor reads (the listing,
  metrics, deadline, wake, dedup and pruning indexes);
- ``bare``: both;
- ``before-NNNN``: every migration but ``NNNN`` (``before-0018``: issue 33's fillfactor), for
  before/after of one migration in one run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.pgdb import BenchDatabase

#: The hot path of a three-step no-op job, in order: (query, step, \gset prefix).
STATEMENTS: list[tuple[str, str | None]] = [
    ("job_insert", None),
    ("job_claim_one_queue", None),
    ("job_checkpoint", "s0"),
    ("job_checkpoint", "s1"),
    ("job_complete_with_checkpoint", "s2"),
]
#: Indexes no statement of the floor reads: listing (``job_list`` by name, queue, fairness
#: key, age), metrics, deadlines, timers, dedup keys and the pruner's.
NON_ESSENTIAL_INDEXES = (
    "idx_workflow_run_created",
    "idx_workflow_run_name_created",
    "idx_workflow_run_queue_created",
    "idx_workflow_run_fairness_created",
    "idx_workflow_run_status_run_after",
    "idx_workflow_run_deadline",
    "idx_workflow_run_terminal_completed",
    "idx_workflow_run_wake",
    "uq_workflow_run_dedup_live",
    "idx_workflow_run_events_outbox_status_created",
    "idx_workflow_run_events_outbox_pending_key",
)
#: Variant -> (without the transition triggers, without NON_ESSENTIAL_INDEXES, migrations
#: left out): ``before-0018`` is the schema before issue 33's migration, for before/after in
#: one run.
VARIANTS: dict[str, tuple[bool, bool, tuple[str, ...]]] = {
    "shipped": (False, False, ()),
    "before-0018": (False, False, ("0018",)),
    "no-trigger": (True, False, ()),
    "essential-indexes": (False, True, ()),
    "bare": (True, True, ()),
}


def variant_spec(name: str) -> tuple[bool, bool, tuple[str, ...]]:
    """``VARIANTS[name]``, or for ``before-NNNN`` (any migration number) every migration but
    that one.

    :raises KeyError: for any other name.
    """
    if name in VARIANTS:
        return VARIANTS[name]
    m = re.fullmatch(r"before-(\d{4})", name)
    if m:
        return (False, False, (m.group(1),))
    raise KeyError(name)


#: Jobs queued before each run (so a claim always finds one).
BACKLOG = 200
_SHA = "0" * 64


def _params(definition: dict) -> dict[str, Any]:
    """The parameters of the floor's statements: a no-op job's, as the store binds them."""
    entry = {
        "name": "s0",
        "skipped": False,
        "response": {"text": "floor"},
        "definitionSha256": _SHA,
        "descriptorSha256": _SHA,
    }
    return {
        "workflow_name": definition["name"],
        "workflow_definition": json.dumps(definition),
        "input": json.dumps({"text": "floor"}),
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
        "actor": "api",
        "groups": None,
        "retention": None,
        "worker_id": "floor",
        "owner": "floor",
        "lease_s": 60.0,
        "entry_s0": json.dumps(entry),
        "entry_s1": json.dumps({**entry, "name": "s1"}),
        "entry_s2": json.dumps({**entry, "name": "s2"}),
        "result": json.dumps({"text": "floor"}),
        "verdict": "ok",
    }


def _bind(sql: str, step: str | None, params: dict[str, Any]) -> str:
    """``%(name)s`` -> ``:name`` (a pgbench variable) or ``NULL``; the lease from the claim."""
    lease = {"job_id": "c_job_id", "attempt": "c_attempt", "token": "c_lease_token"}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in lease and step is not None:
            return ":" + lease[name]
        if name == "step" and step is not None:
            return ":step_" + step
        if name == "entry" and step is not None:
            return ":entry_" + step
        if name not in params and name != "job_id":
            raise KeyError(f"floor: no value for %({name})s")
        return "NULL" if params.get(name, "") is None else ":" + name

    return re.sub(r"%\((\w+)\)s", sub, sql)


def script(params: dict[str, Any]) -> str:
    """The pgbench script of one job (see the module doc)."""
    from protomolt_jobs.store.queries import QUERIES

    out = ["SELECT gen_random_uuid() AS job_id \\gset"]
    for name, step in STATEMENTS:
        sql = _bind(QUERIES[name], step, params)
        if ";" in sql:
            raise ValueError(f"floor: {name} holds a ';' pgbench would split at")
        out.append(sql + (" \\gset c_" if name == "job_claim_one_queue" else ";"))
    return "\n".join(out) + "\n"


def _defines(params: dict[str, Any]) -> list[str]:
    out = []
    values = {k: v for k, v in params.items() if v is not None}
    values.update({"step_s0": "s0", "step_s1": "s1", "step_s2": "s2"})
    for k, v in values.items():
        out += ["-D", f"{k}={v}"]
    return out


def _conn_args(dsn: str) -> list[str]:
    p = conninfo_to_dict(dsn)
    return ["-h", p.get("host", "127.0.0.1"), "-p", str(p.get("port", 5432)), "-U", "postgres"]


def _prepare(
    dsn: str, no_trigger: bool, essential: bool, without: tuple[str, ...], params: dict[str, Any]
) -> None:
    from protomolt_jobs.store.migrate import migrate, migrations_dir
    from protomolt_jobs.store.queries import QUERIES

    if without:
        with tempfile.TemporaryDirectory() as tmp:
            for f in migrations_dir().iterdir():
                if f.name.endswith(".sql") and not f.name.startswith(without):
                    (Path(tmp) / f.name).write_bytes(f.read_bytes())
            migrate(dsn, directory=Path(tmp))
    else:
        migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if no_trigger:
            conn.execute("DROP TRIGGER trg_workflow_run_transition ON workflow_run")
            conn.execute("DROP TRIGGER trg_workflow_run_submit ON workflow_run")
        if essential:
            for index in NON_ESSENTIAL_INDEXES:
                conn.execute(f"DROP INDEX IF EXISTS {index}")
        insert = QUERIES["job_insert"]
        for _ in range(BACKLOG):
            row = conn.execute("SELECT gen_random_uuid()").fetchone()
            conn.execute(insert, {**params, "job_id": row[0]})


def _pgbench(
    pgbench: str, dsn: str, dbname: str, path: Path, params: dict, clients: int, seconds: float
) -> dict:
    args = [
        pgbench,
        *_conn_args(dsn),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(path),
        *_defines(params),
        dbname,
    ]
    env = {"PGOPTIONS": "-c protomolt_jobs.session=store"}
    import os

    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        env={**os.environ, **env},
        check=False,
    )
    tps = re.search(r"tps = ([0-9.]+) \(without initial", proc.stdout)
    done = re.search(r"number of transactions actually processed: (\d+)", proc.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", proc.stdout)
    if proc.returncode != 0 or not tps or not done:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return {
        "jobs_per_s": round(float(tps.group(1)), 1),
        "jobs": int(done.group(1)),
        "failed": int(failed.group(1)) if failed else 0,
    }


def floor(clients: list[int], seconds: float, variants: list[str]) -> dict:
    """Jobs/s of the floor's script at each client count, per variant, on the benchmark's own
    cluster (started here when the run is not already on one), with each run's PostgreSQL
    CPU per job and statements.

    :raises RuntimeError: no pgbench, or pgbench failed.
    """
    from contextlib import nullcontext

    from bench import ours, scenarios
    from bench.cluster import OwnCluster
    from bench.dbprobe import ClusterProbe, print_probe

    pgbench = shutil.which("pgbench")
    if not pgbench:
        raise RuntimeError("floor: pgbench is not on the PATH")
    params = _params(ours.workflow("127.0.0.1:1"))
    own = nullcontext(None) if scenarios.PROBE is not None else OwnCluster()
    runs = []
    with own as cluster, tempfile.TemporaryDirectory() as tmp:
        probe = scenarios.PROBE or ClusterProbe(cluster.dsn, cluster.postmaster_pid or 0)
        path = Path(tmp) / "job.sql"
        path.write_text(script(params))
        settings = cluster.settings if cluster is not None else None
        for variant in variants:
            no_trigger, essential, without = variant_spec(variant)
            for c in clients:
                with BenchDatabase(f"floor_{variant.replace('-', '_')}") as db:
                    _prepare(db.dsn, no_trigger, essential, without, params)
                    with psycopg.connect(db.dsn, autocommit=True) as conn:
                        conn.execute("CHECKPOINT")
                    probe.start()
                    r = _pgbench(pgbench, db.dsn, db.name, path, params, c, seconds)
                    db_probe = probe.stop(db.name, r["jobs"])
                    with psycopg.connect(db.dsn, autocommit=True) as conn:
                        completed = conn.execute(
                            "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'"
                        ).fetchone()[0]
                run = {
                    "variant": variant,
                    "clients": c,
                    **r,
                    "completed": completed,
                    "db": db_probe,
                }
                runs.append(run)
                print(
                    f"  floor      {variant:18s} {c:>2d} clients  {r['jobs_per_s']:8.1f} jobs/s "
                    f"({r['jobs']} jobs, {completed} COMPLETED, {r['failed']} failed)",
                    flush=True,
                )
                print_probe(variant, db_probe)
    return {
        "seconds": seconds,
        "clients": clients,
        "runs": runs,
        "settings": settings,
        "script": script(params),
    }
