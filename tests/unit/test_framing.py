"""Confluent wire framing (protomolt_jobs.kafka.framing) byte by byte, and the registry lookup
against a stub registry on loopback (the integration tier has no Schema Registry): the id,
the check of the registered schema's first message, and the failure policies."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.kafka import framing as framing_module
from protomolt_jobs.kafka.framing import (
    EventFraming,
    RegistryError,
    RegistrySchemaMismatch,
    first_message,
    frame,
    unframe,
)
from tests.support.schema_registry import JOBS_PROTO, OTHER_PROTO, StubRegistry


def test_event_and_request_frames_are_upstreams_bytes():
    assert frame(b"\x0a\x01x") == b"\x00\x00\x00\x00\x00\x00\x0a\x01x"
    assert frame(b"P", index_path=(1,)) == b"\x00\x00\x00\x00\x00\x02\x02P"
    assert frame(b"P", schema_id=0x01020304) == b"\x00\x01\x02\x03\x04\x00P"
    assert frame(b"P", index_path=(1, 70)) == b"\x00\x00\x00\x00\x00\x04\x02\x8c\x01P"
    assert unframe(b"\x00\x01\x02\x03\x04\x04\x02\x8c\x01P") == (0x01020304, [1, 70], b"P")
    assert unframe(frame(b"", index_path=(0,))) == (0, [0], b"")


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x00\x00", "at least 6 bytes"),
        (b"\x01\x00\x00\x00\x00\x00", "magic byte 1"),
        (b"\x00\x00\x00\x00\x00\x02\x82", "truncated varint"),
        (b"\x00\x00\x00\x00\x00\x7e", "not plausible"),
    ],
)
def test_bad_frames(raw, message):
    with pytest.raises(ValueError, match=message):
        unframe(raw)


def test_frame_refuses_an_id_that_does_not_fit():
    with pytest.raises(ValueError, match="4 unsigned bytes"):
        frame(b"", schema_id=2**32)


def test_events_wire_config():
    assert JobsConfig().events_wire == "confluent"
    assert JobsConfig.from_mapping({"events_wire": "raw"}).events_wire == "raw"
    assert JobsConfig.from_mapping({"schema_registry_url": " "}).schema_registry_url is None
    with pytest.raises(ConfigError, match="jobs.events_wire must be 'confluent' or 'raw'"):
        JobsConfig.from_mapping({"events_wire": "avro"})


def test_raw_wire_is_the_payload():
    assert EventFraming("raw", topic="t")(b"\x0a\x01x") == b"\x0a\x01x"


@pytest.fixture
def registry():
    """A stub Schema Registry holding jobs.proto as ``ev-value`` (id 42)."""
    with StubRegistry() as stub:
        stub.register("ev-value", 42)
        yield stub


def test_registry_id_of_the_topic_subject_is_stamped_and_kept(registry):
    framing = EventFraming("confluent", topic="ev", registry_url=registry.url)
    assert framing(b"P") == b"\x00\x00\x00\x00\x2a\x00P"
    assert framing(b"Q") == b"\x00\x00\x00\x00\x2a\x00Q"
    assert registry.calls == 1


def test_registry_without_the_subject_is_a_registry_error(registry):
    framing = EventFraming("confluent", topic="other", registry_url=registry.url)
    with pytest.raises(RegistryError, match="no schema id for 'other-value'"):
        framing(b"P")
    registry.register("other-value", 7)
    assert framing(b"P") == b"\x00\x00\x00\x00\x07\x00P"  # retried on the next event


def test_first_message_is_the_first_top_level_message_of_the_source():
    assert first_message(JOBS_PROTO) == "ai.pipestream.proto.jobs.v1.WorkflowRunEvent"
    assert first_message(OTHER_PROTO) == "ai.pipestream.proto.jobs.v1.WorkflowRunRequest"
    tricky = (
        'syntax = "proto3"; // message A {}\n/* message B {} */\npackage p.q;\n'
        'option (o) = { message: "message C {" };\nenum E { E_0 = 0; }\n'
        "service S { rpc R(M) returns (M); }\nmessage Outer { message Inner {} }\n"
    )
    assert first_message(tricky) == "p.q.Outer"
    assert first_message("message Bare {}") == "Bare"
    assert first_message('syntax = "proto3"; enum E { X = 0; }') is None


@pytest.mark.parametrize(
    ("schema", "schema_type", "named"),
    [
        (OTHER_PROTO, "PROTOBUF", "ai.pipestream.proto.jobs.v1.WorkflowRunRequest"),
        (JOBS_PROTO.replace("package ai.pipestream.proto.jobs.v1;", ""), "PROTOBUF", "is Wor"),
        ('{"type": "record", "name": "WorkflowRunEvent"}', "AVRO", "of type AVRO"),
    ],
)
def test_a_registered_schema_that_does_not_frame_the_event_as_index_0_is_a_mismatch(
    registry, schema, schema_type, named
):
    registry.register("ev-value", 9, schema, schema_type)
    for policy in ("halt", "fallback-id-0"):
        framing = EventFraming(
            "confluent", topic="ev", registry_url=registry.url, on_failure=policy
        )
        with pytest.raises(RegistrySchemaMismatch, match=named):
            framing.schema_id()  # never stamped, whatever the policy


def test_halt_raises_while_the_registry_is_down_and_fallback_stamps_0(registry, monkeypatch):
    url = registry.url
    registry.stop()
    halt = EventFraming("confluent", topic="ev", registry_url=url, timeout_s=2)
    with pytest.raises(RegistryError, match="no schema id for 'ev-value'"):
        halt.schema_id()
    fallback = EventFraming(
        "confluent", topic="ev", registry_url=url, on_failure="fallback-id-0", timeout_s=2
    )
    assert fallback(b"P") == b"\x00\x00\x00\x00\x00\x00P"
    assert fallback.falling_back

    # Once the registry answers again (after the retry interval) its id is stamped and kept.
    with StubRegistry() as back:
        back.register("ev-value", 42)
        fallback.registry_url = back.url
        assert fallback.schema_id() == 0  # within REGISTRY_RETRY_S: not asked again
        assert back.calls == 0
        monkeypatch.setattr(framing_module, "REGISTRY_RETRY_S", 0.0)
        assert fallback(b"P") == b"\x00\x00\x00\x00\x2a\x00P"
        assert not fallback.falling_back and back.calls == 1


def test_events_wire_and_policy_values_are_checked():
    with pytest.raises(ValueError, match="registry_failure"):
        EventFraming("confluent", topic="t", on_failure="ignore")
    assert EventFraming("confluent", topic="t").schema_id() == 0  # no registry: id 0
