"""``GET /metrics``: the Prometheus text exposition of the process and the node's roles.

The host serves the route; roles contribute :class:`~protomolt_jobs.telemetry.metrics.StoreCollector`
values (the jobs role's run counts, outbox backlog and component health), registered here in a
registry of the node's own, so two nodes in one process never share a collector. The route sits
behind the API token unless ``node.metrics_public`` is true.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio.to_thread
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from protomolt_jobs.telemetry import metrics

__all__ = ["METRICS_PATH", "metrics_route"]

METRICS_PATH = "/metrics"
#: The classic text format every Prometheus (2.x and 3.x) scrapes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_route(collectors: Iterable[Any]) -> Route:
    """The ``GET /metrics`` route over the process counters and ``collectors``.

    :param collectors: prometheus-client collectors contributed by the node's roles.
    """
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)

    async def endpoint(request: Request) -> Response:
        # The collectors may query the database: off the event loop.
        body = await anyio.to_thread.run_sync(metrics.exposition, registry)
        return Response(body, media_type=CONTENT_TYPE)

    return Route(METRICS_PATH, endpoint, methods=["GET"])
