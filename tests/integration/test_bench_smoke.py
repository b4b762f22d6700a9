"""The CI smoke run of the benchmark harness: tiny sizes, no peers, so ``bench/`` cannot rot.

It asserts that every scenario produced figures, that every job the harness submitted
completed, and that the harness left nothing behind (databases, processes). No timing is
asserted: speed is measured by ``python -m bench all``, never by CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.support import pg

ROOT = Path(__file__).resolve().parents[2]


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment carries ``marker`` (every process the bench run started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return pids


def _bench_databases(tag: str) -> set[str]:
    """The databases this run's harness made (tagged), so a bench running elsewhere on the
    same cluster at the same time cannot make this test fail."""
    with psycopg.connect(pg.BASE_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"pmjb_{tag}%",)
        )
        return {r[0] for r in rows}


@pytest.mark.timeout(180)
def test_bench_smoke_runs_every_scenario_and_cleans_up(tmp_path):
    tag = f"s{uuid.uuid4().hex[:6]}"
    out = tmp_path / "smoke.json"
    marker = f"bench-smoke-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "PROTOMOLT_BENCH_DSN": pg.BASE_DSN,
        "BENCH_SMOKE_MARKER": marker,
        "PMJ_BENCH_DB_TAG": tag,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())

    assert results["ceiling"]["tps"]["1"] > 0

    relay = results["relay"]
    assert relay["events"] == relay["rows"] == 100 and relay["not_published"] == 0

    runs = {r["system"]: r for r in results["throughput"]["runs"]}
    assert set(runs) == {"ours", "ours+relay", "ours-realistic+relay"}
    for tp in runs.values():
        assert tp["jobs"] == tp["n"] == 20
        assert "not_completed" not in tp and "error" not in tp
        assert tp["jobs_per_s"] > 0
        assert tp["tx_per_job"] is not None and tp["tx_per_job"] > 0
        assert tp["statements_per_job"] > 0 and tp["cpu_ms_per_job_run"] > 0
        assert tp["checks"]["completed_once"] is True
        sizes = {s["table"]: s for s in tp["sizes"]}
        assert sizes["workflow_run"]["total_bytes"] > 0
    for label in ("ours+relay", "ours-realistic+relay"):
        assert runs[label]["checks"]["all_published"] is True
        assert runs[label]["relay"]["drain_s"] >= 0

    (lat,) = results["latency"]["runs"]
    assert lat["running"]["samples"] == lat["completed"]["samples"] == 5
    assert 0 < lat["running"]["p50_ms"] <= lat["completed"]["p50_ms"]

    (point,) = results["scale"]["points"]
    assert point["terminal_rows"] == 1000
    assert point["claim"]["samples"] == point["sweep"]["samples"] == 20

    (mem,) = results["memory"]["runs"]
    assert mem["completed"] == mem["concurrent"] == 8
    assert mem["peak_rss_mib"] >= mem["base_rss_mib"] > 0

    # The one table was printed with our figures.
    assert "protomolt-jobs benchmarks" in proc.stdout
    assert "throughput W=2 (ours+relay): jobs/s" in proc.stdout

    # Nothing left behind: no benchmark database, no process the run started (the gRPC server
    # and the system-under-test children inherit the marker through their environment).
    assert _bench_databases(tag) == set()
    assert _processes_with(f"BENCH_SMOKE_MARKER={marker}") == []
