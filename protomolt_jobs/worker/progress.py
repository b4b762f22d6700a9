"""The progress reports of a claimed run's resumable steps (docs/long-steps.md).

:class:`ProgressWriter` is what the worker hands the engine as ``EffectContext.on_progress``
and ``progress_saved`` for a run whose workflow has a ``resumable`` step (a run without one
gets neither, and pays nothing). Each report is ONE fenced statement
(``JobStore.job_report_progress``) that also extends the lease, so the heartbeat's next beat
of the run is pushed back a full interval: while chunks keep coming, the report IS the
heartbeat. A report that finds an operator's pause or cancel applies it in the database
(``ControlApplied``): the guard is marked ``controlled`` and the segment ends as after a
checkpoint that met the request (the worker writes nothing more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol
from uuid import UUID

from protomolt_jobs.errors import ControlApplied, LeaseLost
from protomolt_jobs.store.progress import Progress, ProgressReport
from protomolt_jobs.store.progress_token import HEADER, ProgressToken
from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.heartbeat import LeaseGuard

__all__ = ["ProgressStore", "ProgressWriter"]

log = logging.getLogger("protomolt_jobs.worker")


class ProgressStore(Protocol):
    """The progress writes and read of a running segment (``JobStore``'s)."""

    def job_report_progress(self, lease: Lease, lease_s: float, report: ProgressReport) -> int: ...

    def job_progress_saved(
        self, job_id: UUID, step: str, iteration: int = 0
    ) -> Progress | None: ...


class ProgressWriter:
    """The progress reports of one claimed run.

    :param store: the progress writes.
    :param guard: the run's lease.
    :param lease_s: the lease length (seconds) a report extends the lease by.
    :param interval_s: the heartbeat's interval: a report pushes the run's next beat this far.
    :param ctx: log context.
    """

    def __init__(
        self,
        store: ProgressStore,
        guard: LeaseGuard,
        *,
        lease_s: float,
        interval_s: float,
        ctx: Mapping[str, Any],
    ) -> None:
        self._store = store
        self._guard = guard
        self._lease_s = lease_s
        self._interval_s = interval_s
        self._ctx = dict(ctx)

    def on_progress(self, step: str, iteration: int, report: Mapping[str, Any]) -> None:
        """Store one report (``{percent, details, state, adapterVersion, inputSha256,
        definitionSha256, descriptorSha256, done}``).

        :raises LeaseLost: the lease is gone (``ControlApplied``: an operator's pause or cancel
            took the run at this report, which is stored).
        :raises StoreError: the write failed.
        """
        if self._guard.lost:
            lease = self._guard.lease
            raise LeaseLost(lease.job_id, lease.owner, lease.attempt, "progress")
        try:
            seq = self._store.job_report_progress(
                self._guard.lease,
                self._lease_s,
                ProgressReport(
                    step=step,
                    iteration=iteration,
                    percent=report.get("percent"),
                    details=str(report.get("details") or ""),
                    state=report.get("state"),
                    adapter_version=str(report.get("adapterVersion") or ""),
                    input_sha256=str(report.get("inputSha256") or ""),
                    definition_sha256=str(report.get("definitionSha256") or ""),
                    descriptor_sha256=str(report.get("descriptorSha256") or ""),
                    done=bool(report.get("done")),
                ),
            )
        except ControlApplied as applied:
            self._guard.status = applied.status
            self._guard.mark_lost("controlled")
            raise
        except LeaseLost:
            self._guard.mark_lost("lease_lost")
            raise
        # the report extended the lease: the heartbeat need not beat for a full interval
        self._guard.next_due = max(self._guard.next_due, time.monotonic() + self._interval_s)
        log.debug(
            "progress reported",
            extra={"action": "progress_reported", "step": step, "seq": seq, **self._ctx},
        )

    def token(
        self,
        step: str,
        iteration: int,
        resumable: bool,
        fingerprints: Mapping[str, str] | None = None,
    ) -> tuple[str, str]:
        """The ``protomolt-progress-token`` metadata of a ``reportsProgress`` step's call,
        bound to this attempt's lease and carrying the call's ``fingerprints``
        (``{adapterVersion, inputSha256, descriptorSha256, definitionSha256}``, as a chunk's
        report; its ReportProgress writes store them: store/progress_token.py); no
        statement."""
        prints = fingerprints or {}
        issued = ProgressToken(
            self._guard.lease,
            step,
            iteration,
            resumable,
            adapter_version=str(prints.get("adapterVersion") or ""),
            input_sha256=str(prints.get("inputSha256") or ""),
            descriptor_sha256=str(prints.get("descriptorSha256") or ""),
            definition_sha256=str(prints.get("definitionSha256") or ""),
        )
        return (HEADER, issued.encode())

    def saved(self, step: str, iteration: int) -> Progress | None:
        """The last report of ``step`` at ``iteration`` (the state to continue from), or None.

        :raises StoreError: the read failed.
        """
        return self._store.job_progress_saved(self._guard.lease.job_id, step, iteration)
