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

Repeats are bounded: once the same refusal (same principal, same reason) is
:data:`DENIED_BURST` times among the run's last 64 rows within :data:`DENIED_REPEAT_S` seconds
(database time), further repeats are not appended (the statement says ``repeated`` and the log
records each), so a token hammering a run grows its history by at most ten rows per verb and
minute, not one row per call. Every refusal short of that is its own row.

:class:`AuditMixin` is one of :class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

import logging
import uuid

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["DENIED_BURST", "DENIED_KIND", "DENIED_REPEAT_S", "AuditMixin"]

log = logging.getLogger("protomolt_jobs.store")

#: The transition kind of a refused call.
DENIED_KIND = "denied"

#: Seconds, and the number of rows of the same refusal by the same principal within them,
#: after which a repeat is not recorded again.
DENIED_REPEAT_S = 60.0
DENIED_BURST = 10


class AuditMixin(db.Database):
    """``JobStore``'s audit records (refused calls in a run's transition log)."""

    @db.translated
    def transition_record_denied(
        self,
        job_id: uuid.UUID | str,
        *,
        actor: str,
        reason: str,
        repeat_s: float = DENIED_REPEAT_S,
    ) -> bool:
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
        :param repeat_s: the window, seconds (>= 0; 0 records every call): a refusal already
            :data:`DENIED_BURST` times in the log within it is not appended again.
        :returns: True when the refusal is in the run's history (appended now, or the same
            one is there often enough within ``repeat_s``), False when no run has that id.
        :raises ValueError: ``job_id`` is not a UUID, or ``actor`` or ``reason`` is blank.
        :raises StoreUnavailable: the database cannot be reached, or the connection broke.
        :raises StoreError: any other database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("actor", actor)
        checks.text("reason", reason)
        if not repeat_s >= 0:
            raise ValueError(f"repeat_s: must be >= 0 seconds; got {repeat_s!r}")
        params = {
            "job_id": key,
            "actor": scrub_text(actor),
            "reason": scrub_text(reason),
            "repeat_s": float(repeat_s),
            "repeat_burst": DENIED_BURST,
        }
        with self._connection() as conn:
            row = db.one(conn, "transition_record_denied", params)
        if row is None:
            return False
        if row["repeated"]:
            log.info(
                "a repeated refusal to %s in job %s was not recorded again",
                actor,
                key,
                extra={
                    "action": "transition_denied_repeated",
                    "job_id": str(key),
                    "principal": actor,
                },
            )
            return True
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
