"""``python -m bench <scenario>``: ceiling, fairness, cap, throughput, latency, scale, memory, all,
smoke.

``all`` runs every scenario with the sizes in :data:`ALL` (reduced from the issue's defaults so
the whole run fits in about ten minutes on two cores) and prints one table. ``smoke`` is the
CI run: tiny sizes, no peers. ``--json PATH`` writes the raw results as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sys
import time
from datetime import UTC, datetime
from importlib import metadata

import psycopg

from bench import report
from bench.scenarios import PEERS, SCENARIOS, SEPARATE, Options

#: ``all``: every scenario, sized to finish in about ten minutes on a 2-core machine.
ALL = {
    "kafka": "both",
    "workloads": ["noop", "realistic"],
    "n": 2000,
    "jobs_per_worker_cap": 400,
    "latency_n": 300,
    "scale_samples": 300,
    "ceiling_s": 5,
}

#: ``smoke``: tiny sizes, no peers; the CI run.
SMOKE = {
    "n": 20,
    "jobs_per_worker_cap": 20,
    "workers": [2],
    "peers": [],
    "latency_n": 5,
    "relay_jobs": 20,
    "kafka": "both",
    "workloads": ["noop", "realistic"],
    "scale_sizes": [1000],
    "scale_queued": 20,
    "scale_samples": 20,
    "scale_sched_queued": 200,
    "fair_a_jobs": 200,
    "cap_gpu_jobs": 6,
    "cap_cpu_jobs": 40,
    "memory_n": 8,
    "memory_slow_ms": 200,
    "ceiling_clients": [1],
    "ceiling_s": 1,
    "idle_window_s": 0.5,
    "settle_s": 1.0,
}


def versions() -> dict:
    """Versions of the pieces the figures depend on."""
    out = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("protomolt-jobs", "dbos", "procrastinate", "psycopg", "grpcio", "protobuf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=[*SCENARIOS, "all", "smoke"])
    p.add_argument("--n", type=int, help="throughput jobs per run")
    p.add_argument(
        "--workers",
        type=lambda s: [int(x) for x in s.split(",")],
        help="comma-separated W sweep, e.g. 1,4,16",
    )
    p.add_argument(
        "--peers",
        type=lambda s: [x for x in s.split(",") if x],
        help=f"comma-separated subset of {','.join(PEERS)}; empty for none",
    )
    p.add_argument(
        "--jobs-per-worker-cap",
        type=int,
        help="throughput jobs per run at most this times W (keeps W=1 runs of slow peers short)",
    )
    p.add_argument("--latency-n", type=int)
    p.add_argument(
        "--kafka",
        nargs="?",
        const="on",
        choices=["on", "off", "both"],
        help="throughput: run our relay to a Tansu broker (on), not (off), or both",
    )
    p.add_argument(
        "--workload",
        dest="workloads",
        type=lambda s: [x for x in s.split(",") if x],
        help="throughput: our workloads, comma-separated: noop,realistic",
    )
    p.add_argument(
        "--processes",
        type=lambda s: [int(x) for x in s.split(",")],
        help="throughput: our worker processes, comma-separated sweep, e.g. 1,2",
    )
    p.add_argument(
        "--outbox-payloads",
        choices=["columns", "always"],
        help="throughput: our jobs.outbox_payloads (always: every outbox row with its payload)",
    )
    p.add_argument("--relay-jobs", type=int, help="relay: jobs of 5 events the relay drains")
    p.add_argument("--relay-batch", type=int, help="relay: outbox rows per pass")
    p.add_argument("--scale-sizes", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument(
        "--scale-sched-queued",
        type=int,
        help="scale: QUEUED rows over 10 queues x 1000 fairness keys per point (0: skip)",
    )
    p.add_argument("--memory-n", type=int)
    p.add_argument(
        "--floor-clients",
        type=lambda s: [int(x) for x in s.split(",")],
        help="floor: pgbench client counts, e.g. 1,4,16",
    )
    p.add_argument("--floor-s", type=float, help="floor: seconds per pgbench run")
    p.add_argument(
        "--floor-variants",
        type=lambda s: [x for x in s.split(",") if x],
        help="floor: shipped,before-NNNN (any migration),no-trigger,essential-indexes,bare",
    )
    p.add_argument(
        "--own-cluster",
        action="store_true",
        help="run on a throwaway PostgreSQL of the benchmark's own (pg_stat_statements, "
        "track_io_timing): per-statement figures, PostgreSQL CPU per job, HOT share",
    )
    p.add_argument("--json", help="also write the raw results to this file")
    return p.parse_args(argv)


def options(args: argparse.Namespace) -> Options:
    """Options for the scenario, with the command line's overrides applied.

    :raises SystemExit: an unknown peer name.
    """
    base = {"all": ALL, "smoke": SMOKE}.get(args.scenario, {})
    opts = Options(**base)
    for name in (
        "n",
        "jobs_per_worker_cap",
        "workers",
        "peers",
        "latency_n",
        "relay_jobs",
        "relay_batch",
        "kafka",
        "workloads",
        "processes",
        "scale_sizes",
        "scale_sched_queued",
        "memory_n",
        "outbox_payloads",
        "floor_clients",
        "floor_s",
        "floor_variants",
    ):
        value = getattr(args, name)
        if value is not None:
            setattr(opts, name, value)
    bad = [w for w in opts.workloads if w not in ("noop", "realistic")]
    if bad:
        raise SystemExit(f"--workload: unknown {', '.join(bad)}; choose from noop, realistic")
    from bench.floor import VARIANTS, variant_spec

    bad = []
    for v in opts.floor_variants:
        try:
            variant_spec(v)
        except KeyError:
            bad.append(v)
    if bad:
        raise SystemExit(
            f"--floor-variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)} "
            "or before-NNNN"
        )
    unknown = [p for p in opts.peers if p not in PEERS]
    if unknown:
        raise SystemExit(
            f"--peers: unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}"
        )
    return opts


def run(scenario: str, opts: Options) -> dict:
    """Run one scenario (or all of them) and return the results with their context."""
    names = (
        [n for n in SCENARIOS if n not in SEPARATE] if scenario in ("all", "smoke") else [scenario]
    )
    results: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scenario": scenario,
        "options": dataclasses.asdict(opts),
        "versions": versions(),
    }
    for name in names:
        t = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            results[name] = SCENARIOS[name](opts)
        except (RuntimeError, TimeoutError, OSError, psycopg.Error) as exc:
            # One broken scenario must not lose the others' figures; the table says FAILED.
            print(f"!! {name} failed: {exc}", flush=True)
            results[name] = {"error": str(exc)}
        results.setdefault("wall_s", {})[name] = round(time.monotonic() - t, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    args = parse_args(argv)
    opts = options(args)
    if args.own_cluster:
        from bench import scenarios
        from bench.cluster import OwnCluster
        from bench.dbprobe import ClusterProbe

        with OwnCluster() as cluster:
            print(
                f"== own cluster in {cluster.dir} on port {cluster.port} "
                f"(postmaster {cluster.postmaster_pid}): {cluster.settings}",
                flush=True,
            )
            scenarios.PROBE = ClusterProbe(cluster.dsn, cluster.postmaster_pid or 0)
            try:
                results = run(args.scenario, opts)
            finally:
                scenarios.PROBE = None
            results["own_cluster"] = {"port": cluster.port, "settings": cluster.settings}
    else:
        results = run(args.scenario, opts)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, default=str)
    report.print_table(results)
    failed = [k for k in SCENARIOS if "error" in (results.get(k) or {})]
    failed += [
        f"{k}/{r['system']}"
        for k in SCENARIOS
        for r in (results.get(k) or {}).get("runs", [])
        if "error" in r
    ]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
