"""Interop with the Java ProtoMolt on the Kafka lanes (issue #20, slice 1).

A node booted with a real broker takes a request record framed the way upstream's serializer
frames it, runs the job, and publishes events that a Confluent-framed protobuf deserializer
decodes with upstream's descriptors (the decoder and the descriptors are written in
``tests/support/upstream.py`` from the documented wire format, not from our framing code).
"""

from __future__ import annotations

import uuid

import pytest

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.store import JobStore
from tests.integration.test_role import boot, wait_for, write_config
from tests.support.factories import new_job
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.kafka import TopicReader, create_topic, produce, unique_topic
from tests.support.roles import MemoryRepository
from tests.support.upstream import (
    NotConfluentWireFormat,
    confluent_deserialize,
    confluent_serialize,
    upstream_classes,
)


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


def test_framed_request_runs_a_job_and_every_event_is_confluent_framed(
    tmp_path, fresh_dsn, broker, services
):
    events, requests = unique_topic("events"), unique_topic("requests")
    create_topic(broker.bootstrap, events)
    create_topic(broker.bootstrap, requests, partitions=2)
    extra = (
        f'kafka_bootstrap = "{broker.bootstrap}"\n'
        f'events_topic = "{events}"\nrequest_topic = "{requests}"\n'
    )
    repo = MemoryRepository({"seed-review": seed_workflow(services.target, review="invoke")})
    node = boot(write_config(tmp_path, fresh_dsn, extra=extra), repo)
    node.start()
    try:
        store = node.mount("jobs").store
        # The record as upstream's ProtoMoltProtobufSerializer writes it: 00, id 0, path [1].
        _, up_request = upstream_classes()
        job_id = str(uuid.uuid4())
        request = up_request(job_id=job_id, workflow_name="seed-review")
        request.input.update({"text": "hello brave new world"})
        value = confluent_serialize(request, index=1)
        assert value[:7] == b"\x00\x00\x00\x00\x00\x02\x02"
        produce(broker.bootstrap, requests, value, key=job_id)

        job = wait_for(
            lambda: (j := store.job_get(job_id)) is not None and j.status == "COMPLETED" and j,
            60,
            "the framed request's job to complete",
        )
        assert job.workflow_name == "seed-review"
        wait_for(
            lambda: {r.status for r in store.outbox_for_job(job_id)} == {"PUBLISHED"},
            30,
            "every event of the job to be published",
        )
        outbox = {str(r.event_id): bytes(r.payload) for r in store.outbox_for_job(job_id)}
    finally:
        node.close()

    with TopicReader(broker.bootstrap, events) as reader:
        records = reader.read_until(lambda rs: len({r.value for r in rs}) >= len(outbox))
    seen = {}
    for rec in records:
        assert rec.key == job_id
        # Byte by byte: magic 0, schema id 0 (no registry), message index [0] as one byte 00,
        # then exactly the payload the outbox holds (the outbox itself stays raw).
        assert rec.value[0] == 0x00
        assert rec.value[1:5] == b"\x00\x00\x00\x00"
        assert rec.value[5] == 0x00
        schema_id, path, event = confluent_deserialize(rec.value)
        assert (schema_id, path) == (0, [0])
        assert type(event).DESCRIPTOR.full_name == "up.jobs.v1.WorkflowRunEvent"
        assert rec.value[6:] == outbox[event.event_id]
        assert event.job_id == job_id and event.workflow_name == "seed-review"
        seen[event.event_id] = (
            type(event).DESCRIPTOR.enum_types_by_name["Type"].values_by_number[event.type].name
        )
    assert set(seen) == set(outbox)
    assert sorted(seen.values()) == sorted(
        ["TYPE_ACCEPTED"] + ["TYPE_STEP_CHECKPOINT"] * 3 + ["TYPE_COMPLETED"]
    )


def test_raw_wire_publishes_the_bare_payload(fresh_dsn, broker):
    topic = unique_topic("ev")
    create_topic(broker.bootstrap, topic)
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        job_id = str(store.job_insert(new_job()).job.job_id)
        config = JobsConfig(
            dsn=fresh_dsn, kafka_bootstrap=broker.bootstrap, events_topic=topic, events_wire="raw"
        )
        relay = Relay(store, config=config)
        assert relay.run_once() == 1
        payload = bytes(store.outbox_for_job(job_id)[0].payload)
    finally:
        store.close()
    with TopicReader(broker.bootstrap, topic) as reader:
        (record,) = reader.read_until(lambda rs: len(rs) >= 1)
    assert record.value == payload
    with pytest.raises(NotConfluentWireFormat):
        confluent_deserialize(record.value)
    up_event, _ = upstream_classes()
    assert up_event.FromString(record.value).job_id == job_id
