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

With a Schema Registry the id comes from subject ``<events topic>-value``, and the message
index ``[0]`` is only right if the registered schema's first message is ``WorkflowRunEvent``:
every answer is checked (:func:`first_message`), and a schema that says otherwise is a
:class:`RegistrySchemaMismatch`, never stamped. A registry that cannot answer is handled by
``jobs.registry_failure``: ``halt`` (raise, the relay publishes nothing) or ``fallback-id-0``
(stamp 0, as upstream's serializer does, and ask again after :data:`REGISTRY_RETRY_S`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = [
    "EVENTS_WIRES",
    "EVENT_INDEX_PATH",
    "EVENT_MESSAGE",
    "MAGIC",
    "REGISTRY_RETRY_S",
    "REQUEST_INDEX_PATH",
    "EventFraming",
    "RegisteredSchema",
    "RegistryError",
    "RegistrySchemaMismatch",
    "first_message",
    "frame",
    "registry_schema",
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
#: The message index path ``[0]`` must name in a registered schema.
EVENT_MESSAGE = "ai.pipestream.proto.jobs.v1.WorkflowRunEvent"
#: Under ``registry_failure = "fallback-id-0"``, how long frames carry id 0 before the
#: registry is asked again, seconds (a lookup can take its whole timeout).
REGISTRY_RETRY_S = 30.0
#: Longest index path a reader accepts (nesting deeper than this is not plausible).
_MAX_PATH = 16


class RegistryError(ProtomoltJobsError, RuntimeError):
    """The Schema Registry could not say the subject's schema id (unreachable, no such
    subject, an answer without an ``id``). The message names the URL and subject."""


class RegistrySchemaMismatch(RegistryError):
    """The registry answered, but the schema registered under the subject is not one whose
    message index ``[0]`` is :data:`EVENT_MESSAGE` (another first message, another package,
    not PROTOBUF). Frames with that id would tell a registry-aware consumer to decode the
    event as something else, so no policy stamps it. The message names the subject, the
    schema id and what the first message is."""


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


@dataclass(frozen=True)
class RegisteredSchema:
    """The latest schema under a subject, as the registry answered.

    :ivar schema_id: the registry's global id (0 .. 2**32-1).
    :ivar schema_type: ``schemaType`` (Confluent omits it for AVRO), e.g. ``PROTOBUF``.
    :ivar schema: the schema text (``.proto`` source for PROTOBUF), or "" when absent.
    """

    schema_id: int
    schema_type: str
    schema: str


def registry_schema(url: str, subject: str, *, timeout_s: float = 10.0) -> RegisteredSchema:
    """The latest schema registered under ``subject`` in a Confluent Schema Registry
    (``GET {url}/subjects/{subject}/versions/latest``).

    :param timeout_s: bound on the HTTP exchange, seconds.
    :raises RegistryError: when the registry does not answer with an integer ``id`` (it is
        unreachable, times out, has no such subject, or answers something else).
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
    if (
        isinstance(schema_id, bool)
        or not isinstance(schema_id, int)
        or not 0 <= schema_id <= 0xFFFFFFFF
    ):
        raise RegistryError(
            f"schema registry {url}: the answer for {subject!r} carries no integer 'id'"
        )
    schema_type = body.get("schemaType")
    schema = body.get("schema")
    return RegisteredSchema(
        schema_id=schema_id,
        # The Confluent API leaves schemaType out for AVRO, its default.
        schema_type=schema_type if isinstance(schema_type, str) else "AVRO",
        schema=schema if isinstance(schema, str) else "",
    )


def registry_schema_id(url: str, subject: str, *, timeout_s: float = 10.0) -> int:
    """The id of the latest schema under ``subject``, checked to frame a ``WorkflowRunEvent``
    with index ``[0]`` (:func:`check_event_schema`).

    :raises RegistryError: when the registry cannot say it.
    :raises RegistrySchemaMismatch: when the registered schema's first message is not
        :data:`EVENT_MESSAGE`.
    """
    registered = registry_schema(url, subject, timeout_s=timeout_s)
    check_event_schema(registered, url=url, subject=subject)
    return registered.schema_id


_PROTO_TOKENS = re.compile(
    r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|[A-Za-z_][\w.]*|[{};=]""",
    re.DOTALL,
)


def first_message(schema: str) -> str | None:
    """The full name of the first top-level message a ``.proto`` source declares
    (``<package>.<Message>``, or ``<Message>`` without a package): the message a Confluent
    message-index path ``[0]`` names.

    :param schema: ``.proto`` source text.
    :returns: the full name, or None when the text declares no top-level message.
    """
    package = ""
    depth = 0
    statement_start = True  # the next top-level token begins a statement
    expect: str | None = None  # the keyword whose name comes next
    for match in _PROTO_TOKENS.finditer(schema):
        token = match.group(0)
        if token.startswith(("//", "/*", '"', "'")):
            continue
        if token in ("{", "}"):
            depth = depth + 1 if token == "{" else max(0, depth - 1)
            statement_start = depth == 0
            continue
        if depth:
            continue
        if token == ";":
            statement_start, expect = True, None
            continue
        if expect == "message":
            return f"{package}.{token}" if package else token
        if expect == "package":
            package = token
        expect = token if statement_start and token in ("package", "message") else None
        statement_start = False
    return None


def check_event_schema(registered: RegisteredSchema, *, url: str, subject: str) -> None:
    """Check that ``registered`` frames a ``WorkflowRunEvent`` as message index ``[0]``.

    :raises RegistrySchemaMismatch: naming the subject, the id and what index ``[0]`` is.
    """
    if registered.schema_type.upper() != "PROTOBUF":
        raise RegistrySchemaMismatch(
            f"schema registry {url}: subject {subject!r} holds schema id "
            f"{registered.schema_id} of type {registered.schema_type}, not PROTOBUF; events "
            f"are {EVENT_MESSAGE} protobuf records"
        )
    found = first_message(registered.schema)
    if found != EVENT_MESSAGE:
        raise RegistrySchemaMismatch(
            f"schema registry {url}: the first message of schema id {registered.schema_id} "
            f"under subject {subject!r} is {found or 'missing'}, not {EVENT_MESSAGE}; message "
            "index [0] would name the wrong message (register jobs.proto, whose first "
            "message is WorkflowRunEvent)"
        )


class EventFraming:
    """How the relay frames each event payload (``jobs.events_wire``).

    ``"confluent"``: Confluent wire format with index path ``[0]``; the schema id is the
    registry's id for subject ``<events_topic>-value`` when ``registry_url`` is set (looked up
    when first needed, checked with :func:`check_event_schema`, and kept), else 0, as
    upstream's serializer stamps it. ``"raw"``: the protobuf bytes as stored.

    :param wire: ``confluent`` or ``raw``.
    :param topic: the events topic (the subject is ``<topic>-value``).
    :param registry_url: the Schema Registry base URL, or None.
    :param on_failure: ``halt`` or ``fallback-id-0`` (``jobs.registry_failure``): what
        :meth:`schema_id` does when the registry cannot say the id.
    :param timeout_s: bound on one registry lookup, seconds.
    :raises ValueError: for another ``wire`` or ``on_failure`` value.
    """

    def __init__(
        self,
        wire: str,
        *,
        topic: str,
        registry_url: str | None = None,
        on_failure: str = "halt",
        timeout_s: float = 10.0,
    ) -> None:
        if wire not in EVENTS_WIRES:
            raise ValueError(
                f"jobs.events_wire must be one of {', '.join(EVENTS_WIRES)}; got {wire!r}"
            )
        if on_failure not in ("halt", "fallback-id-0"):
            raise ValueError(
                f"jobs.registry_failure must be 'halt' or 'fallback-id-0'; got {on_failure!r}"
            )
        self.wire = wire
        self.subject = f"{topic}-value"
        self.registry_url = registry_url or None
        self.on_failure = on_failure
        self.timeout_s = timeout_s
        self._schema_id: int | None = None if self.registry_url else 0
        #: The last lookup failure, and when it happened (monotonic), while falling back.
        self._failure: tuple[RegistryError, float] | None = None
        #: True while frames carry id 0 because the registry could not say the id.
        self.falling_back = False
        self._lock = threading.Lock()

    @property
    def needs_registry(self) -> bool:
        """True when frames need the registry's id (confluent wire, registry configured,
        id not known yet)."""
        return self.wire == "confluent" and self._schema_id is None

    def check_registered(self) -> int:
        """Look up and check the subject's schema now (the relay's start).

        :returns: the schema id, kept for every later frame.
        :raises RegistryError: when the registry cannot say the id.
        :raises RegistrySchemaMismatch: when the registered schema does not frame a
            ``WorkflowRunEvent`` as index ``[0]``.
        """
        with self._lock:
            return self._lookup()

    def _lookup(self) -> int:
        if self._schema_id is not None:
            return self._schema_id
        assert self.registry_url is not None
        schema_id = registry_schema_id(self.registry_url, self.subject, timeout_s=self.timeout_s)
        self._schema_id = schema_id
        self._failure = None
        if self.falling_back:
            self.falling_back = False
            log.info(
                "schema registry answers again: events framed with schema id %d (subject %s)",
                schema_id,
                self.subject,
                extra={"action": "relay_registry_recovered", "schema_id": schema_id},
            )
        else:
            log.info(
                "events framed with schema id %d (subject %s)",
                schema_id,
                self.subject,
                extra={"action": "relay_registry_schema", "schema_id": schema_id},
            )
        return schema_id

    def schema_id(self) -> int:
        """The schema id stamped into frames: the registry's (looked up once and kept), or
        0 without a registry.

        When the registry cannot say it: under ``halt`` the error is raised (the caller
        publishes nothing and asks again later); under ``fallback-id-0`` the answer is 0, and
        the registry is asked again only after :data:`REGISTRY_RETRY_S`.

        :raises RegistrySchemaMismatch: whatever the policy: the registry's schema does not
            frame a ``WorkflowRunEvent`` as index ``[0]``.
        :raises RegistryError: under ``halt``, when the registry cannot say the id.
        """
        if self._schema_id is not None:
            return self._schema_id
        with self._lock:
            failure = self._failure
            if failure is not None and time.monotonic() - failure[1] < REGISTRY_RETRY_S:
                if isinstance(failure[0], RegistrySchemaMismatch) or self.on_failure == "halt":
                    raise failure[0]
                return 0
            try:
                return self._lookup()
            except RegistrySchemaMismatch as exc:
                self._failure = (exc, time.monotonic())
                raise
            except RegistryError as exc:
                if self.on_failure == "halt":
                    raise
                self._failure = (exc, time.monotonic())
                self.falling_back = True
                log.warning(
                    "%s; framing events with schema id 0 (jobs.registry_failure = "
                    "fallback-id-0) and asking again in %g s",
                    exc,
                    REGISTRY_RETRY_S,
                    extra={"action": "relay_registry_fallback", "subject": self.subject},
                )
                return 0

    def frame(self, payload: bytes, schema_id: int) -> bytes:
        """Frame one outbox payload with a schema id the caller resolved (one lookup per
        pass, :meth:`schema_id`); the payload as is on the raw wire."""
        if self.wire == "raw":
            return payload
        return frame(payload, schema_id=schema_id, index_path=EVENT_INDEX_PATH)

    def __call__(self, payload: bytes) -> bytes:
        """Frame one outbox payload for the events topic.

        :raises RegistryError: see :meth:`schema_id`.
        """
        if self.wire == "raw":
            return payload
        return self.frame(payload, self.schema_id())
