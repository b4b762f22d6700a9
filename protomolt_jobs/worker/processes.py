"""Several worker processes under one supervisor (``--processes N``, DESIGN.md section 17).

One Python process runs its claim loops, gRPC calls and store writes under one GIL, so a node
stops near one core's worth of jobs (docs/benchmarks.md). :class:`WorkerProcesses` starts N
``python -m protomolt_jobs.worker`` children, each with its own pool, LISTEN connection, claim
loops and heartbeat (and a distinct ``worker_id``: ``<id>-<i>`` when one is configured, else
each child's ``host-pid``), and supervises them:

- ``start()`` returns once every child printed its ready line (or raises, stopping the rest);
- a child that exits on its own is started again after a backoff (0.5 s doubling to 10 s):
  its claimed jobs are swept back to QUEUED by the lease sweeper, as for any dead worker;
- ``stop()`` sends SIGTERM to every child (each finishes or releases its in-flight jobs within
  its ``shutdown_grace_seconds``) and SIGKILLs what is left after ``timeout_s``.

Only child 0 runs the lease sweeper (one is enough; the sweep is idempotent anyway).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

log = logging.getLogger("protomolt_jobs.worker.processes")

__all__ = ["WorkerProcesses"]

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0


class WorkerProcesses:
    """N worker child processes (see the module doc).

    :param count: how many (>= 1).
    :param args: the worker's command-line arguments (``--dsn``, ``--set k=v`` ...), without
        ``--processes``; child ``i`` > 0 also gets ``--no-sweeper``.
    :param worker_id: the configured ``jobs.worker_id``, or None for each child's default.
    :param env: the children's environment (default: this process's).
    :raises ValueError: for a count below 1.
    """

    def __init__(
        self,
        count: int,
        *,
        args: Sequence[str],
        worker_id: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"processes: must be >= 1; got {count}")
        self.count = count
        self._args = list(args)
        self._worker_id = worker_id
        self._env = dict(os.environ if env is None else env)
        self._procs: list[subprocess.Popen[str] | None] = [None] * count
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        """The running children's pids, in child order."""
        with self._lock:
            return [p.pid for p in self._procs if p is not None and p.poll() is None]

    def argv(self, i: int) -> list[str]:
        """Child ``i``'s command line."""
        argv = [sys.executable, "-m", "protomolt_jobs.worker", *self._args]
        # The child stops on its own if this process dies without stopping it.
        argv += ["--supervisor-pid", str(os.getpid())]
        if self._worker_id:
            argv += ["--set", f"worker_id={self._worker_id}-{i}"]
        if i > 0 and "--no-sweeper" not in argv:
            argv.append("--no-sweeper")
        return argv

    def start(
        self, ready_timeout_s: float = 60.0, *, abort: threading.Event | None = None
    ) -> list[int]:
        """Start every child and wait for their ready lines; then supervise them.

        :param abort: when set while the children start (the supervisor got SIGTERM), stop
            waiting for them: they are stopped and RuntimeError is raised at once.
        :returns: the children's pids.
        :raises RuntimeError: a child exited or stayed silent past ``ready_timeout_s``, or
            ``abort`` was set (the others are stopped first).
        """
        self._stop.clear()
        try:
            for i in range(self.count):
                self._spawn(i)
            deadline = time.monotonic() + ready_timeout_s
            for i in range(self.count):
                self._await_ready(i, deadline, abort)
        except BaseException:  # stop what started, re-raised
            self.stop(10.0)
            raise
        self._monitor = threading.Thread(
            target=self._supervise, name="protomolt-jobs-worker-processes", daemon=True
        )
        self._monitor.start()
        log.info(
            "%d worker processes running: %s",
            self.count,
            self.pids,
            extra={"action": "worker_processes_started", "processes": self.count},
        )
        return self.pids

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM every child, wait up to ``timeout_s``, SIGKILL the rest (idempotent).

        :returns: True when every child ended within the bound.
        """
        self._stop.set()
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(5.0)
        # Taken under the lock _spawn holds while it starts a child and that refuses once
        # _stop is set: a restart racing this stop is either in the list or never started.
        with self._lock:
            procs = [p for p in self._procs if p is not None]
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        clean = True
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                clean = False
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        return clean

    # -- internals ---------------------------------------------------------------------------

    def _spawn(self, i: int) -> subprocess.Popen[str]:
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError(f"worker process {i} not started: the group is stopping")
            proc = subprocess.Popen(
                self.argv(i),
                stdout=subprocess.PIPE,
                text=True,
                env=self._env,
                start_new_session=False,
            )
            self._procs[i] = proc
        return proc

    def _await_ready(self, i: int, deadline: float, abort: threading.Event | None = None) -> None:
        proc = self._procs[i]
        assert proc is not None and proc.stdout is not None
        while True:
            if abort is not None and abort.is_set():
                raise RuntimeError(f"stopped while worker process {i} was starting")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"worker process {i} (pid {proc.pid}) not ready in time")
            readable, _, _ = select.select([proc.stdout], [], [], min(remaining, 0.5))
            if readable:
                break
        line = proc.stdout.readline()
        try:
            event = json.loads(line) if line else {}
        except ValueError:
            event = {}
        if event.get("event") != "ready":
            proc.wait(10)
            raise RuntimeError(
                f"worker process {i} did not start (exit {proc.returncode}): {line.strip()!r}"
            )

    def _supervise(self) -> None:
        backoff = [0.0] * self.count
        while not self._stop.wait(0.5):
            for i in range(self.count):
                proc = self._procs[i]
                if proc is None or proc.poll() is None:
                    continue
                if self._stop.is_set():
                    return
                backoff[i] = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, backoff[i] * 2))
                log.warning(
                    "worker process %d (pid %d) exited with %s; starting it again in %.1f s",
                    i,
                    proc.pid,
                    proc.returncode,
                    backoff[i],
                    extra={"action": "worker_process_exited", "exit_code": proc.returncode},
                )
                if proc.stdout is not None:
                    proc.stdout.close()
                if self._stop.wait(backoff[i]):
                    return
                try:
                    self._spawn(i)
                    self._await_ready(i, time.monotonic() + 60.0, self._stop)
                except (OSError, RuntimeError) as exc:
                    if self._stop.is_set():
                        return
                    log.warning(
                        "worker process %d did not restart: %s",
                        i,
                        exc,
                        extra={"action": "worker_process_restart_failed"},
                    )
