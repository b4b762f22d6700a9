"""store/audit.py: a refused call naming a run is one more row of its hash-chained transition
log (kind ``denied``), status unchanged, never a worker's boundary write. Real PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

from protomolt_jobs.errors import ControlApplied
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.audit import DENIED_BURST, DENIED_KIND
from tests.support.factories import claimed_job, parked_job, queued_job


@pytest.fixture
def audited(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    yield s
    s.close()


REASON = "permission-denied: cancel-job needs scope 'job-control'"


def _log(store, job_id):
    history = store.job_history(job_id)
    return history, [(t.kind, t.actor, t.prev_status, t.new_status) for t in history.transitions]


def test_a_refusal_is_a_chained_denied_row_and_the_run_is_untouched(audited):
    job = parked_job(audited)
    before = audited.job_get(job.job_id)
    assert audited.transition_record_denied(job.job_id, actor="viewer-1", reason=REASON) is True
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None
    assert rows[-1] == (DENIED_KIND, "viewer-1", "WAITING", "WAITING")
    denied = history.transitions[-1]
    assert denied.reason == REASON and denied.step is None
    assert denied.attempt == before.attempt
    after = audited.job_get(job.job_id)
    assert (after.status, after.outstanding_step, after.attempt, after.updated_at) == (
        before.status,
        before.outstanding_step,
        before.attempt,
        before.updated_at,
    )
    # The chain goes on: the next real change links to the denied row.
    outcome = audited.job_cancel(job.job_id, actor="editor-1", reason="not needed")
    assert outcome.changed
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None
    assert rows[-2:] == [
        (DENIED_KIND, "viewer-1", "WAITING", "WAITING"),
        ("cancel", "editor-1", "WAITING", "CANCELLED"),
    ]
    assert [t.seq for t in history.transitions] == list(range(1, len(rows) + 1))


def test_a_refusal_on_a_running_run_leaves_its_pending_cancel_to_the_worker(audited):
    job = claimed_job(audited)
    requested = audited.job_cancel(job.job_id, actor="editor-1")
    assert requested.changed and requested.status == "RUNNING"
    assert audited.transition_record_denied(job.job_id, actor="viewer-1", reason=REASON)
    row = audited.job_get(job.job_id)
    # Not a boundary write: the request still waits in control, the lease still holds.
    assert row.status == "RUNNING" and row.control["kind"] == "cancel"
    assert row.lease_owner == job.lease.owner
    # The worker's next boundary write honours it, and the chain stays intact.
    with pytest.raises(ControlApplied):
        audited.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    assert audited.job_get(job.job_id).status == "CANCELLED"
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None
    assert [r[0] for r in rows] == ["submit", "claim", "cancel-request", DENIED_KIND, "cancel"]


def test_an_unknown_run_is_not_recorded_and_bad_arguments_are_refused(audited):
    assert audited.transition_record_denied(uuid.uuid4(), actor="viewer-1", reason=REASON) is False
    job = queued_job(audited)
    with pytest.raises(ValueError, match="job_id: must be a UUID"):
        audited.transition_record_denied("not-a-uuid", actor="viewer-1", reason=REASON)
    with pytest.raises(ValueError, match="actor"):
        audited.transition_record_denied(job.job_id, actor=" ", reason=REASON)
    with pytest.raises(ValueError, match="reason"):
        audited.transition_record_denied(job.job_id, actor="viewer-1", reason="")
    # Text no column can hold is stored as U+FFFD, and the chain still verifies.
    assert audited.transition_record_denied(job.job_id, actor="v\x00x", reason="r\ud800")
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None and rows[-1][1] == "v\ufffdx"


def test_a_hammered_refusal_is_recorded_once_per_window_and_others_still_are(audited):
    job = parked_job(audited)
    other = "permission-denied: pause-job needs scope 'job-control'"
    for _ in range(50):
        assert audited.transition_record_denied(job.job_id, actor="viewer-1", reason=REASON)
    assert audited.transition_record_denied(job.job_id, actor="viewer-2", reason=REASON)
    assert audited.transition_record_denied(job.job_id, actor="viewer-1", reason=other)
    assert audited.transition_record_denied(job.job_id, actor="viewer-1", reason=REASON)
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None
    denied = [(r[1], t.reason) for r, t in zip(rows, history.transitions) if r[0] == DENIED_KIND]
    assert denied == [("viewer-1", REASON)] * DENIED_BURST + [
        ("viewer-2", REASON),
        ("viewer-1", other),
    ]
    # a zero window records every call, and the chain still verifies
    for _ in range(3):
        audited.transition_record_denied(job.job_id, actor="viewer-1", reason=REASON, repeat_s=0)
    history, rows = _log(audited, job.job_id)
    assert history.first_bad_seq is None
    assert sum(r[0] == DENIED_KIND for r in rows) == DENIED_BURST + 5
    with pytest.raises(ValueError, match="repeat_s"):
        audited.transition_record_denied(job.job_id, actor="v", reason=REASON, repeat_s=-1)
