"""The worker's log line of a RECOVERY_REQUIRED settlement names the run's own cause (its
error): an unproven external effect, a checkpoint-mismatch or a progress-mismatch, never one
fixed sentence for all three (worker/settler.py). A fake settling store (no database)."""

from __future__ import annotations

import logging
import uuid

import pytest

from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.heartbeat import LeaseGuard
from protomolt_jobs.worker.settlement import Settlement, Write, WriteKind
from protomolt_jobs.worker.settler import Settler


class _Store:
    def __init__(self) -> None:
        self.written: list[tuple[str, str]] = []

    def job_recovery_required(self, lease: Lease, step: str, reason: str) -> str:
        self.written.append((step, reason))
        return "RECOVERY_REQUIRED"


@pytest.mark.parametrize(
    "error",
    [
        (
            "step 'charge' has effect 'external', an intent and no checkpoint, and its call failed "
            "on the last attempt (GRPC: UNAVAILABLE): reconcile-step must say whether it happened"
        ),
        "checkpoint-mismatch: step 'embed' adapterVersion changed (was 'v1', now 'v2')",
        (
            "progress-mismatch: step 'render' adapterVersion changed "
            "(was 'render-1.0', now 'render-2.0')"
        ),
    ],
)
def test_the_recovery_line_names_the_runs_error(caplog, error):
    store = _Store()
    lease = Lease(uuid.uuid4(), "w-1", 1, uuid.uuid4())
    caplog.set_level(logging.WARNING, logger="protomolt_jobs.worker")
    step = error.split("'")[1]
    settled = Settler(store).apply(  # type: ignore[arg-type]
        Write(WriteKind.RECOVERY, step=step, error=error),
        LeaseGuard(lease, 0.0),
        {"job_id": str(lease.job_id)},
    )
    assert settled is Settlement.RECOVERY_REQUIRED
    assert store.written == [(step, error)]
    (record,) = [r for r in caplog.records if getattr(r, "action", "") == "job_recovery_required"]
    assert record.getMessage() == f"job needs recovery at step '{step}': {error}"
    assert "cannot be proven" not in record.getMessage()
    # the structured fields are as before: the step and the error
    assert (record.step, record.error) == (step, error)  # type: ignore[attr-defined]
