"""The scenarios: each builds its fresh databases, starts its servers and children, and returns
plain dicts (JSON-ready) that :mod:`bench.report` turns into the table.

Peers (issue 9 item 2) and how they are treated:

- ``procrastinate``: one worker, ``concurrency=W``, pool W+4, LISTEN/NOTIFY, chained tasks;
- ``dbos-direct``: ``DBOS.start_workflow`` from W threads, no queue;
- ``dbos-queue-10ms``: a queue with ``worker_concurrency=W`` polled every 10 ms;
- ``dbos-queue-1s``: the same queue at DBOS's default 1 s poll. One poll starts at most W
  workflows, so it runs at about W jobs/s; its job count is capped (``DBOS_1S_JOBS_PER_W``
  per worker) to keep the run short.

Every system runs in a fresh database of the same cluster, one after the other, against the
same no-op gRPC server process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import psycopg

from bench.ceiling import ceiling as measure_ceiling
from bench.child import run_child
from bench.noop_grpc import NoopServer
from bench.pgdb import BenchDatabase, relation_sizes
from bench.stats import summary_ms

log = logging.getLogger("protomolt_jobs.bench")

#: Peer name -> (child system, extra params).
PEERS: dict[str, tuple[str, dict]] = {
    "procrastinate": ("procrastinate", {}),
    "dbos-direct": ("dbos", {"mode": "direct"}),
    "dbos-queue-10ms": ("dbos", {"mode": "queue", "poll_s": 0.01}),
    "dbos-queue-1s": ("dbos", {"mode": "queue", "poll_s": 1.0}),
}

#: Tables measured after each throughput run, per child system.
TABLES = {
    "ours": ["workflow_run", "workflow_run_events_outbox", "workflow_run_transition"],
    "procrastinate": ["procrastinate_jobs", "procrastinate_events"],
    "dbos": ["dbos.workflow_status", "dbos.operation_outputs"],
}

#: ``--own-cluster``: the probe of the benchmark's own cluster (set by ``bench.__main__``);
#: each throughput run then reports its statements and PostgreSQL CPU (bench/dbprobe.py).
PROBE = None

#: dbos-queue-1s runs at about W jobs/s: it gets this many jobs per worker.
DBOS_1S_JOBS_PER_W = 15
#: ... and at most this many latency samples (each waits about half a poll).
DBOS_1S_LATENCY_SAMPLES = 20


@dataclass
class Options:
    """What to run and how big. Defaults are the issue's; ``all`` and ``smoke`` shrink them."""

    n: int = 5000
    jobs_per_worker_cap: int = 1000
    workers: list[int] = field(default_factory=lambda: [1, 4, 16])
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    latency_n: int = 1000
    latency_workers: int = 1
    scale_sizes: list[int] = field(default_factory=lambda: [1_000, 100_000, 1_000_000])
    scale_queued: int = 1000
    scale_samples: int = 500
    #: Issue #18: QUEUED rows over 10 queues and 1,000 fairness keys added to each scale point.
    scale_sched_queued: int = 100_000
    #: Issue #18 scenarios: tenant A's flood (fairness), gpu and default jobs (cap).
    fair_a_jobs: int = 5000
    cap_gpu_jobs: int = 40
    cap_cpu_jobs: int = 400
    memory_n: int = 256
    memory_slow_ms: int = 2000
    ceiling_clients: list[int] = field(default_factory=lambda: [1, 4, 8])
    ceiling_s: int = 10
    idle_window_s: float = 3.0
    #: Seconds from a child's ready to its idle window (late statistics, see bench.child).
    settle_s: float = 4.0
    #: throughput: ours with the relay to a Tansu broker ("on"), without ("off"), or both.
    kafka: str = "off"
    #: throughput: our workloads, "noop" (three no-op calls) and/or "realistic" (gates,
    #: celRules, validation, ~1 KB messages). Peers run the no-op workload only.
    workloads: list[str] = field(default_factory=lambda: ["noop"])
    #: throughput: our worker processes (1: the in-process worker only; N: plus N-1 more).
    processes: list[int] = field(default_factory=lambda: [1])
    #: relay: jobs whose 5 events each the relay drains alone, and its batch size.
    relay_jobs: int = 1000
    relay_batch: int = 500
    #: throughput: our ``jobs.outbox_payloads`` (``columns``, the default, or ``always``: every
    #: outbox row written with its payload, the shared-outbox interop mode).
    outbox_payloads: str = "columns"
    #: floor (issue 33): pgbench clients, seconds per run, variants (bench/floor.py).
    floor_clients: list[int] = field(default_factory=lambda: [1, 4, 16])
    floor_s: float = 10.0
    floor_variants: list[str] = field(
        default_factory=lambda: [
            "shipped",
            "before-0018",
            "no-trigger",
            "essential-indexes",
            "bare",
        ]
    )


def _guarded(label: str, fn, *args):
    """``fn(*args)``, or ``{"system": label, "error": ...}`` when the run failed (a child that
    crashed or timed out, a database error): one broken run must not lose the others."""
    try:
        return fn(*args)
    except (RuntimeError, TimeoutError, OSError, psycopg.Error) as exc:
        print(f"  !! {label}: {exc}", flush=True)
        log.error(
            "bench run failed",
            extra={"action": "bench_run_failed", "system": label, "error": str(exc)},
        )
        return {"system": label, "error": str(exc)}


def ceiling(opts: Options) -> dict:
    """Commit rate of the cluster at each client count."""
    return measure_ceiling(opts.ceiling_clients, opts.ceiling_s)


def _systems(opts: Options) -> list[tuple[str, str, dict]]:
    return [("ours", "ours", {})] + [(p, *PEERS[p]) for p in opts.peers]


def ours_variants(opts: Options, bootstrap: str | None) -> list[tuple[str, str, dict]]:
    """Our throughput runs: each workload with the relay on (``<name>+relay``) and/or off.
    ``both`` runs the no-op workload both ways (the relay-off figure is the historical row)
    and the other workloads with the relay on only (the product as deployed)."""
    out = []
    for procs in opts.processes:
        for workload in opts.workloads:
            name = "ours" if workload == "noop" else f"ours-{workload}"
            if procs > 1:
                name += f"-{procs}p"
            extra = {"workload": workload, "processes": procs}
            if opts.outbox_payloads != "columns":
                name += f"-payloads-{opts.outbox_payloads}"
                extra["outbox_payloads"] = opts.outbox_payloads
            if opts.kafka in ("on", "both"):
                out.append((f"{name}+relay", "ours", {"kafka": bootstrap, **extra}))
            if opts.kafka == "off" or (opts.kafka == "both" and workload == "noop"):
                out.append((name, "ours", extra))
    return out


def _throughput_run(label: str, system: str, params: dict, opts: Options) -> dict:
    with BenchDatabase(f"tp_{system}") as db:
        r = run_child(
            system,
            "throughput",
            {**params, "dsn": db.dsn},
            dbname=db.name,
            idle_window_s=opts.idle_window_s,
            settle_s=opts.settle_s,
            on_go=PROBE.start if PROBE is not None else None,
        )
        probe = (
            PROBE.stop(db.name, r["jobs"], harness_s=r.get("harness_db_cpu_s", 0.0))
            if PROBE is not None
            else None
        )
        sizes = relation_sizes(db.dsn, TABLES[system])
    jobs = r["jobs"]
    run = {
        "system": label,
        "workers": params["workers"],
        "n": params["n"],
        "jobs": jobs,
        "jobs_per_s": r["jobs_per_s"],
        "elapsed_s": r["elapsed_s"],
        "tx_per_job": round(r["commits_net"] / jobs, 2) if jobs else None,
        "commits": r["commits"],
        "idle_rate": r["idle_rate"],
        "sizes": sizes,
    }
    if probe is not None:
        run["db"] = probe
    for key in (
        "not_completed",
        "store_calls_per_job",
        "cpu_ms_per_job",
        "cpu_ms_per_job_run",
        "statements_per_job",
        "notifications_per_job",
        "checks",
        "relay",
    ):
        if r.get(key):
            run[key] = r[key]
    extra = ""
    if "statements_per_job" in run:
        extra = (
            f"  {run['statements_per_job']} stmt/job  {run.get('cpu_ms_per_job_run')} ms CPU/job"
        )
    if "relay" in run:
        rl = run["relay"]
        extra += (
            f"  relay {rl['events_per_s']} ev/s lag max {rl['lag_max']} drain {rl['drain_s']} s"
        )
    print(
        f"  throughput {label:22s} W={params['workers']:<3d} n={params['n']:<5d} "
        f"{run['jobs_per_s']:8.1f} jobs/s  {run['tx_per_job']} tx/job{extra}",
        flush=True,
    )
    if probe is not None:
        from bench.dbprobe import print_probe

        print_probe(label, probe)
        hot = "  ".join(
            f"{s['table']} {100 * s['hot_updates'] / s['updates']:.0f} % HOT of {s['updates']}"
            for s in sizes
            if s["updates"]
        )
        print(f"    HOT share of updates: {hot or '-'}", flush=True)
    checks = run.get("checks")
    failed = [k for k in ("completed_once", "all_published") if checks and checks.get(k) is False]
    if failed:
        print(f"  !! {label}: check failed: {', '.join(failed)}: {checks}", flush=True)
        run["error"] = f"check failed: {', '.join(failed)}"
    return run


def throughput(opts: Options) -> dict:
    """Jobs/s and transactions/job of every system at each W (ours: each workload, with the
    relay to a Tansu broker of the run's own and/or without)."""
    from contextlib import nullcontext

    from bench import kafka

    runs = []
    broker_cm = kafka.Broker() if opts.kafka in ("on", "both") else nullcontext()
    with NoopServer(threads=max(32, 2 * max(opts.workers))) as srv, broker_cm as broker:
        bootstrap = broker.bootstrap if broker is not None else None
        for w in opts.workers:
            n = min(opts.n, opts.jobs_per_worker_cap * w)
            systems = ours_variants(opts, bootstrap) + [(p, *PEERS[p]) for p in opts.peers]
            for label, system, extra in systems:
                n_run = min(n, DBOS_1S_JOBS_PER_W * w) if label == "dbos-queue-1s" else n
                params = {"target": srv.target, "n": n_run, "workers": w, **extra}
                run = _guarded(label, _throughput_run, label, system, params, opts)
                runs.append({"workers": w, **run})
    return {"runs": runs}


def _latency_run(label: str, system: str, params: dict) -> dict:
    with BenchDatabase(f"lat_{system}") as db:
        r = run_child(system, "latency", {**params, "dsn": db.dsn}, dbname=None)
    row = {
        "system": label,
        "running": summary_ms(r["running_s"]),
        "completed": summary_ms(r["completed_s"]),
        "max_completed_ms": round(1000 * max(r["completed_s"], default=0.0), 1),
    }
    print(
        f"  latency    {label:16s} running {row['running']}  completed {row['completed']}",
        flush=True,
    )
    return row


def latency(opts: Options) -> dict:
    """Pickup and completion latency of one-step jobs submitted one at a time at idle."""
    out = []
    with NoopServer(threads=16) as srv:
        for label, system, extra in _systems(opts):
            n = opts.latency_n
            if label == "dbos-queue-1s":
                n = min(n, DBOS_1S_LATENCY_SAMPLES)
            params = {"target": srv.target, "n": n, "workers": opts.latency_workers, **extra}
            out.append(_guarded(label, _latency_run, label, system, params))
    return {"runs": out}


def scale(opts: Options) -> dict:
    """Claim and sweep latency of our store as terminal rows accumulate."""
    from bench import ours

    with BenchDatabase("scale") as db:
        points = ours.scale(
            db.dsn,
            sizes=opts.scale_sizes,
            queued=opts.scale_queued,
            samples=opts.scale_samples,
            sched_queued=opts.scale_sched_queued,
        )
    for p in points:
        print(
            f"  scale      {p['terminal_rows']:>9d} terminal rows: claim {p['claim']}  "
            f"sweep {p['sweep']}",
            flush=True,
        )
        if "claim_sched" in p:
            print(
                f"  scale      {p['terminal_rows']:>9d} terminal + {p['sched_queued']} queued over "
                f"10 queues x 1000 keys: claim {p['claim_sched']}  "
                f"limited claim {p['claim_limited']}  buffers per claim "
                f"{p['claim_sched_buffers']} / limited {p['claim_limited_buffers']}",
                flush=True,
            )
    return {"points": points}


def _memory_run(label: str, system: str, params: dict) -> dict:
    with BenchDatabase(f"mem_{system}") as db:
        r = run_child(system, "memory", {**params, "dsn": db.dsn}, dbname=None)
    r.pop("event", None)
    print(
        f"  memory     {label:16s} base {r['base_rss_mib']} MiB  "
        f"peak {r['peak_rss_mib']} MiB  ({r['elapsed_s']} s)",
        flush=True,
    )
    return {"system": label, **r}


def memory(opts: Options) -> dict:
    """Peak RSS of one worker process running ``memory_n`` concurrent slow steps."""
    out = []
    systems = [s for s in _systems(opts) if s[0] in ("ours", "procrastinate", "dbos-direct")]
    with NoopServer(threads=opts.memory_n + 44, slow_ms=opts.memory_slow_ms) as srv:
        for label, system, extra in systems:
            params = {"target": srv.target, "n": opts.memory_n, "workers": 4, **extra}
            out.append(_guarded(label, _memory_run, label, system, params))
    return {"runs": out}


def relay(opts: Options) -> dict:
    """The relay alone: a pre-filled outbox drained to a Tansu broker (events/s, CPU/event)."""
    from bench import kafka

    with kafka.Broker() as broker, BenchDatabase("relay") as db:
        r = kafka.relay_alone(
            db.dsn, broker.bootstrap, jobs=opts.relay_jobs, batch=opts.relay_batch
        )
    print(
        f"  relay      {r['events']} events  {r['events_per_s']} events/s  "
        f"{r['cpu_ms_per_event']} ms CPU/event  ({r['passes']} passes, batch {r['batch']})",
        flush=True,
    )
    return r


def fairness(opts: Options) -> dict:
    """Issue #18: a tenant's flood against another tenant's few jobs (bench/sched.py)."""
    from bench import sched

    with BenchDatabase("fairness") as db:
        r = sched.fairness(db.dsn, a_jobs=opts.fair_a_jobs)
    print(
        f"  fairness   A {r['a_jobs']} then B {r['b_jobs']}, {r['loops']} loops: "
        f"{r['a_started_before_last_b']} of A's started before B's last (FIFO: {r['a_jobs']}); "
        f"{r['claims_per_s']} claims/s",
        flush=True,
    )
    return r


def cap(opts: Options) -> dict:
    """Issue #18: a fleet-wide cap on one queue beside an uncapped one (bench/sched.py)."""
    from bench import sched

    out = {}
    for label, limit in (("capped", 2), ("uncapped", None)):
        with BenchDatabase(f"cap-{label}") as db:
            r = sched.cap(
                db.dsn,
                gpu_jobs=opts.cap_gpu_jobs,
                cpu_jobs=opts.cap_cpu_jobs,
                max_running=limit,
            )
        out[label] = r
        print(
            f"  cap        {label:<9} gpu peak RUNNING {r['gpu_peak_running']}  "
            f"default jobs/s {r['cpu_jobs_per_s']}  total {r['total_s']} s",
            flush=True,
        )
    return out


def floor(opts: Options) -> dict:
    """The SQL floor: a three-step job's statements through pgbench (bench/floor.py)."""
    from bench.floor import floor as measure_floor

    return measure_floor(opts.floor_clients, opts.floor_s, opts.floor_variants)


#: Scenarios ``all`` and ``smoke`` leave out (each starts a cluster of its own).
SEPARATE = ("floor",)

SCENARIOS = {
    "ceiling": ceiling,
    "fairness": fairness,
    "cap": cap,
    "relay": relay,
    "throughput": throughput,
    "latency": latency,
    "scale": scale,
    "memory": memory,
    "floor": floor,
}
