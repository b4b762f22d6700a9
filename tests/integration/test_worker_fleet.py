"""The running worker: wake-ups, heartbeats, permits, 256 in flight, graceful stop, start/stop
stress. Real PostgreSQL and real gRPC test servers on loopback."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.store import JobStore
from protomolt_jobs.worker.claim import UNLISTEN_AFTER_NOTIFIES, Doorbell, Listener
from tests.support.grpc_servers import METHODS, TestServices, seed_workflow
from tests.support.worker_proc import enqueue, event_types, in_process_worker, jobs_config, wait_for


@pytest.fixture(scope="module")
def svc():
    with TestServices(max_workers=320) as services:
        yield services


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=10)
    yield s
    s.close()


def _our_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("protomolt-jobs-") and t.is_alive()
    ]


class _Concurrency:
    """Wraps every test method's default behaviour to count calls in flight across methods."""

    def __init__(self, services: TestServices, hold_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.hold_s = hold_s
        for method in METHODS:
            default = getattr(services, f"_do_{method.lower()}")
            services.set_handler(method, self._wrap(default))

    def _wrap(self, default):
        def handle(request, context):
            with self.lock:
                self.now += 1
                self.max = max(self.max, self.now)
            try:
                time.sleep(self.hold_s)  # the call's work: the sleep is the behaviour
                return default(request, context)
            finally:
                with self.lock:
                    self.now -= 1

        return handle


def test_pickup_follows_notify_not_the_poll_interval(store, fresh_dsn, services):
    # a 30 s poll: only the NOTIFY can explain a pickup within a few seconds
    worker = in_process_worker(store, fresh_dsn, poll_interval_ms=30_000)
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        time.sleep(0.2)  # let the loops finish their start-up claims and go idle
        job = enqueue(store, seed_workflow(services.target), {"text": "quick"})
        t0 = time.monotonic()
        wait_for(lambda: store.job_get(job.job_id).status == "WAITING", timeout_s=10)
        assert time.monotonic() - t0 < 5.0
    finally:
        worker.stop()


def test_an_idle_worker_polls_once_per_interval_not_once_per_loop(store, fresh_dsn):
    claims: list[float] = []
    real_claim = store.job_claim

    def counted(*args, **kwargs):
        claims.append(time.monotonic())
        return real_claim(*args, **kwargs)

    store.job_claim = counted
    worker = in_process_worker(store, fresh_dsn, worker_count=8, poll_interval_ms=100)
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        # Start-up (every loop claims once, the listener's connect rings all) is over once
        # the poller has rung a few times since: the window is counted in the poller's rings.
        rings = worker.poller.rings
        wait_for(lambda: worker.poller.rings >= rings + 3)
        start, n0, r0 = time.monotonic(), len(claims), worker.poller.rings
        wait_for(lambda: worker.poller.rings >= r0 + 15)
        idle = len(claims) - n0
        elapsed = time.monotonic() - start
    finally:
        worker.stop()
    # ~1 claim per 100 ms for the whole worker; 8 loops polling each would make ~120.
    assert 5 <= idle <= 2 * elapsed / 0.1 + 4, idle


def _notify(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("NOTIFY protomolt_jobs")


def test_listener_unlistens_while_every_loop_is_busy_and_listens_again_for_an_idle_one(
    fresh_dsn,
):
    bell = Doorbell(2)
    listener = Listener(fresh_dsn, doorbell=bell, worker_id="w", unlisten_after_s=0.2)
    listener.start()
    try:
        # No loop waits on the doorbell: every loop is busy, so the listener stops listening.
        wait_for(lambda: listener.unlistens == 1)
        assert not listener.listening.is_set()
        while bell.wait(0):  # drop the connect's ring_all tokens
            pass
        _notify(fresh_dsn)  # committed after the UNLISTEN: nobody hears it
        # A loop goes idle: the listener listens again and rings it for one more claim.
        woke: list[bool] = []
        loop = threading.Thread(target=lambda: woke.append(bell.wait(10.0)))
        loop.start()
        loop.join(10)
        assert woke == [True]
        assert listener.listening.is_set()
        assert listener.notifications == 0, "the NOTIFY sent while unlistened was delivered"
        _notify(fresh_dsn)  # listening again: heard and rung
        wait_for(lambda: listener.notifications == 1)
        assert bell.wait(5.0) is True
        # Busy again (nobody waits): a second UNLISTEN.
        wait_for(lambda: listener.unlistens == 2)
    finally:
        assert listener.stop() is True


def test_a_burst_of_unanswered_notifications_stops_listening_before_the_delay(fresh_dsn):
    bell = Doorbell(1)
    # a delay no test waits for: only the count of unanswered notifications can stop it
    listener = Listener(fresh_dsn, doorbell=bell, worker_id="w", unlisten_after_s=600)
    listener.start()
    try:
        wait_for(listener.listening.is_set)
        for _ in range(UNLISTEN_AFTER_NOTIFIES - 1):
            _notify(fresh_dsn)
        wait_for(lambda: listener.notifications == UNLISTEN_AFTER_NOTIFIES - 1)
        assert listener.unlistens == 0 and listener.listening.is_set()
        _notify(fresh_dsn)  # the one that makes the burst: nobody waits, so UNLISTEN
        wait_for(lambda: listener.unlistens == 1)
        assert not listener.listening.is_set()
    finally:
        assert listener.stop() is True


def test_turning_the_unlisten_rule_off_while_not_listening_listens_again(fresh_dsn):
    bell = Doorbell(1)
    listener = Listener(fresh_dsn, doorbell=bell, worker_id="w", unlisten_after_s=0.05)
    listener.start()
    try:
        wait_for(lambda: listener.unlistens == 1)  # no loop waits: every loop is busy
        listener.unlisten_after_s = None  # found by the breaker: it stayed unlistened for good
        wait_for(listener.listening.is_set)
        _notify(fresh_dsn)
        wait_for(lambda: listener.notifications == 1)
        assert listener.unlistens == 1
    finally:
        assert listener.stop() is True


def test_a_job_submitted_while_every_loop_is_busy_runs_without_a_poll(store, fresh_dsn, services):
    release = threading.Event()
    default = services._do_tokenize

    def held(request, context):
        release.wait(30)  # the step's work: held until the test has submitted the second job
        return default(request, context)

    services.set_handler("Tokenize", held)
    # one loop, a 30 s poll: only the listener's hand-over can explain a prompt pickup
    worker = in_process_worker(store, fresh_dsn, worker_count=1, poll_interval_ms=30_000)
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        first = enqueue(store, seed_workflow(services.target), {"text": "held"})
        wait_for(lambda: worker.listener.unlistens >= 1)  # the only loop is busy
        heard = worker.listener.notifications
        second = enqueue(store, seed_workflow(services.target), {"text": "while busy"})
        release.set()
        for job in (first, second):
            wait_for(lambda job=job: store.job_get(job.job_id).status == "WAITING", timeout_s=10)
        assert worker.listener.notifications == heard  # the second job was not announced
        # The loop is idle again: listening, and a new job is picked up by its NOTIFY.
        wait_for(worker.listener.listening.is_set)
        third = enqueue(store, seed_workflow(services.target), {"text": "idle again"})
        wait_for(lambda: store.job_get(third.job_id).status == "WAITING", timeout_s=10)
    finally:
        worker.stop()


def test_bursts_while_loops_turn_busy_and_idle_are_all_picked_up_without_a_poll(
    store, fresh_dsn, services
):
    default = services._do_tokenize

    def working(request, context):
        time.sleep(0.05)  # the step's work: keeps a loop busy for a moment
        return default(request, context)

    services.set_handler("Tokenize", working)
    # a 30 s poll: a lost wake-up would leave a job QUEUED far past the wait below
    worker = in_process_worker(store, fresh_dsn, worker_count=2, poll_interval_ms=30_000)
    worker.listener.unlisten_after_s = 0.02  # turn LISTEN off and on as often as it can
    worker.start()
    rng = random.Random(14)
    jobs = []
    try:
        wait_for(worker.listener.listening.is_set)
        for _ in range(8):
            for _ in range(rng.randint(1, 4)):
                jobs.append(enqueue(store, seed_workflow(services.target), {"text": "burst"}))
            # gaps around the step's length and the unlisten delay: loops go idle in between
            time.sleep(rng.choice([0.0, 0.03, 0.08, 0.2]))
        wait_for(
            lambda: all(store.job_get(j.job_id).status == "WAITING" for j in jobs),
            timeout_s=15,
        )
        assert worker.listener.unlistens >= 1  # the bursts did turn the listener off
    finally:
        worker.stop()


def test_a_backoff_that_passes_is_picked_up_by_the_poller(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target), {"text": "later"})
    claimed = store.job_claim("someone-else", 30)
    assert claimed is not None and claimed.job_id == job.job_id
    store.job_retry(claimed.lease, 0.5, "GRPC: gRPC UNAVAILABLE from x: down")
    worker = in_process_worker(store, fresh_dsn, worker_count=4, poll_interval_ms=100)
    worker.start()
    try:
        # The retry's NOTIFY fires before run_after passes; only the poller announces it.
        wait_for(lambda: store.job_get(job.job_id).status == "WAITING", timeout_s=10)
    finally:
        worker.stop()


def test_listener_reconnects_and_polls_after_a_killed_connection(store, fresh_dsn, services):
    worker = in_process_worker(store, fresh_dsn, poll_interval_ms=30_000)
    worker.start()
    try:
        wait_for(worker.listener.listening.is_set)
        with psycopg.connect(fresh_dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
            ).fetchall()
        assert killed and all(k[0] for k in killed)
        wait_for(lambda: worker.listener.connects >= 2, timeout_s=10)
        job = enqueue(store, seed_workflow(services.target), {"text": "after reconnect"})
        wait_for(lambda: store.job_get(job.job_id).status == "WAITING", timeout_s=10)
    finally:
        worker.stop()


def test_a_step_three_times_longer_than_the_lease_completes_once(store, fresh_dsn, services):
    lease_s = 1.0
    services.set_delay("Tokenize", 3 * lease_s + 0.3)
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "slow step"})
    w1 = in_process_worker(store, fresh_dsn, worker_id="w1", lease_seconds=lease_s)
    w2 = in_process_worker(store, fresh_dsn, worker_id="w2", lease_seconds=lease_s)
    sweeper = Sweeper(store, config=jobs_config(fresh_dsn, sweep_interval_ms=50))
    w1.start()
    try:
        wait_for(lambda: services.calls("Tokenize") == 1)
        # a competing worker and an eager sweeper run throughout the long step
        w2.start()
        sweeper.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=30)
        row = store.job_get(job.job_id)
        assert row.attempt == 1, "a second claim happened"
        assert services.calls("Tokenize") == 1
        kinds = [t for t, _ in event_types(store, job.job_id)]
        assert kinds.count("COMPLETED") == 1
    finally:
        sweeper.stop()
        w2.stop()
        w1.stop()


def test_per_target_cap_bounds_concurrent_calls_from_one_worker(store, fresh_dsn, services):
    probe = _Concurrency(services, hold_s=0.05)
    jobs = [
        enqueue(store, seed_workflow(services.target, review="invoke"), {"text": f"job {i}"})
        for i in range(20)
    ]
    worker = in_process_worker(store, fresh_dsn, worker_count=8, max_concurrent_per_target=2)
    worker.start()
    try:
        wait_for(
            lambda: all(store.job_get(j.job_id).status == "COMPLETED" for j in jobs), timeout_s=60
        )
    finally:
        worker.stop()
    assert probe.max == 2
    assert services.calls("Tokenize") == 20


def test_256_jobs_in_flight_in_one_worker_with_a_pool_of_10(fresh_dsn, services):
    """Each tokenize call holds until all 256 are in flight (bounded), then sleeps 2 s: the
    server sees 256 concurrent calls only if the worker runs 256 segments at once."""
    n = 256
    store = JobStore.open(fresh_dsn, max_size=10)
    gate = threading.Condition()
    state = {"now": 0, "max": 0}

    def tokenize(request, context):
        with gate:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            gate.notify_all()
            gate.wait_for(lambda: state["max"] >= n, timeout=60)
        time.sleep(2.0)  # the call's work, held while all 256 are in flight: the behaviour
        with gate:
            state["now"] -= 1
        return services._do_tokenize(request, context)

    services.set_handler("Tokenize", tokenize)
    workflow = seed_workflow(services.target)
    jobs = [enqueue(store, workflow, {"text": f"w{i}"}) for i in range(n)]
    worker = in_process_worker(
        store,
        fresh_dsn,
        worker_count=n,
        pool_max_size=10,
        max_concurrent_per_target=n,
        lease_seconds=60,
        poll_interval_ms=500,
    )
    peak_connections = 0
    worker.start()
    try:

        def all_parked() -> bool:
            nonlocal peak_connections
            with psycopg.connect(fresh_dsn, autocommit=True) as conn:
                (conns,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()
                (waiting,) = conn.execute(
                    "SELECT count(*) FROM workflow_run WHERE status = 'WAITING'"
                ).fetchone()
            peak_connections = max(peak_connections, conns)
            return waiting == n

        wait_for(all_parked, timeout_s=120, interval_s=0.2)
    finally:
        worker.stop()
        store.close()
    assert state["max"] == n
    assert services.calls("Tokenize") == n
    assert len(jobs) == n
    # the pool (10) plus the worker's LISTEN connection
    assert peak_connections <= 11


def test_graceful_stop_releases_what_outlives_the_grace_and_gives_back_the_attempt(
    store, fresh_dsn, services
):
    services.set_delay("Embed", 3.0)
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "stop me"})
    worker = in_process_worker(store, fresh_dsn, lease_seconds=30)
    worker.start()
    wait_for(lambda: services.calls("Embed") == 1)
    t0 = time.monotonic()
    worker.stop(timeout_s=0.3)
    assert time.monotonic() - t0 < 5.0
    row = store.job_get(job.job_id)
    assert row.status == "QUEUED"
    assert row.attempt == 0, "a graceful release gives the attempt back"
    assert row.lease_owner is None
    assert [c["name"] for c in row.checkpoints] == ["tokenize"]
    # the released segment's embed call returns later (its loop thread then ends); it must
    # write nothing
    wait_for(
        lambda: (
            not any(
                t.name.startswith("protomolt-jobs-claim-loop") and t.is_alive()
                for t in threading.enumerate()
            )
        ),
        timeout_s=15,
    )
    row = store.job_get(job.job_id)
    assert row.status == "QUEUED" and [c["name"] for c in row.checkpoints] == ["tokenize"]
    # another worker resumes at embed and completes with attempt 1
    services.set_delay("Embed", 0)
    w2 = in_process_worker(store, fresh_dsn, worker_id="w2")
    w2.start()
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=20)
    finally:
        w2.stop()
    assert store.job_get(job.job_id).attempt == 1
    assert services.calls("Tokenize") == 1


def test_graceful_stop_lets_a_segment_finish_within_the_grace(store, fresh_dsn, services):
    services.set_delay("Embed", 0.5)
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "finish me"})
    worker = in_process_worker(store, fresh_dsn, lease_seconds=30)
    worker.start()
    wait_for(lambda: services.calls("Embed") == 1)
    worker.stop(timeout_s=10)
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED"
    assert row.attempt == 1


def test_start_stop_stress(store, fresh_dsn, services):
    baseline = set(_our_threads())
    never_started = in_process_worker(store, fresh_dsn)
    never_started.stop()
    never_started.stop()
    worker = in_process_worker(store, fresh_dsn, worker_count=4)
    for _ in range(15):
        worker.start()
        worker.start()
        worker.stop(timeout_s=1)
    worker.stop()
    for _ in range(5):
        w = in_process_worker(store, fresh_dsn, worker_count=3)
        w.start()
        w.stop(timeout_s=1)
        w.stop()
    assert set(_our_threads()) - baseline == set()
    # a restarted worker still works
    job = enqueue(store, seed_workflow(services.target), {"text": "after stress"})
    worker.start()
    try:
        wait_for(lambda: store.job_get(job.job_id).status == "WAITING", timeout_s=15)
    finally:
        worker.stop()
    assert set(_our_threads()) - baseline == set()


def test_a_job_waiting_for_a_permit_keeps_its_lease(store, fresh_dsn, services):
    lease_s = 1.0
    services.set_delay("Tokenize", 2.5 * lease_s)
    first = enqueue(store, seed_workflow(services.target), {"text": "holds the permit"})
    worker = in_process_worker(
        store, fresh_dsn, worker_count=2, max_concurrent_per_target=1, lease_seconds=lease_s
    )
    sweeper = Sweeper(store, config=jobs_config(fresh_dsn, sweep_interval_ms=50))
    worker.start()
    sweeper.start()
    try:
        wait_for(lambda: services.calls("Tokenize") == 1)
        second = enqueue(store, seed_workflow(services.target), {"text": "waits for it"})
        wait_for(lambda: store.job_get(second.job_id).status == "RUNNING")
        # the second job waits for the permit longer than its lease; the heartbeat keeps it
        wait_for(
            lambda: all(store.job_get(j.job_id).status == "WAITING" for j in (first, second)),
            timeout_s=30,
        )
        assert store.job_get(first.job_id).attempt == 1
        assert store.job_get(second.job_id).attempt == 1, "the waiting job was swept"
        assert services.calls("Tokenize") == 2
        assert services.max_in_flight("Tokenize") == 1
    finally:
        sweeper.stop()
        worker.stop()
