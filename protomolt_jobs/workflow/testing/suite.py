"""Every case of a definition run, with verdicts and coverage (the ``test-workflow`` verb's
answer)."""

from __future__ import annotations

from typing import Any

from protomolt_jobs.workflow.testing.cases import Case
from protomolt_jobs.workflow.testing.coverage import coverage
from protomolt_jobs.workflow.testing.harness import run_case
from protomolt_jobs.workflow.testing.verdict import verdict
from protomolt_jobs.workflow.types import CompiledWorkflow

__all__ = ["run_tests"]


def run_tests(
    workflow: CompiledWorkflow,
    cases: list[Case],
    *,
    pool: Any = None,
    max_attempts: int = 3,
    backoff_base_s: float = 5.0,
) -> dict[str, Any]:
    """Run every case; ``{"ok", "passed", "failed", "cases": [verdict...], "coverage"}``
    (``ok``: every case passed and there is at least one)."""
    runs = [
        run_case(workflow, c, pool=pool, max_attempts=max_attempts, backoff_base_s=backoff_base_s)
        for c in cases
    ]
    results = [verdict(workflow, c, r) for c, r in zip(cases, runs, strict=True)]
    passed = sum(1 for r in results if r["passed"])
    return {
        "ok": bool(results) and passed == len(results),
        "passed": passed,
        "failed": len(results) - passed,
        "cases": results,
        "coverage": coverage(workflow, runs),
    }
