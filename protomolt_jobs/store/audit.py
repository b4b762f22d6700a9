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

:class:`TransitionAudit` is a mixin of :class:`~protomolt_jobs.store.store.JobStore`; it uses
only the store's ``_connection()``.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from protomolt_jobs.errors import StoreError, StoreUnavailable
from protomolt_jobs.store.queries import QUERIES
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["DENIED_KIND", "TransitionAudit"]

log = logging.getLogger("protomolt_jobs.store")

#: The transition kind of a refused call.
DENIED_KIND = "denied"


class TransitionAudit:
    """Mixin: :meth:`transition_record_denied` over the host class's ``_connection()``."""

    if TYPE_CHECKING:

        def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

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
        key = _uuid(job_id)
        for field, value in (("actor", actor), ("reason", reason)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{field}: must be a non-blank string; got {value!r}")
        params = {"job_id": key, "actor": scrub_text(actor), "reason": scrub_text(reason)}
        try:
            with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                cur.execute(QUERIES["transition_record_denied"], params)
                row = cur.fetchone()
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                "the jobs database failed during transition_record_denied: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(
                f"transition_record_denied failed: {type(exc).__name__}: {exc}"
            ) from exc
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


def _uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValueError(f"job_id: must be a UUID; got {value!r}")
