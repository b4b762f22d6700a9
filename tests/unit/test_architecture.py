"""The architecture's never-arrows (DESIGN.md section 16) hold, and breaking one fails.

lint-imports reads the contracts in pyproject.toml. These tests run it on the tree, check the
"hooks imports nothing of ours" contract forbids every other module of the package (a new
module must not slip past it), and run it on a temporary copy where the store imports the
engine: that copy must fail.
"""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import protomolt_jobs

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(cwd)},
    )


def test_the_tree_keeps_every_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_hooks_contract_forbids_every_other_module_of_ours():
    top = {
        f"protomolt_jobs.{m.name}"
        for m in pkgutil.iter_modules(protomolt_jobs.__path__)
        if m.name != "hooks" and not m.name.startswith("_")
    }
    listed = set(_contracts()["hooks-is-the-contract-only"]["forbidden_modules"])
    assert top <= listed, f"add to the contract: {sorted(top - listed)}"


def test_a_store_that_imports_the_engine_fails(tmp_path):
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(
        ROOT / "protomolt_jobs",
        copy / "protomolt_jobs",
        ignore=shutil.ignore_patterns("__pycache__", "_migrations"),
    )
    records = copy / "protomolt_jobs" / "store" / "records.py"
    records.write_text(records.read_text() + "\nimport protomolt_jobs.workflow.types  # breaks\n")
    result = _lint(copy)
    assert result.returncode != 0
    assert "The store never imports the engine or the host BROKEN" in result.stdout
