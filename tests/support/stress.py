"""One start/stop stress for every background service (River's ``startstoptest.Stress``).

``stress(make)`` runs, against services built by ``make()``:

- stop before start, and a double stop (both return True at once);
- start and stop from many threads at the same time, several rounds;
- a stop racing a start (thread A starts, thread B stops at once);
- a final stop that returns True, leaves state STOPPED and no thread of the service alive;
- a start after all that, which reaches RUNNING (the service still works), and its stop.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from protomolt_jobs.service import ServiceState


def _alive(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def wait_until(condition: Callable[[], object], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.005)


def stress(make: Callable[[], object], *, threads: int = 6, rounds: int = 3) -> None:
    """Hammer ``make()``'s start/stop (see the module docstring); raise AssertionError."""
    fresh = make()
    assert fresh.stop() is True  # never started
    assert fresh.stop() is True  # and again
    assert fresh.health().state is ServiceState.STOPPED

    service = make()
    prefix = "protomolt-jobs-"
    before = set(_alive(prefix))
    errors: list[BaseException] = []

    def hammer(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(rounds):
                if rnd.random() < 0.5:
                    service.start()
                else:
                    service.stop()
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test
            errors.append(exc)

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    assert not any(t.is_alive() for t in workers), "a start or stop never returned"
    assert errors == []

    # a stop racing a start
    starter = threading.Thread(target=service.start)
    starter.start()
    assert service.stop() is True
    starter.join(60)
    assert service.stop() is True
    assert service.stop() is True  # double stop
    assert service.health().state is ServiceState.STOPPED
    wait_until(lambda: set(_alive(prefix)) <= before)

    # still works
    service.start()
    service.start()
    try:
        wait_until(lambda: service.health().state is ServiceState.RUNNING)
    finally:
        assert service.stop() is True
    assert service.health().state is ServiceState.STOPPED
    wait_until(lambda: set(_alive(prefix)) <= before)
