"""Confluent wire framing of Kafka record values (what the Java ProtoMolt serde writes and reads).

A framed value is::

    00                      magic byte
    <schema id: 4 bytes>    big-endian, unsigned; 0 when no Schema Registry is used
    <message-index path>    zigzag varints: the path [0] is the single byte 00, any other
                            path is its length followed by its indices ([1] is 02 02)
    <protobuf bytes>        the serialized message

``WorkflowRunEvent`` is message 0 of ``jobs.proto`` (path ``[0]``), ``WorkflowRunRequest`` is
message 1 (path ``[1]``), so an event without a registry frames as ``00 00000000 00 <payload>``
and a request as ``00 00000000 02 02 <payload>``. A raw protobuf value never starts with a
zero byte (no field has number 0), so a reader can accept both framings.

:class:`EventFraming` is what the relay applies to each outbox payload at produce time
(``jobs.events_wire``); the outbox keeps raw protobuf either way, as upstream's does.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
import urllib.request
from collections.abc import Sequence

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = [
    "EVENTS_WIRES",
    "EVENT_INDEX_PATH",
    "MAGIC",
    "REQUEST_INDEX_PATH",
    "EventFraming",
    "RegistryError",
    "frame",
    "registry_schema_id",
    "unframe",
]

log = logging.getLogger("protomolt_jobs.framing")

MAGIC = 0
#: Message-index paths in ``ai/pipestream/proto/jobs/v1/jobs.proto``.
EVENT_INDEX_PATH: tuple[int, ...] = (0,)
REQUEST_INDEX_PATH: tuple[int, ...] = (1,)
#: Values of ``jobs.events_wire``.
EVENTS_WIRES = ("confluent", "raw")
#: Longest index path a reader accepts (nesting deeper than this is not plausible).
_MAX_PATH = 16


class RegistryError(ProtomoltJobsError, RuntimeError):
    """The Schema Registry could not say the subject's schema id (unreachable, no such
    subject, an answer without an ``id``). The message names the URL and subject."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _zigzag_encode(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _zigzag_decode(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint in the Confluent message-index array")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def frame(
    payload: bytes, *, schema_id: int = 0, index_path: Sequence[int] = EVENT_INDEX_PATH
) -> bytes:
    """Wrap protobuf bytes in the Confluent wire format.

    :param payload: the serialized message.
    :param schema_id: 0..2**32-1, the registry's id for the subject (0 without a registry).
    :param index_path: the message's index path in its file; ``[0]`` is written as one byte.
    :returns: ``00 <id:4 BE> <path> <payload>``.
    :raises ValueError: when the schema id does not fit 4 unsigned bytes or the path is empty.
    """
    if not 0 <= schema_id <= 0xFFFFFFFF:
        raise ValueError(f"a Confluent schema id is 4 unsigned bytes; got {schema_id}")
    path = list(index_path)
    if not path:
        raise ValueError("a message-index path names at least one message")
    if path == [0]:
        encoded = b"\x00"
    else:
        encoded = _varint(_zigzag_encode(len(path))) + b"".join(
            _varint(_zigzag_encode(i)) for i in path
        )
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big") + encoded + bytes(payload)


def unframe(raw: bytes) -> tuple[int, list[int], bytes]:
    """Split a Confluent-framed value.

    :returns: ``(schema_id, index_path, protobuf_bytes)``.
    :raises ValueError: when the magic byte is not 0, the frame is shorter than 6 bytes, or
        the index array is truncated or implausible.
    """
    raw = bytes(raw)
    if len(raw) < 6:
        raise ValueError(f"a Confluent frame needs at least 6 bytes; got {len(raw)}")
    if raw[0] != MAGIC:
        raise ValueError(f"not Confluent wire format: magic byte {raw[0]}, expected 0")
    schema_id = int.from_bytes(raw[1:5], "big")
    count, pos = _read_varint(raw, 5)
    count = _zigzag_decode(count)
    if count == 0:
        return schema_id, [0], raw[pos:]
    if count < 0 or count > _MAX_PATH:
        raise ValueError(f"message-index array of length {count} is not plausible")
    path = []
    for _ in range(count):
        index, pos = _read_varint(raw, pos)
        path.append(_zigzag_decode(index))
    return schema_id, path, raw[pos:]


def registry_schema_id(url: str, subject: str, *, timeout_s: float = 10.0) -> int:
    """The id of the latest schema registered under ``subject`` in a Confluent Schema
    Registry (``GET {url}/subjects/{subject}/versions/latest``).

    :raises RegistryError: when the registry does not answer with an integer ``id``.
    """
    target = f"{url.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
    request = urllib.request.Request(
        target, headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read().decode("utf-8"))
    except Exception as exc:  # every failure here means "no id"
        raise RegistryError(f"schema registry {url}: no schema id for {subject!r}: {exc}") from exc
    schema_id = body.get("id") if isinstance(body, dict) else None
    if isinstance(schema_id, bool) or not isinstance(schema_id, int) or schema_id < 0:
        raise RegistryError(
            f"schema registry {url}: the answer for {subject!r} carries no integer 'id'"
        )
    return schema_id


class EventFraming:
    """How the relay frames each event payload (``jobs.events_wire``).

    ``"confluent"``: Confluent wire format with index path ``[0]``; the schema id is the
    registry's id for subject ``<events_topic>-value`` when ``registry_url`` is set (looked up
    once, on the first event, and kept), else 0, as upstream's serializer stamps it.
    ``"raw"``: the protobuf bytes as stored.

    :raises ValueError: for another ``wire`` value.
    """

    def __init__(self, wire: str, *, topic: str, registry_url: str | None = None) -> None:
        if wire not in EVENTS_WIRES:
            raise ValueError(
                f"jobs.events_wire must be one of {', '.join(EVENTS_WIRES)}; got {wire!r}"
            )
        self.wire = wire
        self.subject = f"{topic}-value"
        self.registry_url = registry_url or None
        self._schema_id: int | None = None if self.registry_url else 0
        self._lock = threading.Lock()

    def schema_id(self) -> int:
        """The schema id stamped into frames (0 without a registry).

        :raises RegistryError: when a configured registry cannot say it (the caller retries).
        """
        if self._schema_id is None:
            with self._lock:
                if self._schema_id is None:
                    assert self.registry_url is not None
                    self._schema_id = registry_schema_id(self.registry_url, self.subject)
                    log.info(
                        "events framed with schema id %d (subject %s)",
                        self._schema_id,
                        self.subject,
                    )
        return self._schema_id

    def __call__(self, payload: bytes) -> bytes:
        """Frame one outbox payload for the events topic.

        :raises RegistryError: see :meth:`schema_id`.
        """
        if self.wire == "raw":
            return payload
        return frame(payload, schema_id=self.schema_id(), index_path=EVENT_INDEX_PATH)
