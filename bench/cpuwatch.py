"""CPU per process group over a window: ``python -m bench.cpuwatch SECONDS``.

Samples every process's ``utime + stime`` (psutil) every 0.2 s for ``SECONDS`` and prints the
CPU seconds each group used in the window: PostgreSQL backends by database (so ours and a
peer's bench databases separate), the no-op gRPC server, the broker, each bench child, the
rest by name. Start it, then the benchmark, in two shells; a process that starts and ends
inside the window is counted from its start. Divide by the jobs the run completed for CPU
per job by process.
"""

from __future__ import annotations

import argparse
import collections
import time

import psutil


def _group(proc: psutil.Process) -> str:
    name = proc.name()
    cmd = " ".join(proc.cmdline() or [])
    if name.startswith("postgres"):
        # "postgres: 15/main: <user> <database> <client> <state>" for a backend,
        # "postgres: 15/main: checkpointer" for the server's own processes.
        words = cmd.split(":", 2)[-1].split()
        return "postgres: " + (words[1] if len(words) > 1 else " ".join(words) or cmd)[:40]
    if "noop_grpc" in cmd:
        return "no-op gRPC server"
    if "calfkit" in cmd:
        return "broker"
    if "bench.child" in cmd:
        return "bench child: " + " ".join(cmd.split()[3:5])
    return name


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cpuwatch")
    p.add_argument("seconds", type=float)
    args = p.parse_args(argv)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    group: dict[int, str] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.seconds:
        for proc in psutil.process_iter():
            try:
                times = proc.cpu_times()
                used = times.user + times.system
                if proc.pid not in group:
                    group[proc.pid] = _group(proc)
                    # Running before the window: count from now; started inside it: all of it.
                    first[proc.pid] = used if time.monotonic() - t0 < 0.3 else 0.0
                last[proc.pid] = used
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(0.2)
    totals: collections.Counter[str] = collections.Counter()
    for pid, used in last.items():
        totals[group[pid]] += used - first[pid]
    for name, seconds in totals.most_common(20):
        if seconds >= 0.05:
            print(f"{name:60s} {seconds:8.2f} s")
    print(f"{'all':60s} {sum(totals.values()):8.2f} s in {args.seconds:g} s")


if __name__ == "__main__":
    main()
