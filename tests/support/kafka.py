"""Kafka helpers for tests: unique topics, a synchronous producer, and a group-less reader.

The reader uses ``Consumer.assign()`` on every partition from the beginning: it skips the
group join (about a second on Tansu, LIBRARIES.md section 1) and never commits. It does not
trust the broker's high watermark (wrong on Tansu); it reads until a condition holds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 4) -> None:
    """Create ``name`` (already existing is fine)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        try:
            future.result(timeout=10)
        except Exception as exc:  # TOPIC_ALREADY_EXISTS
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise


def partitions_of(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (waits for the metadata to show it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(topic=topic, timeout=5)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return sorted(t.partitions)
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {topic} has no partitions after {timeout_s}s")
        time.sleep(0.1)


def produce(bootstrap: str, topic: str, value: bytes | None, key: str | None = None) -> None:
    """Produce one record and wait for its delivery report (raises on failure)."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    errors: list[KafkaError] = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)

    producer.produce(topic, value=value, key=key, on_delivery=report)
    remaining = producer.flush(15)
    assert remaining == 0, f"record to {topic} not delivered within 15 s"
    assert not errors, f"record to {topic} failed: {errors}"


@dataclass(frozen=True)
class Record:
    """One consumed record."""

    partition: int
    offset: int
    key: str | None
    value: bytes | None


class TopicReader:
    """Reads every partition of a topic from the beginning, accumulating records."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.records: list[Record] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        parts = partitions_of(bootstrap, topic)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])

    def read_until(
        self, done: Callable[[list[Record]], bool], timeout_s: float = 60.0
    ) -> list[Record]:
        """Poll until ``done(records)`` is true; raises AssertionError on timeout."""
        deadline = time.monotonic() + timeout_s
        while not done(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"reading {self.topic}: condition not met after {timeout_s}s "
                    f"({len(self.records)} records)"
                )
            for m in self._consumer.consume(500, timeout=0.5):
                if m.error() is not None:
                    continue
                key = m.key()
                self.records.append(
                    Record(
                        m.partition(),
                        m.offset(),
                        key.decode() if key is not None else None,
                        m.value(),
                    )
                )
        return self.records

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for(condition: Callable[[], object], timeout_s: float = 30.0, interval_s: float = 0.05):
    """Poll ``condition()`` until truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)
