"""``python -m protomolt_jobs.worker --processes 2``: two worker processes under one supervisor,
each claiming work with its own pool and listener, stopped cleanly by one SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from protomolt_jobs.store import JobStore
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.worker_proc import REPO_ROOT, enqueue, wait_for

# Bounds of the waits below, seconds. Each failing wait ends the test, and together they stay
# well inside pytest-timeout's 300 s even on a loaded CI machine.
READY_S = 60.0  # the supervisor's own bound on its children's ready lines is 60 s too
IN_FLIGHT_S = 60.0
COMPLETED_S = 30.0
# The supervisor gives its children 60 s after SIGTERM (then SIGKILLs them); a child with
# nothing in flight stops in about a second.
EXIT_S = 75.0


@pytest.fixture(scope="module")
def services():
    with TestServices() as svc:
        yield svc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purpose once reaped or defunct.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of the processes' stderr, for failure messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "--- supervisor and worker logs (tail) ---\n" + "\n".join(text.splitlines()[-lines:])


def _read_ready(proc: subprocess.Popen[str], log_path: Path) -> dict[str, Any]:
    """The supervisor's ready line, waited for at most READY_S."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(
                f"the supervisor printed no ready line within {READY_S:g}s "
                f"(exit status {proc.poll()})\n{_tail(log_path)}"
            )
        readable, _, _ = select.select([proc.stdout], [], [], min(remaining, 0.5))
        if readable:
            break
    # The ready line is written and flushed whole; EOF means the supervisor exited.
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(
            f"the supervisor exited (status {proc.wait(10)}) before its ready line\n"
            f"{_tail(log_path)}"
        )
    return json.loads(line)


def _start_supervisor(dsn: str, settings: dict[str, Any], log_path: Path) -> subprocess.Popen[str]:
    """``python -m protomolt_jobs.worker --processes 2`` with ``settings`` as ``--set`` keys.

    The supervisor and its children (which inherit its stderr and its process group) log to
    ``log_path``, which failure messages quote. Its own session lets :func:`_end_supervisor`
    kill the children too: SIGKILL to the supervisor alone would leave them running.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "protomolt_jobs.worker", "--processes", "2", "--dsn", dsn]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    with open(log_path, "w") as log_file:
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env=env,
            cwd=str(REPO_ROOT),
            start_new_session=True,
        )


def _end_supervisor(proc: subprocess.Popen[str]) -> None:
    """Kill what is left of the supervisor's process group and close its pipe."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.stdout is not None
    proc.stdout.close()


def test_two_processes_both_claim_work_and_stop_cleanly(fresh_dsn, services, tmp_path):
    services.reset()
    # Each process runs one job at a time (worker_count=1): two Embed calls in flight at once
    # means both processes claimed a job. Each call is held until the test has looked at both
    # jobs, so the state asserted cannot end before it is seen (a barrier let the calls go at
    # once, and a poll of the store could miss the few milliseconds before the jobs completed).
    held: list[str] = []
    held_lock = threading.Lock()
    release = threading.Event()

    def embed_held(request, context):
        with held_lock:
            held.append(request.text)
        # Bounded, so a test stuck elsewhere does not tie up server threads forever (the test
        # sets ``release`` on every way out).
        if not release.wait(IN_FLIGHT_S + COMPLETED_S):
            context.abort(grpc.StatusCode.ABORTED, "the test never released this Embed call")
        return services._do_embed(request, context)

    services.set_handler("Embed", embed_held)
    store = JobStore.open(fresh_dsn, max_size=2)
    log_path = tmp_path / "workers.log"
    settings = {"worker_id": "multi", "worker_count": 1, "poll_interval_ms": 200}
    proc = _start_supervisor(fresh_dsn, {**settings, "pool_max_size": 3}, log_path)
    jobs: list[Any] = []

    def state() -> str:
        rows = [store.job_get(j.job_id) for j in jobs]
        described = ", ".join(
            f"{(r.input or {}).get('text')}: {r.status} owner={r.lease_owner} attempt={r.attempt}"
            + (f" error={r.error!r}" if r.error else "")
            for r in rows
        )
        with held_lock:
            calls = sorted(held)
        return f"Embed calls seen: {calls}; jobs: {described}\n{_tail(log_path)}"

    try:
        ready = _read_ready(proc, log_path)
        assert ready["event"] == "ready" and ready["processes"] == 2
        pids = ready["pids"]
        assert len(set(pids)) == 2 and proc.pid not in pids

        # A budget far above the waits: a call held while the other process claims must not
        # hit its deadline (the job would go into retry backoff and the test would not say why).
        workflow = seed_workflow(services.target, review="invoke", deadline_ms=120_000)
        jobs += [enqueue(store, workflow, {"text": f"t{i}"}) for i in range(2)]

        # Both in flight at once, leased by the two processes (distinct worker ids).
        wait_for(
            lambda: len(list(held)) >= 2,
            timeout_s=IN_FLIGHT_S,
            what=lambda: f"both jobs' Embed calls in flight at once; {state()}",
        )
        rows = [store.job_get(j.job_id) for j in jobs]
        assert sorted(held) == ["t0", "t1"], state()
        assert [r.status for r in rows] == ["RUNNING", "RUNNING"], state()
        assert {r.lease_owner for r in rows} == {"multi-0", "multi-1"}, state()
        release.set()

        wait_for(
            lambda: all(store.job_get(j.job_id).status == "COMPLETED" for j in jobs),
            timeout_s=COMPLETED_S,
            what=lambda: f"both jobs COMPLETED after the Embed calls were released; {state()}",
        )

        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the supervisor did not exit within {EXIT_S:g}s of SIGTERM\n{_tail(log_path)}"
            ) from None
        assert status == 0, f"supervisor exit status {status}\n{_tail(log_path)}"
        wait_for(
            lambda: not any(_alive(p) for p in pids),
            timeout_s=10,
            interval_s=0.05,
            what=lambda: (
                f"the worker processes to end with their supervisor; alive: "
                f"{[p for p in pids if _alive(p)]}\n{_tail(log_path)}"
            ),
        )
    finally:
        release.set()
        _end_supervisor(proc)
        store.close()
        services.reset()


def test_workers_stop_on_their_own_when_the_supervisor_is_killed(fresh_dsn, tmp_path):
    # A SIGKILLed supervisor sends no SIGTERM: each child notices its parent changed (it was
    # started with --supervisor-pid) and stops gracefully instead of running orphaned.
    log_path = tmp_path / "workers.log"
    proc = _start_supervisor(fresh_dsn, {"worker_count": 1, "pool_max_size": 2}, log_path)
    try:
        pids = _read_ready(proc, log_path)["pids"]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait(10)
        wait_for(
            lambda: not any(_alive(p) for p in pids),
            timeout_s=30,
            interval_s=0.05,
            what=lambda: (
                f"the workers to stop after their supervisor was killed; alive: "
                f"{[p for p in pids if _alive(p)]}\n{_tail(log_path)}"
            ),
        )
        assert log_path.read_text(errors="replace").count("is gone; stopping") == 2, _tail(log_path)
    finally:
        _end_supervisor(proc)


def test_a_sigterm_while_the_workers_start_stops_the_supervisor_at_once(tmp_path):
    # The children hang in their first connection (a listener that never answers, and a
    # 120 s connect timeout), so the supervisor is still waiting for their ready lines when
    # SIGTERM comes: it stops them and exits 0 instead of waiting out its 60 s.
    import socket

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(16)  # never accepted: the handshake completes, the server never speaks
    dsn = f"postgresql://postgres@127.0.0.1:{mute.getsockname()[1]}/none"
    log_path = tmp_path / "workers.log"
    proc = _start_supervisor(dsn, {"connect_timeout_seconds": 120}, log_path)
    try:

        def children() -> list[int]:
            try:
                with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
                    return [int(p) for p in fh.read().split()]
            except OSError:
                return []

        # Both children started (and are stuck connecting): the supervisor is in its wait.
        wait_for(
            lambda: len(children()) == 2,
            timeout_s=30,
            interval_s=0.05,
            what=lambda: f"two worker children; have {children()}\n{_tail(log_path)}",
        )
        pids = children()
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the supervisor did not stop within 30 s of SIGTERM while starting\n"
                f"{_tail(log_path)}"
            ) from None
        assert status == 0, f"exit status {status}\n{_tail(log_path)}"
        wait_for(
            lambda: not any(_alive(p) for p in pids),
            timeout_s=15,
            interval_s=0.05,
            what=lambda: f"the children to end; alive {[p for p in pids if _alive(p)]}",
        )
    finally:
        mute.close()
        _end_supervisor(proc)
