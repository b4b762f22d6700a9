"""A standalone worker process: ``python -m protomolt_jobs.worker``.

Runs a :class:`~protomolt_jobs.worker.Worker` and a :class:`~protomolt_jobs.worker.Sweeper`,
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

from protomolt_jobs import crashpoints
from protomolt_jobs.app import JobsApp, Lanes
from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.errors import StoreError
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
        prog="python -m protomolt_jobs.worker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dsn", help="PostgreSQL connection string (jobs.dsn)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a [jobs] key")
    parser.add_argument("--no-sweeper", action="store_true", help="do not run the lease sweeper")
    parser.add_argument("--log-level", default=environ.get("PROTOMOLT_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    try:
        config = JobsConfig.from_mapping(_settings(environ, args))
        if not config.dsn:
            raise ConfigError("jobs.dsn is required (--dsn or PROTOMOLT_JOBS_DSN)")
        crashpoints.arm_for_tests(environ)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(action)s %(message)s",
            defaults={"action": "-"},
        )
    )
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])

    try:
        app = JobsApp.open(
            config,
            runtime=Runtime(structured_generator=config.structured_generator),
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
            pass
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
