"""The committed protomolt_jobs/pb/ modules match what scripts/gen_protos.py generates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_protos.py"


def run(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_generated_modules_are_fresh():
    result = run(SCRIPT, "--check")
    assert result.returncode == 0, (
        "protomolt_jobs/pb is stale; run `python scripts/gen_protos.py` and commit.\n"
        + result.stdout
        + result.stderr
    )


def test_check_fails_on_stale_or_missing_modules_and_regeneration_repairs(tmp_path):
    # A copy of the layout the script expects (scripts/, proto/, protomolt_jobs/pb/).
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "gen_protos.py")
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    shutil.copytree(
        ROOT / "protomolt_jobs" / "pb",
        tmp_path / "protomolt_jobs" / "pb",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    script = tmp_path / "scripts" / "gen_protos.py"
    pb = tmp_path / "protomolt_jobs" / "pb" / "ai" / "pipestream" / "proto" / "jobs" / "v1"
    assert run(script, "--check").returncode == 0

    # A .proto edited without regenerating.
    jobs = tmp_path / "proto" / "ai" / "pipestream" / "proto" / "jobs" / "v1" / "jobs.proto"
    jobs.write_text(jobs.read_text().replace("string step = 5", "string step_name = 5"))
    stale = run(script, "--check")
    assert stale.returncode == 1
    assert "jobs_pb2.py" in stale.stdout

    # Regeneration is the repair, and running it twice changes nothing.
    assert run(script).returncode == 0
    assert "step_name" in (pb / "jobs_pb2.pyi").read_text()
    again = run(script)
    assert again.returncode == 0 and "0 written, 0 removed" in again.stdout
    assert run(script, "--check").returncode == 0

    # A missing generated module and a leftover one are both stale.
    (pb / "jobs_pb2.py").unlink()
    assert run(script, "--check").returncode == 1
    run(script)
    (pb / "orphan_pb2.py").write_text("# no .proto makes this\n")
    orphan = run(script, "--check")
    assert orphan.returncode == 1 and "orphan_pb2.py" in orphan.stdout
    run(script)
    assert not (pb / "orphan_pb2.py").exists()
