"""Reads of the job row and its transition log: one job, a page of jobs, status columns, the
checked history, the ``/metrics`` counts. Each is one read-only statement; JSON columns are
decoded after it (:meth:`~.records.JobRecord.from_row` never raises)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from protomolt_jobs.store import checks, db
from protomolt_jobs.store.records import JOB_STATUSES, History, JobRecord, Transition

__all__ = ["ID_PREFIX", "LIST_LIMIT_DEFAULT", "LIST_LIMIT_MAX", "ReadsMixin"]

#: ``job_list`` page size when the caller asks for 0.
LIST_LIMIT_DEFAULT = 50
#: ``job_list`` page size ceiling.
LIST_LIMIT_MAX = 500
#: ``job_list``'s ``id_prefix``: the first 4 to 32 hex digits of an id (dashes left out).
ID_PREFIX = re.compile(r"[0-9a-fA-F]{4,32}")


class ReadsMixin(db.Database):
    """``JobStore``'s reads of jobs and their history."""

    @db.translated
    @db.read_retried_once
    def job_get(self, job_id: uuid.UUID | str) -> JobRecord | None:
        """One job's full row.

        SQL: ``SELECT ... FROM workflow_run WHERE job_id = %(job_id)s``. Transaction: one,
        read only; JSON is decoded after it.

        :returns: the row, or None for an unknown id. A row whose stored JSON does not decode
            is returned with ``unreadable`` set and the bad column None (never an exception);
            callers report it as ``job-corrupt``.
        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            row = db.one(conn, "job_get", {"job_id": key})
        return JobRecord.from_row(row) if row else None

    @db.translated
    @db.read_retried_once
    def job_list(
        self,
        status: str | None = None,
        workflow_name: str | None = None,
        limit: int = LIST_LIMIT_DEFAULT,
        offset: int = 0,
        *,
        queue: str | None = None,
        fairness_key: str | None = None,
        id_prefix: str | None = None,
    ) -> list[JobRecord]:
        """Jobs newest first (``created_at DESC, job_id DESC``), optionally filtered.

        SQL: ``SELECT ... WHERE status/workflow_name match (None = any) LIMIT OFFSET``.
        Transaction: one, read only. ``limit`` 0 means 50; above 500 it is clamped to 500.
        A row whose stored JSON does not decode is listed with ``unreadable`` set (see
        :class:`JobRecord`); one bad row never fails the page.

        :param status: one of the six statuses, or None.
        :param workflow_name: exact name, or None.
        :param queue: exact queue, or None.
        :param fairness_key: exact fairness key, or None.
        :param id_prefix: the first 4 to 32 hex digits of the id (dashes left out, any case),
            or None: the ids between the prefix padded with ``0`` and with ``f``.
        :param limit: page size, >= 0.
        :param offset: rows to skip, >= 0.
        :raises ValueError: for an unknown status, a malformed ``id_prefix``, or a negative
            limit or offset.
        :raises StoreError: on a database failure.
        """
        if status is not None and status not in JOB_STATUSES:
            raise ValueError(
                f"status: must be one of {', '.join(sorted(JOB_STATUSES))}; got {status!r}"
            )
        checks.non_negative_int("limit", limit)
        checks.non_negative_int("offset", offset)
        effective = LIST_LIMIT_DEFAULT if limit == 0 else min(limit, LIST_LIMIT_MAX)
        id_low = id_high = None
        if id_prefix is not None:
            if not ID_PREFIX.fullmatch(id_prefix):
                raise ValueError(f"id_prefix: must be 4 to 32 hex digits; got {id_prefix!r}")
            id_low = uuid.UUID(id_prefix.lower().ljust(32, "0"))
            id_high = uuid.UUID(id_prefix.lower().ljust(32, "f"))
        params = {
            "id_low": id_low,
            "id_high": id_high,
            "status": status,
            "workflow_name": workflow_name,
            "queue": queue,
            "fairness_key": fairness_key,
            "limit": effective,
            "offset": offset,
        }
        with self._connection() as conn:
            rows = db.rows(conn, "job_list", params)
        return [JobRecord.from_row(r) for r in rows]

    @db.translated
    @db.read_retried_once
    def job_replay_runs(
        self, workflow_name: str, statuses: list[str], limit: int
    ) -> list[JobRecord]:
        """The runs of ``workflow_name`` in ``statuses``, newest first, at most ``limit``
        (``replay-check``).

        SQL: ``job_replay_runs``. Transaction: one, read only. A row whose stored JSON does not
        decode comes back with ``unreadable`` set.

        :raises ValueError: an unknown status, a blank name, or a limit below 1.
        :raises StoreError: on a database failure.
        """
        checks.text("workflow_name", workflow_name)
        checks.positive_int("limit", limit)
        for status in statuses:
            if status not in JOB_STATUSES:
                raise ValueError(f"statuses: {status!r} is not a job status")
        params = {"workflow_name": workflow_name, "statuses": list(statuses), "limit": limit}
        with self._connection() as conn:
            rows = db.rows(conn, "job_replay_runs", params)
        return [JobRecord.from_row(r) for r in rows]

    @db.translated
    def job_statuses(self, job_ids: list[uuid.UUID | str]) -> list[dict[str, Any]]:
        """The status columns of ``job_ids`` (absent ids are left out), for progress displays.

        SQL: ``job_statuses`` (``WHERE job_id = ANY(...)``, the primary key). Transaction: one,
        read only. No definition, input, checkpoints or result are read.

        :returns: rows with ``job_id, workflow_name, status, attempt, outstanding_step, error,
            created_at, updated_at, completed_at``.
        :raises ValueError: an id is not a UUID.
        :raises StoreError: on a database failure.
        """
        keys = [checks.uuid("job_id", j) for j in job_ids]
        with self._connection() as conn:
            return db.rows(conn, "job_statuses", {"job_ids": keys})

    @db.translated
    def job_history(self, job_id: uuid.UUID | str) -> History | None:
        """A job's transition log, oldest first, with its hash chain checked.

        SQL: ``job_history`` (one statement, so one snapshot) reads the row's head and the log,
        recomputing each row's hash from the previous *stored* hash and its own fields
        (``workflow_run_transition_hash``) and checking the sequence has no gap; the last
        hash must be the row's ``history_head`` and the count its ``history_seq`` (a deleted
        tail is caught). Transaction: one, read only.

        :returns: the history (``first_bad_seq`` None when intact), or None for an unknown job.
        :raises ValueError: when ``job_id`` is not a UUID.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            found = db.rows(conn, "job_history", {"job_id": key})
        if not found:
            return None
        head = found[0]
        rows = [r for r in found if r["seq"] is not None]
        first_bad: int | None = None
        for row in rows:
            if not (row["hash_ok"] and row["seq_ok"]):
                first_bad = int(row["seq"])
                break
        if first_bad is None:
            count = len(rows)
            if count < head["history_seq"]:
                first_bad = count + 1
            elif rows and bytes(rows[-1]["hash"]) != bytes(head["history_head"] or b""):
                first_bad = int(rows[-1]["seq"])
        transitions = tuple(
            Transition(
                seq=int(r["seq"]),
                prev_status=r["prev_status"],
                new_status=r["new_status"],
                kind=r["kind"],
                actor=r["actor"],
                reason=r["reason"],
                attempt=int(r["attempt"]),
                step=r["step"],
                at=r["at"],
            )
            for r in rows
        )
        return History(transitions, first_bad)

    @db.translated
    def job_budget_cost_pauses(self, job_id: uuid.UUID | str) -> int:
        """How many times the run was paused by ``budget.maxCost`` (each resume after such a
        pause grants one more ``maxCost``). Transaction: none (one read).

        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            row = db.one(conn, "job_budget_cost_pauses", {"job_id": key})
        return int(row["pauses"]) if row is not None else 0

    @db.translated
    def queue_cap(self, queue: str) -> dict[str, Any] | None:
        """A queue's fleet-wide limits and its RUNNING runs now: ``{max_running,
        max_starts_per_second, next_start_at, running}``, or None when the queue has no limit
        (explain-job asks for a QUEUED run that is due). Transaction: none (one read).

        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            row = db.one(conn, "queue_cap", {"queue": queue})
        return dict(row) if row is not None else None

    @db.translated
    @db.read_retried_once
    def metrics_counts(self) -> tuple[dict[tuple[str, str], int], int]:
        """Runs per status and queue, and the number of PENDING outbox rows (``/metrics``).

        SQL: ``metrics_run_counts`` (two counts, one statement). Transaction: one, read only.

        :returns: ``({(status, queue): runs}, outbox_pending)``; pairs without runs are absent.
        :raises StoreError: on a database failure.
        """
        with self._connection() as conn:
            rows = db.rows(conn, "metrics_run_counts", {})
        runs = {(r["status"], r["queue"]): int(r["n"]) for r in rows if r["kind"] == "run"}
        pending = sum(int(r["n"]) for r in rows if r["kind"] == "outbox")
        return runs, pending
