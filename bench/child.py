"""One system under test in its own process, and the parent's handle on it.

Protocol (JSON lines on the child's stdout, one word on its stdin):

1. the child sets the system up (pools, workers, queues) and prints ``{"event": "ready"}``;
2. the parent measures the idle commit rate, samples ``xact_commit`` and writes ``go``;
3. the child runs the scenario, prints ``{"event": "result", ...}``, tears down and exits.

Run as ``python -m bench.child <system> <scenario> '<json params>'``; ``system`` is ``ours``,
``dbos`` or ``procrastinate``.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.pgdb import XactCounter

#: Default seconds between a child's ready and the idle window (see run_child).
SETTLE_S = 4.0

SYSTEMS = {
    "ours": "bench.ours",
    "dbos": "bench.peer_dbos",
    "procrastinate": "bench.peer_procrastinate",
}


def emit(event: str, **fields: Any) -> None:
    """Print one protocol line to the parent."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def ready_and_wait() -> None:
    """Tell the parent the system is up, then block until it says ``go``."""
    emit("ready")
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit("bench parent went away before go")


def rss_mib() -> float:
    """Resident set size of this process now, MiB (``/proc/self/statm``: no psutil needed)."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def wait_until(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> int:
    """Call ``check`` every ``poll_s`` until it is true; returns how many times it was called.

    :raises TimeoutError: still false after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    calls = 0
    while True:
        calls += 1
        if check():
            return calls
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s:.0f} s")
        time.sleep(poll_s)


def run_child(
    system: str,
    scenario: str,
    params: dict,
    *,
    dbname: str | None,
    idle_window_s: float = 3.0,
    settle_s: float = SETTLE_S,
    timeout_s: float = 1800.0,
    on_go: Callable[[], None] | None = None,
) -> dict:
    """Run one system in a child process and return its result, with ``xact_commit`` accounting.

    Adds ``commits`` (raw delta from go to exit), ``idle_rate`` (commits/s before go) and
    ``commits_net`` (delta minus idle rate x run time minus the child's own polls) when
    ``dbname`` is given. ``on_go`` is called just before ``go`` (the start of the measured
    window; e.g. :meth:`bench.dbprobe.ClusterProbe.start`).

    :raises RuntimeError: the child failed or broke the protocol (its stderr is passed through).
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.child", system, scenario, json.dumps(params)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parent.parent),
        env=env,
    )
    counter = XactCounter(dbname) if dbname else None
    try:
        msg = _read_event(proc)
        if msg.get("event") != "ready":
            raise RuntimeError(f"{system}/{scenario}: expected ready, got {msg}")
        idle_rate, start = (0.0, None)
        if counter:
            # Let start-up bursts reach the statistics before the idle window: an idle backend
            # reports its counters up to several seconds late (PostgreSQL 15 measured: a 16-loop
            # start-up still showed as 5 extra commits/s 2.5 s after ready, none after 4 s).
            # Counted in the idle rate, they would be subtracted from the run as if idle.
            time.sleep(settle_s)
            idle_rate, start = counter.idle_rate(idle_window_s)
        if on_go is not None:
            on_go()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = _read_event(proc)
        if result.get("event") != "result":
            raise RuntimeError(f"{system}/{scenario}: expected result, got {result}")
        proc.wait(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{system}/{scenario}: child exited {proc.returncode}")
        if counter and start is not None:
            counter.wait_idle()
            end = counter.sample()
            raw = end.commits - start.commits
            net = raw - idle_rate * (end.at - start.at) - result.get("own_commits", 0)
            result.update(commits=raw, idle_rate=round(idle_rate, 2), commits_net=net)
        return result
    finally:
        if counter:
            counter.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _read_event(proc: subprocess.Popen) -> dict:
    while True:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            raise RuntimeError(f"bench child exited {proc.returncode} before answering")
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
        # Libraries print to stdout too (DBOS banners); pass them through to stderr.
        sys.stderr.write(line + "\n")


class _ExtrasFormatter(logging.Formatter):
    """Message plus the record's structured fields (``action``, ``error``, ``job_id``, ...)."""

    _plain = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        extras = {k: v for k, v in vars(record).items() if k not in self._plain}
        return f"{super().format(record)} {extras}" if extras else super().format(record)


def main() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ExtrasFormatter("%(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    system, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    module = importlib.import_module(SYSTEMS[system])
    result = getattr(module, scenario)(json.loads(raw))
    emit("result", **result)


if __name__ == "__main__":
    main()
