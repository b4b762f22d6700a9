"""Profile our per-job path with pyinstrument: ``python -m bench.profile [--n N]``.

Everything runs in the main thread (pyinstrument samples the thread it starts on): N
three-step jobs are submitted through the Submitter, then ``Worker.run_once()`` claims and
executes them one by one, against the loopback no-op gRPC server, on a fresh database. Prints
the pyinstrument tree (time per call path over the whole run) and the store calls per job.
"""

from __future__ import annotations

import argparse
import time

from pyinstrument import Profiler

from bench.noop_grpc import NoopServer
from bench.pgdb import BenchDatabase


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--html", help="also write the HTML report here")
    args = p.parse_args(argv)

    from bench import ours

    with NoopServer(threads=8) as srv, BenchDatabase("prof") as db:
        engine = ours._Engine({"dsn": db.dsn}, worker_count=1, per_target=8)
        definition = ours.workflow(srv.target)
        try:
            profiler = Profiler(interval=0.0005)
            t0 = time.perf_counter()
            profiler.start()
            for i in range(args.n):
                engine.submit(definition, f"p{i}")
            submit_s = time.perf_counter() - t0
            done = 0
            while engine.worker.run_once():
                done += 1
            profiler.stop()
            total_s = time.perf_counter() - t0
        finally:
            engine.worker.stop(5.0)
            engine.store.close()
            engine.channels.close()
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    if args.html:
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
