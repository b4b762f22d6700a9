"""protomolt-jobs under the benchmark: the real store, submitter and worker on the bench database.

Runs only inside a :mod:`bench.child` process (one system per process), except :func:`scale`,
which the parent calls directly (it starts no worker).

- throughput: N jobs of a three-step workflow (three no-op unary gRPC calls to the loopback
  server) submitted through :class:`protomolt_jobs.submitter.Submitter` from 4 threads, while a
  :class:`protomolt_jobs.worker.Worker` with ``worker_count=W`` and a
  :class:`~protomolt_jobs.worker.Sweeper` run; first submit -> last ``completed_at``.
- latency: one one-step job at a time; a bench-only trigger stamps each status change with
  ``clock_timestamp()`` so submit -> RUNNING and submit -> COMPLETED come from the database.
- memory: 256 one-step jobs whose step is the slow call, ``worker_count=256``; peak RSS.
- scale: claim and sweep latency with 1k / 100k / 1M terminal rows plus 1k queued.

No Kafka: the relay stays off and outbox rows stay PENDING (the relay's cost is not counted).
"""

from __future__ import annotations

import json
import logging
import resource
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg

from bench.child import ready_and_wait, rss_mib, wait_until
from bench.noop_grpc import SERVICE, descriptor_set_b64
from bench.pgdb import relation_sizes
from bench.stats import summary_ms

log = logging.getLogger("protomolt_jobs.bench")

_DONE = "('COMPLETED', 'FAILED', 'DEAD')"


def workflow(target: str, *, steps: int = 3, slow: bool = False, name: str = "bench-noop") -> dict:
    """The workflow envelope: ``steps`` calls of ``Noop/Call`` (or ``Noop/Slow``), each passing
    the previous response's ``text`` on."""
    method = f"{SERVICE}/{'Slow' if slow else 'Call'}"
    out = []
    for i in range(steps):
        source = "input" if i == 0 else f"s{i - 1}"
        out.append(
            {
                "name": f"s{i}",
                "target": target,
                "method": method,
                "rules": [f"text = {source}.text"],
            }
        )
    return {
        "name": name,
        "schema": {"descriptorSetBase64": descriptor_set_b64()},
        "inputType": "bench.v1.Ping",
        "steps": out,
    }


class _Channels:
    """A channel per ``(target, tls)`` for the process's lifetime: the channel factory the jobs
    role gets from its node (``host/channels.py``), so the engine reuses channels across jobs
    as it does in the product instead of opening one per job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, bool], grpc.Channel] = {}

    def channel(self, target: str, tls: bool) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get((target, tls))
            if ch is None:
                if tls:
                    ch = grpc.secure_channel(target, grpc.ssl_channel_credentials())
                else:
                    ch = grpc.insecure_channel(target)
                self._channels[(target, tls)] = ch
            return ch

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()


class _Engine:
    """Store, submitter, worker and sweeper of one child process."""

    def __init__(self, params: dict, *, worker_count: int, per_target: int) -> None:
        from protomolt_jobs.config import JobsConfig
        from protomolt_jobs.store import JobStore
        from protomolt_jobs.store.migrate import migrate
        from protomolt_jobs.submitter import Submitter
        from protomolt_jobs.worker import Sweeper, Worker
        from protomolt_jobs.workflow.types import Runtime

        dsn = params["dsn"]
        migrate(dsn)
        pool_max = params.get("pool_max", min(worker_count + 4, 20))
        self.config = JobsConfig(
            dsn=dsn,
            worker_id=f"bench-{uuid.uuid4().hex[:8]}",
            worker_count=worker_count,
            lease_seconds=params.get("lease_s", 60.0),
            max_concurrent_per_target=per_target,
            pool_max_size=pool_max,
        )
        self.store = JobStore.open(dsn, max_size=pool_max)
        self.calls = _count_calls(self.store)
        self.channels = _Channels()
        self.runtime = Runtime(channel_factory=self.channels.channel)
        self.submitter = Submitter(self.store, None, self.runtime, self.config.max_attempts)
        self.worker = Worker(self.store, runtime=self.runtime, config=self.config, dsn=dsn)
        self.sweeper = Sweeper(self.store, config=self.config)
        self.dsn = dsn

    def start(self) -> None:
        self.worker.start()
        self.sweeper.start()

    def submit(self, definition: dict, text: str) -> str:
        """Submit one job; returns its id. :raises RuntimeError: the submitter refused it."""
        outcome = self.submitter.submit(workflow=definition, input={"text": text})
        if not outcome.ok:
            raise RuntimeError(f"bench submit refused: {outcome.reason}: {outcome.error}")
        return outcome.job_id

    def close(self) -> None:
        try:
            self.worker.stop(10.0)
            self.sweeper.stop(5.0)
        finally:
            self.store.close()
            self.channels.close()


def _count_calls(store: object) -> dict[str, int]:
    """Wrap each ``job_*``/``outbox_*`` method of this store instance with a call counter (each
    is one transaction); ``job_claim`` that finds nothing counts as ``job_claim:empty``."""
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def wrap(name: str, fn):
        def counted(*args, **kwargs):
            result = fn(*args, **kwargs)
            key = f"{name}:empty" if name == "job_claim" and result is None else name
            with lock:
                calls[key] = calls.get(key, 0) + 1
            return result

        return counted

    for name in dir(store):
        if name.startswith(("job_", "outbox_")):
            setattr(store, name, wrap(name, getattr(store, name)))
    return calls


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _counts(dsn: str) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM workflow_run GROUP BY status").fetchall()
    return {status: int(n) for status, n in rows}


def throughput(params: dict) -> dict:
    """N three-step jobs; jobs/s from first submit to the last ``completed_at``."""
    n, w = params["n"], params["workers"]
    engine = _Engine(params, worker_count=w, per_target=max(8, w))
    definition = workflow(params["target"])
    try:
        engine.start()
        ready_and_wait()
        t0 = time.time()
        cpu0 = _cpu_s()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: engine.submit(definition, f"j{i}"), range(n)))
        with psycopg.connect(engine.dsn, autocommit=True) as conn:

            def done() -> bool:
                q = f"SELECT count(*) FROM workflow_run WHERE status IN {_DONE}"
                return conn.execute(q).fetchone()[0] >= n

            polls = wait_until(done, params.get("timeout_s", 1800), 0.2)
            cpu_s = _cpu_s() - cpu0
            last = conn.execute(
                "SELECT extract(epoch FROM max(completed_at)) FROM workflow_run"
            ).fetchone()[0]
    finally:
        engine.close()
    counts = _counts(params["dsn"])
    elapsed = float(last) - t0
    completed = counts.get("COMPLETED", 0)
    return {
        "jobs": completed,
        "not_completed": {k: v for k, v in counts.items() if k != "COMPLETED"},
        "elapsed_s": round(elapsed, 3),
        "jobs_per_s": round(completed / elapsed, 1),
        "own_commits": polls + 2,
        # CPU of this process (submitters, worker, gRPC threads) per job: one process, one GIL.
        "cpu_ms_per_job": round(1000 * cpu_s / max(1, completed), 2),
        "store_calls_per_job": {
            k: round(v / max(1, n), 2) for k, v in sorted(engine.calls.items())
        },
    }


_TRIGGER = """
CREATE TABLE bench_transition (job_id uuid, status text, at timestamptz);
CREATE FUNCTION bench_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_transition VALUES (NEW.job_id, NEW.status, clock_timestamp());
  RETURN NEW;
END $$;
CREATE TRIGGER bench_transition AFTER UPDATE OF status ON workflow_run FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION bench_transition();
"""


def latency(params: dict) -> dict:
    """One one-step job at a time at idle; submit -> RUNNING and submit -> COMPLETED."""
    n = params["n"]
    # A short lease: a job whose settle fails is swept back within seconds, not a minute.
    engine = _Engine({**params, "lease_s": 10.0}, worker_count=params["workers"], per_target=8)
    definition = workflow(params["target"], steps=1)
    try:
        with psycopg.connect(engine.dsn, autocommit=True) as conn:
            conn.execute(_TRIGGER)
        engine.start()
        ready_and_wait()
        submits: dict[str, float] = {}
        with psycopg.connect(engine.dsn, autocommit=True) as conn:
            for i in range(n):
                t = time.time()
                job_id = engine.submit(definition, f"l{i}")
                submits[job_id] = t
                wait_until(
                    lambda j=job_id: conn.execute(
                        f"SELECT status IN {_DONE} FROM workflow_run WHERE job_id = %(j)s",
                        {"j": j},
                    ).fetchone()[0],
                    60,
                    0.002,
                )
            rows = conn.execute(
                "SELECT job_id::text, status, extract(epoch FROM at) FROM bench_transition"
            ).fetchall()
    finally:
        engine.close()
    running = [float(at) - submits[j] for j, s, at in rows if s == "RUNNING" and j in submits]
    completed = [float(at) - submits[j] for j, s, at in rows if s == "COMPLETED" and j in submits]
    return {"running_s": running, "completed_s": completed}


def memory(params: dict) -> dict:
    """``n`` concurrent slow one-step jobs in one worker process; peak RSS (``ru_maxrss``)."""
    n = params["n"]
    engine = _Engine({**params, "pool_max": 10}, worker_count=n, per_target=n)
    definition = workflow(params["target"], steps=1, slow=True)
    try:
        engine.start()
        ready_and_wait()
        base_mib = rss_mib()
        t0 = time.time()
        for i in range(n):
            engine.submit(definition, f"m{i}")
        with psycopg.connect(engine.dsn, autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        f"SELECT count(*) FROM workflow_run WHERE status IN {_DONE}"
                    ).fetchone()[0]
                    >= n
                ),
                600,
                0.2,
            )
        elapsed = time.time() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        threads = threading.active_count()
    finally:
        engine.close()
    return {
        "base_rss_mib": base_mib,
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "elapsed_s": round(elapsed, 2),
        "concurrent": n,
        "threads": threads,
        "completed": _counts(params["dsn"]).get("COMPLETED", 0),
    }


# --- scale: claim and sweep latency as terminal rows accumulate -----------------------------

_TERMINAL_ROWS = """
INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status, attempt,
    checkpoints, result, verdict, created_at, updated_at, completed_at)
SELECT gen_random_uuid(), 'bench-noop', %(definition)s::jsonb, '{"text": "t"}'::jsonb,
    CASE WHEN g %% 10 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 1,
    %(checkpoints)s::jsonb, '{"text": "t"}'::jsonb, '',
    now() - interval '1 day' + g * interval '1 ms', now() - interval '1 day',
    now() - interval '1 day'
FROM generate_series(1, %(rows)s) AS g
"""


def scale(
    dsn: str,
    *,
    sizes: list[int],
    queued: int = 1000,
    samples: int = 500,
    target: str = "127.0.0.1:1",
) -> list[dict]:
    """Claim and sweep latency (p50/p99) with ``sizes`` terminal rows plus ``queued`` QUEUED.

    Per size: TRUNCATE, one ``generate_series`` INSERT of terminal rows (90 % COMPLETED, 10 %
    FAILED, three checkpoints each), ``queued`` QUEUED rows, VACUUM ANALYZE; then ``samples``
    ``job_claim`` calls and ``samples`` ``job_sweep_expired`` calls (nothing expired: the sweep's
    steady state), timed around the store call.
    """
    from protomolt_jobs.store import JobStore, NewJob
    from protomolt_jobs.store.migrate import migrate

    migrate(dsn)
    definition = workflow(target)
    checkpoints = [{"name": f"s{i}", "skipped": False, "response": {"text": "t"}} for i in range(3)]
    store = JobStore.open(dsn, max_size=2)
    out = []
    try:
        for rows in sizes:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("TRUNCATE workflow_run, workflow_run_events_outbox")
                t = time.monotonic()
                conn.execute(
                    _TERMINAL_ROWS,
                    {
                        "definition": json.dumps(definition),
                        "checkpoints": json.dumps(checkpoints),
                        "rows": rows,
                    },
                )
                build_s = time.monotonic() - t
            for i in range(queued):
                store.job_insert(
                    NewJob(
                        job_id=uuid.uuid4(),
                        workflow_name="bench-noop",
                        workflow_definition=definition,
                        input={"text": f"q{i}"},
                    )
                )
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE workflow_run")
            claims: list[float] = []
            for _ in range(min(samples, queued)):
                t = time.perf_counter()
                job = store.job_claim("bench-scale", 60.0)
                claims.append(time.perf_counter() - t)
                if job is None:
                    raise RuntimeError("scale: the claim found no QUEUED row")
            sweeps: list[float] = []
            for _ in range(samples):
                t = time.perf_counter()
                store.job_sweep_expired()
                sweeps.append(time.perf_counter() - t)
            sizes_now = relation_sizes(dsn, ["workflow_run"])[0]
            out.append(
                {
                    "terminal_rows": rows,
                    "queued": queued,
                    "build_s": round(build_s, 1),
                    "claim": summary_ms(claims),
                    "sweep": summary_ms(sweeps),
                    "table_mib": round(sizes_now["total_bytes"] / 2**20, 1),
                }
            )
            log.info("scale point measured", extra={"action": "bench_scale_point", "rows": rows})
    finally:
        store.close()
    return out
