"""Procrastinate as a peer: the same three no-op gRPC calls as three chained tasks.

Each task makes one call with ``grpc.aio`` (the tasks are coroutines, as Procrastinate
recommends for I/O; blocking sync tasks would serialise its event loop) and defers the next
task with the response text. One worker with ``concurrency=W`` and a connection pool of W+4
(issue 9 item 2); LISTEN/NOTIFY on, default polling fallback. Runs only inside a
:mod:`bench.child` process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import procrastinate
import psycopg

from bench import harness_cpu
from bench.child import emit, rss_mib
from bench.noop_grpc import CALL, SLOW, decode_text, encode_ping

_target = ""
_slow = False
_channel: grpc.aio.Channel | None = None


def _make_app(dsn: str, pool_max: int) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_max)
    )

    async def call(text: str) -> str:
        global _channel
        if _channel is None:
            _channel = grpc.aio.insecure_channel(_target)
        method = SLOW if _slow else CALL
        return decode_text(await _channel.unary_unary(method)(encode_ping(text), timeout=30))

    @app.task(name="step1")
    async def step1(text: str) -> None:
        await app.tasks["step2"].defer_async(text=await call(text))

    @app.task(name="step2")
    async def step2(text: str) -> None:
        await app.tasks["step3"].defer_async(text=await call(text))

    @app.task(name="step3")
    async def step3(text: str) -> None:
        await call(text)

    @app.task(name="single")
    async def single(text: str) -> None:
        await call(text)

    return app


async def _ready_and_wait() -> None:
    emit("ready")
    line = await asyncio.to_thread(input)
    if line.strip() != "go":
        raise SystemExit("bench parent went away before go")


async def _run(params: dict, body) -> dict:
    global _target, _slow
    _target, _slow = params["target"], bool(params.get("slow"))
    w = params["workers"]
    app = _make_app(params["dsn"], params.get("pool_max", w + 4))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=w, wait=True, install_signal_handlers=False)
        )
        try:
            await _ready_and_wait()
            return await body(app)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            if _channel is not None:
                await _channel.close()


async def _poll(
    conn: psycopg.AsyncConnection, query: str, n: int, timeout_s: float, poll_s: float
) -> int:
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        polls += 1
        row = await (await conn.execute(query)).fetchone()
        if row[0] >= n:
            return polls
        if time.monotonic() > deadline:
            raise TimeoutError(f"procrastinate: {row[0]}/{n} done after {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


def throughput(params: dict) -> dict:
    """N chained three-task jobs; jobs/s from first defer to the last step3 success."""
    n, dsn = params["n"], params["dsn"]

    async def body(app: procrastinate.App) -> dict:
        t0 = time.time()
        sem = asyncio.Semaphore(4)

        async def submit(i: int) -> None:
            async with sem:
                await app.tasks["step1"].defer_async(text=f"j{i}")

        await asyncio.gather(*(submit(i) for i in range(n)))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            polls = await _poll(
                conn,
                "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'step3' "
                "AND status = 'succeeded'",
                n,
                params.get("timeout_s", 1800),
                0.2,
            )
            row = await (
                await conn.execute(
                    "SELECT extract(epoch FROM max(e.at)), count(*) FROM procrastinate_events e "
                    "JOIN procrastinate_jobs j ON j.id = e.job_id "
                    "WHERE j.task_name = 'step3' AND e.type = 'succeeded'"
                )
            ).fetchone()
            harness_cpu.account(conn.info.backend_pid)
        elapsed = float(row[0]) - t0
        return {
            "jobs": row[1],
            "elapsed_s": round(elapsed, 3),
            "jobs_per_s": round(row[1] / elapsed, 1),
            "own_commits": polls + 1,
            # PostgreSQL CPU of the completion poll's backend (bench/harness_cpu.py).
            "harness_db_cpu_s": round(harness_cpu.SPENT_S, 3),
        }

    return asyncio.run(_run(params, body))


def latency(params: dict) -> dict:
    """One one-task job at a time; submit -> started and submit -> succeeded (event times)."""
    n, dsn = params["n"], params["dsn"]

    async def body(app: procrastinate.App) -> dict:
        submits: dict[int, float] = {}
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for i in range(n):
                t = time.time()
                job_id = await app.tasks["single"].defer_async(text=f"l{i}")
                submits[job_id] = t
                await _poll(
                    conn,
                    f"SELECT count(*) FROM procrastinate_jobs WHERE id = {int(job_id)} "
                    "AND status = 'succeeded'",
                    1,
                    60,
                    0.002,
                )
            rows = await (
                await conn.execute(
                    "SELECT e.job_id, e.type::text, extract(epoch FROM e.at) "
                    "FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
                    "WHERE j.task_name = 'single' AND e.type IN ('started', 'succeeded')"
                )
            ).fetchall()
        running = [float(at) - submits[j] for j, typ, at in rows if typ == "started"]
        completed = [float(at) - submits[j] for j, typ, at in rows if typ == "succeeded"]
        return {"running_s": running, "completed_s": completed}

    return asyncio.run(_run(params, body))


def memory(params: dict) -> dict:
    """``n`` concurrent slow one-task jobs; peak RSS of this (worker) process."""
    import resource

    n, dsn = params["n"], params["dsn"]
    # Pool capped: the cluster's max_connections (100) is shared with everything else.
    params = {**params, "slow": True, "workers": n, "pool_max": 24}

    async def body(app: procrastinate.App) -> dict:
        base_mib = rss_mib()
        t0 = time.time()
        for i in range(n):
            await app.tasks["single"].defer_async(text=f"m{i}")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await _poll(
                conn,
                "SELECT count(*) FROM procrastinate_jobs WHERE "
                "task_name = 'single' AND status = 'succeeded'",
                n,
                600,
                0.2,
            )
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "base_rss_mib": base_mib,
            "peak_rss_mib": round(peak_kib / 1024, 1),
            "elapsed_s": round(time.time() - t0, 2),
            "concurrent": n,
        }

    return asyncio.run(_run(params, body))
