"""Confluent wire framing (protomolt_jobs.kafka.framing) byte by byte, and the registry lookup
against a stub registry on loopback (the integration tier has no Schema Registry)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.kafka.framing import EventFraming, RegistryError, frame, unframe


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
    """A stub Schema Registry: subject -> latest id; counts lookups."""
    state = {"ids": {"ev-value": 42}, "calls": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["calls"] += 1
            subject = self.path.split("/")[2]
            if self.path.endswith("/versions/latest") and subject in state["ids"]:
                body = {"subject": subject, "version": 3, "id": state["ids"][subject]}
                code = 200
            else:
                body, code = {"error_code": 40401, "message": "Subject not found"}, 404
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_registry_id_of_the_topic_subject_is_stamped_and_kept(registry):
    framing = EventFraming("confluent", topic="ev", registry_url=registry["url"])
    assert framing(b"P") == b"\x00\x00\x00\x00\x2a\x00P"
    assert framing(b"Q") == b"\x00\x00\x00\x00\x2a\x00Q"
    assert registry["calls"] == 1


def test_registry_without_the_subject_is_a_registry_error(registry):
    framing = EventFraming("confluent", topic="other", registry_url=registry["url"])
    with pytest.raises(RegistryError, match="no schema id for 'other-value'"):
        framing(b"P")
    registry["ids"]["other-value"] = 7
    assert framing(b"P") == b"\x00\x00\x00\x00\x07\x00P"  # retried on the next event
