"""The rows that arrive through the store's doors: a submitted job (``job_insert``, with its
event and the workers' wake-up) and a request-topic record that could not be read
(``reject_insert``)."""

from __future__ import annotations

from typing import Any

from protomolt_jobs.errors import NotFound, StoreError
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.records import InsertOutcome, JobRecord, NewJob
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["PRIORITIES", "InsertsMixin"]

#: Valid priorities (1 highest).
PRIORITIES = frozenset({1, 2, 3, 4, 5})
#: Inserts tried when a dedup key's live holder ends between the conflict and the read.
_DEDUP_TRIES = 5


def _retention(retention: Any) -> Any:
    """``NewJob.retention`` as the ``retention`` column's JSONB (None stays NULL).

    :raises ValueError: a status that is not a final one, or seconds that are not above 0.
    """
    if retention is None:
        return None
    for status, seconds in dict(retention).items():
        if status not in ("COMPLETED", "FAILED", "DEAD", "CANCELLED"):
            raise ValueError(f"retention: {status!r} is not a final status")
        checks.positive_seconds(f"retention.{status}", seconds)
    return checks.jsonb("retention", {k: float(v) for k, v in retention.items()}, dict)


class InsertsMixin(db.Database):
    """``JobStore``'s inserts: a job, and a request-topic reject."""

    @db.translated
    def job_insert(self, new: NewJob) -> InsertOutcome:
        """Insert a job idempotently on ``job_id``, with its event, and wake workers.

        SQL: one statement (``job_insert``): ``INSERT ... ON CONFLICT (job_id) DO NOTHING`` and,
        when a row was created, its outbox row (ACCEPTED, attempt 0, ``detail.status`` QUEUED;
        or FAILED with the error for a job failed at birth) and ``NOTIFY protomolt_jobs``
        (QUEUED only), returning the stored row (without its definition and input: the record
        takes those from ``new``, see ``:returns:``). A resubmission changes nothing and
        returns the existing row untouched (read by a second statement).

        Transaction: the one statement (autocommit); a conflict's reads are their own.

        NUL and lone surrogates in ``workflow_name``, ``error`` and the JSON values are stored
        as U+FFFD (see :mod:`~.scrub`).

        :returns: the stored row and whether this call created it (``unreadable`` set when an
            existing row's JSON does not decode). A created row's ``workflow_definition`` and
            ``input`` are not read back: they are the values this call stored (equal to a read
            of them; the caller's own objects when they needed no scrub and decode back to
            themselves, see :func:`~.checks.jsonb_value`).
        :raises ValueError: on a malformed ``new`` (the message names the field).
        :raises TypeError: when ``workflow_definition`` or ``input`` is not a JSON object.
        :raises StoreError: on a database failure.
        """
        job_id = checks.uuid("job_id", new.job_id)
        if new.status not in ("QUEUED", "FAILED"):
            raise ValueError(f"status: a new job is QUEUED or FAILED; got {new.status!r}")
        if new.status == "FAILED" and not new.error:
            raise ValueError("error: a job failed at birth must say why")
        checks.text("workflow_name", new.workflow_name)
        checks.positive_int("max_attempts", new.max_attempts)
        if isinstance(new.priority, bool) or new.priority not in PRIORITIES:
            raise ValueError(f"priority: must be an integer 1..5; got {new.priority!r}")
        checks.text("queue", new.queue)
        checks.text("fairness_key", new.fairness_key)
        checks.positive_seconds("fairness_weight", new.fairness_weight)
        if new.dedup_key is not None:
            checks.text("dedup_key", new.dedup_key)
        if new.deadline_s is not None:
            checks.positive_seconds("deadline_s", new.deadline_s)
        error = scrub_text(new.error)
        params = {
            "job_id": job_id,
            "workflow_name": scrub_text(new.workflow_name),
            "workflow_definition": checks.jsonb(
                "workflow_definition", new.workflow_definition, dict
            ),
            "input": checks.jsonb("input", new.input, dict),
            "status": new.status,
            "max_attempts": new.max_attempts,
            "error": error,
            "trace_context": new.trace_context,
            "priority": new.priority,
            "queue": scrub_text(new.queue),
            "fairness_key": scrub_text(new.fairness_key),
            "stride": 1.0 / float(new.fairness_weight),
            # A failed-at-birth row never holds its key (it is terminal already).
            "dedup_key": scrub_text(new.dedup_key) if new.status == "QUEUED" else None,
            "deadline_s": float(new.deadline_s) if new.deadline_s is not None else None,
            "actor": scrub_text(new.actor or "api"),
            "groups": sorted({scrub_text(g) for g in new.groups}) or None,
            "retention": _retention(new.retention),
        }
        existing: dict[str, Any] | None = None
        deduplicated = False
        with self._connection() as conn:
            # Autocommit: the insert, its event and the NOTIFY are one statement (job_insert);
            # the reads after a conflict are statements of their own (each its own snapshot,
            # as they were in one READ COMMITTED transaction).
            # The dedup holder may end between our conflict and our read: then the key is free
            # and the insert is tried again (a holder cannot end more than once per attempt).
            for _ in range(_DEDUP_TRIES):
                row = db.one(conn, "job_insert", params)
                if row is not None:
                    break
                existing = db.one(conn, "job_get", {"job_id": job_id})
                if existing is not None:
                    break
                if params["dedup_key"] is not None:
                    existing = db.one(
                        conn, "job_get_live_dedup", {"dedup_key": params["dedup_key"]}
                    )
                    if existing is not None:
                        deduplicated = True
                        break
                    continue
                raise NotFound(f"workflow run not found: {job_id}")
            else:
                raise StoreError(
                    f"dedup key {new.dedup_key!r} kept changing hands; insert not settled"
                )
        if existing is not None:
            return InsertOutcome(
                JobRecord.from_row(existing), created=False, deduplicated=deduplicated
            )
        assert row is not None
        # The statement does not send the two documents back (a 28 KB definition cost its
        # transfer and a json.loads per submit): the record carries what this call stored.
        row["workflow_definition"] = checks.jsonb_value(params["workflow_definition"])
        row["input"] = checks.jsonb_value(params["input"])
        return InsertOutcome(JobRecord.from_row(row), created=True)

    @db.translated
    def reject_insert(
        self, raw: bytes | None, topic: str, partition: int, offset: int, reason: str
    ) -> int:
        """Keep a request-topic record that could not be decoded or validated.

        SQL: ``INSERT INTO workflow_run_rejects (topic, partition, offset, raw, reason)``
        (``received_at`` = now()). Transaction: one.

        :param raw: the record value as received (None for a tombstone).
        :returns: the reject's id.
        :raises ValueError: for a blank topic or reason.
        :raises StoreError: on a database failure.
        """
        checks.text("topic", topic)
        checks.text("reason", reason)
        params = {
            "topic": scrub_text(topic),
            "partition": int(partition),
            "offset": int(offset),
            "raw": bytes(raw) if raw is not None else None,
            "reason": scrub_text(reason),
        }
        with self._connection() as conn:
            row = db.one(conn, "reject_insert", params)
        assert row is not None
        return int(row["id"])
