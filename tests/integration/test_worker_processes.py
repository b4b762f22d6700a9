"""``python -m protomolt_jobs.worker --processes 2``: two worker processes under one supervisor,
each claiming work with its own pool and listener, stopped cleanly by one SIGTERM."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from protomolt_jobs.store import JobStore
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.worker_proc import REPO_ROOT, enqueue, wait_for


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


def test_two_processes_both_claim_work_and_stop_cleanly(fresh_dsn, services):
    services.reset()
    both_in_flight = threading.Barrier(2, timeout=60)

    def embed_waits_for_the_other(request, context):
        # Each process runs one job at a time (worker_count=1): two calls in flight at once
        # means both processes claimed a job.
        both_in_flight.wait()
        return services._do_embed(request, context)

    services.set_handler("Embed", embed_waits_for_the_other)
    store = JobStore.open(fresh_dsn, max_size=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "protomolt_jobs.worker", "--processes", "2", "--dsn", fresh_dsn]
    for key, value in {
        "worker_id": "multi",
        "worker_count": 1,
        "poll_interval_ms": 200,
        "pool_max_size": 3,
    }.items():
        argv += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO_ROOT))
    try:
        readable, _, _ = select.select([proc.stdout], [], [], 60)
        assert readable, "the supervisor printed no ready line"
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and ready["processes"] == 2
        pids = ready["pids"]
        assert len(set(pids)) == 2 and proc.pid not in pids

        jobs = [
            enqueue(store, seed_workflow(services.target, review="invoke"), {"text": f"t{i}"})
            for i in range(2)
        ]
        # Both in flight at once, leased by the two processes (distinct worker ids).
        owners = wait_for(
            lambda: (
                {
                    r.lease_owner
                    for r in (store.job_get(j.job_id) for j in jobs)
                    if r.status == "RUNNING" and services.calls("Embed") >= 2
                }
                == {"multi-0", "multi-1"}
            ),
            timeout_s=60,
        )
        assert owners
        wait_for(
            lambda: all(store.job_get(j.job_id).status == "COMPLETED" for j in jobs),
            timeout_s=60,
        )

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), "a worker process outlived its supervisor"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        store.close()
        services.reset()
