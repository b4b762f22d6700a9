"""Bounded loops: ``extend-loop`` and the extensions' read.

A run whose loop exhausts with ``onExhausted: "park"`` is PAUSED by its worker
(``SettlesMixin.job_loop_pause`` in store/settles.py: ``paused_from`` QUEUED, the error
``LOOP: ...``, a ``loop`` transition). ``extend-loop`` (:meth:`LoopsMixin.job_extend_loop`)
raises one loop's bound for the run (``loop_extensions``, migration 0016) under the row lock,
records an ``extend-loop`` transition with the actor and reason, and requeues the run when that
loop's exhaustion paused it. The worker reads the extensions only when a loop reaches its bound
(:meth:`LoopsMixin.job_loop_extensions`), never on the claim. :class:`LoopsMixin` is one of
:class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.errors import NotFound
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["LOOP_ERROR_PREFIX", "LoopExtension", "LoopsMixin"]

#: How the error of a run paused by an exhausted loop starts (``FailureKind.LOOP``).
LOOP_ERROR_PREFIX = "LOOP: "
#: Statuses extend-loop changes (a finished run has no loop left to extend).
EXTENDABLE = ("QUEUED", "RUNNING", "WAITING", "PAUSED")


@dataclass(frozen=True, slots=True)
class LoopExtension:
    """What :meth:`LoopsMixin.job_extend_loop` found and did.

    :ivar changed: the extension was stored.
    :ivar status: the run's status after the call (None: no such run).
    :ivar total: the loop's extension after the call (re-runs added in all).
    :ivar requeued: the run was PAUSED by this loop's exhaustion and is QUEUED now.
    :ivar refusal: why nothing changed (``status``, ``cap`` or ``pending-request``).
    """

    changed: bool
    status: str | None
    total: int = 0
    requeued: bool = False
    refusal: str = ""


def _extensions(text: Any) -> dict[str, int]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


class LoopsMixin(db.Database):
    """``JobStore``'s bounded-loop writes and read."""

    @db.translated
    def job_loop_extensions(self, job_id: uuid.UUID | str) -> dict[str, int]:
        """The re-runs ``extend-loop`` added to the run's loops (``{loop step: n}``; empty
        when none or no such run). One statement."""
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            row = db.one(conn, "job_loop_extensions", {"job_id": key})
        return _extensions(row["loop_extensions"]) if row is not None else {}

    @db.translated
    def job_extend_loop(
        self,
        job_id: uuid.UUID | str,
        step: str,
        by: int,
        *,
        cap: int,
        declared: int,
        actor: str,
        reason: str | None = None,
    ) -> LoopExtension:
        """Raise loop ``step``'s bound for one run by ``by`` re-runs, up to ``cap`` in all.

        Transaction: one, under the run's row lock (``job_loop_lock``), so a cancel, a pause or
        another extend-loop is seen whole: the run ends in one state and the answer says which.
        A RUNNING run with a pending cancel or pause request is refused (``pending-request``):
        its worker is about to stop. A run PAUSED with a ``LOOP:`` error naming ``step`` is
        requeued (QUEUED now, attempt 0, the error cleared, NOTIFY).

        :param declared: the definition's ``loop.max`` (the cap bounds ``declared + total``).
        :param cap: the node's ``jobs.loop_extend_cap``: most iterations a loop may reach.
        :returns: a :class:`LoopExtension`.
        :raises NotFound: for an unknown job id.
        :raises ValueError: a malformed id, a blank step or actor, ``by`` below 1.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        checks.text("actor", actor)
        if isinstance(by, bool) or not isinstance(by, int) or by < 1:
            raise ValueError("by: must be a whole number >= 1")
        step = scrub_text(step)
        with self._connection() as conn, conn.transaction():
            row = db.one(conn, "job_loop_lock", {"job_id": key})
            if row is None:
                raise NotFound(f"workflow run not found: {key}")
            status = str(row["status"])
            current = _extensions(row["loop_extensions"]).get(step, 0)
            if status not in EXTENDABLE:
                return LoopExtension(False, status, current, refusal="status")
            if declared + current + by > cap:
                return LoopExtension(False, status, current, refusal="cap")
            if status == "RUNNING":
                pending = db.one(conn, "job_get", {"job_id": key})
                if pending is not None and pending["control"]:
                    return LoopExtension(False, status, current, refusal="pending-request")
            error = str(row["error"] or "")
            requeue = status == "PAUSED" and error.startswith(LOOP_ERROR_PREFIX + f"loop '{step}'")
            changed = db.one(
                conn,
                "job_control_extend_loop",
                {
                    "job_id": key,
                    "step": step,
                    "total": current + by,
                    "requeue": requeue,
                    "actor": scrub_text(actor),
                    "reason": scrub_text(f"by {by}" + (f": {reason}" if reason else "")),
                },
            )
            assert changed is not None  # the row is locked
            if requeue:
                self._outbox_txn(conn, changed, EventType.TYPE_RESUMED, step=step, error="")
                db.execute(conn, "job_notify", {})
        return LoopExtension(True, str(changed["status"]), current + by, requeued=requeue)
