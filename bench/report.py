"""The one results table (rich): ours, each peer's figure, and ours / peer."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.scenarios import PEERS
from bench.stats import ratio

#: Column order of the peers.
PEER_ORDER = list(PEERS)
#: Row order of our throughput variants (workload, relay on or off).
OURS_ORDER = ["ours+relay", "ours", "ours-realistic+relay", "ours-realistic"]


def _get(run: dict | None, key: str):
    """``run[a][b]`` for ``"a.b"``; None when absent."""
    value = run
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float) and v >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:g}{unit}"


def _hot_share(sizes: dict) -> str:
    """HOT updates as a share of all updates (``-`` when there were none or not read)."""
    updates = sizes.get("updates") or 0
    return f"{100 * (sizes.get('hot_updates') or 0) / updates:.0f} % HOT" if updates else "-"


def rows(results: dict) -> list[dict]:
    """Flatten scenario results into ``{metric, better, ours, peers: {name: value}}`` rows."""
    out: list[dict] = []
    ceiling = results.get("ceiling")
    if ceiling and "tps" not in ceiling:
        ceiling = None
    if ceiling:
        for c, tps in ceiling["tps"].items():
            out.append(
                {
                    "metric": f"ceiling: commits/s, {c} conn ({ceiling['method']})",
                    "better": "",
                    "ours": tps,
                    "peers": {},
                }
            )
    fl = results.get("floor")
    for r in (fl or {}).get("runs", []):
        for key, label, better in (
            ("jobs_per_s", "jobs/s", "higher"),
            ("db.cpu.total_ms_per_job", "PostgreSQL CPU ms/job", "lower"),
        ):
            out.append(
                {
                    "metric": f"floor ({r['variant']}, pgbench): {label}, {r['clients']} clients",
                    "better": better,
                    "ours": _get(r, key),
                    "peers": {},
                }
            )
    rl = results.get("relay")
    if rl and "events_per_s" in rl:
        for key, label, better in (
            ("events_per_s", "events/s", "higher"),
            ("cpu_ms_per_event", "CPU ms/event", "lower"),
        ):
            out.append(
                {
                    "metric": f"relay alone (batch {rl['batch']}, {rl['events']} events): {label}",
                    "better": better,
                    "ours": rl[key],
                    "peers": {},
                }
            )
    tp = results.get("throughput")
    if tp and "runs" not in tp:
        tp = None
    if tp:
        by = {(r["system"], r["workers"]): r for r in tp["runs"] if "error" not in r}
        present = {r["system"] for r in tp["runs"]}
        ours_labels = [x for x in OURS_ORDER if x in present]
        ours_labels += sorted(x for x in present if x.startswith("ours") and x not in OURS_ORDER)
        for w in sorted({r["workers"] for r in tp["runs"]}):
            for label in ours_labels:
                ours = by.get((label, w))
                noop = "realistic" not in label
                for key, name, better in (
                    ("jobs_per_s", "jobs/s", "higher"),
                    ("tx_per_job", "transactions/job", "lower"),
                    ("statements_per_job", "statements/job (client count)", "lower"),
                    (
                        "notifications_per_job",
                        "of the transactions/job: NOTIFY reads by the listener",
                        "",
                    ),
                    ("cpu_ms_per_job_run", "CPU ms/job, worker+relay", "lower"),
                    ("cpu_ms_per_job", "CPU ms/job, with submitting", "lower"),
                    ("db.cpu.total_ms_per_job", "PostgreSQL CPU ms/job (own cluster)", "lower"),
                    # What was subtracted (times the run's duration) to get transactions/job.
                    ("idle_rate", "idle commits/s (subtracted)", "lower"),
                    ("relay.events_per_s", "relay events/s", "higher"),
                    ("relay.lag_max", "outbox lag max (PENDING rows)", "lower"),
                    ("relay.lag_mean", "outbox lag mean (PENDING rows)", "lower"),
                    ("relay.drain_s", "lag to 0 after last completion (s)", "lower"),
                    ("checks.completed_once", "every job COMPLETED once", ""),
                    ("checks.all_published", "every outbox row PUBLISHED", ""),
                ):
                    value = _get(ours, key)
                    if value is None:
                        continue
                    peers = {}
                    if noop and key in (
                        "jobs_per_s",
                        "tx_per_job",
                        "idle_rate",
                        "db.cpu.total_ms_per_job",
                    ):
                        peers = {p: _get(by[(p, w)], key) for p in PEER_ORDER if (p, w) in by}
                    out.append(
                        {
                            "metric": f"throughput W={w} ({label}): {name}",
                            "better": better,
                            "ours": value,
                            "peers": peers,
                        }
                    )
            ours = by.get(("ours", w))
            if ceiling and ours and ours["tx_per_job"]:
                clients = min(ceiling["tps"], key=lambda c: abs(int(c) - w))
                share = ours["jobs_per_s"] * ours["tx_per_job"] / ceiling["tps"][clients]
                out.append(
                    {
                        "metric": f"throughput W={w} (ours): share of ceiling ({clients} conn)",
                        "better": "",
                        "ours": round(100 * share, 1),
                        "peers": {},
                        "unit": "%",
                    }
                )
    lat = results.get("latency")
    if lat and "runs" not in lat:
        lat = None
    if lat:
        by = {r["system"]: r for r in lat["runs"] if "error" not in r}
        for phase in ("running", "completed"):
            for q in ("p50_ms", "p95_ms", "p99_ms"):
                out.append(
                    {
                        "metric": f"latency submit->{phase.upper()} {q[:3]} (ms)",
                        "better": "lower",
                        "ours": by["ours"][phase][q] if "ours" in by else None,
                        "peers": {p: by[p][phase][q] for p in PEER_ORDER if p in by},
                    }
                )
    sc = results.get("scale")
    if sc and "points" not in sc:
        sc = None
    if sc:
        for p in sc["points"]:
            for what in ("claim", "sweep"):
                for q in ("p50_ms", "p99_ms"):
                    out.append(
                        {
                            "metric": f"scale {p['terminal_rows']:,} terminal + "
                            f"{p['queued']} queued: {what} {q[:3]} (ms)",
                            "better": "lower",
                            "ours": p[what][q],
                            "peers": {},
                        }
                    )
            for what in ("claim_sched", "claim_limited"):
                if what not in p:
                    continue
                for q in ("p50_ms", "p99_ms"):
                    out.append(
                        {
                            "metric": f"scale {p['terminal_rows']:,} terminal + "
                            f"{p['sched_queued']:,} queued (10 queues x 1,000 keys): "
                            f"{'limited claim' if what == 'claim_limited' else 'claim'} "
                            f"{q[:3]} (ms)",
                            "better": "lower",
                            "ours": p[what][q],
                            "peers": {},
                        }
                    )
    if tp:
        w = max(r["workers"] for r in tp["runs"])
        for r in tp["runs"]:
            if r["workers"] != w or "error" in r:
                continue
            for s in r["sizes"]:
                out.append(
                    {
                        "metric": f"after throughput W={w}: {s['table']} total MiB "
                        f"(index MiB, dead tuples, HOT share of updates)",
                        "better": "",
                        "system": r["system"],
                        "text": f"{s['total_bytes'] / 2**20:.1f} ({s['index_bytes'] / 2**20:.1f}, "
                        f"{s['dead_tuples']}, {_hot_share(s)})",
                        "ours": None,
                        "peers": {},
                    }
                )
    for name in ("ceiling", "floor", "relay", "throughput", "latency", "scale", "memory"):
        if "error" in (results.get(name) or {}):
            out.append(
                {
                    "metric": f"{name} FAILED: {results[name]['error'][:70]}",
                    "better": "",
                    "ours": None,
                    "peers": {},
                }
            )
        for r in (results.get(name) or {}).get("runs", []):
            if "error" in r:
                w = f" W={r['workers']}" if "workers" in r else ""
                out.append(
                    {
                        "metric": f"{name}{w}: {r['system']} FAILED: {r['error'][:60]}",
                        "better": "",
                        "ours": None,
                        "peers": {},
                    }
                )
    mem = results.get("memory")
    if mem and "runs" not in mem:
        mem = None
    if mem:
        by = {r["system"]: r for r in mem["runs"] if "error" not in r}
        n = next(iter(by.values()))["concurrent"] if by else 0
        out.append(
            {
                "metric": f"memory: peak RSS MiB, {n} concurrent slow steps",
                "better": "lower",
                "ours": by["ours"]["peak_rss_mib"] if "ours" in by else None,
                "peers": {p: by[p]["peak_rss_mib"] for p in PEER_ORDER if p in by},
            }
        )
    return out


def table(results: dict, title: str = "protomolt-jobs benchmarks") -> Table:
    """The rich table; ``x`` columns are ours / peer."""
    t = Table(title=title, show_lines=False)
    t.add_column("metric")
    t.add_column("better")
    t.add_column("ours", justify="right")
    peers = [p for p in PEER_ORDER if any(p in r["peers"] for r in rows(results))]
    for p in peers:
        t.add_column(p, justify="right")
        t.add_column("ours/" + p, justify="right")
    for r in rows(results):
        if "text" in r:
            # Table-size rows: the system's figure goes in its own column.
            mine = r["system"].startswith("ours")
            metric = f"{r['metric']} ({r['system']})" if mine else r["metric"]
            line = [metric, "", r["text"] if mine else ""]
            for p in peers:
                line += [r["text"] if r["system"] == p else "", ""]
            if mine or r["system"] in peers:
                t.add_row(*line)
            continue
        unit = r.get("unit", "")
        line = [r["metric"], r["better"], _fmt(r["ours"], unit)]
        for p in peers:
            v = r["peers"].get(p)
            line += [_fmt(v), _fmt(ratio(r["ours"], v), "x") if v is not None else ""]
        t.add_row(*line)
    return t


def print_table(results: dict, console: Console | None = None) -> None:
    """Print the one table to the terminal (width permitting, else rich wraps cells), then,
    after an ``--own-cluster`` run, the cluster's settings and each throughput run's
    database figures (statements, PostgreSQL CPU per job, HOT share)."""
    (console or Console(width=220)).print(table(results))
    own = results.get("own_cluster")
    if not own:
        return
    from bench.dbprobe import print_probe

    print("own cluster settings: " + ", ".join(f"{k}={v}" for k, v in own["settings"].items()))
    for r in (results.get("throughput") or {}).get("runs", []):
        if "db" not in r:
            continue
        print(f"{r['system']} W={r['workers']}: {r['jobs_per_s']} jobs/s, {r['tx_per_job']} tx/job")
        print_probe(r["system"], r["db"])
        for s in r.get("sizes", []):
            print(f"    {s['table']}: {_hot_share(s)} of {s['updates']} updates")


def markdown(results: dict) -> str:
    """The same table as GitHub markdown (what docs/benchmarks.md carries)."""
    t = table(results)
    headers = [str(c.header) for c in t.columns]
    cells = [list(c._cells) for c in t.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for i in range(len(cells[0]) if cells else 0):
        lines.append("| " + " | ".join(str(col[i]) for col in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.report results.json [--markdown]``: re-render a saved run."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("json")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    with open(args.json) as fh:
        results = json.load(fh)
    if args.markdown:
        print(markdown(results))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
