"""Preemption (issue 28 item 5; docs/long-steps.md "Preemption"): with a queue capped at one
RUNNING run and a preemption rule, an urgent run makes a low-priority resumable render yield
at a chunk boundary. Real PostgreSQL, real gRPC render services on loopback that count
frames, real worker processes (their sweepers ask the yield)."""

from __future__ import annotations

import json
import math
import threading
import uuid

import psycopg
import pytest

from protomolt_jobs.errors import ControlApplied
from protomolt_jobs.store import JobStore, NewJob
from protomolt_jobs.store.progress import ProgressReport
from tests.support.render_service import RenderService, render_workflow
from tests.support.worker_proc import WorkerProcess, event_types, wait_for

FRAMES = 12
FRAME_S = 0.3
AFTER_MS = 600
QUEUE = "gpu"


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=8)
    yield s
    s.close()


def _job(service, *, frames, priority, name):
    return NewJob(
        job_id=uuid.uuid4(),
        workflow_name=name,
        workflow_definition=render_workflow(service.target, name=name),
        input={"scene": name, "frames": frames},
        max_attempts=3,
        priority=priority,
        queue=QUEUE,
    )


class RunningSampler(threading.Thread):
    """Samples the queue's RUNNING count every 10 ms until stopped."""

    def __init__(self, dsn):
        super().__init__(daemon=True)
        self.dsn = dsn
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM workflow_run WHERE status = 'RUNNING' AND queue = %s",
                    (QUEUE,),
                ).fetchone()
                self.samples.append(n)
                self.stop.wait(0.01)


def _history(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT kind, prev_status, new_status, actor, step, attempt"
            " FROM workflow_run_transition WHERE job_id = %s ORDER BY seq",
            (job_id,),
        ).fetchall()


def test_an_urgent_run_preempts_a_low_priority_render_at_a_chunk_boundary(store, fresh_dsn):
    keys = {
        "queues": QUEUE,
        "queue_limits": json.dumps({QUEUE: {"max_running": 1}}),
        "queue_preemption": json.dumps(
            {QUEUE: {"min_priority_gap": 2, "after_ms": AFTER_MS, "min_run_ms": 0}}
        ),
        "sweep_interval_ms": 200,
        "poll_interval_ms": 200,
        "lease_seconds": 5.0,
        "worker_count": 2,
        "pool_max_size": 6,
    }
    sampler = RunningSampler(fresh_dsn)
    with RenderService(frame_s=FRAME_S) as low_svc, RenderService(frame_s=0.05) as urgent_svc:
        low = store.job_insert(_job(low_svc, frames=FRAMES, priority=5, name="render-low")).job
        procs = [WorkerProcess(fresh_dsn, worker_id=f"pre-{i}", **keys) for i in range(2)]
        try:
            sampler.start()
            for p in procs:
                p.start()
            wait_for(lambda: len(low_svc.rendered) >= 2 or None, timeout_s=30, interval_s=0.02)
            rendered_at_submit = len(low_svc.rendered)
            urgent = store.job_insert(_job(urgent_svc, frames=2, priority=1, name="urgent")).job
            wait_for(lambda: urgent_svc.started or None, timeout_s=30, interval_s=0.02)
            low_rendered_when_urgent_started = len(low_svc.rendered)
            low_started_when_urgent_started = list(low_svc.started)
            wait_for(
                lambda: store.job_get(urgent.job_id).status == "COMPLETED" or None, timeout_s=30
            )
            wait_for(lambda: store.job_get(low.job_id).status == "COMPLETED" or None, timeout_s=60)
        finally:
            sampler.stop.set()
            sampler.join(5)
            for p in procs:
                p.close()
    # the cap was never exceeded, sampled throughout
    assert len(sampler.samples) > 50, len(sampler.samples)
    assert max(sampler.samples) == 1, max(sampler.samples)
    # the urgent run started within the declared wait plus one chunk (counted in frames of
    # the low render: the wait, one sweep interval and the chunk in flight)
    bound = math.ceil(AFTER_MS / 1000 / FRAME_S) + 2
    assert low_rendered_when_urgent_started - rendered_at_submit <= bound, (
        rendered_at_submit,
        low_rendered_when_urgent_started,
    )
    assert low_rendered_when_urgent_started < FRAMES  # it yielded before it finished
    # ... at a chunk boundary: no low frame was in flight when the urgent run started
    assert low_started_when_urgent_started == list(range(1, low_rendered_when_urgent_started + 1))
    # resumed from its progress: every frame rendered exactly once
    assert low_svc.started == list(range(1, FRAMES + 1)), low_svc.started
    assert low_svc.rendered == list(range(1, FRAMES + 1)), low_svc.rendered
    row = store.job_get(low.job_id)
    assert row.result["framesDone"] == FRAMES
    assert row.attempt == 1  # the yield used up no attempt
    history = _history(fresh_dsn, low.job_id)
    kinds = [h[0] for h in history]
    assert kinds.count("yield-request") == 1 and kinds.count("yield") == 1, kinds
    request = history[kinds.index("yield-request")]
    assert request[1:3] == ("RUNNING", "RUNNING") and request[3] == "sweeper"
    yielded = history[kinds.index("yield")]
    assert yielded[1:3] == ("RUNNING", "QUEUED") and yielded[4] == "render", yielded
    assert yielded[5] == 0  # the attempt given back
    types = [e for e, _ in event_types(store, low.job_id)]
    assert types.count("YIELDED") == 1 and types[-1] == "COMPLETED", types
    assert store.job_get(urgent.job_id).attempt == 1


def _claim_low_render(store, svc, dsn, *, priority=5, report=True):
    limited = store.queue_limits_sync({QUEUE: {"max_running": 1}})
    job = store.job_insert(_job(svc, frames=FRAMES, priority=priority, name="low")).job
    claimed = store.job_claim("w1", 60, queues=[QUEUE], limited=limited)
    assert claimed is not None and claimed.job_id == job.job_id
    if report:
        store.job_report_progress(
            claimed.lease, 60, ProgressReport(step="render", percent=10.0, state={"nextFrame": 2})
        )
    return claimed


def _preempt(store, **over):
    rule = {"min_gap": 2, "after_s": 0.0, "min_run_s": 0.0, "actor": "sweeper", **over}
    return store.job_preempt(QUEUE, **rule)


def test_the_rule_gap_and_resumable_state_decide_who_is_asked(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn)
        # nothing waits: nobody is asked
        assert _preempt(store) is None
        # a waiting run only one level more urgent: below the gap
        store.job_insert(_job(svc, frames=1, priority=4, name="near"))
        assert _preempt(store) is None
        # a run that has not run min_run_s yet is not asked
        urgent = store.job_insert(_job(svc, frames=1, priority=1, name="urgent")).job
        assert _preempt(store, min_run_s=3600.0) is None
        # nor for a run that has not waited after_s
        assert _preempt(store, after_s=3600.0) is None
        asked = _preempt(store)
        assert asked is not None
        assert (asked.job_id, asked.for_job_id) == (claimed.job_id, urgent.job_id)
        # one yield pending per queue: a second pass asks nobody else
        assert _preempt(store) is None
        # the heartbeat does not apply it; the next progress report does, in that statement
        with pytest.raises(ControlApplied) as applied:
            store.job_report_progress(
                claimed.lease,
                60,
                ProgressReport(step="render", percent=20.0, state={"nextFrame": 3}),
            )
        assert applied.value.status == "QUEUED"
        row = store.job_get(claimed.job_id)
        assert (row.status, row.attempt, row.lease_owner) == ("QUEUED", 0, None)
        saved = store.job_progress_saved(claimed.job_id, "render")
        assert saved.state == {"nextFrame": 3} and saved.seq == 2
        assert "YIELDED" in [e for e, _ in event_types(store, claimed.job_id)]


def test_a_service_reporting_progress_is_told_to_stop_early_for_a_yield(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn)
        report = ProgressReport(step="render", percent=15.0)
        assert store.job_report_live(claimed.lease, 60, report) == "continue"
        store.job_insert(_job(svc, frames=1, priority=1, name="urgent"))
        assert _preempt(store) is not None
        # a ReportProgress from inside the call: told to stop (as for a pause), nothing applied
        assert store.job_report_live(claimed.lease, 60, report) == "pause_requested"
        assert store.job_get(claimed.job_id).status == "RUNNING"
        # the service's early return is the chunk's write: the yield lands there
        with pytest.raises(ControlApplied) as applied:
            store.job_report_progress(
                claimed.lease, 60, ProgressReport(step="render", percent=20.0, state={"f": 3})
            )
        assert applied.value.status == "QUEUED"


def test_a_run_outside_a_resumable_step_is_never_asked(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn, report=False)
        store.job_insert(_job(svc, frames=1, priority=1, name="urgent"))
        assert _preempt(store) is None
        # its resumable step said done: between steps, not preemptible either
        store.job_report_progress(
            claimed.lease, 60, ProgressReport(step="render", percent=100.0, done=True)
        )
        assert _preempt(store) is None
        assert store.job_get(claimed.job_id).control is None


def test_a_yield_pending_at_another_boundary_is_dropped(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn)
        store.job_insert(_job(svc, frames=1, priority=1, name="urgent"))
        assert _preempt(store) is not None
        # the worker stops gracefully before its next chunk: released as written, the request
        # dropped (no stale yield left on the row for its next claim)
        store.job_release(claimed.lease)
        row = store.job_get(claimed.job_id)
        assert row.status == "QUEUED" and row.control is None
        kinds = [h[0] for h in _history(fresh_dsn, claimed.job_id)]
        assert kinds[-1] == "release" and "yield" not in kinds, kinds


def test_a_cancel_recorded_after_a_yield_request_wins(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn)
        store.job_insert(_job(svc, frames=1, priority=1, name="urgent"))
        assert _preempt(store) is not None
        store.job_cancel(claimed.job_id, actor="alice", reason="enough")
        with pytest.raises(ControlApplied) as applied:
            store.job_report_progress(
                claimed.lease, 60, ProgressReport(step="render", percent=20.0)
            )
        assert applied.value.status == "CANCELLED"


def test_an_operators_pause_replaces_a_pending_yield(store, fresh_dsn):
    with RenderService() as svc:
        claimed = _claim_low_render(store, svc, fresh_dsn)
        store.job_insert(_job(svc, frames=1, priority=1, name="urgent"))
        assert _preempt(store) is not None
        assert store.job_get(claimed.job_id).control["kind"] == "yield"
        outcome = store.job_pause(claimed.job_id, actor="alice", reason="tonight")
        assert outcome.status == "RUNNING" and outcome.changed
        assert store.job_get(claimed.job_id).control["kind"] == "pause"
        with pytest.raises(ControlApplied) as applied:
            store.job_report_progress(
                claimed.lease, 60, ProgressReport(step="render", percent=20.0)
            )
        assert applied.value.status == "PAUSED"
