"""Factories that reach job states through the real store (never by writing rows directly).

Each takes a :class:`~protomolt_jobs.store.JobStore` and keyword overrides, and returns the
job's :class:`~protomolt_jobs.store.JobRecord` in the requested state. The workflow definition
is a minimal dict: the store does not parse definitions.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from protomolt_jobs.store import JobRecord, JobStore, NewJob

__all__ = [
    "claimed_job",
    "dead_job",
    "failed_job",
    "minimal_definition",
    "new_job",
    "parked_job",
    "queued_job",
]

_names = itertools.count()


def minimal_definition(name: str = "test-workflow") -> dict[str, Any]:
    """A small workflow envelope the store keeps verbatim (it is never parsed here)."""
    return {
        "name": name,
        "inputType": "test.v1.Input",
        "steps": [
            {"name": "first", "target": "inprocess:test", "method": "test.v1.Svc/First"},
            {
                "name": "approve",
                "target": "inprocess:test",
                "method": "test.v1.Svc/Approve",
                "completion": "external",
            },
        ],
    }


def new_job(**kw: Any) -> NewJob:
    """A :class:`NewJob` with fresh defaults; any field can be overridden."""
    name = kw.pop("workflow_name", f"wf-{next(_names)}")
    values: dict[str, Any] = {
        "job_id": uuid.uuid4(),
        "workflow_name": name,
        "workflow_definition": minimal_definition(name),
        "input": {"text": "hello"},
        "max_attempts": 3,
    }
    values.update(kw)
    return NewJob(**values)


def queued_job(store: JobStore, **kw: Any) -> JobRecord:
    """Insert a QUEUED job (with its ACCEPTED event)."""
    outcome = store.job_insert(new_job(**kw))
    assert outcome.created, "queued_job: the job id already existed"
    return outcome.job


def claimed_job(
    store: JobStore, *, worker_id: str = "worker-a", lease_s: float = 60.0, **kw: Any
) -> JobRecord:
    """Insert a job and claim it: RUNNING under ``worker_id``, attempt 1.

    The claim takes the oldest eligible job, so the store's queue must hold no older QUEUED job
    (the factory asserts it got the one it inserted).
    """
    job = queued_job(store, **kw)
    claimed = store.job_claim(worker_id, lease_s)
    assert claimed is not None and claimed.job_id == job.job_id, (
        "claimed_job: another QUEUED job was older than the one inserted"
    )
    return claimed


def parked_job(store: JobStore, *, step: str = "approve", **kw: Any) -> JobRecord:
    """A job WAITING on ``step`` after one checkpointed step (``first``)."""
    claimed = claimed_job(store, **kw)
    store.job_checkpoint(claimed.lease, {"name": "first", "skipped": False, "response": {}})
    store.job_park(claimed.lease, step)
    job = store.job_get(claimed.job_id)
    assert job is not None and job.status == "WAITING"
    return job


def dead_job(
    store: JobStore, *, error: str = "GRPC: gRPC UNAVAILABLE from test", **kw: Any
) -> JobRecord:
    """A DEAD job (claimed once, then dead-lettered by its owner)."""
    claimed = claimed_job(store, **kw)
    store.job_dead(claimed.lease, error)
    job = store.job_get(claimed.job_id)
    assert job is not None and job.status == "DEAD"
    return job


def failed_job(store: JobStore, *, error: str = "VALIDATION: bad", **kw: Any) -> JobRecord:
    """A FAILED job (claimed once, then failed by its owner)."""
    claimed = claimed_job(store, **kw)
    store.job_fail(claimed.lease, error, step="first")
    job = store.job_get(claimed.job_id)
    assert job is not None and job.status == "FAILED"
    return job
