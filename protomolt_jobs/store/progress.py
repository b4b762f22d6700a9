"""Progress checkpoints of long steps: the report (the heartbeat) and its reads.

A long step reports progress (a ``resumable`` step: after every chunk; see
``workflow/resumable.py`` and docs/long-steps.md). :meth:`ProgressMixin.job_report_progress`
writes one report with ONE fenced statement (``job_progress``) that extends the lease, so the
report is the heartbeat, and upserts the ``(job_id, step, iteration)`` row of
``workflow_run_progress`` (migration 0022), a table apart from the run row. When an operator's
pause or cancel is pending, that statement is a boundary write and the database applies the
request there (migration 0002's trigger): the report is kept and the run is PAUSED or
CANCELLED between chunks; a preemption's pending yield (migration 0024) sends it back to
QUEUED there, its attempt kept (docs/long-steps.md, Preemption). Runs without long steps never touch this table.
:class:`ProgressMixin` is one of :class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from protomolt_jobs.errors import ControlApplied
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.records import Lease
from protomolt_jobs.store.scrub import scrub_json, scrub_text

__all__ = ["Progress", "ProgressMixin", "ProgressReport", "report_params"]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One report of a long step (what the worker writes).

    :ivar step: the step's name.
    :ivar iteration: the loop iteration (0 outside a loop).
    :ivar percent: 0..100, or None when the step gives none.
    :ivar details: free text shown with the bar ("" for none).
    :ivar state: the saved state (any JSON value; None: none).
    :ivar state_ref: a reference to a state stored elsewhere ("" for none).
    :ivar adapter_version: the adapter's version ("" for unknown).
    :ivar input_sha256: hex SHA-256 of the step's request ("" for unknown).
    :ivar definition_sha256: hex SHA-256 of the run's definition (``effects.fingerprint``;
        "" for unknown).
    :ivar descriptor_sha256: hex SHA-256 of the step's descriptors ("" for unknown).
    :ivar done: the step said it is finished (this is its last chunk).
    """

    step: str
    iteration: int = 0
    percent: float | None = None
    details: str = ""
    state: Any = None
    state_ref: str = ""
    adapter_version: str = ""
    input_sha256: str = ""
    definition_sha256: str = ""
    descriptor_sha256: str = ""
    done: bool = False


@dataclass(frozen=True, slots=True)
class Progress:
    """A stored report (:meth:`ProgressMixin.job_progress_saved`, ``job_progress_current``).

    :ivar seq: reports of this step so far (1 for the first).
    :ivar attempt: the attempt that wrote it.
    :ivar updated_at: when (database time).
    :ivar definition_sha256: the definition's fingerprint when written ("" for none: written
        before migration 0025, by a ReportProgress whose token carried none, or accepted by
        ``migrate-checkpoint keep`` and not reported since; then no fingerprint is compared
        on resume).
    :ivar descriptor_sha256: the step's descriptors' fingerprint when written ("" for none).
    """

    step: str
    iteration: int
    attempt: int
    seq: int
    percent: float | None
    details: str
    state: Any
    state_ref: str
    adapter_version: str
    input_sha256: str
    done: bool
    updated_at: datetime
    definition_sha256: str = ""
    descriptor_sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        """``{step, iteration, percent, details, updatedAt}`` (get-job's ``progress``)."""
        return {
            "step": self.step,
            "iteration": self.iteration,
            "percent": self.percent,
            "details": self.details,
            "updatedAt": self.updated_at.isoformat(),
        }


def _progress(row: dict[str, Any]) -> Progress:
    state = None
    if row.get("state") is not None:
        try:
            state = json.loads(row["state"])
        except ValueError:  # only a hand edit writes an unreadable state
            state = None
    return Progress(
        step=row["step"],
        iteration=row["iteration"],
        attempt=row["attempt"],
        seq=row["seq"],
        percent=row["percent"],
        details=row["details"] or "",
        state=state,
        state_ref=row.get("state_ref") or "",
        adapter_version=row["adapter_version"] or "",
        input_sha256=row.get("input_sha256") or "",
        done=row["done"],
        updated_at=row["updated_at"],
        definition_sha256=row.get("definition_sha256") or "",
        descriptor_sha256=row.get("descriptor_sha256") or "",
    )


def report_params(report: ProgressReport) -> dict[str, Any]:
    """The ``job_progress`` parameters of ``report``, checked and scrubbed.

    :raises ValueError, TypeError: naming the field (``step``, ``iteration``, ``percent``,
        ``state``).
    """
    checks.text("step", report.step)
    checks.non_negative_int("iteration", report.iteration)
    percent = report.percent
    if percent is not None:
        if isinstance(percent, bool) or not isinstance(percent, (int, float)):
            raise TypeError(f"percent: must be a number; got {type(percent).__name__}")
        if not math.isfinite(percent) or not 0 <= percent <= 100:
            raise ValueError(f"percent: must be within 0..100; got {percent}")
    try:
        state = None if report.state is None else json.dumps(scrub_json(report.state))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"state: not representable as JSON: {exc}") from None
    return {
        "step": scrub_text(report.step),
        "iteration": report.iteration,
        "percent": None if percent is None else float(percent),
        "details": scrub_text(report.details or ""),
        "state": state,
        "state_ref": scrub_text(report.state_ref) or None,
        "adapter_version": scrub_text(report.adapter_version) or None,
        "input_sha256": report.input_sha256 or None,
        "definition_sha256": report.definition_sha256 or None,
        "descriptor_sha256": report.descriptor_sha256 or None,
        "done": bool(report.done),
    }


class ProgressMixin(db.Database):
    """``JobStore``'s progress report (the heartbeat of a long step) and its reads."""

    @db.translated
    def job_report_progress(self, lease: Lease, lease_s: float, report: ProgressReport) -> int:
        """Store one progress report and extend the lease.

        SQL: fenced ``job_progress`` (one statement: lease_until = now() + lease_s, upsert of
        the progress row); when a pending request was applied there, its CANCELLED or PAUSED
        event in the same transaction. Transaction: one.

        :returns: the report's ``seq`` (1 for the step's first report).
        :raises LeaseLost: when the fence matches no row (nothing stored).
        :raises ControlApplied: when a pending pause or cancel took the run at this report
            (the report is stored; the run is PAUSED or CANCELLED, its lease cleared), or a
            preemption's yield did (status QUEUED, the attempt given back, a YIELDED event).
        :raises ValueError, TypeError: a blank step, a negative iteration, a percent outside
            0..100, a state JSON cannot hold, a non-positive ``lease_s``.
        :raises StoreError: on a database failure.
        """
        checks.positive_seconds("lease_s", lease_s)
        params = report_params(report)
        params["lease_s"] = float(lease_s)
        params["live"] = False
        params["bound"] = params["mac"] = None
        with self._connection() as conn, conn.transaction():
            row = db.fenced(conn, "job_progress", lease, params)
            if row["status"] == "QUEUED":
                # a preemption's yield was honoured at this report (migration 0024): its
                # event, and a wake-up for the claim loops (the urgent run waits)
                self._outbox_txn(
                    conn, row, EventType.TYPE_YIELDED, step=params["step"], notify=True
                )
            else:
                self._control_event_txn(conn, row, params["step"])
        if row["status"] != "RUNNING":
            raise ControlApplied(
                lease.job_id, lease.owner, lease.attempt, "job_progress", str(row["status"])
            )
        return int(row["seq"])

    @db.translated
    def job_report_live(
        self,
        lease: Lease,
        lease_s: float,
        report: ProgressReport,
        proof: tuple[str, str] | None = None,
    ) -> str:
        """Store one report made from inside a running call (``ReportProgress``) and extend
        the lease; never applies a pending request (the service is told and acts on it).

        SQL: fenced ``job_progress`` with ``live`` (one statement; not a boundary write; a
        report without a state keeps the stored state; the fingerprints written are
        ``report``'s, those of the call's progress token, or the stored ones when
        ``report.definition_sha256`` is ""). Transaction: one. ``proof``: a progress token's
        ``(bound, mac)`` (store/progress_token.py): the fence then checks the mac against the
        row's lease token instead of ``lease.token``.

        :returns: ``"continue"``, or ``"pause_requested"``/``"cancel_requested"`` when an
            operator's pause or cancel of the run is pending. A pending preemption ``yield``
            (docs/long-steps.md) is ``"pause_requested"`` too: the service returns early with
            its state, and that chunk's write applies the yield (QUEUED, not PAUSED).
        :raises LeaseLost: when the fence matches no row (a stale attempt; nothing stored).
        :raises ValueError, TypeError: as :meth:`job_report_progress`.
        :raises StoreError: on a database failure.
        """
        checks.positive_seconds("lease_s", lease_s)
        params = report_params(report)
        params["lease_s"] = float(lease_s)
        params["live"] = True
        params["done"] = False
        params["bound"], params["mac"] = proof if proof is not None else (None, None)
        with self._connection() as conn, conn.transaction():
            row = db.fenced(conn, "job_progress", lease, params)
        kind = row.get("control_kind")
        if kind in ("pause", "yield"):
            return "pause_requested"
        if kind == "cancel":
            return "cancel_requested"
        return "continue"

    @db.translated
    def job_progress_saved(self, job_id: UUID, step: str, iteration: int = 0) -> Progress | None:
        """The last report of ``step`` (at ``iteration``) of the run, or None.

        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            row = db.one(
                conn,
                "job_progress_saved",
                {"job_id": job_id, "step": step, "iteration": iteration},
            )
        return None if row is None else _progress(row)

    @db.translated
    def job_progress_current(self, job_id: UUID) -> Progress | None:
        """The run's most recent report of a step not yet done (the step in flight), or None.

        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            row = db.one(conn, "job_progress_current", {"job_id": job_id})
        if row is None:
            return None
        row.setdefault("state", None)
        return _progress(row)
