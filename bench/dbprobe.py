"""Where the database's work goes during a measured window of an own cluster (``--own-cluster``).

:class:`ClusterProbe` brackets a window (``start()`` ... ``stop(dbname, jobs)``) and reports:

- **statements**: ``pg_stat_statements`` of the benchmark database (reset at ``start``), top
  statements by total execution time: the store's named query when the text is one of
  :data:`protomolt_jobs.store.queries.QUERIES`, else the normalised text shortened; calls,
  total and mean ms, rows, WAL bytes, shared blocks hit and dirtied, and whether it was a
  top-level statement, plans per call and planning ms per job (``track_planning``: a plan
  per call means the statement is planned every time) (``track=all`` also lists the trigger's INSERT and the foreign-key
  checks run inside the store's statements: ``top`` false);
- **cpu**: PostgreSQL CPU by process accounting, from ``/proc/<pid>/stat`` (``utime + stime``):
  the postmaster's children are sampled every 0.2 s and grouped by kind (client backends,
  autovacuum workers, checkpointer, walwriter, background writer, ...). The total is exact:
  live processes' CPU plus the postmaster's ``cutime + cstime`` (every child it reaped during
  the window, so backends that ended before the last sample are counted in full); the part
  of exited processes after their last sample shows as ``exited (unsampled)``. Each figure is
  also given per job, in ms. The CPU of the harness's own connections (its completion polls,
  lag samples and checks, :mod:`bench.harness_cpu`) is taken out of the total and the
  backends' figure and shown apart (``harness_excluded_ms_per_job``).

Linux only (``/proc``), 10 ms accounting ticks: use windows of a few seconds or more.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import psycopg

_TICK = os.sysconf("SC_CLK_TCK")
#: Background process kinds (the rest of the postmaster's children are client backends).
BACKGROUND = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "autovacuum worker",
    "logical replication launcher",
    "archiver",
    "startup",
)
#: Words pg_stat_statements replaces with ``$n`` (constants).
_CONSTANT_WORDS = {"interval", "null", "true", "false"}
#: Statements listed in the report.
TOP = 14


def _stat(pid: int) -> tuple[int, float, float] | None:
    """``(ppid, utime + stime, cutime + cstime)`` in seconds, or None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    return int(fields[1]), own, reaped


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "client backend"
    rest = cmd.split("postgres:", 1)[-1].strip()
    for kind in BACKGROUND:
        if rest.startswith(kind):
            return kind
    return "client backend"


def _sys(pid: int) -> float:
    """Kernel CPU seconds of ``pid`` plus its reaped children's (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[12]) + int(fields[14])) / _TICK


def _children(postmaster: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st and st[0] == postmaster:
            out[int(entry)] = st[1]
    return out


def _key(sql: str) -> str:
    """The words of a statement's text, string literals dropped: the same for a named query
    and its ``pg_stat_statements`` normalisation (which turns constants, typed literals such
    as ``interval '1 microsecond'``, ``NULL``, ``TRUE`` and ``FALSE`` included, into ``$n``)."""
    sql = re.sub(r"%\(\w+\)s", "", re.sub(r"'[^']*'", "", sql))
    words = re.findall(r"[A-Za-z_][A-Za-z_0-9]*", sql)
    return " ".join(w for w in words if w.lower() not in _CONSTANT_WORDS)


def _names() -> dict[str, str]:
    from protomolt_jobs.store.queries import QUERIES

    return {_key(sql): name for name, sql in QUERIES.items()}


def short(sql: str, width: int = 90) -> str:
    """One line of at most ``width`` characters."""
    one = " ".join(sql.split())
    return one if len(one) <= width else one[: width - 1] + "…"


class ClusterProbe:
    """Statement statistics and process CPU of one cluster over a window."""

    def __init__(self, dsn: str, postmaster_pid: int) -> None:
        self.dsn = dsn
        self.postmaster = postmaster_pid
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._kinds: dict[int, str] = {}
        self._total0 = 0.0
        self._sys0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _total(self) -> float:
        st = _stat(self.postmaster)
        own = (st[1] + st[2]) if st else 0.0
        return own + sum(_children(self.postmaster).values())

    def _total_sys(self) -> float:
        return _sys(self.postmaster) + sum(_sys(pid) for pid in _children(self.postmaster))

    def _sample(self) -> None:
        for pid, used in _children(self.postmaster).items():
            if pid not in self._kinds:
                self._kinds[pid] = _kind(pid)
                self._first.setdefault(pid, 0.0)
            self._last[pid] = used

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def start(self) -> None:
        """Reset the statement statistics and take the opening CPU sample."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        self._first = dict(_children(self.postmaster))
        self._kinds = {pid: _kind(pid) for pid in self._first}
        self._last = dict(self._first)
        self._total0 = self._total()
        self._sys0 = self._total_sys()
        self._t0 = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cluster-probe")
        self._thread.start()

    def _wait_gone(self, dbname: str, timeout_s: float = 15.0) -> None:
        """Wait until no client backend of ``dbname`` is left and the postmaster has reaped
        the last one (its CPU is then in the postmaster's ``cutime``)."""
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'client backend'",
                    (dbname,),
                ).fetchone()
                if not row or row[0] == 0:
                    break
                time.sleep(0.05)
        time.sleep(0.2)

    def stop(self, dbname: str, jobs: int, harness_s: float = 0.0) -> dict:
        """Close the window once the run's backends are gone; ``{"cpu": ...,
        "statements": [...]}`` (see the module doc).

        :param harness_s: CPU seconds of the harness's own connections in the window (its
            polls, samples and checks; :mod:`bench.harness_cpu`), subtracted from the total
            and the backends' figure and reported apart as ``harness_excluded_ms_per_job``.
        """
        self._wait_gone(dbname)
        self._sample()
        total = self._total() - self._total0
        kernel = self._total_sys() - self._sys0
        self._stop.set()
        if self._thread:
            self._thread.join()
        wall = time.monotonic() - self._t0
        by_kind: dict[str, float] = {}
        for pid, last in self._last.items():
            kind = self._kinds.get(pid, "client backend")
            by_kind[kind] = by_kind.get(kind, 0.0) + last - self._first.get(pid, 0.0)
        by_kind["exited (unsampled)"] = max(0.0, total - sum(by_kind.values()))
        total = max(total, sum(by_kind.values()))
        harness_s = min(max(0.0, harness_s), total)

        def per_job(s: float) -> float | None:
            return round(1000 * s / jobs, 3) if jobs else None

        cpu = {
            "window_s": round(wall, 2),
            "total_s": round(total, 2),
            # Without the harness's own polls (harness_excluded_ms_per_job).
            "total_ms_per_job": per_job(total - harness_s),
            # Of the total, in the kernel (WAL writes and flushes, sockets, ...).
            "sys_ms_per_job": per_job(max(0.0, kernel)),
            # Client backends plus what exited between samples (backends at the end of a
            # run): the statements' own cost.
            "backend_ms_per_job": per_job(
                by_kind.get("client backend", 0.0) + by_kind["exited (unsampled)"] - harness_s
            ),
            # The backends of the harness's polls, samples and checks: in by_kind (client
            # backend, exited), not in the two figures above.
            "harness_excluded_ms_per_job": per_job(harness_s),
            "by_kind_ms_per_job": {k: per_job(v) for k, v in sorted(by_kind.items()) if v > 0},
        }
        return {"cpu": cpu, "statements": self.statements(dbname, jobs)}

    def statements(self, dbname: str, jobs: int) -> list[dict]:
        """The top statements of ``dbname`` by total execution time since the reset."""
        names = _names()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT query, toplevel, calls, total_exec_time, rows, wal_bytes, "
                "shared_blks_hit, shared_blks_dirtied, plans, total_plan_time "
                "FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND calls > 0 "
                "ORDER BY total_exec_time DESC LIMIT %s",
                (dbname, TOP),
            ).fetchall()
        out = []
        for query, top, calls, total_ms, nrows, wal, hit, dirtied, plans, plan_ms in rows:
            if not calls:
                continue  # planned only (a PL/pgSQL expression's plan under track_planning)
            out.append(
                {
                    "statement": names.get(_key(query)) or short(query),
                    "top": bool(top),
                    "calls": calls,
                    "calls_per_job": round(calls / jobs, 2) if jobs else None,
                    "total_ms": round(total_ms, 1),
                    "mean_ms": round(total_ms / calls, 3) if calls else None,
                    "ms_per_job": round(total_ms / jobs, 3) if jobs else None,
                    "rows": nrows,
                    "wal_bytes_per_call": round(int(wal) / calls) if calls else None,
                    "blks_hit_per_call": round(hit / calls, 1) if calls else None,
                    "blks_dirtied_per_call": round(dirtied / calls, 2) if calls else None,
                    # Plans made (track_planning): 1 per call = re-planned every time.
                    "plans_per_call": round(plans / calls, 2) if calls else None,
                    "plan_ms_per_job": round(plan_ms / jobs, 3) if jobs else None,
                }
            )
        return out


def print_probe(label: str, probe: dict) -> None:
    """The probe's figures as indented lines under a run's line."""
    cpu = probe["cpu"]
    kinds = "  ".join(f"{k} {v}" for k, v in cpu["by_kind_ms_per_job"].items())
    print(
        f"    postgres CPU/job {cpu['total_ms_per_job']} ms (backends "
        f"{cpu['backend_ms_per_job']} ms, kernel {cpu.get('sys_ms_per_job')} ms) over "
        f"{cpu['window_s']} s: {kinds}; harness polls excluded "
        f"{cpu.get('harness_excluded_ms_per_job', 0)} ms",
        flush=True,
    )
    print(
        f"    {'statement':58s} {'top':>3s} {'calls/job':>9s} {'mean ms':>8s} "
        f"{'ms/job':>7s} {'WAL B/call':>10s} {'hit/call':>8s} {'dirt/call':>9s} "
        f"{'plans/call':>10s} {'plan ms/job':>11s}",
        flush=True,
    )
    for s in probe["statements"]:
        print(
            f"    {short(s['statement'], 58):58s} {'y' if s['top'] else 'n':>3s} "
            f"{s['calls_per_job']!s:>9s} {s['mean_ms']!s:>8s} {s['ms_per_job']!s:>7s} "
            f"{s['wal_bytes_per_call']!s:>10s} {s['blks_hit_per_call']!s:>8s} "
            f"{s['blks_dirtied_per_call']!s:>9s} {s['plans_per_call']!s:>10s} "
            f"{s['plan_ms_per_job']!s:>11s}",
            flush=True,
        )
