"""Fresh benchmark databases and the transaction counter read from ``pg_stat_database``.

Transactions per job come from ``xact_commit`` deltas of the benchmark database. The counter
reads them over a connection to the cluster's maintenance database, so its own reads never
count against the benchmark database. PostgreSQL 15 flushes a backend's counters when it goes
idle (at most once a second) and when it exits; the harness therefore reads the final sample
only after every backend of the run has gone (:meth:`XactCounter.wait_idle`).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Self

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger("protomolt_jobs.bench")

#: Maintenance DSN of the target cluster; the benchmark databases are siblings of it.
ADMIN_DSN = os.environ.get("PROTOMOLT_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def dsn_for(dbname: str) -> str:
    """The admin DSN pointed at another database of the same cluster."""
    params = conninfo_to_dict(ADMIN_DSN)
    params["dbname"] = dbname
    return make_conninfo(**params)


def sqlalchemy_url(dsn: str) -> str:
    """A ``postgresql+psycopg://`` URL for the same database (DBOS takes SQLAlchemy URLs)."""
    p = conninfo_to_dict(dsn)
    user = p.get("user", "postgres")
    host = p.get("host", "127.0.0.1")
    port = p.get("port", "5432")
    return f"postgresql+psycopg://{user}@{host}:{port}/{p['dbname']}"


class BenchDatabase:
    """A database created for one benchmark run and dropped (``WITH (FORCE)``) on exit.

    Use as a context manager: ``with BenchDatabase("tp") as db: db.dsn``.
    """

    def __init__(self, label: str) -> None:
        # PMJ_BENCH_DB_TAG (a few [a-z0-9] characters) lets a caller find exactly the
        # databases of its own run, e.g. the smoke test checking that all were dropped.
        tag = os.environ.get("PMJ_BENCH_DB_TAG", "")
        self.name = f"pmjb_{tag}{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.dsn = dsn_for(self.name)

    def __enter__(self) -> Self:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        log.info("bench database created", extra={"action": "bench_db_created", "db": self.name})
        return self

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )
        log.info("bench database dropped", extra={"action": "bench_db_dropped", "db": self.name})


@dataclass(frozen=True)
class XactSample:
    """``xact_commit`` of the benchmark database at ``at`` (monotonic seconds)."""

    commits: int
    at: float


class XactCounter:
    """Reads ``pg_stat_database.xact_commit`` of one database from the maintenance database."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self._conn = psycopg.connect(ADMIN_DSN, autocommit=True)

    def close(self) -> None:
        self._conn.close()

    def sample(self) -> XactSample:
        """One reading; autocommit, so every call sees fresh shared-memory statistics."""
        row = self._conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %(db)s",
            {"db": self.dbname},
        ).fetchone()
        return XactSample(int(row[0]) if row else 0, time.monotonic())

    def backends(self) -> int:
        """Client backends still connected to the benchmark database."""
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %(db)s "
            "AND backend_type = 'client backend'",
            {"db": self.dbname},
        ).fetchone()
        return int(row[0])

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no client backend is connected (their counters are flushed at exit)."""
        deadline = time.monotonic() + timeout_s
        while self.backends() and time.monotonic() < deadline:
            time.sleep(0.1)
        # A backend's exit-time flush lands just before it leaves pg_stat_activity; one short
        # pause covers the remaining race.
        time.sleep(0.3)

    def idle_rate(self, window_s: float) -> tuple[float, XactSample]:
        """Commits per second over ``window_s`` with the system up and idle; returns the rate and
        the closing sample (the start of the measured run)."""
        a = self.sample()
        time.sleep(window_s)
        b = self.sample()
        return max(0.0, (b.commits - a.commits) / (b.at - a.at)), b


def relation_sizes(dsn: str, tables: list[str]) -> list[dict]:
    """Heap, index and total size (bytes), live and dead tuples, updates and the share of them
    that were HOT (heap-only: no index entry written) of each existing table."""
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            row = conn.execute(
                "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), "
                "pg_total_relation_size(c.oid), coalesce(s.n_live_tup, 0), "
                "coalesce(s.n_dead_tup, 0), coalesce(s.n_tup_upd, 0), "
                "coalesce(s.n_tup_hot_upd, 0) FROM pg_class c "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.oid = to_regclass(%(t)s)",
                {"t": table},
            ).fetchone()
            if row:
                out.append(
                    {
                        "table": table,
                        "heap_bytes": row[0],
                        "index_bytes": row[1],
                        "total_bytes": row[2],
                        "live_tuples": row[3],
                        "dead_tuples": row[4],
                        "updates": row[5],
                        "hot_updates": row[6],
                    }
                )
    return out
