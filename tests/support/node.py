"""Test helpers for the node surfaces: a stub catalog whose verbs raise any action error."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from protomolt_jobs.errors import ERROR_CLASSES, error_for_code
from protomolt_jobs.host.catalog import Catalog

#: Every action error code with its (gRPC status name, HTTP status), per DESIGN.md section 4.
ERROR_TABLE: dict[str, tuple[str, int]] = {
    "invalid-input": ("INVALID_ARGUMENT", 400),
    "unknown-action": ("UNIMPLEMENTED", 404),
    "permission-denied": ("PERMISSION_DENIED", 403),
    "resource-exhausted": ("RESOURCE_EXHAUSTED", 429),
    "unavailable": ("UNAVAILABLE", 503),
    "job-corrupt": ("DATA_LOSS", 500),
    "internal-error": ("INTERNAL", 500),
}
assert set(ERROR_TABLE) == set(ERROR_CLASSES)


class StubAction:
    """A verb that answers per its input: ``{"raise": code}`` raises that action error,
    ``{"boom": true}`` raises RuntimeError, ``{"answer": {...}}`` returns it, else echoes."""

    scope = "service-invoke"

    def __init__(self, name: str) -> None:
        self.input_schema: dict[str, Any] = {"type": "object"}
        self.name = name
        self.description = f"stub {name}"
        self.calls: list[dict[str, Any]] = []

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(input)
        code = input.get("raise") or input.get("workflowName", "")
        if code in ERROR_CLASSES:
            raise error_for_code(code, f"stub {code}", {"field": "x"})
        if input.get("boom") or code == "boom":
            raise RuntimeError("secret stack detail")
        if "answer" in input:
            return input["answer"]
        if code == "bad-answer":
            return {"ok": True, "jobId": {"not": "a string"}}
        return {"ok": True, "echo": input, "jobId": "j-1", "status": "QUEUED"}


def stub_catalog(*names: str) -> tuple[Catalog, dict[str, StubAction]]:
    """A real Catalog holding a StubAction per name (default: the six surface verbs)."""
    names = names or (
        "submit-workflow",
        "get-job",
        "list-jobs",
        "complete-step",
        "run-workflow",
    )
    catalog = Catalog()
    actions = {}
    for n in names:
        actions[n] = StubAction(n)
        catalog.register(actions[n])
    return catalog, actions


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 10,
) -> tuple[int, Any, dict[str, str]]:
    """One HTTP call: ``(status, decoded JSON body or bytes, headers)``."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, payload, hdrs = resp.status, resp.read(), _headers(resp.headers)
    except urllib.error.HTTPError as err:
        status, payload, hdrs = err.code, err.read(), _headers(err.headers)
    try:
        return status, json.loads(payload), hdrs
    except ValueError:
        return status, payload, hdrs


def node_environ(
    data_dir: Any,
    dsn: str | None,
    *,
    roles: str = "registry,parse,jobs",
    token: str | None = None,
    **jobs: Any,
) -> dict[str, str]:
    """``PROTOMOLT_*`` variables for a test node: free ports, short cadences, ``dsn``."""
    env = {
        "PROTOMOLT_ROLES": roles,
        "PROTOMOLT_NODE_DATA_DIR": str(data_dir),
        "PROTOMOLT_NODE_HTTP_PORT": "0",
        "PROTOMOLT_NODE_GRPC_PORT": "0",
        "PROTOMOLT_JOBS_WORKER_COUNT": "2",
        "PROTOMOLT_JOBS_POLL_INTERVAL_MS": "100",
        "PROTOMOLT_JOBS_BACKOFF_BASE_SECONDS": "0.2",
        "PROTOMOLT_JOBS_LEASE_SECONDS": "30",
        "PROTOMOLT_JOBS_SHUTDOWN_GRACE_SECONDS": "2",
    }
    if dsn:
        env["PROTOMOLT_JOBS_DSN"] = dsn
    if token:
        env["PROTOMOLT_API_TOKEN"] = token
    env.update({f"PROTOMOLT_JOBS_{k.upper()}": str(v) for k, v in jobs.items()})
    return env


def start_node(environ: dict[str, str]) -> Any:
    """Compose and start a node from ``environ`` with both surfaces (``NodeSurfaces``)."""
    from protomolt_jobs.host.cli import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    config = NodeConfig.load(None, environ)
    return start_surfaces(compose(config), config)


def start_node_with_file(data_dir: Any, dsn: str | None, text: str, **jobs: Any) -> Any:
    """:func:`start_node` with a ``protomolt.toml`` holding ``text`` (for what only the file
    can say: ``[node.tokens]``, ``[node.groups]``, ``[node.scopes]``) and the test variables
    of :func:`node_environ` (free ports, ``dsn``)."""
    from pathlib import Path

    from protomolt_jobs.host.boot import start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.nodeconfig import NodeConfig

    path = Path(data_dir) / "protomolt.toml"
    path.write_text(text)
    config = NodeConfig.load(path, node_environ(Path(data_dir) / "data", dsn, **jobs))
    return start_surfaces(compose(config), config)


def wait_for(predicate: Any, *, timeout_s: float = 30.0, interval_s: float = 0.05) -> Any:
    """Poll ``predicate()`` until it returns something truthy; that value.

    :raises AssertionError: it stayed falsy for ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s (last value {last!r})")


def _headers(message: Any) -> dict[str, str]:
    """Response headers with canonical capitalisation (``Content-Type``): servers may send
    names in any case (uvicorn sends them lower-case)."""
    return {"-".join(p.capitalize() for p in k.split("-")): v for k, v in message.items()}
