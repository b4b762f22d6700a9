"""Prometheus metrics: the process's counters and a node's database collector (``/metrics``).

Process-wide instruments live in :data:`REGISTRY` (not prometheus-client's global registry, so
a host embedding us keeps its own). They are updated where the work happens and cost a lock
and an add, never a statement:

======================================== ======================================================
metric                                   meaning
======================================== ======================================================
``protomolt_jobs_claims_total``          jobs this process's workers claimed
``protomolt_jobs_settled_total``         segments settled, label ``outcome``: ``completed``,
                                         ``parked``, ``retried``, ``dead``, ``failed``,
                                         ``controlled`` (an operator's cancel or pause, or a
                                         budget pause, took the run), ``recovery_required``
                                         (a step's state cannot be proven), ``abandoned`` (lease
                                         lost, or released at a stop), ``unsettled`` (the
                                         settling write failed)
``protomolt_jobs_lease_lost_total``      fenced writes or heartbeats that matched no row
``protomolt_jobs_step_duration_seconds`` histogram of step calls, labels ``workflow``,
                                         ``method`` (``/pkg.Service/Method``) and ``outcome``
                                         (``OK`` or the gRPC status name)
``protomolt_jobs_relay_published_total`` outbox events the relay published to Kafka
``protomolt_jobs_queue_wait_seconds``    histogram, labels ``workflow`` and ``queue``: submit
                                         to the run's first claim (database times)
``protomolt_jobs_end_to_end_seconds``    histogram, labels ``workflow`` and ``queue``: submit
                                         to a terminal settlement by a worker (completed,
                                         failed, dead)
======================================== ======================================================

A node adds :class:`StoreCollector` (one read, cached :data:`STORE_CACHE_S` seconds, so
scrapes from several Prometheus servers cost one query): ``protomolt_jobs_runs`` (gauge, labels
``status`` and ``queue``), ``protomolt_jobs_outbox_pending`` and ``protomolt_jobs_component_up``
(label ``component``). Labels are bounded: no job id, no error text.

No ``_created`` series: prometheus-client's per-series creation timestamps are turned off once,
when this module is imported (:func:`prometheus_client.disable_created_metrics`, which is
process-wide); every counter and histogram exports its samples alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = [
    "CLAIMS",
    "END_TO_END_SECONDS",
    "LEASE_LOST",
    "QUEUE_WAIT_SECONDS",
    "REGISTRY",
    "RELAY_PUBLISHED",
    "SETTLED",
    "STEP_SECONDS",
    "STORE_CACHE_S",
    "StoreCollector",
    "count_settled",
    "exposition",
    "observe_run",
    "observe_step",
]

log = logging.getLogger("protomolt_jobs.metrics")

#: Seconds a :class:`StoreCollector` reuses its last read.
STORE_CACHE_S = 5.0
#: Statuses always exported (0 when none), so a dashboard's series do not come and go.
_STATUSES = (
    "QUEUED",
    "RUNNING",
    "WAITING",
    "PAUSED",
    "RECOVERY_REQUIRED",
    "COMPLETED",
    "FAILED",
    "DEAD",
    "CANCELLED",
)

# One ``_created`` series per counter and histogram child doubles the series count for a
# timestamp no query of ours reads (Prometheus infers resets from the counter itself).
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)

CLAIMS = Counter(
    "protomolt_jobs_claims", "Jobs claimed by this process's workers.", registry=REGISTRY
)
SETTLED = Counter(
    "protomolt_jobs_settled",
    "Segments settled by this process's workers, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
LEASE_LOST = Counter(
    "protomolt_jobs_lease_lost",
    "Fenced writes or heartbeats that matched no row (another claim owns the job).",
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "protomolt_jobs_step_duration_seconds",
    "Step calls, seconds from request sent to response or error, by workflow.",
    ["workflow", "method", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
QUEUE_WAIT_SECONDS = Histogram(
    "protomolt_jobs_queue_wait_seconds",
    "Runs, seconds from submit to their first claim (database times), by workflow and queue.",
    ["workflow", "queue"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400),
    registry=REGISTRY,
)
END_TO_END_SECONDS = Histogram(
    "protomolt_jobs_end_to_end_seconds",
    "Runs, seconds from submit to a terminal settlement by a worker (completed, failed, dead), "
    "by workflow and queue.",
    ["workflow", "queue"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400, 604800),
    registry=REGISTRY,
)
RELAY_PUBLISHED = Counter(
    "protomolt_jobs_relay_published",
    "Outbox events the relay published to Kafka.",
    registry=REGISTRY,
)

for _outcome in (
    "completed",
    "parked",
    "retried",
    "dead",
    "failed",
    "controlled",
    "recovery_required",
    "abandoned",
    "unsettled",
):
    SETTLED.labels(_outcome)  # exported at 0 from the start

# Labelled children, cached: ``labels()`` costs more than the observation itself, and the
# label sets are few (a method and an outcome; an outcome).
_step_children: dict[tuple[str, str, str], Any] = {}
_settled_children: dict[str, Any] = {}
_run_children: dict[tuple[Any, str, str], Any] = {}


def observe_step(workflow: str, method: str, outcome: str, seconds: float) -> None:
    """Record one step call of ``workflow`` in :data:`STEP_SECONDS`."""
    key = (workflow, method, outcome)
    child = _step_children.get(key)
    if child is None:
        child = _step_children.setdefault(key, STEP_SECONDS.labels(workflow, method, outcome))
    child.observe(seconds)


def count_settled(outcome: str) -> None:
    """Count one settlement in :data:`SETTLED`."""
    child = _settled_children.get(outcome)
    if child is None:
        child = _settled_children.setdefault(outcome, SETTLED.labels(outcome))
    child.inc()


def observe_run(
    workflow: str, queue: str, *, waited_s: float | None = None, total_s: float | None = None
) -> None:
    """Record a run's latencies: ``waited_s`` in :data:`QUEUE_WAIT_SECONDS` (its first claim),
    ``total_s`` in :data:`END_TO_END_SECONDS` (its terminal settlement); None skips one.
    Negative values (clock steps of the database) are recorded as 0."""
    for histogram, seconds in ((QUEUE_WAIT_SECONDS, waited_s), (END_TO_END_SECONDS, total_s)):
        if seconds is None:
            continue
        key = (histogram, workflow, queue)
        child = _run_children.get(key)
        if child is None:
            child = _run_children.setdefault(key, histogram.labels(workflow, queue))
        child.observe(max(0.0, seconds))


class StoreCollector:
    """Counts read from the store, cached; registered in a node's own registry.

    :param store: a :class:`~protomolt_jobs.store.store.JobStore` (``metrics_counts()``), or
        None when the node has no database (then only component health is exported).
    :param components: returns ``{component: running}`` for the node's background duties.
    :param cache_s: seconds a read is reused.
    """

    def __init__(
        self,
        store: Any,
        components: Callable[[], Mapping[str, bool]] = dict,
        *,
        cache_s: float = STORE_CACHE_S,
    ) -> None:
        self._store = store
        self._components = components
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._read_at = -1e18
        self._counts: tuple[dict[tuple[str, str], int], int] | None = None
        self._store_up = False

    def _read(self) -> tuple[dict[tuple[str, str], int], int] | None:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self._cache_s:
                self._read_at = now
                try:
                    self._counts = self._store.metrics_counts()
                    self._store_up = True
                except Exception:  # a scrape must answer even when the database does not
                    log.warning(
                        "metrics: store counts unavailable",
                        exc_info=True,
                        extra={"action": "metrics_store_unavailable"},
                    )
                    self._counts, self._store_up = None, False
            return self._counts

    def collect(self) -> Iterator[Metric]:
        """Yield the gauges (prometheus-client's collector protocol)."""
        up = GaugeMetricFamily(
            "protomolt_jobs_component_up",
            "1 when the node's component is running (store: the last count query answered).",
            labels=["component"],
        )
        if self._store is not None:
            counts = self._read()
            up.add_metric(["store"], 1.0 if self._store_up else 0.0)
            if counts is not None:
                runs, pending = counts
                gauge = GaugeMetricFamily(
                    "protomolt_jobs_runs", "Runs by status and queue.", labels=["status", "queue"]
                )
                # Every status of the default queue is exported (0 when none), so the usual
                # series do not come and go; other queues appear once they hold runs.
                keys = {(s, "default") for s in _STATUSES} | set(runs)
                for status, queue in sorted(keys):
                    gauge.add_metric([status, queue], float(runs.get((status, queue), 0)))
                yield gauge
                yield GaugeMetricFamily(
                    "protomolt_jobs_outbox_pending",
                    "Outbox events not yet published (PENDING).",
                    value=float(pending),
                )
        try:
            components = dict(self._components())
        except Exception:  # a scrape must answer without the health part
            log.warning(
                "metrics: component health unavailable",
                exc_info=True,
                extra={"action": "metrics_components_unavailable"},
            )
            components = {}
        for name, running in sorted(components.items()):
            up.add_metric([name], 1.0 if running else 0.0)
        yield up


def exposition(node_registry: CollectorRegistry | None = None) -> bytes:
    """The text exposition of the process's metrics and, when given, a node's collectors.

    :returns: Prometheus text format 0.0.4 (UTF-8).
    """
    body = generate_latest(REGISTRY)
    if node_registry is not None:
        body += generate_latest(node_registry)
    return body
