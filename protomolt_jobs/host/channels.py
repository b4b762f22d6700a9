"""Channels for step targets: the node's in-process endpoint and everything else.

grpcio has no in-process transport, so co-mounted roles' gRPC services
(:class:`~protomolt_jobs.hooks.contract.InProcessService` contributions) are served by one
gRPC server bound to a unix socket under the node's data directory. ``inprocess:NAME``
targets resolve to that socket; the name is stable across restarts, so a job row that
snapshotted ``inprocess:parse`` keeps working after the node reboots. Any other target is a
normal ``host:port`` channel, secure when the step says ``tls``. Channels are node-owned:
one per ``(target, tls)``, shared by every caller, closed when the node closes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc

from protomolt_jobs.hooks.contract import InProcessService

__all__ = ["IN_PROCESS_PREFIX", "Channels"]

log = logging.getLogger("protomolt_jobs.channels")

#: Target prefix of co-mounted services.

#: Options of every channel the node shares. Channels live as long as the node, so after a
#: target's outage gRPC's default reconnect backoff (growing to 120 s) would keep steps failing
#: UNAVAILABLE long after the target is back; cap it at a few seconds.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)

IN_PROCESS_PREFIX = "inprocess:"
#: AF_UNIX paths longer than this do not fit ``sun_path`` on Linux (108 bytes with the NUL).
_MAX_SOCKET_PATH = 100


class Channels:
    """The node's :class:`~protomolt_jobs.hooks.contract.ChannelFactory`.

    :param data_dir: the node's data directory; the socket goes to ``<data_dir>/run/``
        (or a short temporary directory when that path is too long for a unix socket).
    :param node_id: distinguishes the socket of concurrent nodes sharing a data directory.
    :param max_workers: threads of the in-process server (one per call in flight).
    """

    def __init__(self, data_dir: Path, *, node_id: str, max_workers: int = 64) -> None:
        self._data_dir = Path(data_dir)
        self._node_id = node_id
        self._max_workers = max_workers
        self._services: dict[str, InProcessService] = {}
        self._server: grpc.Server | None = None
        self._socket_path: Path | None = None
        self._temp_dir: str | None = None
        self._channels: dict[tuple[str, bool], grpc.Channel] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ wiring

    def register(self, services: Sequence[InProcessService]) -> None:
        """Add in-process services (before :meth:`start`).

        :raises ValueError: two services share a name, or the server already started.
        """
        with self._lock:
            if self._server is not None:
                raise ValueError("in-process services must be registered before the node starts")
            for service in services:
                if service.name in self._services:
                    raise ValueError(f"two in-process services are named {service.name!r}")
                self._services[service.name] = service

    @property
    def names(self) -> list[str]:
        """Names of the registered in-process services."""
        return sorted(self._services)

    @property
    def socket_path(self) -> Path | None:
        """The in-process server's socket once started, else None."""
        return self._socket_path

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Serve the registered in-process services (nothing to do when there are none).

        :raises RuntimeError: the socket cannot be bound.
        """
        with self._lock:
            if self._server is not None or not self._services or self._closed:
                return
            path = self._choose_socket_path()
            path.unlink(missing_ok=True)
            server = grpc.server(
                futures.ThreadPoolExecutor(
                    max_workers=self._max_workers, thread_name_prefix="inprocess-grpc"
                )
            )
            for service in self._services.values():
                server.add_generic_rpc_handlers(tuple(service.handlers))
            try:
                bound = server.add_insecure_port(f"unix:{path}")
            except RuntimeError as exc:
                raise RuntimeError(f"cannot bind the in-process endpoint at {path}: {exc}") from exc
            if not bound:
                raise RuntimeError(f"cannot bind the in-process endpoint at {path}")
            server.start()
            self._server = server
            self._socket_path = path
        log.info(
            "in-process endpoint serving %s on %s",
            ", ".join(self.names),
            path,
            extra={"action": "inprocess_started", "services": self.names},
        )

    def close(self, grace_s: float = 1.0) -> None:
        """Close every channel handed out, stop the in-process server and remove its socket.
        Idempotent."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
            path = self._socket_path
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
        if server is not None:
            server.stop(grace_s).wait()
            log.info("in-process endpoint stopped", extra={"action": "inprocess_stopped"})
        if path is not None:
            path.unlink(missing_ok=True)
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    # ------------------------------------------------------------------ channels

    def channel(self, target: str, tls: bool) -> grpc.Channel:
        """The node-owned channel to ``target`` (one per ``(target, tls)``, reused by every
        caller and closed by :meth:`close`); callers must not close it.

        :param target: ``inprocess:NAME`` or ``host:port``.
        :param tls: secure channel with the default roots (ignored for in-process targets).
        :raises ValueError: an ``inprocess:`` name no co-mounted role serves, a blank target,
            or the node is closed.
        """
        if not isinstance(target, str) or not target.strip():
            raise ValueError(
                f"a gRPC target must be 'host:port' or 'inprocess:NAME'; got {target!r}"
            )
        in_process = target.startswith(IN_PROCESS_PREFIX)
        if in_process:
            name = target[len(IN_PROCESS_PREFIX) :]
            if name not in self._services:
                known = ", ".join(self.names) or "none"
                raise ValueError(
                    f"no in-process service named {name!r} on this node (in-process services: "
                    f"{known}); mount the role that serves it"
                )
        key = (target, bool(tls) and not in_process)
        with self._lock:
            if self._closed:
                raise ValueError(f"the node's channels are closed; cannot open {target}")
            channel = self._channels.get(key)
            if channel is None:
                if in_process:
                    channel = grpc.insecure_channel(
                        f"unix:{self._choose_socket_path()}", options=CHANNEL_OPTIONS
                    )
                elif key[1]:
                    channel = grpc.secure_channel(
                        target, grpc.ssl_channel_credentials(), options=CHANNEL_OPTIONS
                    )
                else:
                    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
                self._channels[key] = channel
        return channel

    def _choose_socket_path(self) -> Path:
        if self._socket_path is not None:
            return self._socket_path
        path = self._data_dir / "run" / f"inprocess-{self._node_id}.sock"
        if len(str(path)) > _MAX_SOCKET_PATH:
            # A deep data dir cannot hold a unix socket; a short private temp dir can.
            if self._temp_dir is None:
                self._temp_dir = tempfile.mkdtemp(prefix="pmj-")
            path = Path(self._temp_dir) / f"{self._node_id}.sock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._socket_path = path
        return path

    def __repr__(self) -> str:
        return f"Channels(services={self.names}, socket={self._socket_path})"
