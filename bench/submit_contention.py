"""Concurrent submits through ``JobStore.job_insert``: inserts per second with T threads.

Creates a fresh database, migrates it with the migrations of the ``protomolt_jobs`` on
``sys.path`` (run with ``PYTHONPATH=<a checkout>`` to measure another commit's store), then
T threads each insert N jobs (``--keys same``: every job with the default fairness key, as a
workflow that uses none of #18's keys; ``distinct``: one key per thread). Prints one JSON line.

    PYTHONPATH=/tmp/before python -m bench.submit_contention --threads 8 --n 200
"""

from __future__ import annotations

import argparse
import inspect
import json
import threading
import time
import uuid

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import protomolt_jobs
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.migrate import migrate
from protomolt_jobs.store.records import NewJob

BASE = "postgresql://postgres@127.0.0.1:5432/postgres"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--keys", choices=("same", "distinct"), default="same")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    fields = inspect.signature(NewJob).parameters
    results = []
    for _ in range(args.rounds):
        name = f"pmj_submit_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(BASE, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        dsn = make_conninfo(**{**conninfo_to_dict(BASE), "dbname": name})
        try:
            migrate(dsn)
            store = JobStore.open(dsn, max_size=args.threads)
            definition = {"name": "w", "steps": [{"name": "s", "target": "t"}]}
            barrier = threading.Barrier(args.threads + 1)

            def submit(
                t: int,
                store: JobStore = store,
                barrier: threading.Barrier = barrier,
                definition: dict = definition,
            ) -> None:
                barrier.wait()
                for _ in range(args.n):
                    extra = {}
                    if args.keys == "distinct" and "fairness_key" in fields:
                        extra["fairness_key"] = f"tenant-{t}"
                    store.job_insert(NewJob(uuid.uuid4(), "w", definition, {"text": "x"}, **extra))

            threads = [threading.Thread(target=submit, args=(t,)) for t in range(args.threads)]
            for th in threads:
                th.start()
            barrier.wait()
            started = time.perf_counter()
            for th in threads:
                th.join()
            elapsed = time.perf_counter() - started
            store.close()
            results.append(args.threads * args.n / elapsed)
        finally:
            with psycopg.connect(BASE, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print(
        json.dumps(
            {
                "store": protomolt_jobs.__file__,
                "threads": args.threads,
                "n": args.n,
                "keys": args.keys,
                "inserts_per_s": [round(r, 1) for r in results],
            }
        )
    )


if __name__ == "__main__":
    main()
