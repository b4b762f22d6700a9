"""The event contract's size limits, and the largest Kafka record they allow.

``WorkflowRunEvent`` (``proto/.../jobs.proto``) bounds its text fields in code points; the
store truncates to them (:mod:`protomolt_jobs.store.events`) and the configuration refuses a
producer whose ``message.max.bytes`` could not carry the largest such event
(:mod:`protomolt_jobs.config`). Both read the numbers here, so they cannot drift apart.
"""

from __future__ import annotations

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_EVENT_BYTES",
    "MAX_EVENT_RECORD_BYTES",
    "MAX_NAME_CHARS",
    "MAX_VERDICT_CHARS",
]

#: ``WorkflowRunEvent.error`` max_len (code points).
MAX_ERROR_CHARS = 4000
#: ``WorkflowRunEvent.verdict`` max_len (code points).
MAX_VERDICT_CHARS = 500
#: ``WorkflowRunEvent.step`` and ``workflow_name`` max_len (code points).
MAX_NAME_CHARS = 200

#: UTF-8 bytes of one code point, at most.
_UTF8_BYTES = 4
#: Characters of a textual UUID (``event_id``, ``job_id``, the record key).
_UUID_CHARS = 36
#: ``detail.status`` is a job status name (``RECOVERY_REQUIRED`` is the longest, 17); bounded
#: generously so a new status cannot outgrow it.
_STATUS_CHARS = 64
#: Varint bytes of an int32 at least 0 (``attempt``) and of an int64 (``Timestamp.seconds``).
_INT32_VARINT = 5
_INT64_VARINT = 10


def _varint_bytes(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _field(length: int) -> int:
    """Bytes of one length-delimited field numbered below 16: tag, length, body."""
    return 1 + _varint_bytes(length) + length


#: The largest serialized ``WorkflowRunEvent`` the contract allows: every text field at its
#: max_len of four-byte code points (about 21 KB).
MAX_EVENT_BYTES = (
    2 * _field(_UUID_CHARS)  # event_id, job_id
    + 2 * _field(MAX_NAME_CHARS * _UTF8_BYTES)  # workflow_name, step
    + 1
    + 1  # type (enum numbers below 128)
    + 1
    + _INT32_VARINT  # attempt
    + _field(MAX_VERDICT_CHARS * _UTF8_BYTES)
    + _field(MAX_ERROR_CHARS * _UTF8_BYTES)
    # detail: Struct{fields: {"status": Value{string_value: status}}}
    + _field(_field(_field(len("status")) + _field(_field(_STATUS_CHARS))))
    # occurred_at: Timestamp{seconds, nanos}
    + _field(1 + _INT64_VARINT + 1 + _INT32_VARINT)
)
#: Confluent framing of a value: magic byte, 4-byte schema id, message index ``[0]``.
_FRAME_BYTES = 1 + 4 + 1
#: Kafka's v2 record batch header (61 bytes) plus one record's most overhead (length,
#: attributes, timestamp and offset deltas, key and value lengths, header count: 36 bytes).
_RECORD_OVERHEAD = 61 + 36
#: The largest Kafka record (batch of one) the relay produces for a contract-valid event:
#: the event, its framing, its key (the job id) and the record overhead. A producer's
#: ``message.max.bytes`` below this could refuse a valid event as MSG_SIZE_TOO_LARGE.
MAX_EVENT_RECORD_BYTES = MAX_EVENT_BYTES + _FRAME_BYTES + _UUID_CHARS + _RECORD_OVERHEAD
