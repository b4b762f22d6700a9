"""The durable store: the job row, the claim, fenced writes, the sweep, parked completions and
the transactional outbox, on PostgreSQL (psycopg 3 + psycopg_pool).

``JobStore`` and the records are imported lazily so that the migration runner
(``protomolt_jobs.store.migrate``) stays importable on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protomolt_jobs.store.records import (
        AlreadyDone,
        InsertOutcome,
        JobRecord,
        Lease,
        NewJob,
        OutboxRow,
        ParkedCompletion,
        ParkedStepCompleted,
        SweepResult,
        WrongState,
    )
    from protomolt_jobs.store.store import JobStore

__all__ = [
    "AlreadyDone",
    "InsertOutcome",
    "JobRecord",
    "JobStore",
    "Lease",
    "NewJob",
    "OutboxRow",
    "ParkedCompletion",
    "ParkedStepCompleted",
    "SweepResult",
    "WrongState",
]


def __getattr__(name: str) -> Any:
    if name == "JobStore":
        from protomolt_jobs.store import store

        return store.JobStore
    if name in __all__:
        from protomolt_jobs.store import records

        return getattr(records, name)
    raise AttributeError(f"module 'protomolt_jobs.store' has no attribute {name!r}")
