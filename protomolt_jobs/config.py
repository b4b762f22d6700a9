"""The jobs configuration: one frozen dataclass, its defaults and its validation.

Keys match the ``[jobs]`` section of ``protomolt.toml`` and the environment overrides
``PROTOMOLT_JOBS_<KEY>`` (see ``docs/configuration.md``). Defaults follow the reference
(upstream ``WorkflowRunsConfig``): 2 claim loops, a 5 minute lease, 500 ms poll, 5 s backoff
base, 3 attempts, 8 concurrent calls per target, events on ``workflow-run-events``.

The librdkafka settings of the relay's producer and of the request consumer
(``[jobs.kafka.producer]``, ``[jobs.kafka.consumer]``) are checked here too, before anything
starts (:func:`kafka_client_settings`): the keys the lanes own are refused, the bounds of a
stock Apache Kafka broker are enforced, and librdkafka itself judges every name and value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
from collections.abc import Mapping
from typing import Any, Literal

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.limits import MAX_EVENT_BYTES, MAX_EVENT_RECORD_BYTES

__all__ = [
    "ADMIN_SETTING_PREFIXES",
    "CONSUMER_DEFAULTS",
    "CONSUMER_GROUP",
    "CONSUMER_OWNED",
    "EVENT_TYPES",
    "OUTBOX_PAYLOADS",
    "PRODUCER_DEFAULTS",
    "PRODUCER_OWNED",
    "REGISTRY_FAILURE_POLICIES",
    "UPSTREAM_EVENT_TYPES",
    "ConfigError",
    "JobsConfig",
    "default_worker_id",
    "extended_topic",
    "kafka_client_settings",
    "preemption_rule",
]

#: Consumer group of the request-topic consumer (a constant, as upstream).
CONSUMER_GROUP = "protomolt-jobs-worker"

#: Values of ``jobs.event_types``: ``extended`` (every type on the events topic) or
#: ``upstream`` (upstream's six types there, the others on ``<events topic>.extended``).
EVENT_TYPES = ("extended", "upstream")
#: The ``WorkflowRunEvent.Type`` numbers upstream's contract defines (ACCEPTED .. DEAD).
UPSTREAM_EVENT_TYPES = frozenset(range(1, 7))
#: Values of ``jobs.registry_failure``: what the relay does when the Schema Registry cannot
#: say the schema id: ``halt`` (publish nothing until it can) or ``fallback-id-0`` (stamp id
#: 0, as upstream's serializer does).
REGISTRY_FAILURE_POLICIES = ("halt", "fallback-id-0")
#: Values of ``jobs.outbox_payloads``: ``columns`` (the fenced writes store their events as
#: columns and our relay encodes them) or ``always`` (every outbox row is written with its
#: payload, for a Java relay on a shared outbox; migration 0012, docs/interop.md).
OUTBOX_PAYLOADS = ("columns", "always")
#: Values of ``jobs.group_commit``: ``auto`` (on when ``worker_count`` is at least
#: :data:`GROUP_COMMIT_AUTO_LOOPS`), ``on``, ``off`` (store/group_commit.py).
GROUP_COMMIT_MODES = ("auto", "on", "off")
#: ``jobs.group_commit = "auto"`` turns group commit on from this many claim loops: measured
#: on two cores (docs/benchmarks.md, issue 33 change 3), 16 loops gain (PostgreSQL CPU per job
#: -26..-36 %, 2.5-2.8 transactions per job) while 4 loops lose jobs/s (0.7-0.95x), their
#: batches too small to pay for the wait.
GROUP_COMMIT_AUTO_LOOPS = 8


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
    #: The most iterations ``extend-loop`` may raise a loop's bound to, for one run: a loop's
    #: ``loop.max`` plus every extension stays at or under it (docs/workflows.md *Bounded loops*).
    loop_extend_cap: int = 20
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
    #: The shortest and longest ``retention`` a workflow definition may set, seconds (1 hour
    #: and 3650 days; docs/workflows.md, Retention). Checked at check-workflow, PUT and submit.
    workflow_retention_min_seconds: float = 3_600.0
    workflow_retention_max_seconds: float = 3_650 * 86_400.0
    #: The queues this process's claim loops serve (a TOML list, or JSON / comma-separated
    #: text in the environment).
    queues: tuple[str, ...] = ("default",)
    #: Fleet-wide limits per queue: ``{"gpu": {"max_running": 2, "max_starts_per_second": 5}}``
    #: (TOML ``[jobs.queue_limits.gpu]``; ``PROTOMOLT_JOBS_QUEUE_LIMITS`` as JSON). Written to
    #: the database at start and enforced there for every worker.
    queue_limits: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    #: Preemption rules per queue (docs/long-steps.md, Preemption): ``{"gpu":
    #: {"min_priority_gap": 2, "after_ms": 120000, "min_run_ms": 300000}}`` (TOML
    #: ``[jobs.queue_preemption.gpu]``; ``PROTOMOLT_JOBS_QUEUE_PREEMPTION`` as JSON). The
    #: sweeper asks a run of a capped queue to yield for a more urgent one under its rule.
    queue_preemption: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    #: Fairness weights per fairness key (> 0; an unlisted key weighs 1): a key of weight 2
    #: gets twice the claims of a weight-1 key while both have a backlog
    #: (``[jobs.fairness_weights]``; ``PROTOMOLT_JOBS_FAIRNESS_WEIGHTS`` as JSON).
    fairness_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: librdkafka settings of the relay's producer, property -> value (TOML
    #: ``[jobs.kafka.producer]``; ``PROTOMOLT_JOBS_KAFKA_PRODUCER`` as a JSON object), merged
    #: over :data:`PRODUCER_DEFAULTS`. Checked by :func:`kafka_client_settings`.
    kafka_producer: Mapping[str, str | int | float | bool] = dataclasses.field(default_factory=dict)
    #: librdkafka settings of the request consumer (``[jobs.kafka.consumer]``;
    #: ``PROTOMOLT_JOBS_KAFKA_CONSUMER``), merged over :data:`CONSUMER_DEFAULTS`.
    kafka_consumer: Mapping[str, str | int | float | bool] = dataclasses.field(default_factory=dict)
    #: Which event types the events topic carries: ``extended`` (all of them, the default) or
    #: ``upstream`` (types 1-6 only; 7 and above go to :func:`extended_topic`).
    event_types: str = "extended"
    #: What the relay does when a configured Schema Registry cannot say the schema id:
    #: ``halt`` (events wait as PENDING) or ``fallback-id-0`` (frames carry schema id 0).
    registry_failure: str = "halt"
    #: Which outbox rows carry their encoded payload: ``columns`` (rows of the one-statement
    #: writes have none; only our relay reads them) or ``always`` (every row has it, written
    #: in the same statement; for an outbox a Java relay also polls).
    outbox_payloads: str = "columns"
    #: Group commit of the claim loops' checkpoint and settle writes (store/group_commit.py):
    #: ``auto`` (on from :data:`GROUP_COMMIT_AUTO_LOOPS` claim loops), ``on`` or ``off``.
    group_commit: str = "auto"
    #: Whether the pruner also deletes rows our store did not write (``origin`` NULL,
    #: migration 0013: a Java node's runs and outbox rows, which upstream keeps forever).
    prune_foreign_rows: bool = False
    #: The activation gate (docs/workflows.md, *Tests in the definition*): ``PUT`` of a workflow
    #: whose ``tests`` cases fail, or that has none, is refused (422) and nothing is stored.
    #: Off: the PUT stores it and records the result.
    require_workflow_tests: bool = False
    #: Policy floors (``[[jobs.approval_floors]]``; ``PROTOMOLT_JOBS_APPROVAL_FLOORS`` as a
    #: JSON list): tables ``{name, when, quorum?, approvers?, veto?}`` that select steps and
    #: set the weakest approval they may have (docs/approvals.md, *Policy floors*). Checked
    #: here for shape; the jobs role compiles them (``workflow/floors.py``) and refuses a
    #: malformed one naming its key.
    approval_floors: tuple[Mapping[str, Any], ...] = ()
    #: Capability grants (``[[jobs.grants]]``; ``PROTOMOLT_JOBS_GRANTS`` as a JSON list): what a
    #: step that declares ``capabilities`` may use, for which workflows and submitters
    #: (:class:`Grant`; docs/approvals.md *Capabilities and grants*). None: nothing is granted.
    grants: tuple[Grant, ...] = ()

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
        if self.workflow_retention_min_seconds > self.workflow_retention_max_seconds:
            raise ConfigError(
                "jobs.workflow_retention_min_seconds "
                f"({self.workflow_retention_min_seconds:g}) must not be above "
                f"jobs.workflow_retention_max_seconds ({self.workflow_retention_max_seconds:g})"
            )
        if self.events_wire not in ("confluent", "raw"):
            raise ConfigError(
                f"jobs.events_wire must be 'confluent' or 'raw'; got {_shown(self.events_wire)}"
            )
        if self.event_types not in EVENT_TYPES:
            raise ConfigError(
                "jobs.event_types must be 'extended' (every event type on the events topic) or "
                f"'upstream' (types 1-6 there, the others on <events topic>.extended); got "
                f"{_shown(self.event_types)}"
            )
        if self.registry_failure not in REGISTRY_FAILURE_POLICIES:
            raise ConfigError(
                "jobs.registry_failure must be 'halt' or 'fallback-id-0'; got "
                f"{_shown(self.registry_failure)}"
            )
        if self.outbox_payloads not in OUTBOX_PAYLOADS:
            raise ConfigError(
                "jobs.outbox_payloads must be 'columns' (our relay encodes the column rows) or "
                "'always' (every outbox row carries its payload, for a Java relay on a shared "
                f"outbox); got {_shown(self.outbox_payloads)}"
            )
        if self.group_commit not in GROUP_COMMIT_MODES:
            raise ConfigError(
                "jobs.group_commit must be 'auto' (on from "
                f"{GROUP_COMMIT_AUTO_LOOPS} claim loops), 'on' or 'off'; got "
                f"{_shown(self.group_commit)}"
            )
        for flag in ("prune_foreign_rows", "require_workflow_tests"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(
                    f"jobs.{flag} must be true or false; got {_shown(getattr(self, flag))}"
                )
        if not isinstance(self.approval_floors, tuple) or not all(
            isinstance(t, Mapping) for t in self.approval_floors
        ):
            raise ConfigError(
                "jobs.approval_floors must be a list of tables ([[jobs.approval_floors]]); got "
                f"{_shown(self.approval_floors)}"
            )
        # Refused here, before anything starts: misspelt, owned or out-of-bounds settings.
        kafka_client_settings("producer", self.kafka_producer, probe=bool(self.kafka_producer))
        kafka_client_settings("consumer", self.kafka_consumer, probe=bool(self.kafka_consumer))
        _check_queues(self.queues)
        _check_queue_limits(self.queue_limits)
        _check_queue_preemption(self.queue_preemption, self.queue_limits)
        _check_weights(self.fairness_weights)
        if not self.events_topic or not str(self.events_topic).strip():
            raise ConfigError("jobs.events_topic must not be blank")
        _check_topic("jobs.events_topic", self.events_topic)
        if self.extended_topic is not None:
            _check_topic(
                "jobs.events_topic",
                self.extended_topic,
                f"its extended sibling {_shown(self.extended_topic)} ({len(self.extended_topic)} "
                'characters), where event_types = "upstream" puts event types 7 and above,',
            )
        if self.request_topic is not None:
            _check_topic("jobs.request_topic", self.request_topic)
            if self.request_topic in (self.events_topic, self.extended_topic):
                which = (
                    "the events topic"
                    if self.request_topic == self.events_topic
                    else (
                        '<jobs.events_topic>.extended, where event_types = "upstream" puts event '
                        "types 7 and above"
                    )
                )
                raise ConfigError(
                    f"jobs.request_topic {self.request_topic!r} is {which} (jobs.events_topic "
                    f"= {self.events_topic!r}): the request consumer would read our own events "
                    "as requests and reject them; choose another request topic"
                )
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
    def group_commit_on(self) -> bool:
        """Whether this process's store carries concurrent fenced writes in one transaction:
        ``group_commit`` ``on``, or ``auto`` with at least :data:`GROUP_COMMIT_AUTO_LOOPS`
        claim loops (``worker_count``)."""
        if self.group_commit == "auto":
            return self.worker_count >= GROUP_COMMIT_AUTO_LOOPS
        return self.group_commit == "on"

    @property
    def effective_request_topic(self) -> str | None:
        """The request topic in force: the configured one, else ``workflow-run-requests``
        when a broker is configured, else None."""
        if self.request_topic:
            return self.request_topic
        return "workflow-run-requests" if self.kafka_bootstrap else None

    @property
    def extended_topic(self) -> str | None:
        """Where event types 7 and above go: ``<events_topic>.extended`` when
        ``event_types = "upstream"``, else None (every event on the events topic)."""
        return extended_topic(self.events_topic) if self.event_types == "upstream" else None

    def producer_settings(self) -> dict[str, Any]:
        """The relay's producer settings from configuration: :data:`PRODUCER_DEFAULTS`
        overlaid with ``kafka_producer`` (canonical property names), without the keys the
        relay owns (:data:`PRODUCER_OWNED`, set by the relay itself)."""
        return kafka_client_settings("producer", self.kafka_producer, probe=False)

    def consumer_settings(self) -> dict[str, Any]:
        """The request consumer's settings from configuration: :data:`CONSUMER_DEFAULTS`
        overlaid with ``kafka_consumer``, without :data:`CONSUMER_OWNED`."""
        return kafka_client_settings("consumer", self.kafka_consumer, probe=False)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> JobsConfig:
        """Build from a ``[jobs]`` table whose values may be strings (environment overrides).

        The ``kafka`` key is the ``[jobs.kafka]`` table: ``producer`` and ``consumer``
        sub-tables (or JSON object text); ``kafka_producer`` and ``kafka_consumer`` (JSON
        object text from ``PROTOMOLT_JOBS_KAFKA_PRODUCER``/``_CONSUMER``) override its
        entries property by property.

        :param values: key -> value; unknown keys are an error.
        :raises ConfigError: naming the key and the expected form.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        kafka: dict[str, dict[str, Any]] = {}
        for key, raw in values.items():
            if key == "kafka":
                kafka = _kafka_table(raw)
                continue
            if key not in fields:
                known = ", ".join(sorted({*fields, "kafka"}))
                raise ConfigError(f"unknown key jobs.{key}; known keys: {known}")
            kwargs[key] = _coerce(key, raw, fields[key])
        for kind in ("producer", "consumer"):
            merged = {**kafka.get(kind, {}), **kwargs.get(f"kafka_{kind}", {})}
            if merged:
                kwargs[f"kafka_{kind}"] = merged
        return cls(**kwargs)


#: Integer keys and their largest sane value (all must be above 0). The bounds catch typos
#: and units mix-ups (milliseconds given as microseconds) before they boot a broken node.
_INT_LIMITS: dict[str, int] = {
    "worker_count": 4096,
    "poll_interval_ms": 3_600_000,
    "max_attempts": 1000,
    "loop_extend_cap": 1000,
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
    "workflow_retention_min_seconds": (None, 3_650 * 86_400.0),
    "workflow_retention_max_seconds": (None, 3_650 * 86_400.0),
    "relay_linger_seconds": (0.0, 60.0),
}
_INT_KEYS = set(_INT_LIMITS)
_FLOAT_KEYS = set(_SECONDS_LIMITS)


#: The keys of one ``[[jobs.grants]]`` entry.
GRANT_KEYS = (
    "capabilities",
    "workflows",
    "principals",
    "groups",
    "decision",
    "approvers",
    "quorum",
    "expires",
    "onExpire",
    "escalate",
)
#: What an expired grant gate does (``onExpire``), as for an approval step: never accept.
GRANT_ON_EXPIRE = ("reject", "fail", "pause")
_GRANT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:/-]{0,127}")


@dataclasses.dataclass(frozen=True)
class Grant:
    """One ``[[jobs.grants]]`` entry: ``capabilities`` granted for steps of ``workflows`` (empty:
    every workflow) of runs submitted by one of ``principals`` or a member of one of
    ``groups`` (both empty: any submitter).

    :param rule: ``jobs.grants[<i>]``, the decision id of what it decides.
    :param decision: ``allow``, or ``needs-approval`` (an approval gate with ``approvers``
        ``{"roles": (...), "principals": (...)}`` and ``quorum`` decides the step's grant).
    :param expires_s: the gate's expiry in seconds after its park (None: never), ended by
        ``on_expire`` (``reject``, ``fail`` or ``pause``; never an accept).
    :param escalate: ``(after_s, roles, principals)`` by ``after_s``: from then on these may
        vote too (the quorum is never lowered).
    """

    rule: str
    capabilities: frozenset[str]
    decision: str = "allow"
    workflows: frozenset[str] = frozenset()
    principals: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    approvers: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    quorum: int = 1
    expires_s: float | None = None
    on_expire: str = "reject"
    escalate: tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...] = ()

    def applies(self, workflow: str, submitter: str | None, groups: frozenset[str]) -> bool:
        """Whether this grant covers a run of ``workflow`` submitted by ``submitter`` (None:
        unknown, matched only by a grant that names no principal or group) in ``groups``."""
        if self.workflows and workflow not in self.workflows:
            return False
        if not self.principals and not self.groups:
            return True
        if submitter is None:
            return False
        return submitter in self.principals or bool(self.groups & groups)


def parse_grants(raw: Any) -> tuple[Grant, ...]:
    """``[[jobs.grants]]`` (a list of tables, or JSON list text) as :class:`Grant` values.

    :raises ConfigError: naming the entry and key (``jobs.grants[0].decision ...``).
    """
    if not isinstance(raw, list):
        raise ConfigError(
            "jobs.grants must be a list of tables ([[jobs.grants]] entries; a JSON list in the "
            f"environment); got {_shown(raw)}"
        )
    return tuple(_parse_grant(f"jobs.grants[{i}]", entry) for i, entry in enumerate(raw))


def _names(
    rule: str, entry: Mapping[str, Any], key: str, *, required: bool = False
) -> frozenset[str]:
    value = entry.get(key)
    if value is None and not required:
        return frozenset()
    if (
        not isinstance(value, list)
        or (required and not value)
        or not all(isinstance(v, str) and _GRANT_NAME.fullmatch(v) for v in value)
    ):
        need = "a non-empty list" if required else "a list"
        raise ConfigError(f"{rule}.{key} must be {need} of names; got {_shown(value)}")
    return frozenset(value)


def _parse_grant(rule: str, entry: Any) -> Grant:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{rule} must be a table; got {_shown(entry)}")
    for key in entry:
        if key not in GRANT_KEYS:
            raise ConfigError(f"unknown key {rule}.{key}; known keys: {', '.join(GRANT_KEYS)}")
    decision = entry.get("decision", "allow")
    if decision not in ("allow", "needs-approval"):
        raise ConfigError(
            f"{rule}.decision must be allow or needs-approval; got {_shown(decision)}"
        )
    approvers: dict[str, tuple[str, ...]] = {}
    quorum = entry.get("quorum", 1)
    expires_s: float | None = None
    on_expire = "reject"
    escalate: tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...] = ()
    if decision == "allow":
        for key in ("approvers", "quorum", "expires", "onExpire", "escalate"):
            if key in entry:
                raise ConfigError(f"{rule}.{key} is for decision needs-approval only")
    else:
        table = entry.get("approvers")
        if not isinstance(table, Mapping) or not table or set(table) - {"roles", "principals"}:
            raise ConfigError(
                f"{rule}.approvers must be a table with roles and/or principals; "
                f"got {_shown(table)}"
            )
        for key in ("roles", "principals"):
            if key in table:
                approvers[key] = tuple(sorted(_names(f"{rule}.approvers", table, key)))
        if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= 100:
            raise ConfigError(
                f"{rule}.quorum must be a whole number from 1 to 100; got {_shown(quorum)}"
            )
        expires_s, on_expire, escalate = _grant_timers(rule, entry)
    return Grant(
        rule=rule,
        capabilities=_names(rule, entry, "capabilities", required=True),
        decision=decision,
        workflows=_names(rule, entry, "workflows"),
        principals=_names(rule, entry, "principals"),
        groups=_names(rule, entry, "groups"),
        approvers=approvers,
        quorum=quorum,
        expires_s=expires_s,
        on_expire=on_expire,
        escalate=escalate,
    )


def _grant_timers(
    rule: str, entry: Mapping[str, Any]
) -> tuple[float | None, str, tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...]]:
    """``expires``, ``onExpire`` and ``escalate`` of a needs-approval grant (as an approval
    object's: docs/approvals.md)."""
    expires_s = None
    if "expires" in entry:
        expires_s = duration_s(entry["expires"])
        if expires_s is None:
            raise ConfigError(
                f"{rule}.expires must be a positive ISO-8601 duration (P3D, PT24H, PT30S); "
                f"got {_shown(entry['expires'])}"
            )
    if "onExpire" in entry and expires_s is None:
        raise ConfigError(f"{rule}.onExpire needs {rule}.expires")
    on_expire = entry.get("onExpire", "reject")
    if on_expire not in GRANT_ON_EXPIRE:
        raise ConfigError(
            f"{rule}.onExpire must be reject, fail or pause (an expiry never accepts); "
            f"got {_shown(on_expire)}"
        )
    raw = entry.get("escalate", [])
    if not isinstance(raw, list):
        raise ConfigError(
            f"{rule}.escalate must be a list of tables {{after, addRoles, addPrincipals}}; "
            f"got {_shown(raw)}"
        )
    out = []
    for i, item in enumerate(raw):
        where = f"{rule}.escalate[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"after", "addRoles", "addPrincipals"}:
            raise ConfigError(
                f"{where} must be a table {{after, addRoles, addPrincipals}}; got {_shown(item)}"
            )
        after_s = duration_s(item.get("after"))
        if after_s is None:
            raise ConfigError(
                f"{where}.after must be a positive ISO-8601 duration; got {_shown(item.get('after'))}"
            )
        if expires_s is not None and after_s >= expires_s:
            raise ConfigError(f"{where}.after is not before {rule}.expires")
        roles = tuple(sorted(_names(where, item, "addRoles")))
        principals = tuple(sorted(_names(where, item, "addPrincipals")))
        if not roles and not principals:
            raise ConfigError(f"{where} adds no role and no principal")
        out.append((after_s, roles, principals))
    out.sort(key=lambda e: e[0])
    return expires_s, on_expire, tuple(out)


_DURATION = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


def duration_s(text: Any) -> float | None:
    """An ISO-8601 duration (``P3D``, ``PT24H``, ``PT1.5S``; weeks, days, hours, minutes,
    seconds) in seconds, or None when ``text`` is not one (or is zero). Approval objects and
    grant gates read their timers with it."""
    if not isinstance(text, str):
        return None
    m = _DURATION.fullmatch(text.strip())
    if m is None or text.strip() in ("P", "PT") or text.strip().endswith("T"):
        return None
    parts = {k: float(v) for k, v in m.groupdict().items() if v is not None}
    total = (
        parts.get("w", 0) * 604800
        + parts.get("d", 0) * 86400
        + parts.get("h", 0) * 3600
        + parts.get("m", 0) * 60
        + parts.get("s", 0)
    )
    return total if total > 0 else None


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


#: Kafka's rule for a topic name: these characters, at most 249 of them, never ``.`` or ``..``.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}\Z")


def _check_topic(key: str, topic: Any, what: str = "") -> None:
    """Refuse a topic name Kafka would refuse, at load rather than at the first produce."""
    if isinstance(topic, str) and _TOPIC_NAME.match(topic) and topic not in (".", ".."):
        return
    subject = f"{key} = {_shown(topic)}: {what}" if what else f"{key} = {_shown(topic)}"
    raise ConfigError(
        f"{subject} is not a legal Kafka topic name (letters, digits, '.', '_' and '-', at most "
        "249 characters, not '.' or '..')"
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


#: The keys of a ``[jobs.queue_preemption.<queue>]`` table: (name, least, most, default).
_PREEMPTION_KEYS = {
    "min_priority_gap": (1, 4, 1),
    "after_ms": (0, 86_400_000, 0),
    "min_run_ms": (0, 86_400_000, 0),
}


def preemption_rule(rule: Mapping[str, Any]) -> dict[str, int]:
    """A checked ``[jobs.queue_preemption.<queue>]`` table with its defaults filled in:
    ``{"min_priority_gap": 1..4 (default 1), "after_ms": 0..86400000 (default 0),
    "min_run_ms": 0..86400000 (default 0)}``."""
    return {key: int(rule.get(key, default)) for key, (_, _, default) in _PREEMPTION_KEYS.items()}


def _check_queue_preemption(rules: Any, limits: Any) -> None:
    if not isinstance(rules, Mapping):
        raise ConfigError(
            "jobs.queue_preemption must be a table of queues, e.g. [jobs.queue_preemption.gpu] "
            f"with min_priority_gap = 2; got {_shown(rules)}"
        )
    for queue, rule in rules.items():
        if not _is_name(queue):
            raise ConfigError(f"jobs.queue_preemption: {_shown(queue)} is not a queue name")
        if not isinstance(rule, Mapping):
            raise ConfigError(
                f"jobs.queue_preemption.{queue} must be a table with min_priority_gap, "
                f"after_ms and/or min_run_ms; got {_shown(rule)}"
            )
        if "max_running" not in (limits.get(queue) or {}):
            raise ConfigError(
                f"jobs.queue_preemption.{queue}: preemption needs a cap; set "
                f"jobs.queue_limits.{queue}.max_running"
            )
        for key, value in rule.items():
            if key not in _PREEMPTION_KEYS:
                raise ConfigError(
                    f"unknown key jobs.queue_preemption.{queue}.{key}; known keys: "
                    + ", ".join(_PREEMPTION_KEYS)
                )
            least, most, _ = _PREEMPTION_KEYS[key]
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise ConfigError(
                    f"jobs.queue_preemption.{queue}.{key} must be an integer within "
                    f"{least}..{most}; got {_shown(value)}"
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
    if key in ("queue_limits", "queue_preemption", "fairness_weights"):
        return _json_table(key, raw)
    if key == "approval_floors":
        floors = _json_table(key, raw)
        return tuple(floors) if isinstance(floors, list) else floors
    if key == "grants":
        return parse_grants(_json_table(key, raw))
    if key in ("kafka_producer", "kafka_consumer"):
        table = _json_table(key, raw)
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"jobs.{key} must be a table of librdkafka settings (a JSON object in the "
                f"environment); got {_shown(table)}"
            )
        return dict(table)
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
    if key in ("prune_foreign_rows", "require_workflow_tests"):
        if isinstance(raw, bool):
            return raw
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in ("true", "false"):
            return word == "true"
        raise ConfigError(f"jobs.{key} must be true or false; got {_shown(raw)}")
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


# --------------------------------------------------------------------------- Kafka clients

#: The relay's producer settings before ``[jobs.kafka.producer]``. ``message.timeout.ms``
#: bounds one record's delivery (librdkafka's default is 300 s; the relay's claim lease and
#: lane-failure detection scale with it); ``linger.ms`` is short because the relay produces
#: a whole batch at once.
PRODUCER_DEFAULTS: Mapping[str, Any] = {"linger.ms": 1, "message.timeout.ms": 30_000}
#: Producer settings the relay sets itself whatever the configuration says, and why.
PRODUCER_OWNED: Mapping[str, str] = {
    "bootstrap.servers": "it is jobs.kafka_bootstrap",
    "enable.idempotence": (
        "the relay's per-job order on the topic and its retries without duplicates depend on "
        "the idempotent producer (always true)"
    ),
    "acks": "an event is marked PUBLISHED only once every in-sync replica has it (always all)",
    "partitioner": (
        "murmur2_random puts a job's key on the partition a Java Kafka client picks for it "
        "(upstream consumers and producers agree)"
    ),
    "transactional.id": "the relay does not use transactions (a transactional producer "
    "needs init_transactions and commits the relay never makes)",
}
#: The request consumer's settings before ``[jobs.kafka.consumer]``. The session timeout is
#: a stock Apache Kafka broker's ``group.min.session.timeout.ms`` (6000): the shortest a
#: real cluster accepts, so a dead member's partitions move on quickly.
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "session.timeout.ms": 6_000,
    "heartbeat.interval.ms": 1_000,
    # A request topic created after we subscribed is noticed within seconds.
    "topic.metadata.refresh.interval.ms": 5_000,
}
#: Consumer settings the request consumer sets itself, and why.
CONSUMER_OWNED: Mapping[str, str] = {
    "bootstrap.servers": "it is jobs.kafka_bootstrap",
    "group.id": f"the group is the constant {CONSUMER_GROUP!r}, as upstream's",
    "enable.auto.commit": (
        "an offset is committed only after its record's row committed (always false)"
    ),
    "auto.commit.enable": "the legacy spelling of enable.auto.commit (always false)",
    "auto.offset.reset": (
        "a new group must read the requests produced before it existed (always earliest, "
        "as upstream's consumer)"
    ),
    "group.protocol": (
        "the consumer's join, stop and rebalance handling are written and tested for the "
        "classic group protocol (the test broker never assigns partitions under KIP-848)"
    ),
}
#: librdkafka aliases -> the name used here (librdkafka accepts both; the last one set wins,
#: so two spellings of one property are refused rather than left to dict order).
_KAFKA_ALIASES: Mapping[str, str] = {
    "metadata.broker.list": "bootstrap.servers",
    "request.required.acks": "acks",
    "delivery.timeout.ms": "message.timeout.ms",
    "queue.buffering.max.ms": "linger.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "message.send.max.retries": "retries",
    "compression.codec": "compression.type",
    "sasl.mechanism": "sasl.mechanisms",
}
#: Python client keys that take callables; the lanes set their own.
_KAFKA_CALLBACKS = frozenset({"logger", "on_delivery", "on_commit"})
#: ``(least, most)`` a stock Apache Kafka broker (or the relay) accepts, and where it comes
#: from. librdkafka's own ranges are wider and are checked by librdkafka.
_KAFKA_BOUNDS: Mapping[str, Mapping[str, tuple[int, int, str]]] = {
    "consumer": {
        "session.timeout.ms": (
            6_000,
            1_800_000,
            (
                "a stock Apache Kafka broker's group.min.session.timeout.ms (6000) and "
                "group.max.session.timeout.ms (1800000): a join outside them fails with "
                "INVALID_SESSION_TIMEOUT"
            ),
        ),
    },
    "producer": {
        "message.timeout.ms": (
            1,
            3_600_000,
            (
                "0 means never time out, and the relay could not tell a dead broker from a slow "
                "one; the claim lease on outbox rows is twice this plus 10 s"
            ),
        ),
        "message.max.bytes": (
            MAX_EVENT_RECORD_BYTES,
            1_000_000_000,
            (
                f"the largest event the contract allows is {MAX_EVENT_BYTES} bytes (error, "
                "verdict, step and workflow name at their max_len of four-byte characters); "
                f"framed, keyed and batched it is a {MAX_EVENT_RECORD_BYTES}-byte record, and "
                "a smaller limit would fail a valid event as MSG_SIZE_TOO_LARGE until it is "
                "marked FAILED; 1000000000 is librdkafka's most"
            ),
        ),
    },
}
#: Consumer settings that only apply under the KIP-848 ``consumer`` group protocol, which the
#: request consumer never uses (``group.protocol`` is owned as ``classic``): librdkafka would
#: ignore them.
_CONSUMER_PROTOCOL_ONLY: Mapping[str, str] = {
    "group.remote.assignor": (
        "it picks the broker-side assignor of the KIP-848 'consumer' group protocol, and the "
        "request consumer uses the classic protocol (group.protocol is owned), so librdkafka "
        "would ignore it; for the classic protocol set partition.assignment.strategy"
    ),
}
#: Connection properties the topic admin client takes from the producer's settings, so a
#: secured cluster's topics are created with the same credentials.
ADMIN_SETTING_PREFIXES = (
    "security.",
    "ssl.",
    "sasl.",
    "enable.ssl.",
    "enable.sasl.",
    "ssl_engine.",
    "https.",
    "client.dns.",
    "broker.address.",
)
_KAFKA_KEY = re.compile(r"[a-z][a-z0-9_.]*\Z")
_MISPLACED = re.compile(
    r"Configuration property (\S+) is a (producer|consumer) property and will be ignored"
)


def extended_topic(events_topic: str) -> str:
    """The topic of event types 7 and above under ``event_types = "upstream"``:
    ``<events_topic>.extended``."""
    return f"{events_topic}.extended"


def _kafka_table(raw: Any) -> dict[str, dict[str, Any]]:
    """The ``[jobs.kafka]`` table: ``producer`` and/or ``consumer`` sub-tables."""
    if isinstance(raw, str):
        text = raw.strip()
        if not text.startswith("{"):
            raise ConfigError(
                "jobs.kafka must be a table with producer and/or consumer sub-tables "
                "([jobs.kafka.producer], [jobs.kafka.consumer]); for the bootstrap servers "
                f"set jobs.kafka_bootstrap; got {_shown(raw)}"
            )
        raw = _json_table("kafka", text)
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "jobs.kafka must be a table with producer and/or consumer sub-tables; got "
            f"{_shown(raw)}"
        )
    out: dict[str, dict[str, Any]] = {}
    for sub, table in raw.items():
        if sub not in ("producer", "consumer"):
            raise ConfigError(f"unknown key jobs.kafka.{sub}; known keys: consumer, producer")
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"jobs.kafka.{sub} must be a table of librdkafka settings like "
                f'[jobs.kafka.{sub}] then "client.id" = "x"; got {_shown(table)}'
            )
        out[sub] = dict(table)
    return out


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        text = value.strip()
        return int(text) if len(text) <= 20 else None
    return None


def kafka_client_settings(
    kind: Literal["producer", "consumer"],
    overrides: Mapping[str, Any],
    *,
    probe: bool = False,
    broker_bounds: bool = True,
    with_defaults: bool = True,
) -> dict[str, Any]:
    """Check librdkafka settings for the relay's producer or the request consumer and
    return them merged over the defaults.

    Checks, in order: each key is a librdkafka property name (lower case, dots) with a
    string, integer, float or boolean value; two spellings of one property (an alias and its
    name) are refused; keys the lane owns (:data:`PRODUCER_OWNED`, :data:`CONSUMER_OWNED`)
    and callbacks are refused with the reason; with ``broker_bounds``, the bounds a stock
    Apache Kafka broker enforces (consumer ``session.timeout.ms`` 6000..1800000, a
    ``heartbeat.interval.ms`` below the session timeout, producer ``message.timeout.ms``
    1..3600000, and a producer ``message.max.bytes`` that carries the largest event the
    contract allows, :data:`~protomolt_jobs.limits.MAX_EVENT_RECORD_BYTES`); non-finite
    numbers, NUL characters, KIP-848-only consumer settings and unquoted dotted TOML keys are
    refused naming the key; with ``probe``, librdkafka itself builds a client from the settings (no
    broker is contacted), which refuses unknown names, malformed values, its own ranges and
    combinations (``max.poll.interval.ms`` below the session timeout), and a property of the
    other client kind is refused as it would be ignored.

    :param kind: ``producer`` (the relay) or ``consumer`` (the request consumer).
    :param overrides: property -> value, as configured.
    :param probe: let librdkafka check the merged settings (about 5 ms).
    :param broker_bounds: enforce the broker's bounds (the node configuration does; the
        in-process test hooks ``producer_config``/``consumer_config`` do not, since the test
        broker enforces none).
    :param with_defaults: overlay the defaults (False: the overrides alone, canonical).
    :returns: defaults overlaid with the overrides, keyed by the names used here (aliases
        resolved), owned keys absent.
    :raises ConfigError: naming ``jobs.kafka.<kind>.<property>`` and the rule or bound.
    """
    where = f"jobs.kafka.{kind}"
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"{where} must be a table of librdkafka settings; got {_shown(overrides)}"
        )
    owned = PRODUCER_OWNED if kind == "producer" else CONSUMER_OWNED
    defaults = PRODUCER_DEFAULTS if kind == "producer" else CONSUMER_DEFAULTS
    given: dict[str, tuple[str, Any]] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not _KAFKA_KEY.match(key):
            raise ConfigError(
                f"{where}: {_shown(key)} is not a librdkafka property name (lower-case words "
                "joined by dots, like session.timeout.ms)"
            )
        if key.endswith("_cb") or key in _KAFKA_CALLBACKS:
            raise ConfigError(f"{where}.{key} is a callback; the lane sets its own")
        if isinstance(value, Mapping):
            # TOML reads an unquoted `session.timeout.ms = 1000` as nested tables.
            dotted = ", ".join(f"{key}.{path}" for path in _leaf_paths(value))
            raise ConfigError(
                f"{where}.{key} is a table, not a setting: an unquoted dotted key like "
                f"{dotted or key} = ... is read by TOML as nested tables; quote the property "
                f'name: "{dotted.split(", ")[0] if dotted else key}" = ...'
            )
        if isinstance(value, list | tuple) or not isinstance(value, str | int | float | bool):
            raise ConfigError(
                f"{where}.{key} must be a string, number or boolean; got {_shown(value)}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}.{key} must be a finite number; got {_shown(value)}")
        if isinstance(value, str) and "\x00" in value:
            raise ConfigError(
                f"{where}.{key} must not contain a NUL character: librdkafka reads C strings "
                f"and would silently cut the value there; got {_shown(value)}"
            )
        name = _KAFKA_ALIASES.get(key, key)
        if name in given:
            raise ConfigError(
                f"{where} sets both {given[name][0]} and {key}, two names of one librdkafka "
                "property; keep one"
            )
        if name in owned:
            spelled = key if key == name else f"{key} (an alias of {name})"
            raise ConfigError(f"{where}.{spelled} cannot be set: {owned[name]}")
        if kind == "consumer" and name in _CONSUMER_PROTOCOL_ONLY:
            raise ConfigError(f"{where}.{key} cannot be set: {_CONSUMER_PROTOCOL_ONLY[name]}")
        given[name] = (key, value)
    merged = {**defaults, **{name: value for name, (_key, value) in given.items()}}
    if not with_defaults:
        merged = {name: value for name, (_key, value) in given.items()}
    if broker_bounds:
        for name, (least, most, why) in _KAFKA_BOUNDS[kind].items():
            if name not in given:
                continue
            number = _as_int(merged[name])
            if number is None or not least <= number <= most:
                raise ConfigError(
                    f"{where}.{given[name][0]} must be an integer from {least} to {most} "
                    f"({why}); got {_shown(merged[name])}"
                )
        if kind == "consumer" and (
            "heartbeat.interval.ms" in given or "session.timeout.ms" in given
        ):
            beat = _as_int(merged.get("heartbeat.interval.ms"))
            session = _as_int(merged.get("session.timeout.ms"))
            if beat is not None and session is not None and beat >= session:
                raise ConfigError(
                    f"{where}.heartbeat.interval.ms must be below session.timeout.ms "
                    f"({session}; a third of it or less is usual): a member that heartbeats "
                    f"less often than that is expelled from the group; got {beat}"
                )
    if probe:
        _probe(kind, merged, {name: key for name, (key, _value) in given.items()})
    return merged


def _leaf_paths(table: Mapping[Any, Any]) -> list[str]:
    """The dotted paths to the leaves of nested tables (``{"timeout": {"ms": 1}}`` ->
    ``["timeout.ms"]``)."""
    paths: list[str] = []
    for key, value in table.items():
        if isinstance(value, Mapping):
            paths.extend(f"{key}.{path}" for path in _leaf_paths(value))
        else:
            paths.append(str(key))
    return paths


class _WarningSink:
    """What librdkafka logs while a probe client is built (its ``logger``): a logger of the
    probe's own, so concurrent probes never see each other's warnings."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def log(self, _level: int, message: str, *args: Any) -> None:
        self.messages.append(message % args if args else message)


def _probe(kind: str, settings: Mapping[str, Any], written: Mapping[str, str]) -> None:
    """Let librdkafka build a client from ``settings`` (and the owned values the lane sets),
    without a broker; its refusal becomes a :class:`ConfigError`. ``written`` maps a
    setting's name here to the key as the user wrote it, so a refusal names that key."""
    from confluent_kafka import Consumer, KafkaException, Producer

    where = f"jobs.kafka.{kind}"
    sink = _WarningSink()
    conf: dict[str, Any] = {"client.id": "protomolt-jobs-config-check", **settings}
    if kind == "producer":
        conf.update({"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"})
    else:
        conf.update(
            {
                "group.id": CONSUMER_GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    try:
        if kind == "producer":
            producer = Producer(conf, logger=sink)
            producer.poll(0)  # delivers librdkafka's configuration warnings to the logger
            del producer
        else:
            consumer = Consumer(conf, logger=sink)
            consumer.poll(0)
            consumer.close()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        text = err.str() if hasattr(err, "str") else str(err)
        raise ConfigError(f"{where}: librdkafka refuses the settings: {text.strip()}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: librdkafka refuses the settings: {exc}") from None
    for message in sink.messages:
        found = _MISPLACED.search(message)
        if found:
            prop, other = found.groups()
            # librdkafka names its canonical property (queue.buffering.max.ms for linger.ms)
            key = written.get(_KAFKA_ALIASES.get(prop, prop), prop)
            spelled = key if key == prop else f"{key} (librdkafka's {prop})"
            raise ConfigError(
                f"{where} sets {spelled}, a {other} property: the {kind} would ignore it "
                f"(put it in [jobs.kafka.{other}])"
            )
