"""Worker parts without services: backoff, the doorbell, the heartbeat (fake store), the
sweeper cadence, crash-point parsing and start/stop of components that were never started."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from protomolt_jobs import crashpoints
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.worker.claim import ClaimLoop, Doorbell, Poller, backlogged
from protomolt_jobs.worker.heartbeat import Heartbeat
from protomolt_jobs.worker.policies import backoff_s


@dataclass(frozen=True)
class _Lease:
    job_id: uuid.UUID
    owner: str
    attempt: int


def _poll(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_backoff_doubles_per_attempt_and_is_capped():
    assert [backoff_s(5, a) for a in (1, 2, 3)] == [5.0, 10.0, 20.0]
    assert backoff_s(0.2, 1) == pytest.approx(0.2)
    assert backoff_s(1, 0) == 1.0  # a zero attempt is treated as the first
    assert backoff_s(1, 500) == float(2**20)


def test_doorbell_token_survives_a_ring_before_the_wait():
    bell = Doorbell(4)
    bell.ring()
    t0 = time.monotonic()
    assert bell.wait(5.0) is True
    assert time.monotonic() - t0 < 1.0
    assert bell.wait(0.05) is False  # the token was consumed


def test_doorbell_caps_tokens_and_wakes_a_waiter():
    bell = Doorbell(2)
    bell.ring(10)
    assert bell.wait(0.01) and bell.wait(0.01)
    assert bell.wait(0.01) is False
    woke = threading.Event()

    def waiter():
        if bell.wait(5.0):
            woke.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert _poll(lambda: bell.waiting == 1)  # the waiter is blocked before the ring
    bell.ring()
    t.join(5)
    assert woke.is_set()


def test_doorbell_close_releases_waiters():
    bell = Doorbell(1)
    done = threading.Event()
    t = threading.Thread(target=lambda: (bell.wait(30.0), done.set()))
    t.start()
    bell.close()
    t.join(5)
    assert done.is_set()
    bell.reopen()
    assert bell.wait(0.01) is False


def test_doorbell_wait_without_timeout_returns_on_ring_or_close():
    bell = Doorbell(2)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(bell.wait(None))) for _ in range(2)]
    for t in threads:
        t.start()
    assert _poll(lambda: bell.waiting == 2)  # both are blocked before the ring
    bell.ring(1)
    assert _poll(lambda: results)
    assert results == [True]  # one ring wakes one waiter; the other keeps waiting
    bell.close()
    for t in threads:
        t.join(5)
    assert sorted(results) == [False, True]


def test_doorbell_tells_how_long_every_loop_has_been_busy_and_calls_the_idle_hook_once():
    bell = Doorbell(2)
    idle_calls: list[int] = []
    bell.watch_idle(lambda: idle_calls.append(bell._waiting))
    assert _poll(lambda: bell.busy_for() > 0.01)  # nobody has waited since it was made
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(bell.wait(None))) for _ in range(2)]
    for t in threads:
        t.start()
    assert _poll(lambda: bell.waiting == 2)
    assert bell.busy_for() == 0.0  # a loop waits: not busy
    assert idle_calls == [1]  # called when the first waiter came, not for the second
    bell.ring(2)
    for t in threads:
        t.join(5)
    assert results == [True, True]
    assert bell.waiting == 0 and bell.busy_for() < 1.0
    bell.watch_idle(None)
    t = threading.Thread(target=lambda: bell.wait(5.0))
    t.start()
    assert _poll(lambda: bell.waiting == 1)
    bell.ring()
    t.join(5)
    assert idle_calls == [1]  # the hook was removed


def test_doorbell_relistened_rings_the_waiters_and_sends_a_straddling_claim_back():
    bell = Doorbell(2)
    before = bell.listens()  # a loop reads it before its claim
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(bell.wait(5.0)))
    waiter.start()
    assert _poll(lambda: bell.waiting == 1)
    bell.relistened()  # a LISTEN after an UNLISTEN
    waiter.join(5)
    assert results == [True]  # the idle loop was rung
    # the loop whose claim began before the LISTEN claims again at once, taking no token
    assert bell.wait(5.0, since=before) is True
    assert bell.wait(0.05, since=bell.listens()) is False  # no LISTEN since: it waits
    bell.close()
    assert bell.wait(5.0, since=before) is False  # closed: no more claims


def test_poller_rings_once_per_interval_and_stops():
    bell = Doorbell(16)
    poller = Poller(doorbell=bell, interval_s=0.05, worker_id="w")
    poller.start()
    assert _poll(lambda: poller.rings >= 4)
    assert poller.stop() is True  # returns once the loop has ended: no ring after this
    rings = poller.rings
    assert rings >= 4
    assert poller.health().state.value == "STOPPED"
    taken = 0
    while bell.wait(0.01):
        taken += 1
    assert taken == min(rings, bell.capacity)  # one token per ring, not one per loop
    poller.stop()  # double stop is fine


def test_poller_refuses_a_non_positive_interval():
    with pytest.raises(ValueError, match="poll interval"):
        Poller(doorbell=Doorbell(1), interval_s=0, worker_id="w")


class _Claimed:
    def __init__(self, waited_s: float, *, retry_s: float = 0.0) -> None:
        created = datetime(2026, 1, 1, tzinfo=UTC)
        self.created_at = created
        self.run_after = created + timedelta(seconds=retry_s)
        self.updated_at = self.run_after + timedelta(seconds=waited_s)


def test_backlogged_reads_the_wait_in_database_time():
    assert backlogged(_Claimed(0.004)) is False  # announced and picked up at once
    assert backlogged(_Claimed(0.5)) is True  # it sat in the queue
    assert backlogged(_Claimed(0.004, retry_s=30)) is False  # waited for run_after, not a loop
    assert backlogged(object()) is True  # unknown shape: pass the baton


def _loop(bell: Doorbell, job: object) -> tuple[ClaimLoop, list]:
    ran: list = []
    loop = ClaimLoop(
        claim=lambda: job,
        execute=ran.append,
        doorbell=bell,
        stopping=threading.Event(),
        name="t",
        worker_id="w",
    )
    return loop, ran


def test_a_claim_passes_the_baton_only_on_a_backlog():
    bell = Doorbell(4)
    fresh, ran = _loop(bell, _Claimed(0.002))
    assert fresh.run_once() is True and len(ran) == 1
    assert bell.wait(0.01) is False  # no baton: its own NOTIFY woke the loop
    waiting, ran = _loop(bell, _Claimed(1.0))
    assert waiting.run_once() is True and len(ran) == 1
    assert bell.wait(0.01) is True  # baton: others are likely queued
    empty, ran = _loop(bell, None)
    assert empty.run_once() is False and ran == []
    assert bell.wait(0.01) is False


def test_a_loop_claiming_straight_on_drops_the_ring_of_the_job_it_took():
    bell = Doorbell(4)
    loop, ran = _loop(bell, _Claimed(0.002))
    bell.ring(1)  # the next job's NOTIFY
    assert loop.run_once() is True  # first claim after a wake-up: keeps the ring
    assert loop.run_once() is True  # straight on: it took that job; its ring would be empty
    assert len(ran) == 2
    assert bell.wait(0.01) is False


class _HeartbeatStore:
    def __init__(self) -> None:
        self.beats: list[tuple[object, float]] = []
        self.lost: set[uuid.UUID] = set()
        self.failing = False

    def job_heartbeat(self, lease, lease_s):
        if lease.job_id in self.lost:
            raise LeaseLost(lease.job_id, lease.owner, lease.attempt, "heartbeat")
        if self.failing:
            raise StoreError("connection refused")
        self.beats.append((lease, lease_s))

    def job_heartbeat_control(self, lease, lease_s):
        self.job_heartbeat(lease, lease_s)
        return None, None

    def job_controls(self, job_ids):
        # ``controls``: what it answers; ``polls``: the id lists it was asked for
        self.polls = [*getattr(self, "polls", []), list(job_ids)]
        return {j: c for j, c in getattr(self, "controls", {}).items() if j in job_ids}


def test_heartbeat_extends_tracked_leases_about_every_third_of_the_lease():
    store = _HeartbeatStore()
    hb = Heartbeat(store, lease_s=0.3, worker_id="w")
    lease = _Lease(uuid.uuid4(), "w", 1)
    hb.start()
    try:
        guard = hb.track(lease)
        assert _poll(lambda: len(store.beats) >= 3)
        assert all(b == (lease, 0.3) for b in store.beats)
        assert not guard.lost
        hb.untrack(guard)
        n = len(store.beats)
        # A witness lease tracked now is first due one interval later, after the untracked
        # lease would have been due: two witness beats prove the heartbeat has cycled past it.
        witness = _Lease(uuid.uuid4(), "w", 1)
        hb.track(witness)
        assert _poll(lambda: sum(b[0] == witness for b in store.beats) >= 2)
        # at most one beat of the untracked lease was already under way
        assert sum(b[0] == lease for b in store.beats) <= n + 1
    finally:
        hb.stop()


def test_the_cancel_poll_reads_only_watched_jobs_and_stops_their_calls_before_the_beat():
    store = _HeartbeatStore()
    store.controls = {}
    hb = Heartbeat(store, lease_s=30, worker_id="w")  # first beat in 10 s
    watched, plain = _Lease(uuid.uuid4(), "w", 1), _Lease(uuid.uuid4(), "w", 1)
    hb.start()
    try:
        g_watched, g_plain = hb.track(watched), hb.track(plain)
        stopped = threading.Event()
        unwatch = g_watched.watch_cancel(stopped.set)
        assert _poll(lambda: len(getattr(store, "polls", [])) >= 2)
        assert all(ids == [watched.job_id] for ids in store.polls)
        assert not stopped.is_set()
        store.controls = {watched.job_id: {"kind": "cancel", "actor": "op"}}
        assert _poll(stopped.is_set)
        assert g_watched.cancel_requested and not g_plain.cancel_requested
        assert store.beats == []  # the poll is not a beat: no lease was extended
        unwatch()
        hb.untrack(g_watched)
        n = len(store.polls)
        # a witness watched later: once it has been polled twice, the unwatched job is polled
        # no more (at most one poll of it was already under way)
        witness = hb.track(_Lease(uuid.uuid4(), "w", 1))
        witness.watch_cancel(lambda: None)
        assert _poll(lambda: sum(witness.lease.job_id in ids for ids in store.polls) >= 2)
        assert sum(watched.job_id in ids for ids in store.polls[n:]) <= 1
        assert all(plain.job_id not in ids for ids in store.polls)
    finally:
        hb.stop()


def test_heartbeat_marks_the_guard_lost_on_lease_lost():
    store = _HeartbeatStore()
    hb = Heartbeat(store, lease_s=0.15, worker_id="w")
    lease = _Lease(uuid.uuid4(), "w", 2)
    store.lost.add(lease.job_id)
    hb.start()
    try:
        guard = hb.track(lease)
        assert _poll(lambda: guard.lost)
        assert guard.reason == "lease_lost"
        # The guard is marked lost before the lease leaves the tracked set (same beat).
        assert _poll(lambda: hb.tracked() == [])
    finally:
        hb.stop()


def test_heartbeat_retries_after_a_store_error():
    store = _HeartbeatStore()
    store.failing = True
    hb = Heartbeat(store, lease_s=0.3, worker_id="w")
    guard = hb.track(_Lease(uuid.uuid4(), "w", 1))
    guard.next_due = 0.0
    assert hb.run_once() == 0
    assert guard.failures == 1 and not guard.lost
    store.failing = False
    guard.next_due = 0.0
    assert hb.run_once() == 1
    assert guard.failures == 0


def _lease_lost_warnings(caplog) -> list:
    return [
        r
        for r in caplog.records
        if getattr(r, "action", None) == "lease_lost" and r.levelno >= logging.WARNING
    ]


def test_a_guard_settled_while_earlier_beats_ran_is_not_beaten(caplog):
    """run_once snapshots the due guards, then beats them one by one outside its lock."""
    caplog.set_level(logging.DEBUG, logger="protomolt_jobs")
    store = _HeartbeatStore()
    hb = Heartbeat(store, lease_s=30, worker_id="w")
    first = hb.track(_Lease(uuid.uuid4(), "w", 1))
    second = hb.track(_Lease(uuid.uuid4(), "w", 1))
    first.next_due = second.next_due = 0.0
    real = store.job_heartbeat

    def beat(lease, lease_s):
        if lease == first.lease:
            # meanwhile the second job settles: its row leaves RUNNING, its guard is untracked
            store.lost.add(second.lease.job_id)
            hb.untrack(second)
        real(lease, lease_s)

    store.job_heartbeat = beat
    assert hb.run_once() == 1
    assert [b[0] for b in store.beats] == [first.lease]
    assert not second.lost
    assert _lease_lost_warnings(caplog) == []


@pytest.mark.parametrize("how", ["untracked", "settling"])
def test_lease_lost_on_a_beat_racing_the_settlement_is_not_a_warning(caplog, how):
    caplog.set_level(logging.DEBUG, logger="protomolt_jobs")
    store = _HeartbeatStore()
    hb = Heartbeat(store, lease_s=30, worker_id="w")
    guard = hb.track(_Lease(uuid.uuid4(), "w", 1))
    guard.next_due = 0.0

    def beat(lease, lease_s):
        # the settling write commits while this beat is in flight
        if how == "untracked":
            hb.untrack(guard)
        else:
            guard.settling = True
        raise LeaseLost(lease.job_id, lease.owner, lease.attempt, "heartbeat")

    store.job_heartbeat = beat
    assert hb.run_once() == 0
    assert not guard.lost
    assert hb.tracked() == []
    assert _lease_lost_warnings(caplog) == []
    assert any(getattr(r, "action", None) == "heartbeat_after_settle" for r in caplog.records)


def test_a_stop_that_times_out_on_a_blocked_beat_never_leaves_two_threads():
    entered, unblock = threading.Event(), threading.Event()
    store = _HeartbeatStore()
    real = store.job_heartbeat

    def blocking(lease, lease_s):
        entered.set()
        unblock.wait(10)
        real(lease, lease_s)

    store.job_heartbeat = blocking
    hb = Heartbeat(store, lease_s=0.3, worker_id="blocked")
    name = "protomolt-jobs-heartbeat-blocked"

    def alive() -> int:
        return sum(1 for t in threading.enumerate() if t.name == name and t.is_alive())

    guard = hb.track(_Lease(uuid.uuid4(), "w", 1))
    guard.next_due = 0.0
    hb.start()
    try:
        assert entered.wait(5)
        hb.stop(timeout_s=0.05)  # the beat is blocked: the join times out
        hb.start()
        assert alive() == 1
        unblock.set()
        # the one thread carries on beating after a restart
        n = len(store.beats)
        assert _poll(lambda: len(store.beats) >= n + 2)
        assert alive() == 1
    finally:
        unblock.set()
        hb.stop()
    assert _poll(lambda: alive() == 0)

    # a stop that timed out and no restart: the thread still ends once its beat returns
    entered.clear()
    unblock.clear()
    hb.start()
    try:
        assert entered.wait(5)
        hb.stop(timeout_s=0.05)
        unblock.set()
        assert _poll(lambda: alive() == 0)
    finally:
        unblock.set()
        hb.stop()


def test_components_tolerate_stop_before_start_and_double_stop():
    hb = Heartbeat(_HeartbeatStore(), lease_s=1, worker_id="w")
    hb.stop()
    hb.start()
    hb.start()
    hb.stop()
    hb.stop()

    class _SweepStore:
        def job_sweep_expired(self, limit=500):
            from protomolt_jobs.store.records import SweepResult

            return SweepResult(requeued=0, dead=0)

    sweeper = Sweeper(_SweepStore(), config=JobsConfig(worker_id="w", sweep_interval_ms=10))
    sweeper.stop()
    sweeper.start()
    sweeper.start()
    sweeper.stop()
    sweeper.stop()


def test_sweeper_sweeps_on_its_own_cadence_and_survives_errors(caplog):
    calls = {"n": 0}

    class _SweepStore:
        def job_sweep_expired(self, limit=500):
            from protomolt_jobs.store.records import SweepResult

            calls["n"] += 1
            if calls["n"] == 2:
                raise StoreError("database is restarting")
            return SweepResult(requeued=1, dead=0)

    sweeper = Sweeper(_SweepStore(), config=JobsConfig(worker_id="w", sweep_interval_ms=20))
    caplog.set_level("INFO", logger="protomolt_jobs.sweeper")
    sweeper.start()
    try:
        assert _poll(lambda: calls["n"] >= 4)
    finally:
        sweeper.stop()
    actions = {r.action for r in caplog.records if hasattr(r, "action")}
    assert {"sweep_requeued", "sweep_failed"} <= actions


def test_crash_points_parse_and_match(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr(crashpoints.os, "_exit", exits.append)
    try:
        assert crashpoints.arm_for_tests({}) is None
        crashpoints.reached("after_claim")
        assert exits == []
        assert crashpoints.arm_for_tests({crashpoints.ENV_VAR: "after_checkpoint:embed"}) == (
            "after_checkpoint",
            "embed",
        )
        crashpoints.reached("after_checkpoint", "tokenize")
        assert exits == []
        crashpoints.reached("after_checkpoint", "embed")
        assert exits == [crashpoints.CRASH_EXIT_CODE]
        crashpoints.arm_for_tests({crashpoints.ENV_VAR: "after_claim"})
        crashpoints.reached("after_claim", "any-workflow")
        assert exits == [crashpoints.CRASH_EXIT_CODE] * 2
        with pytest.raises(ValueError, match=crashpoints.ENV_VAR):
            crashpoints.arm_for_tests({crashpoints.ENV_VAR: "somewhere"})
    finally:
        crashpoints.disarm()


def test_worker_process_entry_refuses_bad_configuration(capsys):
    from protomolt_jobs.worker.__main__ import main

    assert main(["--set", "worker_count=0", "--dsn", "postgresql://x/y"], environ={}) == 2
    assert "jobs.worker_count" in capsys.readouterr().err
    assert main([], environ={}) == 2
    assert "jobs.dsn is required" in capsys.readouterr().err
    assert main(["--set", "nonsense"], environ={"PROTOMOLT_JOBS_DSN": "postgresql://x/y"}) == 2
    assert "--set expects key=value" in capsys.readouterr().err
    env = {"PROTOMOLT_JOBS_DSN": "postgresql://x/y", crashpoints.ENV_VAR: "nowhere"}
    assert main([], environ=env) == 2
    assert crashpoints.ENV_VAR in capsys.readouterr().err


def test_a_stopping_process_group_starts_no_child():
    # stop() takes its list of children under the lock _spawn holds while it starts one, and
    # _spawn refuses once stopping: a restart racing a stop never leaves a child behind.
    from protomolt_jobs.worker.processes import WorkerProcesses

    group = WorkerProcesses(1, args=["--dsn", "postgresql://127.0.0.1:1/none"])
    group._stop.set()
    with pytest.raises(RuntimeError, match="stopping"):
        group._spawn(0)
    assert group.pids == []
    assert group.stop(1.0) is True
