"""protomolt-jobs under the benchmark: the real store, submitter and worker on the bench database.

Runs only inside a :mod:`bench.child` process (one system per process), except :func:`scale`,
which the parent calls directly (it starts no worker).

- throughput: N jobs of a three-step workflow (three no-op unary gRPC calls to the loopback
  server) submitted through :class:`protomolt_jobs.runs.submitter.Submitter` from 4 threads, while a
  :class:`protomolt_jobs.worker.Worker` with ``worker_count=W`` and a
  :class:`~protomolt_jobs.worker.Sweeper` run; first submit -> last ``completed_at``.
- latency: one one-step job at a time; a bench-only trigger stamps each status change with
  ``clock_timestamp()`` so submit -> RUNNING and submit -> COMPLETED come from the database.
- memory: 256 one-step jobs whose step is the slow call, ``worker_count=256``; peak RSS.
- scale: claim and sweep latency with 1k / 100k / 1M terminal rows plus 1k queued.

Throughput with ``kafka`` (a broker's bootstrap) also runs the relay in this process, as the
jobs role does; without it the relay stays off and outbox rows stay PENDING.
"""

from __future__ import annotations

import json
import logging
import resource
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import psycopg

from bench import harness_cpu
from bench.child import ready_and_wait, rss_mib, wait_until
from bench.noop_grpc import DOC_SERVICE, SERVICE, descriptor_set_b64, doc_descriptor_set_b64
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


def realistic_workflow(target: str, *, name: str = "bench-realistic") -> dict:
    """The realistic workload: three ``Docs/Echo`` steps over a ~1 KB ``bench.v1.Doc``, each
    with a ``when`` gate, two ``celRules`` (one with a filter) and ``validate: true`` against
    the Doc's declared rules (field rules and two CEL rules)."""
    gates = [
        "size(input.body) > 0 && input.score >= 0",
        "s0.score >= 0 && size(s0.tags) > 0",
        "s1.lang != '' || size(s1.title) > 0",
    ]
    steps = []
    for i, gate in enumerate(gates):
        src = "input" if i == 0 else f"s{i - 1}"
        steps.append(
            {
                "name": f"s{i}",
                "target": target,
                "method": f"{DOC_SERVICE}/Echo",
                "when": gate,
                "rules": [
                    f"id = {src}.id",
                    f"title = {src}.title",
                    f"body = {src}.body",
                    f"tags = {src}.tags",
                    f"score = {src}.score",
                ],
                "celRules": [
                    {"target": "lang", "selector": f"{src}.lang.lowerAscii()"},
                    {
                        "filter": f"{src}.score < 1000",
                        "target": "score",
                        "selector": f"{src}.score + 1",
                    },
                ],
                "validate": True,
            }
        )
    return {
        "name": name,
        "schema": {"descriptorSetBase64": doc_descriptor_set_b64()},
        "inputType": "bench.v1.Doc",
        "steps": steps,
    }


def realistic_input(i: int) -> dict:
    """A ~1 KB ``bench.v1.Doc`` (proto3 JSON)."""
    return {
        "id": f"doc-{i}",
        "title": f"Quarterly report {i}: throughput, latency and the events lane",
        "body": ("The relay drains the outbox to the events topic in batches. " * 15)[:900],
        "tags": ["bench", "realistic", "report", f"n{i % 10}"],
        "score": i % 500,
        "lang": "EN",
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
        from protomolt_jobs.app import JobsApp, Lanes
        from protomolt_jobs.config import JobsConfig
        from protomolt_jobs.workflow.types import Runtime

        dsn = params["dsn"]
        pool_max = params.get("pool_max", min(worker_count + 4, 20))
        kafka = params.get("kafka")
        self.config = JobsConfig(
            dsn=dsn,
            kafka_bootstrap=kafka or None,
            events_topic=f"pmjb-events-{uuid.uuid4().hex[:8]}",
            worker_id=f"bench-{uuid.uuid4().hex[:8]}",
            worker_count=worker_count,
            lease_seconds=params.get("lease_s", 60.0),
            max_concurrent_per_target=per_target,
            pool_max_size=pool_max,
            outbox_payloads=params.get("outbox_payloads", "columns"),
            group_commit=params.get("group_commit", "auto"),
        )
        self.channels = _Channels()
        self.runtime = Runtime(channel_factory=self.channels.channel)
        # The product's composition root (role and worker process build through it too).
        self.app = JobsApp.open(
            self.config, runtime=self.runtime, lanes=Lanes(request_consumer=False)
        )
        self.store = self.app.store
        self.calls = _count_calls(self.store)
        self.submitter = self.app.submitter
        self.worker = self.app.worker
        self.sweeper = self.app.sweeper
        self.relay = self.app.relay
        self.dsn = dsn
        #: ``processes`` > 1: this process's worker plus processes - 1 worker processes
        #: (``python -m protomolt_jobs.worker``), as ``protomolt-jobs serve --processes N``.
        self.extra = None
        processes = int(params.get("processes", 1))
        if processes > 1:
            from protomolt_jobs.worker.processes import WorkerProcesses

            args = ["--dsn", dsn, "--no-sweeper", "--log-level", "WARNING"]
            for key in (
                "worker_count",
                "lease_seconds",
                "max_concurrent_per_target",
                "outbox_payloads",
                "group_commit",
            ):
                args += ["--set", f"{key}={getattr(self.config, key)}"]
            args += ["--set", f"pool_max_size={pool_max}"]
            self.extra = WorkerProcesses(
                processes - 1, args=args, worker_id=f"{self.config.worker_id}-p"
            )

    def start(self) -> None:
        self.app.start()
        if self.extra is not None:
            self.extra.start()

    def submit(self, definition: dict, text: str | dict) -> str:
        """Submit one job (``text`` for the no-op workflow, or a whole input object); returns
        its id. :raises RuntimeError: the submitter refused it."""
        payload = text if isinstance(text, dict) else {"text": text}
        outcome = self.submitter.submit(workflow=definition, input=payload)
        if not outcome.ok:
            raise RuntimeError(f"bench submit refused: {outcome.reason}: {outcome.error}")
        return outcome.job_id

    def close(self) -> None:
        try:
            if self.extra is not None:
                self.extra.stop(30.0)
            self.app.close()
        finally:
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


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children (worker processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _counts(dsn: str) -> dict:
    with harness_cpu.connect(dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM workflow_run GROUP BY status").fetchall()
    return {status: int(n) for status, n in rows}


class StatementCounter:
    """Statements this process sends to PostgreSQL, counted at the client.

    The server's ``pg_stat_statements`` is not loaded on the bench cluster (it needs
    ``shared_preload_libraries`` and a restart), so the harness counts what psycopg sends:
    every ``Cursor.execute`` (also ``Connection.execute``), every ``executemany`` parameter
    set, and every command psycopg issues itself (``BEGIN``, ``COMMIT``, ``ROLLBACK``,
    savepoints). Threads marked with :meth:`uncounted` (the harness's own polls) are skipped.
    """

    def __init__(self) -> None:
        import psycopg._connection_base as base

        self.count = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        counter = self

        execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
        exec_command = base.BaseConnection._exec_command

        def counted_execute(cur, *args, **kwargs):
            counter._add(1)
            return execute(cur, *args, **kwargs)

        def counted_executemany(cur, query, params_seq, *args, **kwargs):
            params_seq = list(params_seq)
            counter._add(len(params_seq))
            return executemany(cur, query, params_seq, *args, **kwargs)

        def counted_command(conn, *args, **kwargs):
            counter._add(1)
            return (yield from exec_command(conn, *args, **kwargs))

        psycopg.Cursor.execute = counted_execute
        psycopg.Cursor.executemany = counted_executemany
        base.BaseConnection._exec_command = counted_command

    def _add(self, n: int) -> None:
        if getattr(self._local, "off", False):
            return
        with self._lock:
            self.count += n

    def uncounted(self) -> None:
        """Stop counting this thread's statements (the harness's own polls)."""
        self._local.off = True


#: Installed once per child process, before any store exists.
STATEMENTS: StatementCounter | None = None


class _LagSampler:
    """PENDING outbox rows every ``every_s`` on its own connection (the relay's lag)."""

    def __init__(self, dsn: str, every_s: float = 0.25) -> None:
        self.samples: list[tuple[float, int]] = []
        self.polls = 0
        self._dsn, self._every = dsn, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        if STATEMENTS:
            STATEMENTS.uncounted()
        t0 = time.time()
        with harness_cpu.connect(self._dsn) as conn:
            while not self._stop.wait(self._every):
                n = conn.execute(
                    "SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PENDING'"
                ).fetchone()[0]
                self.polls += 1
                self.samples.append((round(time.time() - t0, 2), int(n)))


def _checks(dsn: str, n: int, *, kafka: bool) -> dict:
    """Nothing lost: every job COMPLETED exactly once (one row, one COMPLETED event) and, with
    the relay on, every outbox row PUBLISHED."""
    with harness_cpu.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM workflow_run").fetchone()[0]
        completed = conn.execute(
            "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'"
        ).fetchone()[0]
        events = conn.execute(
            "SELECT count(*), count(DISTINCT kafka_key) FROM workflow_run_events_outbox"
            " WHERE event_type = 'COMPLETED'"
        ).fetchone()
        unpublished = conn.execute(
            "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED'"
        ).fetchone()[0]
    out = {
        "rows": int(rows),
        "completed": int(completed),
        "completed_events": int(events[0]),
        "jobs_with_completed_event": int(events[1]),
        "completed_once": rows == n and completed == n and events[0] == n and events[1] == n,
    }
    if kafka:
        out["unpublished_rows"] = int(unpublished)
        out["all_published"] = unpublished == 0
    return out


def throughput(params: dict) -> dict:
    """N three-step jobs; jobs/s from first submit to the last ``completed_at`` (relay off) or
    to the last terminal event's ``published_at`` (``kafka``: the relay runs in this process
    against the broker, and a job counts as done when its last event is acked).

    ``workload``: ``noop`` (three no-op calls) or ``realistic`` (:func:`realistic_workflow`).
    """
    global STATEMENTS
    STATEMENTS = STATEMENTS or StatementCounter()
    n, w = params["n"], params["workers"]
    kafka = params.get("kafka")
    realistic = params.get("workload", "noop") == "realistic"
    engine = _Engine(params, worker_count=w, per_target=max(8, w))
    if realistic:
        definition = realistic_workflow(params["target"])
        inputs = [realistic_input(i) for i in range(n)]
    else:
        definition = workflow(params["target"])
        inputs = [f"j{i}" for i in range(n)]
    submit_cpu = [0.0]
    submit_lock = threading.Lock()

    def submit(i: int) -> str:
        t = time.thread_time()
        job_id = engine.submit(definition, inputs[i])
        spent = time.thread_time() - t
        with submit_lock:
            submit_cpu[0] += spent
        return job_id

    lag = _LagSampler(engine.dsn) if kafka else None
    if kafka:
        finished = (
            "SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PUBLISHED'"
            " AND event_type IN ('COMPLETED', 'FAILED', 'DEAD')"
        )
        last_q = (
            "SELECT extract(epoch FROM max(published_at)), extract(epoch FROM max(o.created_at))"
            " FROM workflow_run_events_outbox AS o"
        )
    else:
        finished = f"SELECT count(*) FROM workflow_run WHERE status IN {_DONE}"
        last_q = "SELECT extract(epoch FROM max(completed_at)), NULL FROM workflow_run"
    try:
        engine.start()
        ready_and_wait()
        STATEMENTS.uncounted()  # this thread polls from here on
        statements0 = STATEMENTS.count
        notifications0 = engine.worker.listener.notifications
        t0 = time.time()
        cpu0 = _cpu_s()
        children0 = _children_cpu_s()
        if lag:
            lag.start()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submit, range(n)))
        with harness_cpu.connect(engine.dsn) as conn:

            def done() -> bool:
                return conn.execute(finished).fetchone()[0] >= n

            polls = wait_until(done, params.get("timeout_s", 1800), 0.2)
            if kafka:
                # Lag back to 0: every row published (the relay drains the last ones).
                polls += wait_until(
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM workflow_run_events_outbox"
                            " WHERE status = 'PENDING'"
                        ).fetchone()[0]
                        == 0
                    ),
                    60,
                    0.1,
                )
            cpu_s = _cpu_s() - cpu0
            statements = STATEMENTS.count - statements0
            notifications = engine.worker.listener.notifications - notifications0
            last, _ = conn.execute(last_q).fetchone()
            last_completed = conn.execute(
                "SELECT extract(epoch FROM max(completed_at)) FROM workflow_run"
            ).fetchone()[0]
    finally:
        if lag:
            lag.stop()
        engine.close()
    # Worker processes' CPU (reaped at close; their start-up is counted too, ~0.5 s each).
    children_s = _children_cpu_s() - children0
    cpu_s += children_s
    counts = _counts(params["dsn"])
    elapsed = float(last) - t0
    completed = counts.get("COMPLETED", 0)
    checks = _checks(params["dsn"], n, kafka=bool(kafka))
    result = {
        "jobs": completed,
        "not_completed": {k: v for k, v in counts.items() if k != "COMPLETED"},
        "elapsed_s": round(elapsed, 3),
        "jobs_per_s": round(completed / elapsed, 1),
        "own_commits": polls + 2 + (lag.polls + 1 if lag else 0),
        # CPU of this process (submitters, worker, relay, gRPC threads) per job: one GIL.
        "cpu_ms_per_job": round(1000 * cpu_s / max(1, completed), 2),
        # The same without the submitting threads' own CPU (thread_time): worker + relay.
        "cpu_ms_per_job_run": round(1000 * (cpu_s - submit_cpu[0]) / max(1, completed), 2),
        # Counted in this process only: with worker processes the count would be partial.
        "statements_per_job": (
            round(statements / max(1, completed), 2)
            if int(params.get("processes", 1)) == 1
            else None
        ),
        # NOTIFYs this process's listener read: each is a transaction of its own on the server
        # (PostgreSQL reads a notification into an idle session in one), inside tx/job.
        "notifications_per_job": (
            round(notifications / max(1, completed), 2)
            if int(params.get("processes", 1)) == 1
            else None
        ),
        "processes": int(params.get("processes", 1)),
        "worker_processes_cpu_s": round(children_s, 2),
        "store_calls_per_job": {
            k: round(v / max(1, n), 2) for k, v in sorted(engine.calls.items())
        },
        "checks": checks,
    }
    if kafka:
        pending = [p for _, p in lag.samples]
        result["relay"] = {
            "events_per_s": round(_published(params["dsn"]) / elapsed, 1),
            "lag_max": max(pending, default=0),
            "lag_mean": round(sum(pending) / len(pending), 1) if pending else 0,
            "lag_samples": lag.samples[:: max(1, len(lag.samples) // 40)],
            "drain_s": round(float(last) - float(last_completed), 3),
        }
    # PostgreSQL CPU of this run's own polls, samples and checks (bench/harness_cpu.py).
    result["harness_db_cpu_s"] = round(harness_cpu.SPENT_S, 3)
    return result


def _published(dsn: str) -> int:
    with harness_cpu.connect(dsn) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PUBLISHED'"
            ).fetchone()[0]
        )


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


_SCHED_QUEUED_ROWS = """
INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,
    priority, queue, fairness_key, fairness_pass, created_at)
SELECT gen_random_uuid(), 'bench-sched', %(definition)s::jsonb, '{"text": "t"}'::jsonb,
    'QUEUED', 1 + (g %% 5), 'q' || (g %% 10), 'k' || (g %% 1000),
    (g / 1000) + 1, now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, %(rows)s) AS g
"""


def _scale_sched(dsn: str, store: Any, definition: dict, rows: int, samples: int) -> dict:
    """The scheduled half of a scale point (see :func:`scale`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM workflow_queue")
        conn.execute(_SCHED_QUEUED_ROWS, {"definition": json.dumps(definition), "rows": rows})
        conn.execute("VACUUM ANALYZE workflow_run")
    every = [f"q{i}" for i in range(10)]
    claims: list[float] = []
    for _ in range(samples):
        t = time.perf_counter()
        job = store.job_claim("bench-scale", 60.0, queues=every)
        claims.append(time.perf_counter() - t)
        if job is None:
            raise RuntimeError("scale: the scheduled claim found no QUEUED row")
    limited = store.queue_limits_sync({"q1": {"max_running": 1_000_000}})
    limited_claims: list[float] = []
    for _ in range(samples):
        t = time.perf_counter()
        job = store.job_claim("bench-scale", 60.0, queues=["q0", "q1", "q2"], limited=limited)
        limited_claims.append(time.perf_counter() - t)
        if job is None:
            raise RuntimeError("scale: the limited claim found no QUEUED row")
    return {
        "sched_queued": rows,
        "claim_sched": summary_ms(claims),
        "claim_limited": summary_ms(limited_claims),
        # What one claim reads, counted by the database (load does not change it).
        "claim_sched_buffers": _claim_buffers(dsn, "job_claim", {"queues": every}),
        "claim_limited_buffers": _claim_buffers(
            dsn,
            "job_claim_limited",
            {"queues": ["q0", "q1", "q2"], "limited": sorted(limited), "skip_busy": True},
        ),
    }


def _claim_buffers(dsn: str, query: str, params: dict) -> int:
    """Shared buffers (hit + read) of one claim under EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    import re

    from protomolt_jobs.store.queries import QUERIES

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + QUERIES[query],
            {"worker_id": "bench-scale", "lease_s": 60.0, **params},
        ).fetchall()
        conn.rollback()
    for (line,) in rows:
        if "Buffers:" in line:
            return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", line))
    return 0


def scale(
    dsn: str,
    *,
    sizes: list[int],
    queued: int = 1000,
    samples: int = 500,
    target: str = "127.0.0.1:1",
    sched_queued: int = 0,
) -> list[dict]:
    """Claim and sweep latency (p50/p99) with ``sizes`` terminal rows plus ``queued`` QUEUED.

    Per size: TRUNCATE, one ``generate_series`` INSERT of terminal rows (90 % COMPLETED, 10 %
    FAILED, three checkpoints each), ``queued`` QUEUED rows, VACUUM ANALYZE; then ``samples``
    ``job_claim`` calls and ``samples`` ``job_sweep_expired`` calls (nothing expired: the sweep's
    steady state), timed around the store call.

    With ``sched_queued`` (issue #18), the point goes on: that many more QUEUED rows in one
    INSERT, spread over 10 queues (``q0``..``q9``), 1,000 fairness keys and priorities 1-5
    (passes as the insert would stamp them: the n-th run of a key gets pass n), VACUUM ANALYZE;
    then ``samples`` claims serving all 10 queues (``claim_sched``) and ``samples`` claims
    serving three queues of which one has a fleet-wide ``max_running`` (``claim_limited``: the
    permit function, its row lock and the RUNNING count on the path).
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
                # CASCADE: the transition log (0002) references the runs.
                conn.execute("TRUNCATE workflow_run, workflow_run_events_outbox CASCADE")
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
            sched: dict = {}
            if sched_queued:
                sched = _scale_sched(dsn, store, definition, sched_queued, samples)
            sizes_now = relation_sizes(dsn, ["workflow_run"])[0]
            out.append(
                {
                    "terminal_rows": rows,
                    "queued": queued,
                    "build_s": round(build_s, 1),
                    "claim": summary_ms(claims),
                    "sweep": summary_ms(sweeps),
                    "table_mib": round(sizes_now["total_bytes"] / 2**20, 1),
                    **sched,
                }
            )
            log.info("scale point measured", extra={"action": "bench_scale_point", "rows": rows})
    finally:
        store.close()
    return out
