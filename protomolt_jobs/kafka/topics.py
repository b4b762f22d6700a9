"""Create the events and request topics at role start when they do not exist.

The relay publishes to ``config.events_topic`` (and, with ``event_types = "upstream"``, the
types upstream does not define to ``<events topic>.extended``); the request consumer reads
``config.effective_request_topic``. All are created here with ``config.topic_partitions``
partitions and ``config.topic_replication`` replicas. The admin client connects with the
producer's connection settings (``security.*``, ``ssl.*``, ``sasl.*`` ... of
``[jobs.kafka.producer]``, :data:`~protomolt_jobs.config.ADMIN_SETTING_PREFIXES`), so a
secured cluster's topics are created with the relay's credentials. A topic that already exists is left
as it is (its partition count is not changed: a job's key must keep landing on the
partition it landed on before).

A broker that cannot be reached at start is not fatal: the lanes wait and retry on their
own, so this logs ``topics_unverified`` and returns. Nothing here raises for the broker's
sake; it raises only when the call is meaningless (no bootstrap configured).
"""

from __future__ import annotations

import concurrent.futures
import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from protomolt_jobs.config import ADMIN_SETTING_PREFIXES, ConfigError, JobsConfig

__all__ = ["ensure_topics", "wanted_topics"]

log = logging.getLogger("protomolt_jobs.topics")

#: How long the admin request may take before the topics count as unverified, seconds.
CREATE_TIMEOUT_S = 10.0


def wanted_topics(config: JobsConfig) -> list[str]:
    """The topics the Kafka lanes use: the events topic, the extended events topic (with
    ``event_types = "upstream"``), then the request topic if any.

    :param config: the jobs configuration.
    :returns: topic names, without duplicates, in that order.
    """
    names = [config.events_topic]
    for name in (config.extended_topic, config.effective_request_topic):
        if name and name not in names:
            names.append(name)
    return names


def ensure_topics(config: JobsConfig, *, timeout_s: float = CREATE_TIMEOUT_S) -> None:
    """Create the lanes' topics that do not exist yet; existing ones are fine.

    :param config: the jobs configuration (``kafka_bootstrap`` must be set).
    :param timeout_s: bound on the whole admin exchange, seconds.
    :raises ConfigError: when ``config.kafka_bootstrap`` is not set.

    Logs ``topics_ready`` (``created_topics`` and ``existing_topics`` lists) on success, or
    ``topics_unverified`` with the broker's error when it cannot be reached or refuses.
    """
    if not config.kafka_bootstrap:
        raise ConfigError("jobs.kafka_bootstrap is not set: there is no broker to create topics on")
    names = wanted_topics(config)
    connection = {
        key: value
        for key, value in config.producer_settings().items()
        if key.startswith(ADMIN_SETTING_PREFIXES)
    }
    admin = AdminClient(
        {
            **connection,
            "bootstrap.servers": config.kafka_bootstrap,
            # Bound the reconnect noise and the time a dead broker can hold the role's start.
            "socket.timeout.ms": int(timeout_s * 1000),
            "reconnect.backoff.max.ms": 1000,
        }
    )
    requested = [
        NewTopic(
            name,
            num_partitions=config.topic_partitions,
            replication_factor=config.topic_replication,
        )
        for name in names
    ]
    created: list[str] = []
    existing: list[str] = []
    problems: dict[str, str] = {}
    try:
        # The AdminClient must stay referenced until every future resolves, or the futures
        # fail with _DESTROY (LIBRARIES.md section 1): ``admin`` lives until this returns.
        futures = admin.create_topics(
            requested, request_timeout=timeout_s, operation_timeout=timeout_s
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s + 1.0)
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing.append(name)
                else:
                    problems[name] = str(err if err is not None else exc)
            except concurrent.futures.TimeoutError:
                problems[name] = f"no answer from the broker within {timeout_s}s"
    except KafkaException as exc:
        problems = {name: str(exc) for name in names}
    if problems:
        log.warning(
            "could not verify the Kafka topics on %s: %s; the relay and the request consumer "
            "will retry on their own",
            config.kafka_bootstrap,
            "; ".join(f"{k}: {v}" for k, v in problems.items()),
            extra={
                "action": "topics_unverified",
                "bootstrap": config.kafka_bootstrap,
                "problems": problems,
            },
        )
        return
    log.info(
        "Kafka topics ready on %s: created %s, already there %s",
        config.kafka_bootstrap,
        created or "none",
        existing or "none",
        extra={
            "action": "topics_ready",
            "bootstrap": config.kafka_bootstrap,
            "created_topics": created,
            "existing_topics": existing,
        },
    )
