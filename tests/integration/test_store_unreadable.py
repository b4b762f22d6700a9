"""A row whose stored JSON cannot be decoded never blocks claims and never raises from reads."""

from __future__ import annotations

import psycopg
import pytest

from protomolt_jobs.errors import StoreError
from protomolt_jobs.store import JobStore
from tests.support.factories import parked_job, queued_job


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def q(dsn: str, sql: str, params: dict | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def deep_object_text(depth: int) -> str:
    """JSON PostgreSQL accepts but Python's decoder refuses (its recursion limit)."""
    return '{"a":' * depth + "1" + "}" * depth


def corrupt(dsn: str, job_id, column: str, json_text: str) -> None:
    q(
        dsn,
        f"UPDATE workflow_run SET {column} = %(v)s::jsonb WHERE job_id = %(id)s",
        {"v": json_text, "id": job_id},
    )


def test_a_deeply_nested_input_is_claimed_with_unreadable_set_and_does_not_block_the_queue(
    store, fresh_dsn
):
    bad = queued_job(store)
    corrupt(fresh_dsn, bad.job_id, "input", deep_object_text(3000))
    newer = queued_job(store)

    claimed = store.job_claim("w", 60)
    assert claimed is not None and claimed.job_id == bad.job_id
    assert claimed.status == "RUNNING" and claimed.attempt == 1
    assert claimed.input is None
    assert claimed.unreadable is not None
    assert claimed.unreadable.startswith("input: RecursionError")
    assert claimed.workflow_definition == bad.workflow_definition  # the rest is readable
    # the claim committed: the worker can fail the row under its lease
    store.job_fail(
        claimed.lease, f"WORKFLOW: stored row is not readable JSON: {claimed.unreadable}"
    )
    assert store.job_get(bad.job_id).status == "FAILED"

    following = store.job_claim("w", 60)
    assert following is not None and following.job_id == newer.job_id
    assert following.unreadable is None and following.input == newer.input


def test_get_and_list_return_the_unreadable_row_instead_of_raising(store, fresh_dsn):
    bad = queued_job(store)
    corrupt(fresh_dsn, bad.job_id, "workflow_definition", deep_object_text(3000))
    good = queued_job(store)

    got = store.job_get(bad.job_id)
    assert got.workflow_definition is None
    assert got.unreadable.startswith("workflow_definition: RecursionError")
    listed = {r.job_id: r for r in store.job_list()}
    assert listed[bad.job_id].unreadable == got.unreadable
    assert listed[good.job_id].unreadable is None


def test_json_of_the_wrong_shape_is_unreadable_and_names_every_bad_column(store, fresh_dsn):
    job = queued_job(store)
    corrupt(fresh_dsn, job.job_id, "input", "[1, 2]")
    corrupt(fresh_dsn, job.job_id, "checkpoints", '{"not": "an array"}')
    got = store.job_get(job.job_id)
    assert (got.input, got.checkpoints) == (None, None)
    assert got.unreadable == (
        "input: not a JSON object (found list); checkpoints: not a JSON array (found dict)"
    )


def test_a_parked_completion_on_unreadable_checkpoints_is_a_store_error(store, fresh_dsn):
    job = parked_job(store)
    corrupt(fresh_dsn, job.job_id, "checkpoints", "[" + deep_object_text(3000) + "]")
    with pytest.raises(StoreError, match="checkpoints of job .* are unreadable: checkpoints: "):
        store.job_complete_parked(job.job_id, "approve", {"name": "approve", "skipped": False})
    assert store.job_get(job.job_id).status == "WAITING"
