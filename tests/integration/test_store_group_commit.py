"""Group commit of the fenced writes (store/group_commit.py) against a real PostgreSQL: writes
carried in one transaction each keep their own fence and their own answer, and a crash in the
middle of a batched commit loses no job and breaks no transition chain."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

from protomolt_jobs.errors import ControlApplied, LeaseLost
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.records import Lease
from tests.support.factories import claimed_job
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import (
    CRASH_EXIT_CODE,
    WorkerProcess,
    enqueue,
    event_types,
    wait_for,
)


def _sql(dsn: str, query: str, *params: Any) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _xact_commits(dsn: str) -> int:
    rows = _sql(
        dsn,
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    return int(rows[0][0])


class _Writers:
    """Threads that each run one store write and keep its answer (a value or an exception)."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    def start(self, name: str, write: Any) -> None:
        def run() -> None:
            try:
                self.answers[name] = write()
            except Exception as exc:  # noqa: BLE001 - the answer under test
                self.answers[name] = exc

        t = threading.Thread(target=run, name=f"writer-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def join(self) -> None:
        for t in self._threads:
            t.join(30)
            assert not t.is_alive(), f"{t.name} did not finish"


def _blocked_leader(store: JobStore, dsn: str, writers: _Writers) -> tuple[Any, Any]:
    """A first writer that leads alone and blocks on a row lock the test holds, so the writes
    started after it queue and are carried together by the next leader. :returns: the lock's
    connection (close it to release the leader) and the leader's job."""
    leader = claimed_job(store, worker_id="w-lead")
    lock = psycopg.connect(dsn)
    lock.execute("SELECT 1 FROM workflow_run WHERE job_id = %s FOR UPDATE", (leader.job_id,))
    writers.start("lead", lambda: store.job_checkpoint(leader.lease, {"name": "first"}))
    wait_for(
        lambda: (
            _sql(
                dsn,
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )[0][0]
            == 1
        ),
        what="the leader's write waiting on the test's row lock",
    )
    return lock, leader


def test_a_stale_fence_in_a_batch_fails_alone(store, fresh_dsn):
    writers = _Writers()
    jobs = [claimed_job(store, worker_id=f"w-{i}") for i in range(3)]
    stale = claimed_job(store, worker_id="w-stale")
    # another attempt took the stale job over: its old lease's fence no longer matches
    _sql(fresh_dsn, "UPDATE workflow_run SET attempt = attempt + 1 WHERE job_id = %s", stale.job_id)
    stale_before = _sql(
        fresh_dsn,
        "SELECT checkpoints, history_seq FROM workflow_run WHERE job_id = %s",
        stale.job_id,
    )
    gc = store._group_commit
    batches0, commits0 = gc.batches, _xact_commits(fresh_dsn)
    lock, leader = _blocked_leader(store, fresh_dsn, writers)
    try:
        for i, job in enumerate(jobs):
            writers.start(
                str(i), lambda job=job: store.job_checkpoint(job.lease, {"name": "first"})
            )
        writers.start("stale", lambda: store.job_checkpoint(stale.lease, {"name": "first"}))
        wait_for(lambda: gc.waiting() == 4, what="four writes queued behind the leader")
    finally:
        lock.rollback()
        lock.close()
    writers.join()

    assert writers.answers["lead"] is None
    for i in range(3):
        assert writers.answers[str(i)] is None, writers.answers[str(i)]
    assert isinstance(writers.answers["stale"], LeaseLost)
    assert writers.answers["stale"].job_id == stale.job_id
    assert gc.batches == batches0 + 1, "the four queued writes went in one transaction"
    assert gc.batched_writes >= 4
    # the leader's own transaction, the batch's, and the test's own statements (fewer than
    # one transaction per write)
    for job in [leader, *jobs]:
        row = store.job_get(job.job_id)
        assert [c["name"] for c in row.checkpoints] == ["first"]
        assert [t for t, _ in event_types(store, job.job_id)] == ["ACCEPTED", "STEP_CHECKPOINT"]
        history = store.job_history(job.job_id)
        assert history.first_bad_seq is None
        assert [t.kind for t in history.transitions][-1] == "checkpoint"
    assert (
        _sql(
            fresh_dsn,
            "SELECT checkpoints, history_seq FROM workflow_run WHERE job_id = %s",
            stale.job_id,
        )
        == stale_before
    ), "the stale write changed its row"
    assert [t for t, _ in event_types(store, stale.job_id)] == ["ACCEPTED"]
    assert _xact_commits(fresh_dsn) > commits0


def test_a_control_request_in_a_batch_reaches_its_writer_alone(store, fresh_dsn):
    writers = _Writers()
    calm = claimed_job(store, worker_id="w-calm")
    cancelled = claimed_job(store, worker_id="w-cancelled")
    store.job_cancel(cancelled.job_id, actor="test", reason="stop it")
    gc = store._group_commit
    batches0 = gc.batches
    lock, _leader = _blocked_leader(store, fresh_dsn, writers)
    try:
        writers.start("calm", lambda: store.job_checkpoint(calm.lease, {"name": "first"}))
        writers.start("cancelled", lambda: store.job_checkpoint(cancelled.lease, {"name": "first"}))
        wait_for(lambda: gc.waiting() == 2, what="two writes queued behind the leader")
    finally:
        lock.rollback()
        lock.close()
    writers.join()

    assert gc.batches == batches0 + 1
    assert writers.answers["calm"] is None
    assert isinstance(writers.answers["cancelled"], ControlApplied)
    assert writers.answers["cancelled"].status == "CANCELLED"
    assert store.job_get(calm.job_id).status == "RUNNING"
    row = store.job_get(cancelled.job_id)
    assert row.status == "CANCELLED"
    assert [c["name"] for c in row.checkpoints] == ["first"]
    assert store.job_history(cancelled.job_id).first_bad_seq is None


def test_a_server_error_in_a_batch_reruns_each_write_alone(store, fresh_dsn):
    # A write the server refuses (here: a lease whose job id is not a uuid the statement can
    # take) aborts the batch's transaction; each write then runs alone and gets its own answer.
    writers = _Writers()
    good = claimed_job(store, worker_id="w-good")
    bad = Lease(job_id="not-a-uuid", owner="w-bad", attempt=1, token=uuid.uuid4())  # type: ignore[arg-type]
    gc = store._group_commit
    batches0 = gc.batches
    lock, _leader = _blocked_leader(store, fresh_dsn, writers)
    try:
        writers.start("good", lambda: store.job_checkpoint(good.lease, {"name": "first"}))
        writers.start("bad", lambda: store.job_checkpoint(bad, {"name": "first"}))
        wait_for(lambda: gc.waiting() == 2, what="two writes queued behind the leader")
    finally:
        lock.rollback()
        lock.close()
    writers.join()

    assert gc.batches == batches0, "the aborted batch is not counted as committed"
    assert writers.answers["good"] is None
    assert not isinstance(writers.answers["bad"], LeaseLost)
    assert isinstance(writers.answers["bad"], Exception)
    assert [c["name"] for c in store.job_get(good.job_id).checkpoints] == ["first"]
    assert [t for t, _ in event_types(store, good.job_id)] == ["ACCEPTED", "STEP_CHECKPOINT"]


def test_a_lone_write_takes_no_batch(store, fresh_dsn):
    job = claimed_job(store)
    gc = store._group_commit
    batches0 = gc.batches
    commits0 = _xact_commits(fresh_dsn)
    store.job_checkpoint(job.lease, {"name": "first"})
    # one transaction for the write, one for the counter's own read
    assert _xact_commits(fresh_dsn) - commits0 <= 2
    assert gc.batches == batches0


def test_with_group_commit_off_writes_never_wait_for_each_other(store, fresh_dsn):
    """jobs.group_commit = off (or auto below 8 claim loops): a write issued while another is
    blocked goes at once on its own connection, as before group commit; nothing is batched."""
    store.group_commit = False
    try:
        writers = _Writers()
        others = [claimed_job(store, worker_id=f"w-{i}") for i in range(3)]
        gc = store._group_commit
        batches0 = gc.batches
        lock, leader = _blocked_leader(store, fresh_dsn, writers)
        try:
            # the leader is blocked on the test's row lock; these finish regardless
            for job in others:
                assert store.job_checkpoint(job.lease, {"name": "first"}) is None
            assert gc.waiting() == 0
        finally:
            lock.rollback()
            lock.close()
        writers.join()
        assert writers.answers["lead"] is None
        assert gc.batches == batches0
        for job in [leader, *others]:
            assert [c["name"] for c in store.job_get(job.job_id).checkpoints] == ["first"]
    finally:
        store.group_commit = True


_CRASHY = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 8,
    "pool_max_size": 10,
}


@pytest.mark.parametrize("point", ["group_commit_sent", "group_commit_done"])
def test_a_crash_in_a_batched_commit_loses_no_job(store, fresh_dsn, services, point):
    workflow = seed_workflow(services.target, review="invoke")
    jobs = [enqueue(store, workflow, {"text": f"job {i}"}) for i in range(24)]
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", crash_at=point, **_CRASHY)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **_CRASHY)
    try:
        a.start(wait_ready=False)
        # eight loops on 24 jobs write at the same moments: a batch forms, and the process
        # dies there (before its Sync, or right after its commit)
        assert a.wait_exit(60) == CRASH_EXIT_CODE
        b.start()
        wait_for(
            lambda: all(store.job_get(j.job_id).status == "COMPLETED" for j in jobs),
            timeout_s=90,
            what="every job COMPLETED after the crash",
        )
    finally:
        a.close()
        b.close()
    for job in jobs:
        row = store.job_get(job.job_id)
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
        kinds = [t for t, _ in event_types(store, job.job_id)]
        assert kinds.count("COMPLETED") == 1, (job.job_id, kinds)
        assert kinds.count("STEP_CHECKPOINT") == 3, (job.job_id, kinds)
        history = store.job_history(job.job_id)
        assert history.first_bad_seq is None, job.job_id
        assert [t.kind for t in history.transitions].count("complete") == 1
