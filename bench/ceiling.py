"""The ceiling: the commit rate of the target PostgreSQL (issue 9 item 1).

With ``pgbench`` on the PATH: ``pgbench -i -s 1`` on a fresh database, then ``pgbench -N -c C
-j min(C, 2) -T t -n`` (simple-update: three single-row statements plus an insert per
transaction) at each client count. Without it: C threads, each on its own connection, looping
single-row UPDATE transactions for ``t`` seconds. Either way the figure is committed
transactions per second.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.pgdb import BenchDatabase


def _pgbench_args(dsn: str) -> list[str]:
    p = conninfo_to_dict(dsn)
    return [
        "-h",
        p.get("host", "127.0.0.1"),
        "-p",
        str(p.get("port", 5432)),
        "-U",
        p.get("user", "postgres"),
    ]


def _pgbench(pgbench: str, dsn: str, dbname: str, clients: int, seconds: int) -> float:
    out = subprocess.run(
        [
            pgbench,
            *_pgbench_args(dsn),
            "-N",
            "-n",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(seconds),
            dbname,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    ).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return float(match.group(1))


def _loop(dsn: str, clients: int, seconds: float) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling (id int PRIMARY KEY, n bigint)")
        conn.execute(
            "INSERT INTO bench_ceiling SELECT g, 0 FROM generate_series(1, 64) g "
            "ON CONFLICT DO NOTHING"
        )
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def run(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < stop:
                conn.execute(
                    "UPDATE bench_ceiling SET n = n + 1 WHERE id = %(id)s", {"id": k % 64 + 1}
                )
                counts[k] += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def ceiling(clients: list[int], seconds: int) -> dict:
    """Commits/s at each client count on a fresh database.

    :returns: ``{"method": "pgbench -N" | "psycopg loop", "tps": {clients: tps}}``.
    """
    pgbench = shutil.which("pgbench")
    with BenchDatabase("ceiling") as db:
        tps: dict[int, float] = {}
        if pgbench:
            subprocess.run(
                [pgbench, *_pgbench_args(db.dsn), "-i", "-s", "1", "-q", db.name],
                capture_output=True,
                check=True,
                timeout=300,
            )
            for c in clients:
                tps[c] = round(_pgbench(pgbench, db.dsn, db.name, c, seconds), 1)
            method = "pgbench -N"
        else:
            for c in clients:
                tps[c] = round(_loop(db.dsn, c, seconds), 1)
            method = "psycopg loop"
    return {"method": method, "seconds": seconds, "tps": tps}
