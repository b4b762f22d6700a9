"""Breaker: the one-queue claim against the list claim."""

from __future__ import annotations

import threading

import pytest

from protomolt_jobs.store import JobStore
from tests.support.factories import queued_job

ODD = "q'uo\"te é 日本 -- x"


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=12)
    try:
        yield s
    finally:
        s.close()


def test_one_queue_and_list_claim_agree_on_order(store):
    for prio in (5, 1, 3, 1, 4):
        queued_job(store, queue=ODD, priority=prio)
    queued_job(store, queue="other", priority=1)
    one = [store.job_claim("w", 60, queues=[ODD]).priority for _ in range(2)]
    many = [store.job_claim("w", 60, queues=[ODD, "zzz"]).priority for _ in range(3)]
    assert one + many == [1, 1, 3, 4, 5]
    assert store.job_claim("w", 60, queues=[ODD]) is None
    assert store.job_claim("w", 60, queues=[ODD, ODD]) is None
    assert store.job_claim("w", 60, queues=["other"]).queue == "other"


def test_one_queue_limited_and_concurrent(store):
    store.queue_limits_sync({ODD: {"max_running": 3}})
    for _ in range(10):
        queued_job(store, queue=ODD)
    # a worker that does not know of the limit must not claim past it
    got = [store.job_claim("w", 60, queues=[ODD]) for _ in range(2)]
    assert got == [None, None]
    claimed: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def go(i):
        barrier.wait()
        for _ in range(5):
            j = store.job_claim(f"w{i}", 60, queues=[ODD], limited={ODD})
            if j is not None:
                with lock:
                    claimed.append(j.job_id)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert len(claimed) == 3 == len(set(claimed))


def test_many_threads_one_queue_unique(store):
    for _ in range(300):
        queued_job(store, queue=ODD)
    claimed: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(10)

    def go(i):
        barrier.wait()
        qs = [ODD] if i % 2 else [ODD, "x"]
        while (j := store.job_claim(f"w{i}", 60, queues=qs)) is not None:
            with lock:
                claimed.append(j.job_id)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert len(claimed) == 300 == len(set(claimed))


def test_chains_written_before_0011_still_verify_after_it(empty_dsn, tmp_path):
    import shutil

    from protomolt_jobs.store.migrate import migrate, migrations_dir
    from tests.support.factories import claimed_job as _claimed

    old = tmp_path / "m"
    old.mkdir()
    for f in migrations_dir().iterdir():
        if f.name.endswith(".sql") and f.name < "0011":
            shutil.copy(str(f), old / f.name)
    migrate(empty_dsn, directory=old)
    s = JobStore.open(empty_dsn, max_size=2)
    try:
        job = _claimed(s)
        s.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
        assert migrate(empty_dsn)[0] == "0011_transition_hash_stable.sql"  # and any later
        s.job_checkpoint(job.lease, {"name": "second", "skipped": False, "response": {}})
        history = s.job_history(job.job_id)
        assert [t.kind for t in history.transitions] == [
            "submit",
            "claim",
            "checkpoint",
            "checkpoint",
        ]
        assert history.first_bad_seq is None, history
    finally:
        s.close()
