"""PostgreSQL CPU spent serving the harness's own connections (``--own-cluster`` accounting).

A throughput child polls the database while the system under test runs: its completion poll
(every 0.2 s), the relay's lag sampler (every 0.25 s), the checks at the end. Those backends
are the postmaster's children like the system's, so process accounting
(:mod:`bench.dbprobe`) counted their CPU in "PostgreSQL CPU per job": measured 0.04-0.06 ms
per job at W=16 with the relay on (a count over the growing outbox every 0.2 s), which is the
harness's cost, not the system's.

Each such connection is opened with :func:`connect` (sync) or registered with
:func:`account` (async): just before it closes, the CPU its backend used since it started
(``utime + stime`` of ``/proc/<backend pid>/stat``, connection start-up included) is added to
:data:`SPENT_S`. The child reports the sum as ``harness_db_cpu_s``; the probe subtracts it
from the window's total and shows it as its own line (``harness polls (excluded)``). What the
backend does after that read (its disconnect) stays counted: microseconds. On a cluster that
is not local (no ``/proc`` entry for the pid) nothing is read and nothing is subtracted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

_TICK = os.sysconf("SC_CLK_TCK")
_lock = threading.Lock()
#: CPU seconds of the closed harness connections' backends, this process.
SPENT_S = 0.0


def backend_cpu_s(pid: int) -> float:
    """``utime + stime`` of a local backend process, seconds (0.0 when it is not readable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def account(backend_pid: int) -> None:
    """Add the CPU of backend ``backend_pid`` so far to :data:`SPENT_S` (call it just before
    the connection closes)."""
    global SPENT_S
    spent = backend_cpu_s(backend_pid)
    with _lock:
        SPENT_S += spent


@contextmanager
def connect(dsn: str, **kwargs: Any) -> Iterator[psycopg.Connection]:
    """An autocommit connection of the harness, its backend's CPU accounted on close."""
    with psycopg.connect(dsn, autocommit=True, **kwargs) as conn:
        try:
            yield conn
        finally:
            account(conn.info.backend_pid)
