"""Profile our per-job path with pyinstrument: ``python -m bench.profile [--n N]``.

Everything runs in the main thread (pyinstrument samples the thread it starts on): N
three-step jobs are submitted through the Submitter, then ``Worker.run_once()`` claims and
executes them one by one, against the loopback no-op gRPC server, on a fresh database. Prints
the pyinstrument tree (time per call path over the whole run) and the store calls per job.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from pyinstrument import Profiler

from bench.noop_grpc import NoopServer
from bench.pgdb import BenchDatabase


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--html", help="also write the HTML report here")
    p.add_argument("--workload", choices=["noop", "realistic"], default="noop")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="cProfile on thread CPU time (time.thread_time) instead of pyinstrument's wall",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="no profiler: only the main thread's CPU per job (time.thread_time), for A/B runs",
    )
    p.add_argument("--dump", help="with --cpu: also write the pstats file here (pstats.Stats)")
    args = p.parse_args(argv)

    from bench import ours

    with NoopServer(threads=8) as srv, BenchDatabase("prof") as db:
        engine = ours._Engine({"dsn": db.dsn}, worker_count=1, per_target=8)
        if args.workload == "realistic":
            definition = ours.realistic_workflow(srv.target)
            inputs = [ours.realistic_input(i) for i in range(args.n)]
        else:
            definition = ours.workflow(srv.target)
            inputs = [f"p{i}" for i in range(args.n)]
        engine.submit(definition, inputs[0])  # warm: parse, verify, channel
        engine.worker.run_once()
        try:
            if args.plain:
                profiler = None
            elif args.cpu:
                profiler = cProfile.Profile(time.thread_time)
                profiler.enable()
            else:
                profiler = Profiler(interval=0.0005)
                profiler.start()
            t0 = time.perf_counter()
            c0 = time.thread_time()
            for i in range(args.n):
                engine.submit(definition, inputs[i])
            submit_s = time.perf_counter() - t0
            submit_cpu = time.thread_time() - c0
            done = 0
            while engine.worker.run_once():
                done += 1
            total_s = time.perf_counter() - t0
            total_cpu = time.thread_time() - c0
            if args.plain:
                pass
            elif args.cpu:
                profiler.disable()
            else:
                profiler.stop()
        finally:
            engine.worker.stop(5.0)
            engine.store.close()
            engine.channels.close()
    if args.plain:
        pass
    elif args.cpu:
        stats = pstats.Stats(profiler)
        if args.dump:
            stats.dump_stats(args.dump)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
    else:
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    print(
        f"main-thread CPU: submit {1000 * submit_cpu / args.n:.2f} ms/job, execute "
        f"{1000 * (total_cpu - submit_cpu) / max(1, done):.2f} ms/job"
        + ("" if args.plain else " (under the profiler)")
    )
    if args.html and not args.cpu and not args.plain:
        with open(args.html, "w") as fh:
            fh.write(profiler.output_html())
    print(
        f"jobs executed: {done}; submit {1000 * submit_s / args.n:.2f} ms/job, "
        f"execute {1000 * (total_s - submit_s) / max(1, done):.2f} ms/job (one thread)"
    )
    print(
        "store calls per job:", {k: round(v / args.n, 2) for k, v in sorted(engine.calls.items())}
    )


if __name__ == "__main__":
    main()
