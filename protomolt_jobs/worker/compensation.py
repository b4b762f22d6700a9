"""Compensation of a graph run an operator cancelled (docs/workflows.md, *Graph workflows*).

Once a run settles CANCELLED, the compensation steps of its succeeded steps run (reverse
completion order), each stored with ``job_compensate``: fenced on the run being CANCELLED at
this attempt, since the cancel cleared the lease. Best effort after the fact: the run holds no
lease, so a failure here is logged and the remaining compensations are not retried by anyone.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.claimed_run import ClaimedJob, ClaimedRun
from protomolt_jobs.worker.permits import TargetPermits
from protomolt_jobs.worker.policies import RowReader
from protomolt_jobs.worker.settlement import LogContext
from protomolt_jobs.workflow.graph_run import run_compensation
from protomolt_jobs.workflow.types import Runtime

__all__ = ["CompensationStore", "compensate_cancelled"]

log = logging.getLogger("protomolt_jobs.worker")


class CompensationStore(RowReader, Protocol):
    """The row read and the fenced write of compensation (``JobStore``'s)."""

    def job_compensate(self, lease: Lease, entry: dict[str, Any]) -> None: ...


def compensate_cancelled(
    job: ClaimedJob,
    lease: Lease,
    ctx: LogContext,
    *,
    store: CompensationStore,
    runtime: Runtime,
    permits: TargetPermits,
) -> None:
    """Run the compensation steps of a cancelled graph run, if it has any.

    Never raises: a failure is logged (``compensation_failed``) and ends the compensation.

    :param job: the claimed job (its row's definition and input are read again).
    :param lease: the fence the job was claimed with (its attempt fences ``job_compensate``).
    :param ctx: the run's log context.
    """
    try:
        run = ClaimedRun.read(job, runtime)
        workflow = run.workflow
        if not workflow.graph or not workflow.compensations:
            return
        row = store.job_get(job.job_id)
        if row is None or row.status != "CANCELLED":
            return
        ran = run_compensation(
            workflow,
            run.message,
            list(row.checkpoints or []),
            lambda entry: store.job_compensate(lease, entry),
            runtime=runtime,
            call_permit=permits.held,
        )
    except Exception as exc:  # the job is settled; nothing here may crash the loop
        log.warning(
            "compensating the cancelled job failed",
            exc_info=True,
            extra={"action": "compensation_failed", "error": str(exc), **ctx},
        )
        return
    if ran:
        log.info(
            "cancelled job compensated", extra={"action": "job_compensated", "steps": ran, **ctx}
        )
