"""Scheduling acceptance with worker processes (``python -m protomolt_jobs.worker``), real
PostgreSQL and a gRPC step server that logs when each call starts.

Jobs are one-step workflows (``Tokenize``); the request's ``text`` names the job
(``"A 17"``, ``"gpu 3"``), so the server's log is the order (and time) in which jobs started.
Backlogs go in through the insert statement itself in one transaction (the test is about
claim order, not the submit path).
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

from protomolt_jobs.store.queries import QUERIES
from tests.support.grpc_servers import TestServices, schema_for
from tests.support.worker_proc import WorkerProcess, wait_for

_FAST = {
    "poll_interval_ms": 100,
    "sweep_interval_ms": 200,
    "lease_seconds": 30,
    "pool_max_size": 10,
}


class StartLog:
    """Records (monotonic time, text) of every Tokenize call and the calls in flight per
    queue prefix (the first word of the text)."""

    def __init__(self, services: TestServices, *, seconds: dict[str, float] | None = None):
        self.services = services
        self.seconds = seconds or {}
        self.lock = threading.Lock()
        self.starts: list[tuple[float, str]] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        services.set_handler("Tokenize", self.handle)

    def handle(self, request, context):
        word = request.text.split()[0]
        with self.lock:
            self.starts.append((time.monotonic(), request.text))
            self.in_flight[word] = self.in_flight.get(word, 0) + 1
            self.max_in_flight[word] = max(self.max_in_flight.get(word, 0), self.in_flight[word])
        try:
            delay = self.seconds.get(word, 0.0)
            if delay:
                time.sleep(delay)  # the step's work: the sleep is the behaviour
            return self.services._do_tokenize(request, context)
        finally:
            with self.lock:
                self.in_flight[word] -= 1

    def texts(self) -> list[str]:
        with self.lock:
            return [t for _, t in self.starts]

    def count(self, word: str) -> int:
        with self.lock:
            return sum(1 for _, t in self.starts if t.split()[0] == word)

    def times(self, word: str) -> list[float]:
        with self.lock:
            return [at for at, t in self.starts if t.split()[0] == word]


def one_step(target: str) -> dict:
    return {
        "name": "one-step",
        # The sources form: a tenth of the descriptor set's size, and 5,000 rows carry it.
        "schema": schema_for("sources"),
        "inputType": "jobs.test.Text",
        "steps": [
            {
                "name": "tokenize",
                "target": target,
                "method": "jobs.test.Tokenizer/Tokenize",
                "rules": ["text = input.text"],
            }
        ],
    }


def insert_jobs(dsn: str, definition: dict, rows: list[dict]) -> None:
    """Queue one-step jobs (``text`` names each) with the job_insert statement, one transaction."""
    snapshot = Jsonb(definition)
    params = [
        {
            "job_id": uuid.uuid4(),
            "workflow_name": "one-step",
            "workflow_definition": snapshot,
            "input": Jsonb({"text": r["text"]}),
            "status": "QUEUED",
            "max_attempts": 3,
            "error": None,
            "priority": r.get("priority", 3),
            "queue": r.get("queue", "default"),
            "fairness_key": r.get("fairness_key", "default"),
            "stride": 1.0,
            "dedup_key": None,
            "deadline_s": None,
            "trace_context": None,
            "actor": "api",
            "groups": None,
            "retention": None,
        }
        for r in rows
    ]
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(QUERIES["job_insert"], params)


def fleet(dsn: str, n: int, **keys) -> list[WorkerProcess]:
    procs = [WorkerProcess(dsn, worker_id=f"sched-{i}", **{**_FAST, **keys}) for i in range(n)]
    try:
        for p in procs:
            p.start()
    except BaseException:
        for p in procs:
            p.close()
        raise
    return procs


def close_all(procs: list[WorkerProcess]) -> None:
    for p in procs:
        p.close()


def test_a_tenant_flood_does_not_delay_another_tenants_runs(fresh_dsn, services):
    log = StartLog(services)
    definition = one_step(services.target)
    insert_jobs(
        fresh_dsn, definition, [{"text": f"A {i}", "fairness_key": "A"} for i in range(5000)]
    )
    insert_jobs(fresh_dsn, definition, [{"text": f"B {i}", "fairness_key": "B"} for i in range(50)])
    procs = fleet(fresh_dsn, 1, worker_count=4)
    try:
        wait_for(lambda: log.count("B") == 50, timeout_s=120, interval_s=0.1)
    finally:
        close_all(procs)
    texts = log.texts()
    last_b = max(i for i, t in enumerate(texts) if t.startswith("B "))
    a_before_last_b = sum(1 for t in texts[:last_b] if t.startswith("A "))
    assert a_before_last_b < 500, f"B's last run started after {a_before_last_b} of A's"
    # Today's FIFO would have started all 5,000 of A first; fair interleaving is about 1:1.
    assert a_before_last_b <= 80, a_before_last_b


def test_a_priority_one_job_submitted_last_starts_within_the_next_five(fresh_dsn, services):
    log = StartLog(services)
    definition = one_step(services.target)
    insert_jobs(fresh_dsn, definition, [{"text": f"P3 {i}"} for i in range(1000)])
    insert_jobs(fresh_dsn, definition, [{"text": "P1 urgent", "priority": 1}])
    procs = fleet(fresh_dsn, 1, worker_count=2)
    try:
        wait_for(lambda: log.count("P1") == 1, timeout_s=60, interval_s=0.05)
    finally:
        close_all(procs)
    assert log.texts().index("P1 urgent") < 5


def test_a_capped_queue_never_exceeds_its_cap_across_processes(fresh_dsn, services, store):
    # cpu jobs take 50 ms: one at a time, 200 of them would take 10 s.
    log = StartLog(services, seconds={"gpu": 1.0, "cpu": 0.05})
    definition = one_step(services.target)
    insert_jobs(fresh_dsn, definition, [{"text": f"gpu {i}", "queue": "gpu"} for i in range(40)])
    procs = fleet(
        fresh_dsn,
        3,
        worker_count=8,
        queues="default,gpu",
        queue_limits='{"gpu": {"max_running": 2}}',
    )
    try:
        wait_for(lambda: log.count("gpu") >= 4, timeout_s=30, interval_s=0.05)
        # Default-queue jobs submitted behind the gpu backlog run at once, at full speed.
        started = time.monotonic()
        insert_jobs(fresh_dsn, definition, [{"text": f"cpu {i}"} for i in range(200)])
        wait_for(
            lambda: len(store.job_list(status="COMPLETED", queue="default", limit=500)) == 200,
            timeout_s=60,
            interval_s=0.1,
        )
        cpu_elapsed = time.monotonic() - started
        gpu_done_meanwhile = log.count("gpu")
        wait_for(
            lambda: len(store.job_list(status="COMPLETED", queue="gpu", limit=500)) == 40,
            timeout_s=60,
            interval_s=0.2,
        )
    finally:
        close_all(procs)
    assert log.max_in_flight["gpu"] == 2, log.max_in_flight
    assert gpu_done_meanwhile < 40, "the cpu jobs should not have waited for the gpu backlog"
    assert cpu_elapsed < 10, cpu_elapsed
    assert log.max_in_flight["cpu"] > 2, log.max_in_flight


def test_a_start_rate_holds_over_ten_seconds_of_backlog(fresh_dsn, services):
    log = StartLog(services)
    definition = one_step(services.target)
    insert_jobs(fresh_dsn, definition, [{"text": f"slow {i}", "queue": "slow"} for i in range(150)])
    procs = fleet(
        fresh_dsn,
        2,
        worker_count=4,
        queues="slow",
        queue_limits='{"slow": {"max_starts_per_second": 5}}',
    )
    try:
        wait_for(lambda: log.count("slow") >= 1, timeout_s=30, interval_s=0.02)
        # Ten seconds of backlog, measured from 2 s after the first call: each worker process
        # compiles the workflow's sources once before its first call, so the first calls
        # bunch up after claims made during the compile.
        start = log.times("slow")[0] + 2.0
        wait_for(lambda: time.monotonic() >= start + 10.5, timeout_s=40, interval_s=0.1)
    finally:
        close_all(procs)
    in_window = [t for t in log.times("slow") if start <= t < start + 10.0]
    assert 45 <= len(in_window) <= 55, len(in_window)


def test_a_capped_queues_slot_held_by_a_sigkilled_worker_is_freed_by_the_sweeper(
    fresh_dsn, services, store
):
    # gpu: max_running = 1. The worker running the only gpu job is SIGKILLed mid-step: its
    # row stays RUNNING (holding the slot) until its lease expires; the sweeper then requeues
    # it, and a second worker runs it and the job behind it.
    log = StartLog(services, seconds={"gpu": 1.0})
    definition = one_step(services.target)
    insert_jobs(fresh_dsn, definition, [{"text": f"gpu {i}", "queue": "gpu"} for i in range(2)])
    keys = {**_FAST, "lease_seconds": 2, "queues": "gpu"}
    keys["queue_limits"] = '{"gpu": {"max_running": 1}}'
    doomed = WorkerProcess(fresh_dsn, worker_id="sched-doomed", **keys)
    doomed.start()
    try:
        wait_for(lambda: log.count("gpu") >= 1, timeout_s=30, interval_s=0.02)
        doomed.kill()
    finally:
        doomed.close()
    (held,) = store.job_list(status="RUNNING", queue="gpu")
    with WorkerProcess(fresh_dsn, worker_id="sched-heir", **keys):
        wait_for(
            lambda: len(store.job_list(status="COMPLETED", queue="gpu")) == 2,
            timeout_s=60,
            interval_s=0.2,
        )
    history = store.job_history(held.job_id).transitions
    assert any(t.kind == "sweep" and t.actor == "sweeper" for t in history), history
    assert store.job_get(held.job_id).attempt == 2
