"""``--own-cluster`` of the benchmark: a tiny throughput run on a throwaway PostgreSQL reports
per-statement figures, PostgreSQL CPU per job and the HOT share, and the cluster is stopped and
its directory removed afterwards, also when the run is interrupted (Ctrl-C). No timing is
asserted: speed lives in ``python -m bench``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.worker_proc import wait_for

ROOT = Path(__file__).resolve().parents[2]
_CLUSTER = re.compile(r"== own cluster in (\S+) on port (\d+) \(postmaster (\d+)\)")


def _alive(pid: int) -> bool:
    """Running (a zombie left for a container's init to reap does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _env() -> dict:
    return {**os.environ, "PMJ_BENCH_DB_TAG": f"o{uuid.uuid4().hex[:6]}"}


@pytest.mark.timeout(240)
def test_own_cluster_throughput_reports_statements_cpu_and_hot_share(tmp_path):
    out = tmp_path / "own.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "throughput",
            "--own-cluster",
            "--n",
            "12",
            "--workers",
            "2",
            "--peers",
            "",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = _CLUSTER.search(proc.stdout)
    assert found, proc.stdout[-2000:]
    directory, postmaster = Path(found.group(1)), int(found.group(3))
    results = json.loads(out.read_text())

    settings = results["own_cluster"]["settings"]
    assert settings["shared_preload_libraries"] == "pg_stat_statements"
    assert settings["track_io_timing"] == "on"
    assert settings["pg_stat_statements.track"] == "all"
    assert settings["server_version"]

    (run,) = results["throughput"]["runs"]
    assert run["jobs"] == 12 and run["checks"]["completed_once"] is True
    cpu = run["db"]["cpu"]
    assert cpu["total_ms_per_job"] is not None and cpu["total_ms_per_job"] >= 0
    assert "backend_ms_per_job" in cpu and isinstance(cpu["by_kind_ms_per_job"], dict)
    # The harness's own polls and checks are shown apart, not in the total (harness_cpu).
    assert cpu["harness_excluded_ms_per_job"] is not None
    assert cpu["harness_excluded_ms_per_job"] >= 0
    statements = {s["statement"]: s for s in run["db"]["statements"]}
    # The store's statements are named; the trigger's nested history insert is listed too.
    for name in ("job_insert", "job_claim_one_queue", "job_checkpoint"):
        assert name in statements, sorted(statements)
        s = statements[name]
        assert s["top"] is True and s["calls"] >= 12
        for key in ("total_ms", "mean_ms", "rows", "wal_bytes_per_call", "blks_hit_per_call"):
            assert s[key] is not None
        assert "blks_dirtied_per_call" in s
    assert any(k.startswith("INSERT INTO workflow_run_transition") for k in statements)
    sizes = {s["table"]: s for s in run["sizes"]}
    assert sizes["workflow_run"]["updates"] >= 12 * 4
    assert 0 <= sizes["workflow_run"]["hot_updates"] <= sizes["workflow_run"]["updates"]

    # The report printed the sections, and the cluster is gone.
    for section in ("postgres CPU/job", "HOT share of updates", "own cluster settings"):
        assert section in proc.stdout
    assert not directory.exists()
    wait_for(lambda: not _alive(postmaster), timeout_s=30, what="postmaster gone")


@pytest.mark.timeout(180)
def test_own_cluster_is_removed_when_the_run_is_interrupted():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "throughput",
            "--own-cluster",
            "--n",
            "4000",
            "--workers",
            "2",
            "--peers",
            "",
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = ""
        while not _CLUSTER.search(line):
            line = proc.stdout.readline()
            assert line, "the bench exited before its cluster started"
        found = _CLUSTER.search(line)
        directory, postmaster = Path(found.group(1)), int(found.group(3))
        assert directory.exists() and _alive(postmaster)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        wait_for(lambda: not _alive(postmaster), timeout_s=30, what="postmaster gone")
        assert not directory.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.timeout(240)
def test_floor_runs_the_store_statements_through_pgbench(tmp_path):
    out = tmp_path / "floor.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "floor",
            "--floor-clients",
            "1,2",
            "--floor-s",
            "1",
            "--floor-variants",
            "shipped,bare",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    floor = json.loads(out.read_text())["floor"]
    # The script is the store's own statements (their text up to the first parameter), in
    # the hot path's order.
    from protomolt_jobs.store.queries import QUERIES

    order = ["job_insert", "job_claim_one_queue", "job_checkpoint", "job_complete_with_checkpoint"]
    at = [floor["script"].find(QUERIES[name].split("%(")[0]) for name in order]
    assert -1 not in at and at == sorted(at), at
    runs = {(r["variant"], r["clients"]): r for r in floor["runs"]}
    assert set(runs) == {("shipped", 1), ("shipped", 2), ("bare", 1), ("bare", 2)}
    for (variant, _), r in runs.items():
        assert r["jobs"] > 0 and r["failed"] == 0
        # Every pgbench transaction completed exactly one job.
        assert r["completed"] == r["jobs"]
        statements = {s["statement"]: s for s in r["db"]["statements"]}
        for name in order:
            assert name in statements, sorted(statements)
        history = any(k.startswith("INSERT INTO workflow_run_transition") for k in statements)
        assert history is (variant == "shipped")
        assert r["db"]["cpu"]["total_ms_per_job"] is not None
    assert "floor (shipped, pgbench): jobs/s, 1 clients" in proc.stdout


def test_floor_variants_name_any_migration_and_harness_backends_are_read_from_proc(fresh_dsn):
    from bench import harness_cpu
    from bench.floor import variant_spec

    assert variant_spec("before-0029") == (False, False, ("0029",))
    assert variant_spec("shipped") == (False, False, ())
    with pytest.raises(KeyError):
        variant_spec("before-29")
    before = harness_cpu.SPENT_S
    with harness_cpu.connect(fresh_dsn) as conn:
        pid = conn.info.backend_pid
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        assert harness_cpu.backend_cpu_s(pid) > 0  # the backend's CPU so far, from /proc
    assert harness_cpu.SPENT_S > before  # counted when the connection closed
    assert harness_cpu.backend_cpu_s(2**22 + 12345) == 0.0  # no such process
