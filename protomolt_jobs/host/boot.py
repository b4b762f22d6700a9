"""Booting a node: load its configuration (with the embedded PostgreSQL a role may need),
start its surfaces, stop on a signal. Shared by ``serve`` (:mod:`protomolt_jobs.host.cli`)
and ``demo`` (:mod:`protomolt_jobs.host.demo`), so neither imports the other.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STOP_SIGNALS", "NodeSurfaces", "install_stop_signals", "load_config", "start_surfaces"]

log = logging.getLogger("protomolt_jobs.cli")

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@dataclass
class NodeSurfaces:
    """A started node with its two surfaces (and the embedded PostgreSQL it may own)."""

    node: Any
    http: Any
    grpc: Any
    embedded: Any = None
    _closed: bool = field(default=False, repr=False)

    @property
    def actions_url(self) -> str:
        """``http://HOST:PORT/protomolt/actions``."""
        return f"{self.http.url}/protomolt/actions"

    def close(self) -> None:
        """Stop the surfaces, then the node, then release the embedded PostgreSQL. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for step in (self.grpc.close, self.http.close, self.node.close):
            try:
                step()
            except Exception:  # every shutdown step must run
                log.exception("shutdown step failed", extra={"action": "shutdown_step_failed"})
        if self.embedded is not None:
            self.embedded.stop()


def start_surfaces(node: Any, config: Any, *, embedded: Any = None) -> NodeSurfaces:
    """Start ``node`` and serve its catalog on the actions route and ProtoMoltService.

    :param node: a composed, not yet started :class:`~protomolt_jobs.host.composer.Node`.
    :param config: its :class:`~protomolt_jobs.host.nodeconfig.NodeConfig` (hosts, ports, token).
    :param embedded: an embedded PostgreSQL to release on close, if any.
    :returns: the running surfaces; :meth:`NodeSurfaces.close` stops everything.
    :raises Exception: whatever failed to start; what had started is closed first.
    """
    from protomolt_jobs.hooks.contract import JobViews, WorkflowRepository
    from protomolt_jobs.host import dashboard
    from protomolt_jobs.host.grpc_service import ProtoMoltGrpcServer
    from protomolt_jobs.host.http_route import ActionsHttpServer, HttpRoute, readiness
    from protomolt_jobs.host.metrics_route import METRICS_PATH, metrics_route
    from protomolt_jobs.telemetry.metrics import StoreCollector

    metrics_public = bool(getattr(config, "metrics_public", False))
    authority = node.authority
    http = grpc_server = None
    try:
        if getattr(config, "otlp_endpoint", None):
            from protomolt_jobs.telemetry import tracing

            tracing.configure(config.otlp_endpoint)
        node.start()
        http = ActionsHttpServer(
            node.catalog,
            host=config.http_host,
            port=config.http_port,
            authority=authority,
            header_timeout_s=config.http_header_timeout_s,
            routes=node.contributions.all(HttpRoute),
            extra=[
                metrics_route(node.contributions.all(StoreCollector)),
                dashboard.slash_redirect(),
                dashboard.dashboard_mount(
                    node.catalog,
                    node.contributions.first(JobViews),
                    authority,
                    node.contributions.first(WorkflowRepository),
                ),
            ],
            public=lambda path: (
                (metrics_public and path == METRICS_PATH) or dashboard.is_public(path)
            ),
            token_cookie=dashboard.TOKEN_COOKIE,
            login_redirect=dashboard.login_redirect,
            health=readiness(node.health),
        ).start()
        grpc_server = ProtoMoltGrpcServer(
            node.catalog,
            host=config.grpc_host,
            port=config.grpc_port,
            authority=authority,
            ready=lambda: node.health()["status"] == "UP",
        ).start()
    except BaseException:  # close what started, re-raised
        for closer in (grpc_server, http):
            if closer is not None:
                closer.close()
        node.close()
        if embedded is not None:
            embedded.stop()
        raise
    for host in {config.http_host, config.grpc_host} - _LOOPBACK:
        if authority.open:
            log.warning(
                "surfaces bind %s without an api_token: anyone who reaches it can run every verb",
                host,
                extra={"action": "open_node_on_network", "host": host},
            )
    for action, message in authority.warnings():
        log.warning(message, extra={"action": action})
    return NodeSurfaces(node=node, http=http, grpc=grpc_server, embedded=embedded)


def load_config(path: str | None, environ: dict[str, str]) -> tuple[Any, Any, list[str]]:
    """Load the node config; start the embedded PostgreSQL when a mounted role wants a
    database (its module's ``database_setting``) and none is configured; collect each
    mounted role's start-up notes (``startup_notes(settings)``). The host knows no role's keys.

    :returns: ``(config, embedded or None, notes)``; notes are lines to print.
    :raises ConfigError: a bad configuration.
    """
    from protomolt_jobs.host import embedded_pg
    from protomolt_jobs.host.nodeconfig import NodeConfig, env_name, role_modules

    config = NodeConfig.load(Path(path) if path else None, environ)
    modules = role_modules()
    mounted = [(role, modules[role]) for role in config.roles if role in modules]
    notes: list[str] = []
    embedded = None
    wanting = [
        (role, key)
        for role, module in mounted
        if isinstance(key := getattr(module, "database_setting", None), str)
        and not config.section(role).get(key)
    ]
    if wanting:
        embedded = embedded_pg.start(config.data_dir)
        environ = {**environ, **{env_name(role, key): embedded.dsn for role, key in wanting}}
        try:
            config = NodeConfig.load(Path(path) if path else None, environ)
        except BaseException:  # stop the server, re-raised
            embedded.stop()
            raise
        first = " (first run: initialised)" if embedded.created else ""
        for role, key in wanting:
            notes.append(
                f"embedded PostgreSQL: {embedded.pgdata}{first}; no {role}.{key} configured "
                f"(set {env_name(role, key)} to use your own)"
            )
    for role, module in mounted:
        startup_notes = getattr(module, "startup_notes", None)
        if callable(startup_notes):
            notes.extend(startup_notes(config.section(role)))
    return config, embedded, notes


#: Signals that stop a node cleanly. SIGHUP is the terminal closing: without a handler it
#: kills the process at once and leaves the embedded PostgreSQL it started running.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install_stop_signals(stop: threading.Event) -> dict[int, Any]:
    """Set ``stop`` on any of :data:`STOP_SIGNALS`; returns the previous handlers."""

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
