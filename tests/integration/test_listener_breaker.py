"""Adversarial tests of the listener's UNLISTEN/LISTEN hand-over (protomolt_jobs/worker/claim.py).

Every worker here polls every 30 s: a job left QUEUED by a lost wake-up would sit far past
the waits below, so a timeout means a lost wake-up, not a slow machine. Real PostgreSQL and
real gRPC test servers on loopback.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

import psycopg
import pytest

from protomolt_jobs.store import JobStore
from protomolt_jobs.worker.claim import Doorbell, Listener
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.worker_proc import enqueue, in_process_worker, wait_for

POLL_MS = 30_000


@pytest.fixture(scope="module")
def svc():
    with TestServices(max_workers=64) as services:
        yield services


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=10)
    yield s
    s.close()


def _worker(store, dsn, **overrides):
    overrides.setdefault("poll_interval_ms", POLL_MS)
    return in_process_worker(store, dsn, **overrides)


def _queued(store, jobs):
    return [j.job_id for j in jobs if store.job_get(j.job_id).status == "QUEUED"]


def _state(store, jobs, *workers):
    def describe():
        parts = [f"queued={_queued(store, jobs)}"]
        for w in workers:
            parts.append(
                f"{w.worker_id}: listening={w.listener.listening.is_set()} "
                f"waiting={w.doorbell.waiting} unlistens={w.listener.unlistens} "
                f"notifications={w.listener.notifications} connects={w.listener.connects} "
                f"poller_rings={w.poller.rings}"
            )
        return "; ".join(parts)

    return describe


def _all_parked(store, jobs):
    return all(store.job_get(j.job_id).status == "WAITING" for j in jobs)


def _slow_steps(services, seconds):
    default = services._do_tokenize

    def working(request, context):
        time.sleep(seconds)
        return default(request, context)

    services.set_handler("Tokenize", working)


def _held_steps(services):
    """Tokenize blocks until the returned event is set (keeps loops busy on demand)."""
    release = threading.Event()
    default = services._do_tokenize

    def held(request, context):
        release.wait(30)
        return default(request, context)

    services.set_handler("Tokenize", held)
    return release


def _listener_backend_pids(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND (query ILIKE 'LISTEN%%' OR query ILIKE 'UNLISTEN%%')"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    return [r[0] for r in rows]


def _terminate(dsn, pids):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def defects(caplog):
    """Records logged at ERROR or above (supervision logs a defect's traceback there)."""
    caplog.set_level(logging.INFO)
    yield lambda: [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- 1. lost wake-ups ------------------------------------------------------------------------


@pytest.mark.parametrize("unlisten_after_s", [0.0, 0.001])
@pytest.mark.parametrize("step_s", [0.0, 0.02])
@pytest.mark.parametrize("loops", [1, 2, 8])
def test_random_bursts_with_maximal_listen_churn_lose_no_wake_up(
    store, fresh_dsn, services, defects, loops, step_s, unlisten_after_s
):
    if step_s:
        _slow_steps(services, step_s)
    worker = _worker(store, fresh_dsn, worker_count=loops)
    worker.listener.unlisten_after_s = unlisten_after_s
    worker.start()
    rng = random.Random(loops * 1000 + int(step_s * 100) + int(unlisten_after_s * 1000))
    jobs = []
    try:
        wait_for(worker.listener.listening.is_set)
        for _ in range(12):
            for _ in range(rng.randint(1, 2 * loops)):
                jobs.append(enqueue(store, seed_workflow(services.target), {"text": "b"}))
            time.sleep(rng.choice([0.0, 0.0, 0.002, 0.01, 0.03, 0.08]))
        wait_for(
            lambda: _all_parked(store, jobs),
            timeout_s=15,
            what=_state(store, jobs, worker),
        )
        # Quiet again: every loop idle, the listener listening (a new job is announced).
        wait_for(lambda: worker.doorbell.waiting == loops)
        wait_for(worker.listener.listening.is_set)
        last = enqueue(store, seed_workflow(services.target), {"text": "after"})
        wait_for(
            lambda: _all_parked(store, [last]), timeout_s=10, what=_state(store, [last], worker)
        )
    finally:
        assert worker.stop() is True
    if loops < 8 or step_s:
        # eight loops on instant jobs are seldom all busy at once: no UNLISTEN is fine there
        assert worker.listener.unlistens >= 1
    assert not defects()


def test_jobs_submitted_as_the_loop_goes_idle_lose_no_wake_up(store, fresh_dsn, services):
    """The narrowest window, one loop: a job submitted while the loop runs another makes the
    listener UNLISTEN at once (its NOTIFY finds no idle loop); the next job is submitted just
    as that one parks, i.e. around the loop's empty claim, its idle hook and the LISTEN."""
    _slow_steps(services, 0.005)
    worker = _worker(store, fresh_dsn, worker_count=1)
    worker.listener.unlisten_after_s = 0.0
    worker.start()
    rng = random.Random(7)
    jobs = []
    try:
        wait_for(worker.listener.listening.is_set)
        for _ in range(40):
            first = enqueue(store, seed_workflow(services.target), {"text": "one"})
            jobs.append(first)
            wait_for(
                lambda job=first: store.job_get(job.job_id).status != "QUEUED",
                timeout_s=10,
                interval_s=0.001,
                what=_state(store, jobs, worker),
            )
            second = enqueue(store, seed_workflow(services.target), {"text": "two"})
            jobs.append(second)
            wait_for(
                lambda job=second: store.job_get(job.job_id).status == "WAITING",
                timeout_s=10,
                interval_s=rng.choice([0.0005, 0.001, 0.003]),
                what=_state(store, jobs, worker),
            )
        wait_for(lambda: _all_parked(store, jobs), timeout_s=10, what=_state(store, jobs, worker))
    finally:
        assert worker.stop() is True
    assert worker.listener.unlistens >= 1


def test_several_workers_on_one_database_lose_no_wake_up(store, fresh_dsn, services, defects):
    _slow_steps(services, 0.01)
    workers = [
        _worker(store, fresh_dsn, worker_count=2, worker_id=f"breaker-{i}") for i in range(3)
    ]
    for w in workers:
        w.listener.unlisten_after_s = 0.0
        w.start()
    rng = random.Random(3)
    jobs = []
    try:
        for w in workers:
            wait_for(w.listener.listening.is_set)
        for _ in range(15):
            for _ in range(rng.randint(1, 8)):
                jobs.append(enqueue(store, seed_workflow(services.target), {"text": "m"}))
            time.sleep(rng.choice([0.0, 0.005, 0.02, 0.06]))
        wait_for(lambda: _all_parked(store, jobs), timeout_s=15, what=_state(store, jobs, *workers))
    finally:
        for w in workers:
            assert w.stop() is True
    assert sum(w.listener.unlistens for w in workers) >= 1
    assert not defects()


def test_a_job_released_by_a_stopping_worker_reaches_a_busy_unlistened_one(
    store, fresh_dsn, services
):
    """A requeue's NOTIFY while the other worker does not listen: its loop finds the job
    with the claim after its own job, or after the LISTEN when it goes idle."""
    release = _held_steps(services)
    a = _worker(store, fresh_dsn, worker_count=1, worker_id="a", shutdown_grace_seconds=0.0)
    a.start()
    try:
        wait_for(a.listener.listening.is_set)
        held = enqueue(store, seed_workflow(services.target), {"text": "held by a"})
        wait_for(lambda: store.job_get(held.job_id).status == "RUNNING")
        b = _worker(store, fresh_dsn, worker_count=1, worker_id="b")
        b.listener.unlisten_after_s = 0.0
        b.start()
        try:
            busy = enqueue(store, seed_workflow(services.target), {"text": "b's"})
            wait_for(lambda: store.job_get(busy.job_id).status == "RUNNING")
            wait_for(lambda: b.listener.unlistens >= 1 and not b.listener.listening.is_set())
            # a stops: its job goes back to QUEUED (NOTIFY) while b does not listen
            stopper = threading.Thread(target=a.stop)
            stopper.start()
            wait_for(lambda: store.job_get(held.job_id).status == "QUEUED", timeout_s=10)
            release.set()
            stopper.join(15)
            wait_for(
                lambda: _all_parked(store, [held, busy]),
                timeout_s=10,
                what=_state(store, [held, busy], b),
            )
        finally:
            assert b.stop() is True
    finally:
        release.set()
        a.stop()


# -- 2. stop / start, failures, a killed connection -------------------------------------------


def _fds(kind=""):
    """Open fds of this process (``kind``: only those whose link starts so: pipe, socket)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith(kind):
            out.append(link)
    return len(out)


def _threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("protomolt-jobs-"))


def test_start_stop_cycles_while_unlistened_leak_nothing_and_stop_promptly(
    store, fresh_dsn, services, defects
):
    worker = _worker(store, fresh_dsn, worker_count=2)
    worker.listener.unlisten_after_s = 0.0
    rng = random.Random(11)
    # one warm-up cycle: the store's pool and the servers' channels open lazily
    worker.start()
    wait_for(worker.listener.listening.is_set)
    worker.stop()
    fds0, pipes0, threads0 = _fds(), _fds("pipe:"), _threads()
    jobs = []
    for i in range(12):
        release = _held_steps(services)
        worker.start()
        try:
            wait_for(worker.listener.listening.is_set, what=_state(store, jobs, worker))
            # A job is picked up promptly after each start (no poll).
            quick = enqueue(store, seed_workflow(services.target), {"text": f"quick {i}"})
            held = [enqueue(store, seed_workflow(services.target), {"text": f"h{i}"})]
            held.append(enqueue(store, seed_workflow(services.target), {"text": f"h{i}"}))
            jobs += [quick, *held]
            wait_for(
                lambda: worker.listener.unlistens >= 1 and worker.doorbell.waiting == 0,
                what=_state(store, jobs, worker),
            )
            if i % 3 == 0:
                wait_for(lambda: not worker.listener.listening.is_set())
            # sometimes stop while a loop goes idle (LISTEN in flight)
            if i % 2:
                release.set()
                time.sleep(rng.choice([0.0, 0.001, 0.005, 0.02]))
        finally:
            release.set()
            t0 = time.monotonic()
            assert worker.stop() is True
            took = time.monotonic() - t0
        assert took < 3.0, took
        assert not worker.listener.listening.is_set()
    # every job ran (parked) or was released back to QUEUED by a stop: start once more
    worker.start()
    try:
        wait_for(lambda: _all_parked(store, jobs), timeout_s=15, what=_state(store, jobs, worker))
    finally:
        worker.stop()
    wait_for(lambda: _threads() == threads0, timeout_s=5, what=lambda: f"{_threads()}")
    # the listener's self-pipe is closed with its thread: no pipe is left behind
    assert _fds("pipe:") == pipes0
    # the store's pool may have grown by a connection or two under the load; nothing more
    assert _fds() <= fds0 + 2, (fds0, _fds(), store.pool.get_stats())
    assert not defects()


def test_listener_connection_killed_while_unlistened_reconnects_listens_and_rings_all(
    store, fresh_dsn, services, defects
):
    release = _held_steps(services)
    worker = _worker(store, fresh_dsn, worker_count=2)
    worker.listener.unlisten_after_s = 0.0
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        held = [enqueue(store, seed_workflow(services.target), {"text": "h"}) for _ in range(2)]
        wait_for(lambda: worker.listener.unlistens >= 1 and not worker.listener.listening.is_set())
        connects = worker.listener.connects
        pids = _listener_backend_pids(fresh_dsn)
        assert len(pids) == 1, pids
        _terminate(fresh_dsn, pids)
        wait_for(lambda: worker.listener.connects == connects + 1)
        # reconnected: it listened, then (loops still busy) stops listening again
        wait_for(lambda: worker.listener.unlistens >= 2 and not worker.listener.listening.is_set())
        late = enqueue(store, seed_workflow(services.target), {"text": "late"})
        release.set()
        wait_for(
            lambda: _all_parked(store, [*held, late]),
            timeout_s=10,
            what=_state(store, [*held, late], worker),
        )
        wait_for(lambda: worker.doorbell.waiting == 2)
        wait_for(worker.listener.listening.is_set)
        last = enqueue(store, seed_workflow(services.target), {"text": "last"})
        wait_for(
            lambda: _all_parked(store, [last]), timeout_s=10, what=_state(store, [last], worker)
        )
    finally:
        release.set()
        assert worker.stop() is True
    assert not defects()


def test_listener_connection_killed_while_loops_idle_rings_every_loop(store, fresh_dsn, services):
    """Jobs committed while the listener is away are found by the ring_all after it
    reconnects. The jobs are inserted in one transaction with the kill, so no NOTIFY
    can reach the old connection."""
    worker = _worker(store, fresh_dsn, worker_count=4)
    worker.listener.unlisten_after_s = 0.0
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        wait_for(lambda: worker.doorbell.waiting == 4)
        connects = worker.listener.connects
        pids = _listener_backend_pids(fresh_dsn)
        assert len(pids) == 1, pids
        _terminate(fresh_dsn, pids)
        # Jobs inserted while it may be away (their NOTIFYs may be lost): the reconnect's
        # ring_all or their NOTIFYs must find them.
        jobs = [enqueue(store, seed_workflow(services.target), {"text": "x"}) for _ in range(6)]
        wait_for(lambda: worker.listener.connects == connects + 1)
        wait_for(lambda: _all_parked(store, jobs), timeout_s=10, what=_state(store, jobs, worker))
    finally:
        assert worker.stop() is True


def test_injected_failure_while_unlistened_restarts_listening_and_loses_nothing(
    store, fresh_dsn, services
):
    release = _held_steps(services)
    worker = _worker(store, fresh_dsn, worker_count=1)
    worker.listener.unlisten_after_s = 0.0
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        first = enqueue(store, seed_workflow(services.target), {"text": "h"})
        wait_for(lambda: worker.listener.unlistens >= 1 and not worker.listener.listening.is_set())
        connects, pipes = worker.listener.connects, _fds("pipe:")
        worker.listener.inject_failure()
        wait_for(lambda: worker.listener.connects == connects + 1, timeout_s=10)
        assert _fds("pipe:") == pipes  # the restarted listener closed its old self-pipe
        second = enqueue(store, seed_workflow(services.target), {"text": "while busy"})
        release.set()
        wait_for(
            lambda: _all_parked(store, [first, second]),
            timeout_s=10,
            what=_state(store, [first, second], worker),
        )
        wait_for(lambda: worker.doorbell.waiting == 1)
        wait_for(worker.listener.listening.is_set)
        third = enqueue(store, seed_workflow(services.target), {"text": "idle"})
        wait_for(
            lambda: _all_parked(store, [third]), timeout_s=10, what=_state(store, [third], worker)
        )
    finally:
        release.set()
        assert worker.stop() is True


def test_stop_during_reconnect_backoff_is_prompt_and_restart_listens(store, fresh_dsn, services):
    worker = _worker(store, fresh_dsn, worker_count=2)
    worker.listener.unlisten_after_s = 0.0
    fds0 = None
    for i in range(5):
        worker.start()
        try:
            wait_for(worker.listener.listening.is_set)
            if fds0 is None:
                fds0 = _fds()
            job = enqueue(store, seed_workflow(services.target), {"text": f"r{i}"})
            wait_for(lambda job=job: _all_parked(store, [job]), timeout_s=10)
            _terminate(fresh_dsn, _listener_backend_pids(fresh_dsn))
        finally:
            t0 = time.monotonic()
            assert worker.stop() is True
            assert time.monotonic() - t0 < 3.0
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        job = enqueue(store, seed_workflow(services.target), {"text": "end"})
        wait_for(lambda: _all_parked(store, [job]), timeout_s=10)
        assert _fds() <= fds0 + 2
    finally:
        worker.stop()


# -- 3. counters ------------------------------------------------------------------------------


def test_counters_follow_the_documented_meaning(store, fresh_dsn, services):
    """``notifications`` counts NOTIFYs received (none while unlistened), ``unlistens`` one
    per UNLISTEN, ``listening`` set exactly while LISTEN is in effect."""
    release = _held_steps(services)
    worker = _worker(store, fresh_dsn, worker_count=1)
    worker.listener.unlisten_after_s = 0.05
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        wait_for(lambda: worker.doorbell.waiting == 1)
        assert worker.listener.unlistens == 0
        n0 = worker.listener.notifications
        first = enqueue(store, seed_workflow(services.target), {"text": "h"})
        wait_for(lambda: worker.listener.notifications == n0 + 1)
        wait_for(lambda: worker.listener.unlistens == 1)
        assert not worker.listener.listening.is_set()
        assert worker.listener.unlistens == 1  # no UNLISTEN while not listening
        n1 = worker.listener.notifications
        extra = [enqueue(store, seed_workflow(services.target), {"text": "u"}) for _ in range(3)]
        release.set()
        wait_for(lambda: _all_parked(store, [first, *extra]), timeout_s=10)
        wait_for(worker.listener.listening.is_set)
        wait_for(lambda: worker.doorbell.waiting == 1)
        # the three NOTIFYs were sent while unlistened: none was received
        assert worker.listener.notifications == n1
        # while idle it stays listening and does not UNLISTEN again
        u = worker.listener.unlistens
        time.sleep(0.3)  # the workload's shape: idle well past the unlisten delay
        assert worker.listener.unlistens == u and worker.listener.listening.is_set()
    finally:
        release.set()
        assert worker.stop() is True
    assert not worker.listener.listening.is_set()


# -- 1b. the listener alone, with simulated claim loops and no poller --------------------------


class _Queue:
    """A job count the simulated loops claim from; a job is counted before its NOTIFY commits
    (as a real insert is visible before its notification is delivered)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.sent = 0
        self.done = 0

    def add(self) -> None:
        with self.lock:
            self.pending += 1
            self.sent += 1

    def describe(self, bell, listener) -> str:
        return (
            f"done={self.done} sent={self.sent} pending={self.pending} "
            f"waiting={bell.waiting} listening={listener.listening.is_set()}"
        )

    def claim(self) -> bool:
        with self.lock:
            if self.pending:
                self.pending -= 1
                return True
            return False


@pytest.mark.parametrize("loops", [1, 3])
def test_listener_alone_under_churn_never_leaves_a_job_with_every_loop_idle(fresh_dsn, loops):
    """Thousands of LISTEN/UNLISTEN turns: simulated loops claim from a counter, work 0-3 ms,
    and wait on the doorbell without any poll; every job must be claimed promptly."""
    bell = Doorbell(loops)
    listener = Listener(fresh_dsn, doorbell=bell, worker_id="w", unlisten_after_s=0.0)
    queue = _Queue()
    stop = threading.Event()
    rng = random.Random(loops)

    def loop(seed):
        r = random.Random(seed)
        while not stop.is_set():
            if queue.claim():
                time.sleep(r.choice([0.0, 0.0, 0.001, 0.003]))
                with queue.lock:
                    queue.done += 1
                continue
            bell.wait(None)

    listener.start()
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(loops)]
    for t in threads:
        t.start()
    try:
        wait_for(listener.listening.is_set)
        with psycopg.connect(fresh_dsn, autocommit=True) as conn:
            for _ in range(150):
                for _ in range(rng.randint(1, 2 * loops)):
                    queue.add()
                    conn.execute("NOTIFY protomolt_jobs")
                time.sleep(rng.choice([0.0, 0.0005, 0.002, 0.005]))
                if rng.random() < 0.1:
                    # quiet moment: every job claimed with no poll at all
                    wait_for(
                        lambda: queue.done == queue.sent,
                        timeout_s=5,
                        what=lambda: queue.describe(bell, listener),
                    )
        wait_for(
            lambda: queue.done == queue.sent,
            timeout_s=5,
            what=lambda: queue.describe(bell, listener),
        )
        wait_for(lambda: bell.waiting == loops)
        wait_for(listener.listening.is_set)
    finally:
        stop.set()
        bell.close()
        for t in threads:
            t.join(5)
        assert listener.stop() is True
    assert listener.unlistens >= 1


# -- 1c. two worker processes (python -m protomolt_jobs.worker --processes 2) ----------------


def test_two_processes_unlisten_while_busy_and_lose_no_wake_up(fresh_dsn, services, tmp_path):
    """Each process one loop, a 30 s poll and the default unlisten delay: slow jobs keep both
    busy past the delay (both listener sessions UNLISTEN), jobs submitted then and in bursts
    afterwards all run without a poll."""
    from tests.integration.test_worker_processes import (
        _end_supervisor,
        _read_ready,
        _start_supervisor,
        _tail,
    )

    release = threading.Event()
    default = services._do_tokenize

    def tokenize(request, context):
        if request.text.startswith("slow"):
            release.wait(30)
        elif request.text.startswith("step"):
            time.sleep(0.02)
        return default(request, context)

    services.set_handler("Tokenize", tokenize)
    store = JobStore.open(fresh_dsn, max_size=2)
    log_path = tmp_path / "workers.log"
    settings = {"worker_id": "multi", "worker_count": 1, "poll_interval_ms": POLL_MS}
    proc = _start_supervisor(fresh_dsn, {**settings, "pool_max_size": 3}, log_path)
    jobs: list = []
    rng = random.Random(5)

    def described():
        return f"queued={_queued(store, jobs)}\n{_tail(log_path)}"

    def unlistened():
        with psycopg.connect(fresh_dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ILIKE 'UNLISTEN%%'"
            ).fetchone()[0]

    try:
        _read_ready(proc, log_path)
        workflow = seed_workflow(services.target)
        jobs += [enqueue(store, workflow, {"text": f"slow {i}"}) for i in range(2)]
        # both processes busy past the delay: both listener sessions sent UNLISTEN
        wait_for(lambda: unlistened() == 2, timeout_s=30, what=described)
        jobs += [enqueue(store, workflow, {"text": f"while busy {i}"}) for i in range(3)]
        release.set()
        for _ in range(10):
            for _ in range(rng.randint(1, 4)):
                jobs.append(enqueue(store, workflow, {"text": "step"}))
            time.sleep(rng.choice([0.0, 0.01, 0.05, 0.6]))
        wait_for(lambda: _all_parked(store, jobs), timeout_s=20, what=described)
    finally:
        release.set()
        _end_supervisor(proc)
        store.close()


# -- 4. everything at once ---------------------------------------------------------------------


def _count_not_parked(dsn, jobs):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM workflow_run WHERE job_id = ANY(%s) AND status <> 'WAITING'",
            ([j.job_id for j in jobs],),
        ).fetchone()[0]


def test_fleet_with_churn_killed_connections_and_injected_failures_loses_no_job(
    store, fresh_dsn, services
):
    """Three workers of four loops (unlisten delays 0, 1 ms and the default), steps of 0-30 ms,
    bursts of up to 12 jobs, listener sessions killed and listener failures injected along
    the way; a 30 s poll: every job parks well before a poll could have found it."""
    default = services._do_tokenize

    def tokenize(request, context):
        time.sleep(int(request.text) / 1000.0)
        return default(request, context)

    services.set_handler("Tokenize", tokenize)
    workers = [_worker(store, fresh_dsn, worker_count=4, worker_id=f"f{i}") for i in range(3)]
    workers[0].listener.unlisten_after_s = 0.0
    workers[1].listener.unlisten_after_s = 0.001
    for w in workers:
        w.start()
    rng = random.Random(21)
    jobs: list = []
    try:
        for w in workers:
            wait_for(w.listener.listening.is_set)
        for round_ in range(40):
            for _ in range(rng.randint(1, 12)):
                ms = rng.choice([0, 0, 1, 5, 30])
                jobs.append(enqueue(store, seed_workflow(services.target), {"text": str(ms)}))
            if round_ % 10 == 3:
                _terminate(fresh_dsn, _listener_backend_pids(fresh_dsn)[:1])
            if round_ % 10 == 7:
                rng.choice(workers).listener.inject_failure()
            time.sleep(rng.choice([0.0, 0.002, 0.01, 0.04, 0.1]))
        wait_for(
            lambda: _count_not_parked(fresh_dsn, jobs) == 0,
            timeout_s=20,
            what=lambda: (
                f"not parked: {_count_not_parked(fresh_dsn, jobs)}; "
                + _state(store, [], *workers)()
            ),
        )
    finally:
        for w in workers:
            assert w.stop() is True
    # the kills and injected failures did make the listeners reconnect
    assert sum(w.listener.connects for w in workers) >= 3 + 4
    assert sum(w.listener.unlistens for w in workers) >= 1


# -- 5. a claim that straddles the LISTEN ------------------------------------------------------


def test_a_loop_whose_claim_straddles_the_listen_claims_once_more(fresh_dsn):
    """Two loops, both busy (UNLISTEN). Loop B starts its claim (snapshot: nothing queued);
    loop A goes idle, which makes the listener LISTEN; two jobs commit just before that
    LISTEN (no NOTIFY reaches anyone); the listener rings the one idle loop (A); B's claim
    returns empty after the ring. A runs J1 (a long step); J2 must not wait for J1 (or a
    poll) while B sits idle: B claims once more because a LISTEN came during its claim.

    The interleaving is forced with fake claims and a listener hook; the listener, the
    doorbell and the claim loops are the real ones."""
    import collections
    import datetime
    import types

    from protomolt_jobs.worker.claim import ClaimLoop

    t = datetime.datetime(2026, 1, 1)

    def job(name):  # waited no time in the queue: no backlog baton
        return types.SimpleNamespace(name=name, created_at=t, run_after=t, updated_at=t)

    bell = Doorbell(2)
    lock = threading.Lock()
    queue: collections.deque = collections.deque()
    claimed: dict[str, tuple[str, float]] = {}
    a_done, b_done, committed, end = (threading.Event() for _ in range(4))
    calls = {"a": 0, "b": 0}

    class _Listener(Listener):
        def _follow_loops(self, conn):
            if (
                not self.listening.is_set()
                and self._doorbell.waiting
                and a_done.is_set()
                and not committed.is_set()
            ):
                with lock:  # committed between the UNLISTEN and this LISTEN: announced to nobody
                    queue.extend([job("J1"), job("J2")])
                committed.set()
            return super()._follow_loops(conn)

    listener = _Listener(fresh_dsn, doorbell=bell, worker_id="w", unlisten_after_s=0.0)

    def pop(who):
        with lock:
            if queue:
                j = queue.popleft()
                claimed[j.name] = (who, time.monotonic())
                return j
        return None

    def claim_a():
        calls["a"] += 1
        if calls["a"] == 1:
            return job("a1")
        if calls["a"] == 2:
            return None  # A's empty claim: A goes idle and wakes the listener
        return pop("A")

    def claim_b():
        calls["b"] += 1
        if calls["b"] == 1:
            return job("b1")
        if calls["b"] == 2:
            # B's claim began while unlistened, before the jobs committed ...
            a_done.set()
            wait_for(lambda: committed.is_set() and listener.listening.is_set(), interval_s=0.0005)
            wait_for(lambda: "J1" in claimed, interval_s=0.0005)  # ... and ends after the
            return None  # listener rang the idle loop (A), which took J1
        return pop("B")

    def execute(j):
        if j.name == "a1":
            a_done.wait(10)
        elif j.name == "b1":
            b_done.wait(10)
        else:
            end.wait(3)  # a long step

    stopping = threading.Event()
    loops = [
        ClaimLoop(claim=c, execute=execute, doorbell=bell, stopping=stopping, name=n, worker_id="w")
        for c, n in ((claim_a, "claim_loop_0"), (claim_b, "claim_loop_1"))
    ]
    listener.start()
    for loop in loops:
        loop.start()
    try:
        wait_for(lambda: listener.unlistens >= 1 and not listener.listening.is_set())
        while bell.wait(0):  # the connect's ring_all tokens
            pass
        b_done.set()
        wait_for(lambda: "J1" in claimed)
        started = claimed["J1"][1]
        wait_for(lambda: "J2" in claimed, timeout_s=5)
        assert claimed["J2"][1] - started < 1.0, claimed  # not after J1's 3 s step
        assert {claimed["J1"][0], claimed["J2"][0]} == {"A", "B"}, claimed
    finally:
        end.set()
        stopping.set()
        bell.close()
        for loop in loops:
            loop.stop()
        assert listener.stop() is True
