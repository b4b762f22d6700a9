"""Audit: refusals recorded in a run's hash-chained transition log.

A call the host refuses for want of a scope (DESIGN.md section 19: no silent paths) is, when it
names a run, one more row of that run's transition log: kind ``denied``, the run's status as
both the previous and the new status, actor the refused principal, reason naming the verb and
the scope. The row is chained like every other (``workflow_run_transition_hash`` over the
previous row's hash), so ``job-history`` shows it and checks it.

The write is one statement (``transition_record_denied`` in ``queries.sql``) that locks the
run's row, appends the transition and moves the row's head (``history_seq``,
``history_head``). It names no change (``change_kind`` stays NULL), so migration 0002's trigger
records nothing more and never treats it as a worker's boundary write: a cancel or pause
request waiting in ``control`` stays for the worker, and the status never changes.

:class:`AuditMixin` is one of :class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

import logging
import uuid

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["DENIED_KIND", "AuditMixin"]

log = logging.getLogger("protomolt_jobs.store")

#: The transition kind of a refused call.
DENIED_KIND = "denied"


class AuditMixin(db.Database):
    """``JobStore``'s audit records (refused calls in a run's transition log)."""

    @db.translated
    def transition_record_denied(self, job_id: uuid.UUID | str, *, actor: str, reason: str) -> bool:
        """Record a refused call in the run's transition log (kind ``denied``).

        SQL: one statement (``transition_record_denied``): lock the run's row, append the
        transition (status unchanged, the run's attempt, no step, the database's time,
        chained hash) and move the row's ``history_seq`` and ``history_head``. Transaction:
        the one statement.

        NUL and lone surrogates in ``actor`` and ``reason`` are stored as U+FFFD.

        :param job_id: the run the refused call named.
        :param actor: the refused principal (non-blank).
        :param reason: what was refused (``permission-denied: cancel-job needs scope
            'job-control'``; non-blank).
        :returns: True when recorded, False when no run has that id.
        :raises ValueError: ``job_id`` is not a UUID, or ``actor`` or ``reason`` is blank.
        :raises StoreUnavailable: the database cannot be reached, or the connection broke.
        :raises StoreError: any other database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("actor", actor)
        checks.text("reason", reason)
        params = {"job_id": key, "actor": scrub_text(actor), "reason": scrub_text(reason)}
        with self._connection() as conn:
            row = db.one(conn, "transition_record_denied", params)
        if row is None:
            return False
        log.info(
            "recorded a refusal to %s in job %s's history",
            actor,
            key,
            extra={
                "action": "transition_denied_recorded",
                "job_id": str(key),
                "principal": actor,
                "seq": row["history_seq"],
            },
        )
        return True
