"""Per-target permits: the cap holds under contention, targets are independent, waits cancel."""

from __future__ import annotations

import threading
import time

import pytest

from protomolt_jobs.worker.permits import PermitCancelled, TargetPermits


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_concurrent_per_target"):
        TargetPermits(0)
    with pytest.raises(ValueError, match="max_concurrent_per_target"):
        TargetPermits(True)


def test_cap_holds_under_contention():
    permits = TargetPermits(2)
    lock = threading.Lock()
    now = {"n": 0, "max": 0}

    def work():
        with permits.held("a:1"):
            with lock:
                now["n"] += 1
                now["max"] = max(now["max"], now["n"])
            time.sleep(0.01)  # the work under the permit: the sleep is the behaviour, not a wait
            with lock:
                now["n"] -= 1

    threads = [threading.Thread(target=work) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert now["max"] == 2
    assert permits.in_use("a:1") == 0


def test_targets_are_independent_and_none_needs_no_permit():
    permits = TargetPermits(1)
    permits.acquire("a:1")
    # another target is free, and "no target" (all steps done) never waits
    with permits.held("b:1"):
        assert permits.in_use("b:1") == 1
    with permits.held(None):
        assert permits.in_use("a:1") == 1
    permits.release("a:1")
    assert permits.in_use("a:1") == 0


def test_a_waiter_gives_up_when_cancelled():
    permits = TargetPermits(1)
    permits.acquire("a:1")
    cancel = threading.Event()
    polled = threading.Event()
    outcome: list[object] = []

    def cancelled() -> bool:
        # acquire polls this only while the permit is taken: the waiter is blocked
        polled.set()
        return cancel.is_set()

    def wait():
        try:
            permits.acquire("a:1", cancelled=cancelled)
            outcome.append("acquired")
        except PermitCancelled as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    assert polled.wait(5)
    assert outcome == []  # still waiting: the permit is held
    cancel.set()
    permits.wake_all()
    t.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], PermitCancelled)
    assert outcome[0].target == "a:1"
    assert permits.in_use("a:1") == 1


def test_release_of_an_unheld_permit_is_a_defect():
    with pytest.raises(RuntimeError, match="not held"):
        TargetPermits(1).release("a:1")
