"""Scheduling scenarios (issue #18) on our store alone: ``fairness`` and ``cap``.

Both drive the real claim statement from claim threads that "run" each job by sleeping (or not)
and completing it through the fenced write, so what is measured is the order and the
concurrency the database hands out, not a step server.

- ``fairness``: tenant A queues 5,000 jobs, then tenant B 50; 4 claim threads drain them.
  Reported: how many of A's jobs started before B's last one (FIFO would be 5,000), claims/s.
- ``cap``: queue ``gpu`` with a fleet-wide ``max_running = 2``, 40 gpu jobs of 0.2 s and 400
  no-op default jobs, 3 "processes" (stores) x 8 claim threads serving both queues. Reported:
  the most gpu jobs RUNNING at once (seen by the threads), the default jobs/s with the capped
  backlog beside them, and the same run without the cap.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from protomolt_jobs.store import JobStore
from protomolt_jobs.store.migrate import migrate
from protomolt_jobs.store.queries import QUERIES

_DEFINITION = {"name": "bench-sched", "steps": [{"name": "noop"}]}


def _queue(dsn: str, rows: list[dict[str, Any]]) -> None:
    """Queue rows with the insert statement itself, in one transaction."""
    params = [
        {
            "job_id": uuid.uuid4(),
            "workflow_name": "bench-sched",
            "workflow_definition": Jsonb(_DEFINITION),
            "input": Jsonb({"tag": r["tag"]}),
            "status": "QUEUED",
            "max_attempts": 3,
            "error": None,
            "trace_context": None,
            "actor": "bench",
            "retention": None,
            "groups": None,
            "priority": 3,
            "queue": r.get("queue", "default"),
            "fairness_key": r.get("fairness_key", "default"),
            "stride": 1.0,
            "dedup_key": None,
            "deadline_s": None,
        }
        for r in rows
    ]
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(QUERIES["job_insert"], params)


def fairness(dsn: str, *, a_jobs: int = 5000, b_jobs: int = 50, loops: int = 4) -> dict:
    """Tenant A's flood, then tenant B's few: when do B's start? (see the module docstring)"""
    migrate(dsn)
    _queue(dsn, [{"tag": "A", "fairness_key": "A"} for _ in range(a_jobs)])
    _queue(dsn, [{"tag": "B", "fairness_key": "B"} for _ in range(b_jobs)])
    store = JobStore.open(dsn, max_size=loops + 1)
    order: list[str] = []
    lock = threading.Lock()
    b_left = threading.Event()

    def loop() -> None:
        while not b_left.is_set():
            job = store.job_claim("bench-fair", 60.0)
            if job is None:
                return
            with lock:
                order.append(job.fairness_key)
                if order.count("B") == b_jobs:
                    b_left.set()
            store.job_complete(job.lease, {}, "done")

    started = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(loops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    store.close()
    last_b = max(i for i, k in enumerate(order) if k == "B")
    return {
        "a_jobs": a_jobs,
        "b_jobs": b_jobs,
        "loops": loops,
        "a_started_before_last_b": sum(1 for k in order[:last_b] if k == "A"),
        "claims_per_s": round(len(order) / elapsed, 1),
    }


def cap(
    dsn: str,
    *,
    gpu_jobs: int = 40,
    gpu_s: float = 0.2,
    cpu_jobs: int = 400,
    processes: int = 3,
    loops: int = 8,
    max_running: int | None = 2,
) -> dict:
    """A capped queue beside an uncapped one (see the module docstring)."""
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM workflow_queue")
    _queue(dsn, [{"tag": "gpu", "queue": "gpu"} for _ in range(gpu_jobs)])
    _queue(dsn, [{"tag": "cpu"} for _ in range(cpu_jobs)])
    stores = [JobStore.open(dsn, max_size=loops + 1) for _ in range(processes)]
    limits = {"gpu": {"max_running": max_running}} if max_running else {}
    limited = stores[0].queue_limits_sync(limits)
    lock = threading.Lock()
    running = {"gpu": 0}
    peak = {"gpu": 0}
    done = {"gpu": 0, "cpu": 0}
    cpu_done_at: list[float] = []

    def loop(store: JobStore) -> None:
        while True:
            job = store.job_claim("bench-cap", 60.0, queues=["default", "gpu"], limited=limited)
            if job is None:
                with lock:
                    if done["gpu"] + done["cpu"] >= gpu_jobs + cpu_jobs:
                        return
                time.sleep(0.01)
                continue
            if job.queue == "gpu":
                with lock:
                    running["gpu"] += 1
                    peak["gpu"] = max(peak["gpu"], running["gpu"])
                time.sleep(gpu_s)
                with lock:
                    running["gpu"] -= 1
            store.job_complete(job.lease, {}, "done")
            with lock:
                done["gpu" if job.queue == "gpu" else "cpu"] += 1
                if job.queue != "gpu":
                    cpu_done_at.append(time.perf_counter())

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(s,)) for s in stores for _ in range(loops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    elapsed = time.perf_counter() - started
    for s in stores:
        s.close()
    cpu_elapsed = max(cpu_done_at) - started if cpu_done_at else 0.0
    return {
        "max_running": max_running,
        "gpu_peak_running": peak["gpu"],
        "cpu_jobs_per_s": round(cpu_jobs / cpu_elapsed, 1) if cpu_elapsed else None,
        "total_s": round(elapsed, 1),
    }


def main_json(result: dict) -> str:
    """One line of JSON (for logs)."""
    return json.dumps(result, sort_keys=True)
