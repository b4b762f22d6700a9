"""The jobs configuration: one frozen dataclass, its defaults and its validation.

Keys match the ``[jobs]`` section of ``protomolt.toml`` and the environment overrides
``PROTOMOLT_JOBS_<KEY>`` (see ``docs/configuration.md``). Defaults follow the reference
(upstream ``WorkflowRunsConfig``): 2 claim loops, a 5 minute lease, 500 ms poll, 5 s backoff
base, 3 attempts, 8 concurrent calls per target, events on ``workflow-run-events``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = ["JobsConfig", "ConfigError", "CONSUMER_GROUP", "default_worker_id"]

#: Consumer group of the request-topic consumer (a constant, as upstream).
CONSUMER_GROUP = "protomolt-jobs-worker"


class ConfigError(ValueError):
    """A configuration value is missing or malformed; the message names the key and the
    expected form."""


def default_worker_id() -> str:
    """``<host>-<pid>``: distinct per process, never blank."""
    return f"{socket.gethostname() or 'host'}-{os.getpid()}"


@dataclasses.dataclass(frozen=True, slots=True)
class JobsConfig:
    """Everything the jobs role reads. Units are in the field names.

    A config with ``dsn=None`` is valid: the role mounts with a null store and its verbs
    answer ``unavailable``.
    """

    #: PostgreSQL connection string (libpq URI or key=value). None: jobs are not configured.
    dsn: str | None = None
    #: Kafka bootstrap servers (``host:port[,host:port]``). None: relay and consumer stay off.
    kafka_bootstrap: str | None = None
    #: Topic of ``WorkflowRunRequest`` records; None disables broker-native submission.
    #: When a bootstrap is set and this is None, the role uses ``workflow-run-requests``.
    request_topic: str | None = None
    #: Topic the relay publishes ``WorkflowRunEvent`` records to.
    events_topic: str = "workflow-run-events"
    #: Stamped into ``lease_owner``; never blank. Default ``<host>-<pid>``.
    worker_id: str = dataclasses.field(default_factory=default_worker_id)
    #: Concurrent job executions in this process (claim loops / in-flight segments).
    worker_count: int = 2
    #: Lease length of a claim, seconds. The heartbeat extends it about every third of it.
    lease_seconds: float = 300.0
    #: Fallback poll of an idle claim loop when no NOTIFY arrives, milliseconds.
    poll_interval_ms: int = 500
    #: Retry backoff base: ``base * 2^(attempt-1)`` seconds.
    backoff_base_seconds: float = 5.0
    #: Attempts a job gets before it goes DEAD (stamped into each row at submit).
    max_attempts: int = 3
    #: Per-process cap of segments running against one target.
    max_concurrent_per_target: int = 8
    #: Sweeper cadence, milliseconds (expired leases back to QUEUED, or DEAD).
    sweep_interval_ms: int = 5_000
    #: Relay poll interval when the outbox is idle, milliseconds.
    relay_poll_interval_ms: int = 500
    #: Outbox rows the relay drains per pass.
    relay_batch_size: int = 100
    #: Partitions and replication of topics the role creates at start.
    topic_partitions: int = 4
    topic_replication: int = 1
    #: Connections in the store's pool.
    pool_max_size: int = 10
    #: Graceful stop: how long in-flight segments may finish before their leases are released.
    shutdown_grace_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.worker_id is None or not str(self.worker_id).strip():
            raise ConfigError(
                "jobs.worker_id must not be blank: it stamps lease_owner on claimed rows; "
                "an anonymous worker fleet cannot be debugged from the row"
            )
        for key in (
            "worker_count",
            "poll_interval_ms",
            "max_attempts",
            "max_concurrent_per_target",
            "sweep_interval_ms",
            "relay_poll_interval_ms",
            "relay_batch_size",
            "topic_partitions",
            "topic_replication",
            "pool_max_size",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"jobs.{key} must be a positive integer; got {value!r}")
        for key in ("lease_seconds", "backoff_base_seconds"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"jobs.{key} must be a positive number of seconds; got {value!r}")
        if isinstance(self.shutdown_grace_seconds, bool) or not isinstance(
            self.shutdown_grace_seconds, (int, float)
        ) or self.shutdown_grace_seconds < 0:
            raise ConfigError(
                "jobs.shutdown_grace_seconds must be a non-negative number of seconds; "
                f"got {self.shutdown_grace_seconds!r}"
            )
        if not self.events_topic or not str(self.events_topic).strip():
            raise ConfigError("jobs.events_topic must not be blank")
        if self.request_topic is not None and not self.kafka_bootstrap:
            raise ConfigError(
                "jobs.request_topic is set but jobs.kafka_bootstrap is not: "
                "broker-native submission needs a broker"
            )
        if self.kafka_bootstrap is not None and self.dsn is None:
            raise ConfigError(
                "jobs.kafka_bootstrap requires jobs.dsn: the job row is the truth; "
                "the broker is propagation"
            )

    @property
    def configured(self) -> bool:
        """True when a database is configured (the role has a real store)."""
        return bool(self.dsn)

    @property
    def effective_request_topic(self) -> str | None:
        """The request topic in force: the configured one, else ``workflow-run-requests``
        when a broker is configured, else None."""
        if self.request_topic:
            return self.request_topic
        return "workflow-run-requests" if self.kafka_bootstrap else None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> JobsConfig:
        """Build from a ``[jobs]`` table whose values may be strings (environment overrides).

        :param values: key -> value; unknown keys are an error.
        :raises ConfigError: naming the key and the expected form.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise ConfigError(f"unknown key jobs.{key}; known keys: {known}")
            kwargs[key] = _coerce(key, raw, fields[key])
        return cls(**kwargs)


_INT_KEYS = {
    "worker_count",
    "poll_interval_ms",
    "max_attempts",
    "max_concurrent_per_target",
    "sweep_interval_ms",
    "relay_poll_interval_ms",
    "relay_batch_size",
    "topic_partitions",
    "topic_replication",
    "pool_max_size",
}
_FLOAT_KEYS = {"lease_seconds", "backoff_base_seconds", "shutdown_grace_seconds"}


def _coerce(key: str, raw: Any, field: dataclasses.Field) -> Any:
    if key in _INT_KEYS:
        if isinstance(raw, bool):
            raise ConfigError(f"jobs.{key} must be a positive integer; got {raw!r}")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str):
            try:
                return int(raw.strip())
            except ValueError:
                pass
        raise ConfigError(f"jobs.{key} must be a positive integer; got {raw!r}")
    if key in _FLOAT_KEYS:
        if isinstance(raw, bool):
            raise ConfigError(f"jobs.{key} must be a number of seconds; got {raw!r}")
        if isinstance(raw, (int, float)):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                pass
        raise ConfigError(f"jobs.{key} must be a number of seconds; got {raw!r}")
    # string keys; an empty string means "not set" for the optional ones
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"jobs.{key} must be a string; got {raw!r}")
    if raw.strip() == "" and key in ("dsn", "kafka_bootstrap", "request_topic"):
        return None
    return raw.strip()
