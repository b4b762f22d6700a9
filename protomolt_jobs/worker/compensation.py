"""Compensation of a graph run stopped between its steps (docs/workflows.md, *Graph
workflows*): an operator cancelled it, or its ``budget.maxCost`` failed it.

Once such a run settles (CANCELLED, or FAILED by its budget), the compensation steps of its
succeeded steps run (reverse completion order), each stored with ``job_compensate``: fenced on
the run having that terminal status at this attempt, since the settle cleared the lease. Best
effort after the fact: the run holds no lease, so a failure here is logged and the remaining
compensations are not retried by anyone. (A run that fails at a step is compensated by the
engine inside its segment, before the FAILED write.) A cancel whose request said
``compensate: false`` (or left it to a definition whose ``cancel.compensate`` is false) runs
none (``workflow/cancel.py``).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.claimed_run import ClaimedJob, ClaimedRun
from protomolt_jobs.worker.permits import TargetPermits
from protomolt_jobs.worker.policies import RowReader
from protomolt_jobs.worker.settlement import LogContext
from protomolt_jobs.workflow import cancel
from protomolt_jobs.workflow.graph_run import run_compensation
from protomolt_jobs.workflow.types import Runtime

__all__ = ["CompensationStore", "compensate_stopped"]

log = logging.getLogger("protomolt_jobs.worker")


class CompensationStore(RowReader, Protocol):
    """The row read and the fenced write of compensation (``JobStore``'s)."""

    def job_compensate(self, lease: Lease, entry: dict[str, Any]) -> None: ...


def compensate_stopped(
    job: ClaimedJob,
    lease: Lease,
    ctx: LogContext,
    *,
    status: str,
    store: CompensationStore,
    runtime: Runtime,
    permits: TargetPermits,
) -> None:
    """Run the compensation steps of a graph run that settled ``status`` (CANCELLED, or FAILED
    by its budget), if it has any.

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
        if row is None or row.status != status:
            return
        if status == "CANCELLED" and not cancel.compensates(
            run.stored.definition, (getattr(row, "cancel_request", None) or {}).get("compensate")
        ):
            log.info(
                "cancelled job not compensated: compensate is false",
                extra={"action": "compensation_skipped", **ctx},
            )
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
            "compensating the stopped job failed",
            exc_info=True,
            extra={"action": "compensation_failed", "error": str(exc), **ctx},
        )
        return
    if ran:
        log.info(
            "stopped job compensated", extra={"action": "job_compensated", "steps": ran, **ctx}
        )
