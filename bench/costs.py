"""CPU per store call, client and server side: ``python -m bench.costs [--n N]``.

One store with a pool of one connection (so one server backend) runs each hot call ``N``
times in a row on a fresh database: the claim, a checkpoint, the heartbeat (the smallest
fenced UPDATE), the completion with its last checkpoint; submits go through the Submitter of
a second store. Client CPU is this thread's ``time.thread_time``; server CPU is the
backend's ``utime + stime`` from ``/proc/<pid>/stat`` (Linux; 10 ms ticks, so use N >= 500).
A bare ``SELECT 1`` on a plain psycopg connection is the floor of a round trip.
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg

from bench.noop_grpc import NoopServer
from bench.pgdb import BenchDatabase

_TICK = os.sysconf("SC_CLK_TCK")


def _backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _backend_pid(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.costs")
    p.add_argument("--n", type=int, default=1000)
    args = p.parse_args(argv)
    n = args.n

    from bench import ours
    from protomolt_jobs.store import JobStore

    rows: list[tuple[str, float, float]] = []
    with NoopServer(threads=2) as srv, BenchDatabase("costs") as db:
        engine = ours._Engine({"dsn": db.dsn, "pool_max": 1}, worker_count=1, per_target=8)
        store = JobStore.open(db.dsn, max_size=1)
        try:
            definition = ours.workflow(srv.target)
            with engine.store.pool.connection() as conn:
                submit_pid = _backend_pid(conn)
            with store.pool.connection() as conn:
                pid = _backend_pid(conn)
            engine.submit(definition, "warm")

            def measure(label: str, backend: int, call) -> None:
                c0, s0 = time.thread_time(), _backend_cpu_s(backend)
                for i in range(n):
                    call(i)
                rows.append(
                    (label, (time.thread_time() - c0) / n, (_backend_cpu_s(backend) - s0) / n)
                )

            measure("submit", submit_pid, lambda i: engine.submit(definition, f"p{i}"))
            leases = [store.job_claim("costs", 60).lease]  # the warm-up job
            measure("claim", pid, lambda i: leases.append(store.job_claim("costs", 60).lease))
            entry = {"name": "s1", "skipped": False, "response": {"v": "x"}}
            measure("checkpoint", pid, lambda i: store.job_checkpoint(leases[i], dict(entry)))
            measure("heartbeat", pid, lambda i: store.job_heartbeat(leases[i], 60))
            last = dict(entry, name="s3")
            measure(
                "complete (+ last checkpoint)",
                pid,
                lambda i: store.job_complete(leases[i], {"ok": True}, "done", final_entry=last),
            )
            with psycopg.connect(db.dsn, autocommit=True) as conn:
                bare = _backend_pid(conn)
                measure("bare SELECT 1 (psycopg)", bare, lambda i: conn.execute("SELECT 1"))
        finally:
            store.close()
            engine.close()
    print(f"{'call':32s} {'client CPU ms':>14s} {'server CPU ms':>14s}   (n = {n} each)")
    for label, client, server in rows:
        print(f"{label:32s} {1000 * client:14.3f} {1000 * server:14.3f}")


if __name__ == "__main__":
    main()
