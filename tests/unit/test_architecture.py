"""The architecture's rules (DESIGN.md sections 16 and 18) hold, and breaking one fails.

lint-imports reads the contracts in pyproject.toml: one ``layers`` contract over the whole
package plus a few narrow ones. These tests run it on the tree, check that every top-level
entry of the package sits in a layer (a new module must not slip past the contract), run it on
temporary copies where the store imports the engine, the host a role module, or one runner
the other (each copy must fail), and walk the package's imports themselves (function-level
ones included) for circles and for ``_private`` names taken from another module.
"""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import protomolt_jobs
from tests.support import imports

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


def test_every_top_level_entry_sits_in_exactly_one_layer():
    top = {m.name for m in pkgutil.iter_modules(protomolt_jobs.__path__) if m.name[0] != "_"}
    layered = [
        name.strip() for layer in _contracts()["layers"]["layers"] for name in layer.split("|")
    ]
    assert sorted(top - set(layered)) == [], "add these to the layers contract"
    assert sorted(set(layered) - top) == [], "the layers contract names modules that are gone"
    assert len(layered) == len(set(layered)), "a module sits in two layers"


def test_the_package_root_holds_at_most_ten_modules():
    root = [m.name for m in pkgutil.iter_modules(protomolt_jobs.__path__) if not m.ispkg]
    assert len(root) + 1 <= 10, root  # + __init__


def test_no_module_of_worker_or_store_outgrows_its_bound():
    """A worker module stays under 450 lines, a store module under 900 (SQL files aside): the
    bounds that keep one claimed job's path and the store readable (issue 25)."""
    package = ROOT / "protomolt_jobs"
    too_long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for folder, bound in (("worker", 450), ("store", 900))
        for path in sorted((package / folder).glob("*.py"))
        if (n := len(path.read_text().splitlines())) > bound
    ]
    assert too_long == []


def _lint_a_copy_with(tmp_path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the tree whose ``module`` (a path under protomolt_jobs/) has
    ``line`` appended."""
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(
        ROOT / "protomolt_jobs",
        copy / "protomolt_jobs",
        ignore=shutil.ignore_patterns("__pycache__", "_migrations"),
    )
    target = copy / "protomolt_jobs" / module
    target.write_text(target.read_text() + f"\n{line}  # breaks\n")
    return _lint(copy)


def test_a_store_that_imports_the_engine_fails(tmp_path):
    result = _lint_a_copy_with(tmp_path, "store/records.py", "import protomolt_jobs.workflow.types")
    assert result.returncode != 0
    assert "protomolt_jobs.store is not allowed to import protomolt_jobs.workflow" in result.stdout


def test_a_host_that_imports_the_role_fails(tmp_path):
    result = _lint_a_copy_with(tmp_path, "host/catalog.py", "import protomolt_jobs.runs.inspector")
    assert result.returncode != 0
    assert "The host imports no part of the jobs role" in result.stdout
    assert "BROKEN" in result.stdout


def test_a_runner_that_imports_the_other_runner_fails(tmp_path):
    result = _lint_a_copy_with(
        tmp_path, "workflow/graph_run.py", "import protomolt_jobs.workflow.sequential_run"
    )
    assert result.returncode != 0
    assert "Runners share step code; none imports another BROKEN" in result.stdout


def test_no_import_circle_among_the_package_modules():
    found = imports.cycles(imports.edges(ROOT))
    assert found == [], f"import circles (function-level imports counted): {found}"


def test_no_module_imports_another_modules_private_name():
    assert imports.private_imports(imports.edges(ROOT)) == []
    assert imports.private_attributes(ROOT) == []


def test_the_walk_sees_a_function_level_circle(tmp_path):
    """The import walk itself: a circle hidden in a function is found, a private import too."""
    pkg = tmp_path / imports.PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from protomolt_jobs.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from protomolt_jobs.a import _hidden\n")
    walked = imports.edges(tmp_path)
    assert imports.cycles(walked) == [["protomolt_jobs.a", "protomolt_jobs.b"]]
    assert imports.private_imports(walked) == [
        "protomolt_jobs.b -> protomolt_jobs.a: _hidden (line 2)"
    ]


def test_importing_the_store_loads_no_engine_grpc_or_cel():
    code = (
        "import sys, protomolt_jobs.store, protomolt_jobs.store.store;"
        "bad = [m for m in sys.modules if m.startswith(('protomolt_jobs.workflow', 'grpc',"
        " 'celpy', 'cel_expr'))];"
        "print(bad); raise SystemExit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
