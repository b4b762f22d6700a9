"""Worker processes for crash tests: ``python -m protomolt_jobs.worker`` as a subprocess.

``WorkerProcess(dsn, worker_id=..., crash_at=..., **jobs_keys).start()`` waits for the
process's ready line; ``.kill()`` SIGKILLs it, ``.terminate()`` asks for a graceful stop,
``.wait_exit(timeout_s)`` returns the exit status. Its stderr (the worker's logs) goes to a
temporary file, shown by ``.logs()`` when a test fails.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from protomolt_jobs.crashpoints import CRASH_EXIT_CODE, ENV_VAR

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["CRASH_EXIT_CODE", "WorkerProcess"]


class WorkerProcess:
    """One worker process.

    :param dsn: the database.
    :param worker_id: ``jobs.worker_id`` (distinct per process).
    :param crash_at: ``PROTOMOLT_JOBS_CRASH_AT`` (``"after_claim"``, ``"after_checkpoint:embed"``).
    :param sweeper: run the lease sweeper in the process.
    :param log_format: ``--log-format`` (``text`` or ``json``).
    :param jobs_keys: further ``[jobs]`` keys (``lease_seconds=2``, ``worker_count=2`` ...).
    """

    def __init__(
        self,
        dsn: str,
        *,
        worker_id: str,
        crash_at: str | None = None,
        sweeper: bool = True,
        log_format: str = "text",
        **jobs_keys: Any,
    ) -> None:
        self.dsn = dsn
        self.log_format = log_format
        self.worker_id = worker_id
        self.crash_at = crash_at
        self.sweeper = sweeper
        self.jobs_keys = {"worker_id": worker_id, **jobs_keys}
        self.proc: subprocess.Popen | None = None
        self._stderr = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in close()
            prefix=f"pmj-{worker_id}-", suffix=".log", delete=False
        )

    def start(self, ready_timeout_s: float = 30.0, *, wait_ready: bool = True) -> WorkerProcess:
        """Start the process and (unless ``wait_ready`` is false: a process armed to crash at
        once may never print it) wait for its ready line.

        :raises RuntimeError: when it exits or stays silent past ``ready_timeout_s``, or when
            this process is still running (a second start would lose track of it: the first
            would outlive the test, orphaned, and load the rest of the suite).
        """
        if self.alive():
            raise RuntimeError(f"worker {self.worker_id} is already running (pid {self.pid})")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        if self.crash_at:
            env[ENV_VAR] = self.crash_at
        argv = [
            sys.executable,
            "-m",
            "protomolt_jobs.worker",
            "--dsn",
            self.dsn,
            "--log-level",
            "INFO",
            "--log-format",
            self.log_format,
        ]
        for key, value in self.jobs_keys.items():
            argv += ["--set", f"{key}={value}"]
        if not self.sweeper:
            argv.append("--no-sweeper")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=str(REPO_ROOT),
            text=True,
            env=env,
        )
        if not wait_ready:
            return self
        deadline = time.monotonic() + ready_timeout_s
        assert self.proc.stdout is not None
        # Wait for the ready line without blocking past the deadline (the ready line is the
        # process's first output; a crashed process closes stdout).
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise RuntimeError(
                    f"worker {self.worker_id} not ready in {ready_timeout_s}s\n{self.logs()}"
                )
            readable, _, _ = select.select([self.proc.stdout], [], [], min(remaining, 0.5))
            if readable:
                break
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(5)
            raise RuntimeError(
                f"worker {self.worker_id} did not start: rc={self.proc.returncode}\n{self.logs()}"
            )
        event = json.loads(line)
        if event.get("event") != "ready":
            raise RuntimeError(f"worker {self.worker_id}: unexpected first line {line!r}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL the process and reap it; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a graceful stop) and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to end by itself; returns the exit status."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def logs(self) -> str:
        """The process's stderr so far."""
        self._stderr.flush()
        return Path(self._stderr.name).read_text(errors="replace")

    def close(self) -> None:
        """Kill if still running and remove the log file."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        try:
            os.unlink(self._stderr.name)
        except OSError:
            pass

    def __enter__(self) -> WorkerProcess:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- helpers the worker tests share ----------------------------------------------------------


def wait_for(
    condition: Any, timeout_s: float = 20.0, interval_s: float = 0.02, *, what: Any = ""
) -> Any:
    """Poll ``condition()`` until it returns a truthy value; return that value.

    :param what: what is awaited, for the failure message: a string, or a callable returning
        one (called once, on failure, so it can describe the state the wait ended in).
    :raises AssertionError: when it stays falsy for ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"condition not met within {timeout_s}s: {described or condition}")
        time.sleep(interval_s)


def enqueue(store: Any, workflow: dict, input: dict, *, max_attempts: int = 3) -> Any:
    """Insert a QUEUED job carrying ``workflow`` and ``input`` through the real store (the
    submitter's write, without its checks); returns the JobRecord."""
    import uuid

    from protomolt_jobs.store import NewJob

    outcome = store.job_insert(
        NewJob(
            job_id=uuid.uuid4(),
            workflow_name=workflow.get("name") or "inline",
            workflow_definition=workflow,
            input=input,
            max_attempts=max_attempts,
        )
    )
    assert outcome.created
    return outcome.job


def event_types(store: Any, job_id: Any) -> list[tuple[str, str]]:
    """The job's outbox rows as ``(event_type, step)`` in commit order."""
    from protomolt_jobs.kafka.wire import WorkflowRunEvent

    out = []
    for row in store.outbox_for_job(job_id):
        event = WorkflowRunEvent.FromString(row.payload)
        out.append((row.event_type, event.step))
    return out


def events(store: Any, job_id: Any) -> list[Any]:
    """The job's outbox payloads decoded as ``WorkflowRunEvent``, in commit order."""
    from protomolt_jobs.kafka.wire import WorkflowRunEvent

    return [WorkflowRunEvent.FromString(r.payload) for r in store.outbox_for_job(job_id)]


def jobs_config(dsn: str, **overrides: Any) -> Any:
    """A JobsConfig for tests: short lease and backoff, quick polls and sweeps."""
    from protomolt_jobs.config import JobsConfig

    values: dict[str, Any] = {
        "dsn": dsn,
        "worker_id": "test-worker",
        "worker_count": 2,
        "lease_seconds": 2.0,
        "poll_interval_ms": 200,
        "backoff_base_seconds": 0.2,
        "max_attempts": 3,
        "sweep_interval_ms": 100,
        "prune_interval_seconds": 0.1,
        "pool_max_size": 10,
        "shutdown_grace_seconds": 5.0,
    }
    values.update(overrides)
    return JobsConfig(**values)


def in_process_worker(store: Any, dsn: str, **overrides: Any) -> Any:
    """A :class:`Worker` in this process on ``store``, configured by :func:`jobs_config`
    (``overrides`` are its keys); not started."""
    from protomolt_jobs.worker import Worker
    from protomolt_jobs.workflow import Runtime

    return Worker(store, runtime=Runtime(), config=jobs_config(dsn, **overrides), dsn=dsn)
