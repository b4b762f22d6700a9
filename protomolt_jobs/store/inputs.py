"""Input ownership: the input park and ``supply-input`` under the run's row lock (migration
0028; docs/explain.md).

- :meth:`InputsMixin.job_park_input` (the worker's settling write): WAITING on the step with
  ``wait_kind = 'input'``, the transition's reason and the WAITING event's verdict naming the
  missing paths and their owners; one fenced statement.
- :meth:`InputsMixin.job_supply_input`: one transaction under the row lock (``job_lock``, the
  lock ``cancel-job`` takes too, so a supply and a cancel are serialised: the run ends in
  exactly one state and each answer says which). A run WAITING for input gets its input
  patched, a ``workflow_input_revision`` row (who, path, old and new SHA-256) and is QUEUED
  with a ``supply-input`` transition and a REQUEUED event (with NOTIFY); any other run is
  left as it is and the outcome names its status.
- :meth:`InputsMixin.input_revisions`: the revisions, oldest first.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.errors import NotFound, StoreError
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.records import JobRecord, Lease
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["InputPatch", "InputRevision", "InputsMixin", "SupplyOutcome", "value_sha256"]

#: ``workflow_run.wait_kind`` of a run parked for a missing input.
INPUT_WAIT = "input"

#: ``(stored input) -> (new input, old value or None when absent, new value)``: applied under
#: the row lock to the input the row holds then; raises ``ValueError`` when it cannot apply.
InputPatch = Callable[[dict[str, Any]], tuple[dict[str, Any], Any, Any]]


def value_sha256(value: Any) -> str:
    """SHA-256 (hex) of ``value``'s canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class SupplyOutcome:
    """What one ``supply-input`` did.

    :ivar supplied: the input was patched and the run QUEUED.
    :ivar status: the run's status after the call (QUEUED when supplied, else the status that
        refused it: CANCELLED after a cancel won the race, QUEUED, RUNNING, ...).
    :ivar step: the step the run waited on (supplied), or its ``outstanding_step``.
    :ivar wait_kind: the run's ``wait_kind`` when refused.
    :ivar revision: the revision's ``seq`` (supplied).
    :ivar old_sha256: SHA-256 of the value replaced (None: the path was absent).
    :ivar new_sha256: SHA-256 of the value supplied.
    """

    supplied: bool
    status: str
    step: str | None = None
    wait_kind: str | None = None
    revision: int | None = None
    old_sha256: str | None = None
    new_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class InputRevision:
    """One ``workflow_input_revision`` row."""

    seq: int
    path: str
    old_sha256: str | None
    new_sha256: str
    old_value: Any
    new_value: Any
    actor: str
    reason: str | None
    step: str | None
    at: Any

    def to_json(self) -> dict[str, Any]:
        """``{seq, path, oldSha256, newSha256, actor, reason?, step?, at}``."""
        body: dict[str, Any] = {
            "seq": self.seq,
            "path": self.path,
            "oldSha256": self.old_sha256,
            "newSha256": self.new_sha256,
            "actor": self.actor,
        }
        if self.reason:
            body["reason"] = self.reason
        if self.step:
            body["step"] = self.step
        body["at"] = self.at.isoformat() if hasattr(self.at, "isoformat") else str(self.at)
        return body


class InputsMixin(db.Database):
    """``JobStore``'s input park, ``supply-input`` and the revisions' read."""

    @db.translated
    def job_park_input(self, lease: Lease, step: str, reason: str) -> str:
        """Park the job on ``step`` waiting for input, with its WAITING event.

        SQL: ``job_park_input``, fenced, one statement (autocommit).

        :param reason: the missing paths and their owners (the transition's reason and the
            event's verdict).
        :returns: the status the row ends in (WAITING; CANCELLED or PAUSED when the trigger
            applied a pending request).
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank step.
        :raises StoreError: on a database failure.
        """
        checks.text("step", step)
        params = {"step": scrub_text(step), "reason": scrub_text(reason or "waiting for input")}
        with self._connection() as conn:
            row = db.fenced(conn, "job_park_input", lease, params)
        return str(row["status"])

    @db.translated
    def job_supply_input(
        self,
        job_id: uuid.UUID | str,
        path: str,
        patch: InputPatch,
        *,
        actor: str,
        reason: str | None,
    ) -> SupplyOutcome:
        """Supply ``path`` of a run waiting for input (the module docstring).

        Transaction: one, under the run's row lock (``job_lock``), then ``job_supply_input``
        and the REQUEUED event with NOTIFY.

        :param patch: builds the new input from the stored one (:data:`InputPatch`).
        :returns: a :class:`SupplyOutcome` (``supplied`` False names the refusing status).
        :raises NotFound: for an unknown job id.
        :raises ValueError: for a malformed id, a blank path or actor, or from ``patch``.
        :raises StoreError: on a database failure or an unreadable stored input.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("path", path)
        checks.text("actor", actor)
        with self._connection() as conn, conn.transaction():
            row = db.one(conn, "job_lock", {"job_id": key})
            if row is None:
                raise NotFound(f"workflow run not found: {key}")
            record = JobRecord.from_row(row)
            if record.status != "WAITING" or record.wait_kind != INPUT_WAIT:
                return SupplyOutcome(
                    False, record.status, record.outstanding_step, record.wait_kind
                )
            if record.input is None:
                raise StoreError(f"stored input of job {key} is unreadable: {record.unreadable}")
            new_input, old_value, new_value = patch(dict(record.input))
            old_sha = None if old_value is None else value_sha256(old_value)
            new_sha = value_sha256(new_value)
            text = reason or ""
            moved = db.one(
                conn,
                "job_supply_input",
                {
                    "job_id": key,
                    "input": checks.jsonb("input", new_input, dict),
                    "actor": scrub_text(actor),
                    "reason": scrub_text(f"{path}: {text}" if text else path),
                    "note": scrub_text(text) if text else None,
                    "step": record.outstanding_step,
                    "path": scrub_text(path),
                    "old_sha256": old_sha,
                    "new_sha256": new_sha,
                    "old_value": None if old_value is None else json.dumps(old_value),
                    "new_value": json.dumps(new_value),
                },
            )
            if moved is None:  # pragma: no cover - the row lock makes the gate hold
                raise StoreError(f"job {key} changed under its row lock")
            self._outbox_txn(
                conn, moved, EventType.TYPE_REQUEUED, verdict="supply-input", notify=True
            )
        return SupplyOutcome(
            True,
            str(moved["status"]),
            record.outstanding_step,
            None,
            int(moved["revision"]),
            old_sha,
            new_sha,
        )

    @db.translated
    def input_revisions(self, job_id: uuid.UUID | str) -> list[InputRevision]:
        """A run's ``supply-input`` revisions, oldest first (one statement, no lock).

        :raises ValueError: for a malformed id.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            rows = db.rows(conn, "input_revisions", {"job_id": key})
        return [
            InputRevision(
                int(r["seq"]),
                str(r["path"]),
                r["old_sha256"],
                str(r["new_sha256"]),
                json.loads(r["old_value"]) if r["old_value"] is not None else None,
                json.loads(r["new_value"]),
                str(r["actor"]),
                r["reason"],
                r["step"],
                r["at"],
            )
            for r in rows
        ]
