"""DBOS Transact as a peer: the same three no-op gRPC calls as three durable ``@DBOS.step``s.

Modes (issue 9 item 2, to be fair to DBOS):

- ``queue`` with ``poll_s`` 1.0: a DBOS queue with its default poll interval, worker
  concurrency W, workflows enqueued from 4 threads;
- ``queue`` with ``poll_s`` 0.01: the same queue polled every 10 ms;
- ``direct``: plain ``DBOS.start_workflow`` from W threads, each waiting for its workflow's
  result before starting the next (concurrency W, no queue).

The system database is the benchmark database itself (schema ``dbos``). This module runs only
inside a :mod:`bench.child` process: DBOS is a process-wide singleton.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
from dbos import DBOS, DBOSConfig

from bench.child import ready_and_wait, rss_mib, wait_until
from bench.noop_grpc import CALL, SLOW, decode_text, encode_ping
from bench.pgdb import sqlalchemy_url

_channel: grpc.Channel | None = None
_slow = False


def _call(text: str) -> str:
    method = SLOW if _slow else CALL
    return decode_text(_channel.unary_unary(method)(encode_ping(text), timeout=30))


@DBOS.step()
def call_step(text: str) -> str:
    return _call(text)


@DBOS.workflow()
def three_steps(text: str) -> str:
    a = call_step(text)
    b = call_step(a)
    return call_step(b)


@DBOS.workflow()
def one_step(text: str) -> str:
    return call_step(text)


def _launch(params: dict) -> None:
    global _channel, _slow
    _channel = grpc.insecure_channel(params["target"])
    _slow = bool(params.get("slow"))
    config: DBOSConfig = {
        "name": "protomolt-bench",
        "system_database_url": sqlalchemy_url(params["dsn"]),
        "sys_db_pool_size": params.get("pool_max", max(20, params["workers"] + 4)),
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)


def _queue(params: dict):
    return DBOS.register_queue(
        "bench", worker_concurrency=params["workers"], polling_interval_sec=params["poll_s"]
    )


def _count_success(dsn: str, name_like: str):
    conn = psycopg.connect(dsn, autocommit=True)

    def count() -> int:
        return conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS' "
            "AND name LIKE %(n)s",
            {"n": name_like},
        ).fetchone()[0]

    return conn, count


def throughput(params: dict) -> dict:
    """N three-step workflows; jobs/s from first submit to last SUCCESS."""
    n, w, dsn = params["n"], params["workers"], params["dsn"]
    _launch(params)
    try:
        queue = _queue(params) if params["mode"] == "queue" else None
        ready_and_wait()
        t0 = time.time()
        polls = 0
        if queue is not None:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda i: queue.enqueue(three_steps, f"j{i}"), range(n)))
            conn, count = _count_success(dsn, "%three_steps")
            try:
                polls = wait_until(lambda: count() >= n, params.get("timeout_s", 1800), 0.2)
            finally:
                conn.close()
        else:

            def loop(k: int) -> None:
                for i in range(k, n, w):
                    DBOS.start_workflow(three_steps, f"j{i}").get_result()

            threads = [threading.Thread(target=loop, args=(k,)) for k in range(w)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        with psycopg.connect(dsn, autocommit=True) as conn:
            last_ms, done = conn.execute(
                "SELECT max(updated_at), count(*) FROM dbos.workflow_status "
                "WHERE status = 'SUCCESS' AND name LIKE '%%three_steps'"
            ).fetchone()
        polls += 1
        elapsed = last_ms / 1000.0 - t0
        return {
            "jobs": done,
            "elapsed_s": round(elapsed, 3),
            "jobs_per_s": round(done / elapsed, 1),
            "own_commits": polls,
        }
    finally:
        DBOS.destroy(destroy_registry=False)


def latency(params: dict) -> dict:
    """One one-step workflow at a time; submit -> started and submit -> SUCCESS."""
    n, dsn = params["n"], params["dsn"]
    _launch(params)
    try:
        queue = _queue(params) if params["mode"] == "queue" else None
        ready_and_wait()
        submits: dict[str, float] = {}
        for i in range(n):
            wid = str(uuid.uuid4())
            from dbos import SetWorkflowID

            with SetWorkflowID(wid):
                submits[wid] = time.time()
                if queue is not None:
                    handle = queue.enqueue(one_step, f"l{i}")
                else:
                    handle = DBOS.start_workflow(one_step, f"l{i}")
            # Poll for the result every 2 ms (DBOS polls once a second by default); the
            # latency itself comes from the row timestamps, this only paces the next submit.
            handle.get_result(polling_interval_sec=0.002)
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT workflow_uuid, coalesce(started_at_epoch_ms, created_at), updated_at "
                "FROM dbos.workflow_status WHERE name LIKE '%%one_step'"
            ).fetchall()
        running = [r[1] / 1000.0 - submits[r[0]] for r in rows if r[0] in submits]
        completed = [r[2] / 1000.0 - submits[r[0]] for r in rows if r[0] in submits]
        return {"running_s": running, "completed_s": completed}
    finally:
        DBOS.destroy(destroy_registry=False)


def memory(params: dict) -> dict:
    """``n`` concurrent one-step workflows whose step is the slow call; peak RSS of this process."""
    import resource

    n = params["n"]
    params = {**params, "slow": True, "pool_max": 24}
    _launch(params)
    try:
        ready_and_wait()
        base_mib = rss_mib()
        t0 = time.time()
        handles = [DBOS.start_workflow(one_step, f"m{i}") for i in range(n)]
        for h in handles:
            h.get_result()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "base_rss_mib": base_mib,
            "peak_rss_mib": round(peak_kib / 1024, 1),
            "elapsed_s": round(time.time() - t0, 2),
            "concurrent": n,
        }
    finally:
        DBOS.destroy(destroy_registry=False)
