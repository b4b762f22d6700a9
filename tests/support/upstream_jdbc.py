"""Upstream's JDBC statements (the Java ProtoMolt's ``JdbcWorkflowRunStore``), as the texts
reference/upstream-jobs.md sections 3.2-3.4 give them, with psycopg placeholders in place of
JDBC's ``?``. A test drives them to stand in for a Java worker sharing our tables.

Upstream's writes name only ``job_id``: no status, owner or token guard.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

UPSTREAM_V1_SQL = (Path(__file__).parent / "upstream_v1.sql").read_text()

JOB_COLUMNS = (
    "job_id, workflow_name, workflow_definition, input, input_ref, status, attempt, "
    "max_attempts, run_after, outstanding_step, checkpoints, result, result_ref, verdict, "
    "error, lease_owner, lease_until, created_at, updated_at, completed_at"
)

INSERT = (
    "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, input_ref, "
    "status, attempt, max_attempts, run_after, outstanding_step, checkpoints, result, "
    "result_ref, verdict, error, lease_owner, lease_until, completed_at) "
    "VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, "
    "%s, %s, %s, %s, %s, %s) ON CONFLICT (job_id) DO NOTHING"
)
ENQUEUE = (
    "INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key, "
    "attempts, status, created_at) VALUES (%s, %s, %s, %s, 0, 'PENDING', %s)"
)
CLAIM = (
    "UPDATE workflow_run SET status = 'RUNNING', lease_owner = %s, lease_until = %s, "
    "attempt = attempt + 1, updated_at = now() "
    "WHERE job_id = (SELECT job_id FROM workflow_run WHERE status = 'QUEUED' "
    "AND run_after <= now() ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1) "
    f"RETURNING {JOB_COLUMNS}"
)
REQUEUE_EXPIRED = (
    "UPDATE workflow_run SET status='QUEUED', lease_owner=NULL, lease_until=NULL, "
    "updated_at=now() WHERE status='RUNNING' AND lease_until IS NOT NULL AND lease_until < now()"
)
SAVE_CHECKPOINT = "UPDATE workflow_run SET checkpoints=%s::jsonb, updated_at=now() WHERE job_id=%s"
MARK_COMPLETED = (
    "UPDATE workflow_run SET status='COMPLETED', result=%s::jsonb, verdict=%s, "
    "lease_owner=NULL, lease_until=NULL, outstanding_step=NULL, completed_at=now(), "
    "updated_at=now() WHERE job_id=%s"
)
MARK_FAILED = (
    "UPDATE workflow_run SET status='FAILED', error=%s, lease_owner=NULL, lease_until=NULL, "
    "outstanding_step=NULL, completed_at=now(), updated_at=now() WHERE job_id=%s"
)
REQUEUE = (
    "UPDATE workflow_run SET status='QUEUED', run_after=%s, lease_owner=NULL, "
    "lease_until=NULL, updated_at=now() WHERE job_id=%s"
)


def now() -> datetime:
    """The app clock upstream uses for run_after, lease_until and event created_at."""
    return datetime.now(UTC)


class JavaWorker:
    """One autocommit connection running upstream's statements (a foreign session: it does
    not carry ``protomolt_jobs.session``)."""

    def __init__(self, dsn: str, worker_id: str = "java-1") -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.worker_id = worker_id

    def close(self) -> None:
        self.conn.close()

    def insert(self, workflow: dict[str, Any], input: dict[str, Any], name: str) -> str:
        """``insert(job, accepted event)`` in one transaction, as upstream's submit does."""
        from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent

        job_id = str(uuid.uuid4())
        when = now()
        with self.conn.transaction():
            cur = self.conn.execute(
                INSERT,
                (
                    job_id,
                    name,
                    json.dumps(workflow),
                    json.dumps(input),
                    None,
                    "QUEUED",
                    0,
                    3,
                    when,
                    None,
                    "[]",
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                ),
            )
            assert cur.rowcount == 1
            event = WorkflowRunEvent(
                event_id=str(uuid.uuid4()),
                job_id=job_id,
                workflow_name=name,
                type=EventType.TYPE_ACCEPTED,
                attempt=0,
            )
            event.detail.update({"status": "QUEUED"})
            event.occurred_at.FromDatetime(when)
            self.conn.execute(
                ENQUEUE, (event.event_id, "ACCEPTED", event.SerializeToString(), job_id, when)
            )
        return job_id

    def claim(self, lease: timedelta = timedelta(minutes=5)) -> dict[str, Any] | None:
        cur = self.conn.execute(CLAIM, (self.worker_id, now() + lease))
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d.name for d in cur.description], row, strict=True))

    def run(self, sql: str, *params: Any) -> int:
        """One upstream statement; the affected row count (upstream requires exactly 1)."""
        return self.conn.execute(sql, params).rowcount
