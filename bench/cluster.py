"""A PostgreSQL cluster of the benchmark's own (``--own-cluster``), stopped and removed at exit.

:class:`OwnCluster` runs ``initdb`` into a temporary directory with the binaries of the shared
cluster's server version (``/usr/lib/postgresql/<major>/bin``, or ``pg_config --bindir``),
starts it on a free loopback port with ``pg_stat_statements`` preloaded
(``pg_stat_statements.track=all``, so statements run by triggers and foreign-key checks show
too) and ``track_io_timing=on``, and points :mod:`bench.pgdb` (and every child, through
``PROTOMOLT_BENCH_DSN``) at it. Everything else is the server's default, so the figures are
those of a stock PostgreSQL; :attr:`OwnCluster.settings` lists what the report prints.

The cluster goes away on every way out: the context manager's exit (normal end, an exception,
Ctrl-C as ``KeyboardInterrupt``), SIGTERM (turned into ``SystemExit``) and, as a last resort,
an ``atexit`` hook. Stop is ``pg_ctl stop -m fast``, then ``immediate``, then SIGKILL of the
postmaster, then the directory is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

import psycopg

from bench import pgdb

#: Settings written to the cluster's postgresql.conf (besides port and sockets).
SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    "pg_stat_statements.max": "10000",
    "track_io_timing": "on",
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
}
#: Server settings read back and printed with the report.
REPORTED = (
    "server_version",
    "shared_buffers",
    "max_connections",
    "fsync",
    "synchronous_commit",
    "wal_level",
    "full_page_writes",
    "checkpoint_timeout",
    "max_wal_size",
    "autovacuum",
    "shared_preload_libraries",
    "pg_stat_statements.track",
    "pg_stat_statements.track_planning",
    "track_io_timing",
    "jit",
)


def _as_owner(cmd: list[str]) -> list[str]:
    """``cmd`` run as the ``postgres`` user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bindir(major: int | None = None) -> Path:
    """The directory of ``initdb``/``pg_ctl`` for server major ``major`` (default: the shared
    cluster's, read over :data:`bench.pgdb.ADMIN_DSN`; 15 when that cannot be reached).

    :raises RuntimeError: no such binaries on this machine.
    """
    if major is None:
        try:
            with psycopg.connect(pgdb.ADMIN_DSN, connect_timeout=3) as conn:
                major = conn.info.server_version // 10000
        except psycopg.Error:
            major = 15
    candidates = [Path(f"/usr/lib/postgresql/{major}/bin")]
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], check=False, capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise RuntimeError(f"--own-cluster: no initdb/pg_ctl for PostgreSQL {major} on this machine")


class OwnCluster:
    """``with OwnCluster() as c: c.dsn``: a throwaway cluster for one benchmark process."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="pmjb-cluster-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.settings: dict[str, str] = {}
        self.postmaster_pid: int | None = None
        self._previous: tuple[str, str | None] | None = None
        self._old_sigterm = None
        self._stopped = False

    def __enter__(self) -> Self:
        atexit.register(self.stop)
        self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_to_exit)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        subprocess.run(
            _as_owner(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        conf = {**SETTINGS, "port": str(self.port), "unix_socket_directories": f"'{self.dir}'"}
        with open(self.data / "postgresql.conf", "a") as fh:
            for key, value in conf.items():
                quoted = value if value.startswith("'") else f"'{value}'"
                fh.write(f"{key} = {quoted}\n")
        subprocess.run(
            _as_owner(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )
        self.postmaster_pid = int((self.data / "postmaster.pid").read_text().split()[0])
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for name in REPORTED:
                row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
                self.settings[name] = row[0] if row else None
        self._previous = (pgdb.ADMIN_DSN, os.environ.get("PROTOMOLT_BENCH_DSN"))
        pgdb.ADMIN_DSN = self.dsn
        os.environ["PROTOMOLT_BENCH_DSN"] = self.dsn

    def stop(self) -> None:
        """Stop the server and remove its directory (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._previous is not None:
            pgdb.ADMIN_DSN = self._previous[0]
            if self._previous[1] is None:
                os.environ.pop("PROTOMOLT_BENCH_DSN", None)
            else:
                os.environ["PROTOMOLT_BENCH_DSN"] = self._previous[1]
        if (self.data / "postmaster.pid").exists():
            for mode in ("fast", "immediate"):
                try:
                    subprocess.run(
                        _as_owner(
                            [
                                str(self.bin / "pg_ctl"),
                                "-D",
                                str(self.data),
                                "-m",
                                mode,
                                "-w",
                                "stop",
                            ]
                        ),
                        capture_output=True,
                        timeout=30,
                        check=True,
                    )
                    break
                except (subprocess.SubprocessError, OSError):
                    continue
            else:
                if self.postmaster_pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.postmaster_pid, signal.SIGKILL)
                    time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _sigterm_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
