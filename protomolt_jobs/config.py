"""The jobs configuration: one frozen dataclass, its defaults and its validation.

Keys match the ``[jobs]`` section of ``protomolt.toml`` and the environment overrides
``PROTOMOLT_JOBS_<KEY>`` (see ``docs/configuration.md``). Defaults follow the reference
(upstream ``WorkflowRunsConfig``): 2 claim loops, a 5 minute lease, 500 ms poll, 5 s backoff
base, 3 attempts, 8 concurrent calls per target, events on ``workflow-run-events``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections.abc import Mapping
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = ["CONSUMER_GROUP", "ConfigError", "JobsConfig", "default_worker_id"]

#: Consumer group of the request-topic consumer (a constant, as upstream).
CONSUMER_GROUP = "protomolt-jobs-worker"


class ConfigError(ProtomoltJobsError, ValueError):
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
    #: Framing of event values on the topic: ``confluent`` (magic byte 0, schema id, message
    #: index 0, as upstream's serializer writes and its deserializer requires) or ``raw``.
    events_wire: str = "confluent"
    #: Confluent Schema Registry base URL; when set, the schema id stamped into framed events
    #: is the one registered for subject ``<events_topic>-value``, else 0.
    schema_registry_url: str | None = None
    #: gRPC target (``host:port`` or ``inprocess:NAME``) of the ``StructuredGenerator`` that
    #: graph workflows' ``structured`` steps call. None: such a step fails (STRUCTURED).
    structured_generator: str | None = None
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
    relay_batch_size: int = 500
    #: After a pass that drained fewer rows than a batch, the relay waits this long before the
    #: next one, so busy nodes publish in batches (a pass costs two transactions and a broker
    #: round trip, whatever its size) instead of one pass per event. Seconds; 0: no wait.
    relay_linger_seconds: float = 0.025
    #: Partitions and replication of topics the role creates at start.
    topic_partitions: int = 4
    topic_replication: int = 1
    #: Connections in the store's pool.
    pool_max_size: int = 10
    #: Graceful stop: how long in-flight segments may finish before their leases are released.
    shutdown_grace_seconds: float = 10.0
    #: How long a store call may wait for a healthy database connection before it fails as
    #: ``unavailable`` (the database cannot be reached), seconds.
    connect_timeout_seconds: float = 2.0
    #: The pruner deletes PUBLISHED outbox rows older than this, seconds (7 days; 0: never).
    outbox_retention_seconds: float = 7 * 86_400.0
    #: The pruner deletes terminal runs (COMPLETED, FAILED, DEAD, CANCELLED) finished longer
    #: ago than this, seconds (30 days; 0: never).
    run_retention_seconds: float = 30 * 86_400.0
    #: How often the pruner runs a pass, seconds.
    prune_interval_seconds: float = 60.0
    #: The queues this process's claim loops serve (a TOML list, or JSON / comma-separated
    #: text in the environment).
    queues: tuple[str, ...] = ("default",)
    #: Fleet-wide limits per queue: ``{"gpu": {"max_running": 2, "max_starts_per_second": 5}}``
    #: (TOML ``[jobs.queue_limits.gpu]``; ``PROTOMOLT_JOBS_QUEUE_LIMITS`` as JSON). Written to
    #: the database at start and enforced there for every worker.
    queue_limits: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    #: Fairness weights per fairness key (> 0; an unlisted key weighs 1): a key of weight 2
    #: gets twice the claims of a weight-1 key while both have a backlog
    #: (``[jobs.fairness_weights]``; ``PROTOMOLT_JOBS_FAIRNESS_WEIGHTS`` as JSON).
    fairness_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.worker_id is None or not str(self.worker_id).strip():
            raise ConfigError(
                "jobs.worker_id must not be blank: it stamps lease_owner on claimed rows; "
                "an anonymous worker fleet cannot be debugged from the row"
            )
        for key, most in _INT_LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
                raise ConfigError(
                    f"jobs.{key} must be a positive integer of at most {most}; got {_shown(value)}"
                )
        for key, (least, seconds_most) in _SECONDS_LIMITS.items():
            value = getattr(self, key)
            # Compare before math.isfinite: it raises OverflowError on a huge int.
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (value > 0 if least is None else value >= least)
                or value > seconds_most
                or not math.isfinite(value)
            ):
                lower = "above 0" if least is None else f"at least {least:g}"
                raise ConfigError(
                    f"jobs.{key} must be a finite number of seconds, {lower} and at most "
                    f"{seconds_most:g}; got {_shown(value)}"
                )
        if self.events_wire not in ("confluent", "raw"):
            raise ConfigError(
                f"jobs.events_wire must be 'confluent' or 'raw'; got {_shown(self.events_wire)}"
            )
        _check_queues(self.queues)
        _check_queue_limits(self.queue_limits)
        _check_weights(self.fairness_weights)
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


#: Integer keys and their largest sane value (all must be above 0). The bounds catch typos
#: and units mix-ups (milliseconds given as microseconds) before they boot a broken node.
_INT_LIMITS: dict[str, int] = {
    "worker_count": 4096,
    "poll_interval_ms": 3_600_000,
    "max_attempts": 1000,
    "max_concurrent_per_target": 4096,
    "sweep_interval_ms": 3_600_000,
    "relay_poll_interval_ms": 3_600_000,
    "relay_batch_size": 100_000,
    "topic_partitions": 10_000,
    "topic_replication": 100,
    "pool_max_size": 1000,
}
#: Seconds keys: (least, most); a least of None means "above 0". NaN and infinities never pass.
_SECONDS_LIMITS: dict[str, tuple[float | None, float]] = {
    "lease_seconds": (None, 86_400.0),
    "backoff_base_seconds": (None, 86_400.0),
    "shutdown_grace_seconds": (0.0, 3_600.0),
    "connect_timeout_seconds": (None, 300.0),
    "outbox_retention_seconds": (0.0, 3_650 * 86_400.0),
    "run_retention_seconds": (0.0, 3_650 * 86_400.0),
    "prune_interval_seconds": (None, 86_400.0),
    "relay_linger_seconds": (0.0, 60.0),
}
_INT_KEYS = set(_INT_LIMITS)
_FLOAT_KEYS = set(_SECONDS_LIMITS)


def _shown(value: Any) -> str:
    """``repr`` of a configured value, cut short (a 5000-digit typo needs no full echo)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


_NAME_MAX = 200
_LIMIT_KEYS = ("max_running", "max_starts_per_second")


def _is_name(value: Any) -> bool:
    return (
        isinstance(value, str)
        and bool(value.strip())
        and value == value.strip()
        and len(value) <= _NAME_MAX
        and not any(ord(c) < 32 for c in value)
    )


def _check_queues(queues: Any) -> None:
    if (
        not isinstance(queues, tuple)
        or not queues
        or not all(_is_name(q) for q in queues)
        or len(set(queues)) != len(queues)
    ):
        raise ConfigError(
            'jobs.queues must be a non-empty list of distinct queue names like ["default", '
            f'"gpu"] (each non-blank, at most {_NAME_MAX} characters); got {_shown(queues)}'
        )


def _check_queue_limits(limits: Any) -> None:
    if not isinstance(limits, Mapping):
        raise ConfigError(
            "jobs.queue_limits must be a table of queues, e.g. [jobs.queue_limits.gpu] with "
            f"max_running = 2; got {_shown(limits)}"
        )
    for queue, limit in limits.items():
        if not _is_name(queue):
            raise ConfigError(f"jobs.queue_limits: {_shown(queue)} is not a queue name")
        if not isinstance(limit, Mapping) or not limit:
            raise ConfigError(
                f"jobs.queue_limits.{queue} must be a table with max_running and/or "
                f"max_starts_per_second; got {_shown(limit)}"
            )
        for key, value in limit.items():
            if key not in _LIMIT_KEYS:
                raise ConfigError(
                    f"unknown key jobs.queue_limits.{queue}.{key}; known keys: "
                    + ", ".join(_LIMIT_KEYS)
                )
            if key == "max_running":
                ok = not isinstance(value, bool) and isinstance(value, int) and 0 < value <= 100_000
                form = "a positive integer of at most 100000"
            else:
                ok = (
                    not isinstance(value, bool)
                    and isinstance(value, (int, float))
                    and math.isfinite(value)
                    and 0 < value <= 1_000_000
                )
                form = "a number above 0 and at most 1000000"
            if not ok:
                raise ConfigError(
                    f"jobs.queue_limits.{queue}.{key} must be {form}; got {_shown(value)}"
                )


def _check_weights(weights: Any) -> None:
    if not isinstance(weights, Mapping):
        raise ConfigError(
            f"jobs.fairness_weights must be a table of key = weight; got {_shown(weights)}"
        )
    for key, value in weights.items():
        if not _is_name(key):
            raise ConfigError(f"jobs.fairness_weights: {_shown(key)} is not a fairness key")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 < value <= 1_000_000
        ):
            raise ConfigError(
                f"jobs.fairness_weights.{key} must be a number above 0 and at most 1000000; "
                f"got {_shown(value)}"
            )


def _json_table(key: str, raw: Any) -> Any:
    """A table key: a TOML table as is, or JSON object text (the environment)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"jobs.{key} must be a JSON object; {exc}") from None
    return raw


def _coerce(key: str, raw: Any, field: dataclasses.Field) -> Any:
    if key == "queues":
        if isinstance(raw, str):
            text = raw.strip()
            if text.startswith("["):
                try:
                    raw = json.loads(text)
                except ValueError as exc:
                    raise ConfigError(f"jobs.queues must be a list of names; {exc}") from None
            else:
                raw = [part.strip() for part in text.split(",")]
        if isinstance(raw, list):
            raw = tuple(raw)
        return raw
    if key in ("queue_limits", "fairness_weights"):
        return _json_table(key, raw)
    if key in _INT_KEYS:
        if isinstance(raw, bool):
            raise ConfigError(
                f"jobs.{key} must be a positive integer of at most {_INT_LIMITS[key]}; "
                f"got {_shown(raw)}"
            )
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str):
            text = raw.strip()
            digits = text.lstrip("+-")
            if text.isascii() and digits.isdigit() and len(digits) <= 20:
                return int(text)
        raise ConfigError(
            f"jobs.{key} must be a positive integer of at most {_INT_LIMITS[key]}; "
            f"got {_shown(raw)}"
        )
    if key in _FLOAT_KEYS:
        if isinstance(raw, bool):
            raise ConfigError(f"jobs.{key} must be a finite number of seconds; got {_shown(raw)}")
        if isinstance(raw, (int, float)):
            try:
                return float(raw)
            except OverflowError:
                raise ConfigError(
                    f"jobs.{key} must be a finite number of seconds; got {_shown(raw)}"
                ) from None
        if isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                pass
        raise ConfigError(f"jobs.{key} must be a finite number of seconds; got {_shown(raw)}")
    # string keys; an empty string means "not set" for the optional ones
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"jobs.{key} must be a string; got {_shown(raw)}")
    if raw.strip() == "" and key in (
        "dsn",
        "kafka_bootstrap",
        "request_topic",
        "schema_registry_url",
        "structured_generator",
    ):
        return None
    return raw.strip()
