"""A case's verdict: its :class:`~.harness.CaseRun` held to its ``expect``, first difference first.

Checked in this order, and the first that differs is the case's ``difference``:
an unmocked step; ``status``; ``errorKind``; ``failedStep``; ``path`` (exact, ``name#k`` for a
loop body's iterations); ``calls`` (each listed step's count exactly; unlisted steps are not
checked); ``skipped`` (the steps the report says were skipped, exactly these, each reason
containing the expected text).
"""

from __future__ import annotations

from typing import Any

from protomolt_jobs.workflow.testing.cases import Case
from protomolt_jobs.workflow.testing.harness import CaseRun, path_of
from protomolt_jobs.workflow.types import CompiledWorkflow

__all__ = ["skipped_of", "verdict"]


def skipped_of(run: CaseRun) -> dict[str, str]:
    """Skipped step -> reason: the report's rows (graph), else the skipped entries."""
    if run.report is not None:
        return {
            r["name"]: str(r.get("reason", ""))
            for r in run.report.get("steps", [])
            if r.get("status") == "skipped"
        }
    return {
        e["name"]: str(e.get("reason", ""))
        for e in run.checkpoints
        if e.get("skipped") is True and isinstance(e.get("name"), str)
    }


def verdict(workflow: CompiledWorkflow, case: Case, run: CaseRun) -> dict[str, Any]:
    """``{"name", "passed", "difference"?, "step"?, "actual": {...}}`` for one case."""
    path = path_of(workflow, run.checkpoints)
    skipped = skipped_of(run)
    actual: dict[str, Any] = {
        "status": run.status,
        "path": path,
        "calls": dict(run.calls),
        "skipped": skipped,
        "attempts": run.attempts,
        "clockMs": run.clock_ms,
    }
    if run.error is not None:
        actual["error"] = run.error
    if run.error_kind is not None:
        actual["errorKind"] = run.error_kind
    if run.failed_step:
        actual["failedStep"] = run.failed_step
    result: dict[str, Any] = {"name": case.name, "passed": True, "actual": actual}
    diff = _first_difference(case.expect, run, path, skipped)
    if diff is not None:
        step, text = diff
        result["passed"] = False
        result["difference"] = text
        if step:
            result["step"] = step
    return result


def _first_difference(
    expect: Any, run: CaseRun, path: list[str], skipped: dict[str, str]
) -> tuple[str, str] | None:
    if run.unmocked is not None:
        return run.unmocked_step or "", f"unmocked: {run.unmocked}"
    want = expect.get("status")
    if want is not None and want != run.status:
        said = f" ({run.error})" if run.error else ""
        return run.failed_step or "", f"status: expected {want}, got {run.status}{said}"
    for key, got in (("errorKind", run.error_kind), ("failedStep", run.failed_step)):
        if key in expect and expect[key] != (got or ""):
            return run.failed_step or "", f"{key}: expected {expect[key]!r}, got {got!r}"
    if "path" in expect and list(expect["path"]) != path:
        want_path = list(expect["path"])
        i = next(
            (k for k, (a, b) in enumerate(zip(want_path, path, strict=False)) if a != b),
            min(len(want_path), len(path)),
        )
        exp_at = want_path[i] if i < len(want_path) else "(end)"
        got_at = path[i] if i < len(path) else "(end)"
        step = (exp_at if exp_at != "(end)" else got_at).split("#", 1)[0]
        return step, (
            f"path: expected {want_path}, got {path}; first difference at {i}: "
            f"expected {exp_at}, got {got_at}"
        )
    for step, n in (expect.get("calls") or {}).items():
        got_n = run.calls.get(step, 0)
        if got_n != n:
            return step, f"calls of '{step}': expected {n}, got {got_n}"
    if "skipped" in expect:
        want_skips: dict[str, str] = expect["skipped"]
        for step in sorted(set(want_skips) | set(skipped)):
            if step not in skipped:
                return step, f"skipped: expected '{step}' skipped, it was not"
            if step not in want_skips:
                return step, f"skipped: '{step}' was skipped ({skipped[step]}), not expected"
            if want_skips[step] not in skipped[step]:
                return step, (
                    f"skipped: '{step}' reason expected to contain {want_skips[step]!r}, "
                    f"got {skipped[step]!r}"
                )
    return None
