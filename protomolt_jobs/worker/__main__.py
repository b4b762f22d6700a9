"""A standalone worker process: ``python -m protomolt_jobs.worker``.

Runs a :class:`~protomolt_jobs.worker.Worker` and a :class:`~protomolt_jobs.maintenance.sweeper.Sweeper`,
built by :meth:`protomolt_jobs.app.JobsApp.open` (the one composition root), against one
database until SIGTERM or SIGINT, then stops gracefully (in-flight jobs get the
grace period, the rest are released back to QUEUED) and exits 0.

Configuration is the ``[jobs]`` keys, from ``PROTOMOLT_JOBS_<KEY>`` environment variables
and ``--set key=value`` options (options win); ``--dsn`` is a shortcut for ``--set dsn=``.
Workflows whose schema is ``descriptorSetBase64`` or ``sources`` need nothing else; a
``type`` schema needs a host's type pool and does not run here.

Crash tests (only): ``PROTOMOLT_JOBS_CRASH_AT`` arms a named crash point, see
:mod:`protomolt_jobs.crashpoints`.

Once running it prints one line ``{"event": "ready", "worker_id": ..., "pid": ...}`` to
stdout, so a parent process can wait for it.

``--processes N`` (N > 1) makes this process a supervisor of N such worker processes
(:mod:`protomolt_jobs.worker.processes`: each its own pool, listener and claim loops; the
first one runs the sweeper); it prints ``{"event": "ready", "processes": N, "pids": [...],
"pid": ...}`` once all of them are ready, and SIGTERM/SIGINT stops them all. A child whose
supervisor dies without stopping it (SIGKILL) notices within half a second (its parent
changes) and stops as if it had been sent SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

import grpc

from protomolt_jobs import crashpoints
from protomolt_jobs.app import JobsApp, Lanes
from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.errors import StoreError
from protomolt_jobs.telemetry.logs import FORMATS
from protomolt_jobs.telemetry.logs import configure as configure_logging
from protomolt_jobs.workflow import Runtime

_ENV_PREFIX = "PROTOMOLT_JOBS_"


def _settings(environ: Mapping[str, str], args: argparse.Namespace) -> dict[str, str]:
    settings: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(_ENV_PREFIX) and key != crashpoints.ENV_VAR:
            settings[key[len(_ENV_PREFIX) :].lower()] = value
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value; got {item!r}")
        settings[key.strip()] = value
    if args.dsn:
        settings["dsn"] = args.dsn
    # The worker process neither relays nor consumes: keep broker keys from failing validation
    # on an unrelated combination.
    for key in ("kafka_bootstrap", "request_topic"):
        settings.pop(key, None)
    return settings


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the worker process.

    :returns: the exit status (0 after a graceful stop, 1 when the database cannot be
        reached, 2 on bad configuration).
    """
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m protomolt_jobs.worker",
        description=__doc__.split("\n")[0],
        # No abbreviations: "--proc 2" would pass _without_processes to every child, each of
        # which would then supervise children of its own, without end.
        allow_abbrev=False,
    )
    parser.add_argument("--dsn", help="PostgreSQL connection string (jobs.dsn)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a [jobs] key")
    parser.add_argument("--no-sweeper", action="store_true", help="do not run the lease sweeper")
    parser.add_argument("--log-level", default=environ.get("PROTOMOLT_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=environ.get("PROTOMOLT_LOG_FORMAT", "text"),
        help="text (job fields after the message) or json (one object per line)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run N worker processes under this one (each with its own pool and listener)",
    )
    parser.add_argument(
        "--supervisor-pid",
        type=int,
        default=None,
        help="(set by --processes) stop gracefully once this process is no longer the parent",
    )
    args = parser.parse_args(argv)
    try:
        config = JobsConfig.from_mapping(_settings(environ, args))
        if not config.dsn:
            raise ConfigError("jobs.dsn is required (--dsn or PROTOMOLT_JOBS_DSN)")
        crashpoints.arm_for_tests(environ)
        if args.processes < 1:
            raise ConfigError(f"--processes must be >= 1; got {args.processes}")
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    configure_logging(args.log_level, args.log_format)
    if args.processes > 1:
        return _supervise(args, argv, environ)

    channels = _Channels()
    try:
        app = JobsApp.open(
            config,
            runtime=Runtime(
                structured_generator=config.structured_generator, channel_factory=channels.channel
            ),
            lanes=Lanes(sweeper=not args.no_sweeper, relay=False, request_consumer=False),
        )
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        app.start()
        print(
            json.dumps({"event": "ready", "worker_id": config.worker_id, "pid": os.getpid()}),
            flush=True,
        )
        while not stop.wait(0.5):
            if args.supervisor_pid is not None and os.getppid() != args.supervisor_pid:
                # The supervisor died without stopping us (SIGKILL, OOM): nobody would ever
                # send the SIGTERM, so stop as if it had (in-flight jobs finish or go back).
                logging.getLogger("protomolt_jobs.worker").warning(
                    "the supervisor (pid %d) is gone; stopping",
                    args.supervisor_pid,
                    extra={"action": "worker_orphaned", "worker_id": config.worker_id},
                )
                break
    finally:
        app.close()
        channels.close()
    return 0


class _Channels:
    """One gRPC channel per ``(target, tls)`` for the process's life, as the node gives its
    role (``host/channels.py``): without it each segment opens a channel and a handshake."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, bool], grpc.Channel] = {}

    def channel(self, target: str, tls: bool) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get((target, tls))
            if ch is None:
                ch = (
                    grpc.secure_channel(target, grpc.ssl_channel_credentials())
                    if tls
                    else grpc.insecure_channel(target)
                )
                self._channels[(target, tls)] = ch
            return ch

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()


def _supervise(
    args: argparse.Namespace, argv: Sequence[str] | None, environ: Mapping[str, str]
) -> int:
    """``--processes N``: N worker processes under this one until SIGTERM or SIGINT."""
    from protomolt_jobs.worker.processes import WorkerProcesses

    child_args = _without_processes(list(sys.argv[1:] if argv is None else argv))
    worker_id = _settings(environ, args).get("worker_id") or None
    # The children get the id with their index appended; drop the parent's own setting.
    child_env = {k: v for k, v in environ.items() if k != f"{_ENV_PREFIX}WORKER_ID"}
    child_args = _without_worker_id(child_args)
    group = WorkerProcesses(args.processes, args=child_args, worker_id=worker_id, env=child_env)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        pids = group.start(abort=stop)
    except RuntimeError as exc:
        if stop.is_set():
            return 0  # SIGTERM/SIGINT while the children started: they are stopped
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            json.dumps(
                {"event": "ready", "processes": args.processes, "pids": pids, "pid": os.getpid()}
            ),
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    finally:
        group.stop(timeout_s=60.0)
    return 0


def _without_processes(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--processes":
            skip = True
            continue
        if item.startswith("--processes="):
            continue
        out.append(item)
    return out


def _without_worker_id(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--set" and i + 1 < len(argv) and argv[i + 1].startswith("worker_id="):
            i += 2
            continue
        if argv[i].startswith("--set=worker_id="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
