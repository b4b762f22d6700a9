"""The validation dialect against upstream's, rule kind by rule kind (issue #20).

Each case declares one rule on a field ``v`` of a message of its own, then checks a violating
value (upstream's rule id and message, as upstream's ProtoValidator reports them) and a valid
value (no violation). The expected texts are upstream's; where this project deliberately
differs, docs/contract.md has the table and the case says so.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest
from google.protobuf import duration_pb2, message_factory, timestamp_pb2

from protomolt_jobs.workflow.validation import RuleError, compile_rules, validate_message
from tests.unit.test_validation import build_pool

F = "(ai.pipestream.proto.validate.v1.field)"
M = "(ai.pipestream.proto.validate.v1.message)"

NOW = dt.datetime.now(dt.UTC)


def ts(seconds_from_now: float) -> timestamp_pb2.Timestamp:
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(NOW + dt.timedelta(seconds=seconds_from_now))
    return t


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(dt.timedelta(seconds=seconds))
    return d


# (case id, field type, rules text, bad value, good value, rule id, message)
CASES = [
    # required
    ("required", "string", "{required: true}", "", "x", "required", "field is required"),
    # strings
    (
        "string.const",
        "string",
        '{string: {const: "a"}}',
        "b",
        "a",
        "string.const",
        'must equal "a"',
    ),
    (
        "string.len",
        "string",
        "{string: {len: 2}}",
        "abc",
        "ab",
        "string.len",
        "length must be exactly 2",
    ),
    (
        "string.min_len",
        "string",
        "{string: {min_len: 2}}",
        "a",
        "ab",
        "string.min_len",
        "length must be at least 2",
    ),
    (
        "string.max_len",
        "string",
        "{string: {max_len: 2}}",
        "abc",
        "ab",
        "string.max_len",
        "length must be at most 2",
    ),
    (
        "string.pattern",
        "string",
        '{string: {pattern: "^a+$"}}',
        "b",
        "aa",
        "string.pattern",
        "value does not match pattern",
    ),
    (
        "string.prefix",
        "string",
        '{string: {prefix: "p"}}',
        "x",
        "px",
        "string.prefix",
        'must start with "p"',
    ),
    (
        "string.suffix",
        "string",
        '{string: {suffix: "s"}}',
        "x",
        "xs",
        "string.suffix",
        'must end with "s"',
    ),
    (
        "string.contains",
        "string",
        '{string: {contains: "c"}}',
        "x",
        "xcx",
        "string.contains",
        'must contain "c"',
    ),
    (
        "string.not_contains",
        "string",
        '{string: {not_contains: "c"}}',
        "c",
        "x",
        "string.not_contains",
        'must not contain "c"',
    ),
    (
        "string.in",
        "string",
        '{string: {in: ["a", "b"]}}',
        "c",
        "a",
        "string.in",
        "must be one of [a, b]",
    ),
    (
        "string.not_in",
        "string",
        '{string: {not_in: ["a", "b"]}}',
        "a",
        "c",
        "string.not_in",
        "must not be one of [a, b]",
    ),
    (
        "string.email",
        "string",
        "{string: {email: true}}",
        "no-at",
        "a@b.example",
        "string.email",
        "value must be a valid email address",
    ),
    (
        "string.email_empty",
        "string",
        "{string: {email: true}}",
        "",
        "a@b.example",
        "string.email_empty",
        "value is empty",
    ),
    (
        "string.uuid",
        "string",
        "{string: {uuid: true}}",
        "nope",
        "123e4567-e89b-12d3-a456-426614174000",
        "string.uuid",
        "value must be a valid UUID",
    ),
    (
        "string.hostname",
        "string",
        "{string: {hostname: true}}",
        "-bad-",
        "a.example",
        "string.hostname",
        "value must be a valid hostname",
    ),
    (
        "string.uri",
        "string",
        "{string: {uri: true}}",
        "/relative",
        "https://a.example/x",
        "string.uri",
        "value must be an absolute URI",
    ),
    (
        "string.ip",
        "string",
        "{string: {ip: true}}",
        "1.2.3",
        "::1",
        "string.ip",
        "value must be a valid IP address",
    ),
    (
        "string.ipv4",
        "string",
        "{string: {ipv4: true}}",
        "::1",
        "10.0.0.1",
        "string.ipv4",
        "value must be a valid IPv4 address",
    ),
    (
        "string.ipv6",
        "string",
        "{string: {ipv6: true}}",
        "10.0.0.1",
        "::1",
        "string.ipv6",
        "value must be a valid IPv6 address",
    ),
    (
        "string.date",
        "string",
        "{string: {date: true}}",
        "2024-02-30",
        "2024-02-29",
        "string.date",
        "value must be an ISO-8601 calendar date",
    ),
    (
        "string.date_time",
        "string",
        "{string: {date_time: true}}",
        "2024-02-29",
        "2024-02-29T10:00:00Z",
        "string.date_time",
        "value must be an RFC 3339 date-time",
    ),
    (
        "string.mime_type",
        "string",
        "{string: {mime_type: true}}",
        "text",
        "text/plain",
        "string.mime_type",
        "value must be an IANA media type (type/subtype)",
    ),
    (
        "string.language_tag",
        "string",
        "{string: {language_tag: true}}",
        "e",
        "en-GB",
        "string.language_tag",
        "value must be a BCP 47 language tag",
    ),
    (
        "string.currency_code",
        "string",
        "{string: {currency_code: true}}",
        "ABC",
        "EUR",
        "string.currency_code",
        "value must be an ISO 4217 currency code",
    ),
    (
        "string.phone_number",
        "string",
        "{string: {phone_number: true}}",
        "call me",
        "+44 20 7946 0958",
        "string.phone_number",
        "value must be a telephone number",
    ),
    (
        "string.sha256_hex",
        "string",
        "{string: {sha256_hex: true}}",
        "ab",
        "a" * 64,
        "string.sha256_hex",
        "value must be a lowercase hex SHA-256 digest",
    ),
    (
        "string.sha1_hex",
        "string",
        "{string: {sha1_hex: true}}",
        "ab",
        "a" * 40,
        "string.sha1_hex",
        "value must be a lowercase hex SHA-1 digest",
    ),
    (
        "string.hex",
        "string",
        "{string: {hex: true}}",
        "xyz",
        "0af",
        "string.hex",
        "value must be lowercase hexadecimal",
    ),
    (
        "string.base64",
        "string",
        "{string: {base64: true}}",
        "abc",
        "YWJj",
        "string.base64",
        "value must be base64",
    ),
    (
        "string.slug",
        "string",
        "{string: {slug: true}}",
        "Not A Slug",
        "a-slug",
        "string.slug",
        "value must be a lowercase slug (a-z0-9 with interior ., _ or -)",
    ),
    (
        "string.region_code",
        "string",
        "{string: {region_code: true}}",
        "ZZ",
        "GB",
        "string.region_code",
        "value must be an ISO 3166-1 alpha-2 region code",
    ),
    (
        "string.protobuf_fqn",
        "string",
        "{string: {protobuf_fqn: true}}",
        "a..b",
        "a.b.C",
        "string.protobuf_fqn",
        "value must be a valid protobuf fully-qualified name",
    ),
    # numbers: single bounds, combined bounds, reversed (exclusive) bounds
    ("int32.gt", "int32", "{int32: {gt: 0}}", 0, 1, "int32.gt", "must be > 0"),
    ("int32.gte", "int32", "{int32: {gte: 1}}", 0, 1, "int32.gte", "must be >= 1"),
    ("int32.lt", "int32", "{int32: {lt: 5}}", 5, 4, "int32.lt", "must be < 5"),
    ("int32.lte", "int32", "{int32: {lte: 5}}", 6, 5, "int32.lte", "must be <= 5"),
    (
        "int32.gte_lte",
        "int32",
        "{int32: {gte: 1, lte: 5}}",
        6,
        5,
        "int32.gte_lte",
        "must be gte 1 and lte 5",
    ),
    (
        "int32.gt_lt",
        "int32",
        "{int32: {gt: 0, lt: 10}}",
        10,
        9,
        "int32.gt_lt",
        "must be gt 0 and lt 10",
    ),
    (
        "int32.gt_lt_exclusive",
        "int32",
        "{int32: {gt: 10, lt: 0}}",
        5,
        11,
        "int32.gt_lt_exclusive",
        "must be gt 10 or lt 0",
    ),
    (
        "int32.gte_lte_exclusive",
        "int32",
        "{int32: {gte: 10, lte: 0}}",
        5,
        0,
        "int32.gte_lte_exclusive",
        "must be gte 10 or lte 0",
    ),
    ("int32.const", "int32", "{int32: {const: 3}}", 4, 3, "int32.const", "must equal 3"),
    (
        "int32.in",
        "int32",
        "{int32: {in: [1, 2]}}",
        3,
        2,
        "int32.in",
        "must be one of the allowed values",
    ),
    (
        "int32.not_in",
        "int32",
        "{int32: {not_in: [1, 2]}}",
        2,
        3,
        "int32.not_in",
        "must not be one of the forbidden values",
    ),
    (
        "int64.gt_lte",
        "int64",
        "{int64: {gt: 0, lte: 1000}}",
        1001,
        1000,
        "int64.gt_lte",
        "must be gt 0 and lte 1000",
    ),
    ("uint32.gte", "uint32", "{uint32: {gte: 2}}", 1, 2, "uint32.gte", "must be >= 2"),
    ("uint64.lt", "uint64", "{uint64: {lt: 2}}", 2, 1, "uint64.lt", "must be < 2"),
    ("double.gt", "double", "{double: {gt: 0.5}}", 0.5, 0.6, "double.gt", "must be > 0.5"),
    (
        "double.gte_lt",
        "double",
        "{double: {gte: 0, lt: 1}}",
        1.0,
        0.0,
        "double.gte_lt",
        "must be within gte/lt range",
    ),
    (
        "double.gt_lt_exclusive",
        "double",
        "{double: {gt: 1, lt: 0}}",
        0.5,
        2.0,
        "double.gt_lt_exclusive",
        "must be within gt/lt range",
    ),
    (
        "double.const",
        "double",
        "{double: {const: 1.5}}",
        1.0,
        1.5,
        "double.const",
        "must equal 1.5",
    ),
    (
        "double.finite",
        "double",
        "{double: {finite: true}}",
        math.inf,
        1.0,
        "double.finite",
        "must be finite",
    ),
    (
        "double.in",
        "double",
        "{double: {in: [1.5]}}",
        1.0,
        1.5,
        "double.in",
        "must be one of the allowed values",
    ),
    ("float.lte", "float", "{float: {lte: 1}}", 2.0, 1.0, "float.lte", "must be <= 1.0"),
    # bool, bytes, enum
    ("bool.const", "bool", "{bool: {const: true}}", False, True, "bool.const", "must equal true"),
    (
        "bytes.len",
        "bytes",
        "{bytes: {len: 2}}",
        b"abc",
        b"ab",
        "bytes.len",
        "length must be exactly 2 bytes",
    ),
    (
        "bytes.min_len",
        "bytes",
        "{bytes: {min_len: 2}}",
        b"a",
        b"ab",
        "bytes.min_len",
        "length must be at least 2 bytes",
    ),
    (
        "bytes.max_len",
        "bytes",
        "{bytes: {max_len: 1}}",
        b"ab",
        b"a",
        "bytes.max_len",
        "length must be at most 1 bytes",
    ),
    (
        "bytes.prefix",
        "bytes",
        '{bytes: {prefix: "p"}}',
        b"x",
        b"px",
        "bytes.prefix",
        "must start with the required bytes",
    ),
    (
        "bytes.suffix",
        "bytes",
        '{bytes: {suffix: "s"}}',
        b"x",
        b"xs",
        "bytes.suffix",
        "must end with the required bytes",
    ),
    (
        "bytes.contains",
        "bytes",
        '{bytes: {contains: "c"}}',
        b"x",
        b"xcx",
        "bytes.contains",
        "must contain the required bytes",
    ),
    ("enum.const", "Color", "{enum: {const: 1}}", 2, 1, "enum.const", "must equal 1"),
    (
        "enum.defined_only",
        "Color",
        "{enum: {defined_only: true}}",
        7,
        2,
        "enum.defined_only",
        "must be a defined enum value, got 7",
    ),
    ("enum.in", "Color", "{enum: {in: [1]}}", 2, 1, "enum.in", "must be one of the allowed values"),
    (
        "enum.not_in",
        "Color",
        "{enum: {not_in: [1]}}",
        1,
        2,
        "enum.not_in",
        "must not be one of the forbidden values",
    ),
    # collections
    (
        "repeated.min_items",
        "repeated string",
        "{repeated: {min_items: 1}}",
        [],
        ["a"],
        "repeated.min_items",
        "must have at least 1 items",
    ),
    (
        "repeated.max_items",
        "repeated string",
        "{repeated: {max_items: 1}}",
        ["a", "b"],
        ["a"],
        "repeated.max_items",
        "must have at most 1 items",
    ),
    (
        "repeated.unique",
        "repeated string",
        "{repeated: {unique: true}}",
        ["a", "a"],
        ["a", "b"],
        "repeated.unique",
        "repeated values must be unique",
    ),
    (
        "map.min_pairs",
        "map<string, string>",
        "{map: {min_pairs: 1}}",
        {},
        {"k": "v"},
        "map.min_pairs",
        "must have at least 1 entries",
    ),
    (
        "map.max_pairs",
        "map<string, string>",
        "{map: {max_pairs: 1}}",
        {"a": "1", "b": "2"},
        {"a": "1"},
        "map.max_pairs",
        "must have at most 1 entries",
    ),
    # timestamps and durations
    (
        "timestamp.gt",
        "google.protobuf.Timestamp",
        "{timestamp: {gt: {seconds: 1000}}}",
        timestamp_pb2.Timestamp(seconds=1000),
        timestamp_pb2.Timestamp(seconds=1001),
        "timestamp.gt",
        "must be > 1970-01-01T00:16:40Z",
    ),
    (
        "timestamp.gte_lte",
        "google.protobuf.Timestamp",
        "{timestamp: {gte: {seconds: 0}, lte: {seconds: 60, nanos: 500000000}}}",
        timestamp_pb2.Timestamp(seconds=61),
        timestamp_pb2.Timestamp(seconds=60),
        "timestamp.gte_lte",
        "must be gte 1970-01-01T00:00:00Z and lte 1970-01-01T00:01:00.500Z",
    ),
    (
        "timestamp.lt_now",
        "google.protobuf.Timestamp",
        "{timestamp: {lt_now: true}}",
        ts(3600),
        ts(-3600),
        "timestamp.lt_now",
        "must be in the past",
    ),
    (
        "timestamp.gt_now",
        "google.protobuf.Timestamp",
        "{timestamp: {gt_now: true}}",
        ts(-3600),
        ts(3600),
        "timestamp.gt_now",
        "must be in the future",
    ),
    (
        "timestamp.within",
        "google.protobuf.Timestamp",
        "{timestamp: {within: {seconds: 5400}}}",
        ts(-7200),
        ts(-60),
        "timestamp.within",
        "must be within PT1H30M of now",
    ),
    (
        "duration.gt",
        "google.protobuf.Duration",
        "{duration: {gt: {seconds: 1}}}",
        dur(1),
        dur(2),
        "duration.gt",
        "must be > PT1S",
    ),
    (
        "duration.gte_lt",
        "google.protobuf.Duration",
        "{duration: {gte: {nanos: 500000000}, lt: {seconds: 3600}}}",
        dur(3600),
        dur(1),
        "duration.gte_lt",
        "must be gte PT0.5S and lt PT1H",
    ),
    # CEL: with an id, without one (the expression is the id), upstream's functions
    (
        "cel.id",
        "string",
        '{cel: {id: "short", message: "too long", expression: "size(this) < 3"}}',
        "abcd",
        "ab",
        "short",
        "too long",
    ),
    (
        "cel.no-id",
        "string",
        '{cel: {expression: "size(this) < 3"}}',
        "abcd",
        "ab",
        "size(this) < 3",
        '"size(this) < 3" returned false',
    ),
    (
        "cel.string-result",
        "string",
        "{cel: {id: \"s\", expression: \"this == 'ok' ? '' : 'not ok: ' + this\"}}",
        "no",
        "ok",
        "s",
        "not ok: no",
    ),
    (
        "cel.isEmail",
        "string",
        '{cel: {id: "e", expression: "this.isEmail()"}}',
        "nope",
        "a@b.example",
        "e",
        '"this.isEmail()" returned false',
    ),
    (
        "cel.isHostname",
        "string",
        '{cel: {id: "h", expression: "this.isHostname()"}}',
        "a..b",
        "a.b",
        "h",
        '"this.isHostname()" returned false',
    ),
    (
        "cel.isIp",
        "string",
        '{cel: {id: "i", expression: "this.isIp(4)"}}',
        "::1",
        "1.2.3.4",
        "i",
        '"this.isIp(4)" returned false',
    ),
    (
        "cel.isIpPrefix",
        "string",
        '{cel: {id: "p", expression: "this.isIpPrefix(4, true)"}}',
        "10.0.0.1/24",
        "10.0.0.0/24",
        "p",
        '"this.isIpPrefix(4, true)" returned false',
    ),
    (
        "cel.isUri",
        "string",
        '{cel: {id: "u", expression: "this.isUri()"}}',
        "/x",
        "https://a.example",
        "u",
        '"this.isUri()" returned false',
    ),
    (
        "cel.isUriRef",
        "string",
        '{cel: {id: "r", expression: "this.isUriRef()"}}',
        "a b",
        "/x?y=1",
        "r",
        '"this.isUriRef()" returned false',
    ),
    (
        "cel.isHostAndPort",
        "string",
        '{cel: {id: "hp", expression: "this.isHostAndPort(true)"}}',
        "a.example",
        "a.example:443",
        "hp",
        '"this.isHostAndPort(true)" returned false',
    ),
    (
        "cel.isNan",
        "double",
        '{cel: {id: "n", expression: "!this.isNan()"}}',
        math.nan,
        1.0,
        "n",
        '"!this.isNan()" returned false',
    ),
    (
        "cel.isInf",
        "double",
        '{cel: {id: "f", expression: "!this.isInf(1)"}}',
        math.inf,
        -math.inf,
        "f",
        '"!this.isInf(1)" returned false',
    ),
    (
        "cel.format",
        "int32",
        "{cel: {id: \"fmt\", expression: \"this < 3 ? '' : '%d is over %s'.format([this, 'two'])\"}}",
        5,
        1,
        "fmt",
        "5 is over two",
    ),
    (
        "cel.strings",
        "string",
        '{cel: {id: "lower", expression: "this.lowerAscii() == this && this.charAt(0) != \'_\'"}}',
        "Ab",
        "ab",
        "lower",
        "\"this.lowerAscii() == this && this.charAt(0) != '_'\" returned false",
    ),
    (
        "cel.now",
        "google.protobuf.Timestamp",
        '{cel: {id: "past", expression: "this < now"}}',
        ts(3600),
        ts(-3600),
        "past",
        '"this < now" returned false',
    ),
]

CASES += [
    (
        "string.path_safe_name",
        "string",
        "{string: {path_safe_name: true}}",
        "../escape",
        "a.b-c_d",
        "string.path_safe_name",
        "value must be a path-safe name (a letter or digit, then letters, digits, ., _ or -)",
    ),
    (
        "string.gtin",
        "string",
        "{string: {gtin: true}}",
        "4006381333932",
        "4006381333931",
        "string.gtin",
        "value must be a GTIN (8, 12, 13, or 14 digits with a valid check digit)",
    ),
    (
        "string.decimal",
        "string",
        "{string: {decimal: true}}",
        "-1.5",
        "10.25",
        "string.decimal",
        "value must be an unsigned decimal string",
    ),
    (
        "string.endpoint_address",
        "string",
        "{string: {endpoint_address: true}}",
        "localhost:99999",
        "localhost:9090",
        "string.endpoint_address",
        "value must be a host:port pair with a valid port or an absolute URI",
    ),
    (
        "string.identifier",
        "string",
        "{string: {identifier: true}}",
        "a.b",
        "a_b1",
        "string.identifier",
        "value must be a bare identifier (a letter or underscore, then letters, digits, or underscores)",
    ),
    ("double.lte", "double", "{double: {lte: 0.25}}", 0.5, 0.25, "double.lte", "must be <= 0.25"),
    (
        "double.not_in",
        "double",
        "{double: {not_in: [0.5]}}",
        0.5,
        1.0,
        "double.not_in",
        "must not be one of the forbidden values",
    ),
    (
        "duration.lte",
        "google.protobuf.Duration",
        "{duration: {lte: {seconds: 90}}}",
        dur(91),
        dur(90),
        "duration.lte",
        "must be <= PT1M30S",
    ),
    (
        "timestamp.lt",
        "google.protobuf.Timestamp",
        "{timestamp: {lt: {seconds: 60}}}",
        timestamp_pb2.Timestamp(seconds=60),
        timestamp_pb2.Timestamp(seconds=59),
        "timestamp.lt",
        "must be < 1970-01-01T00:01:00Z",
    ),
]


def _proto() -> str:
    lines = [
        'syntax = "proto3";',
        "package dialect.v1;",
        'import "ai/pipestream/proto/validate/v1/validate.proto";',
        'import "google/protobuf/timestamp.proto";',
        'import "google/protobuf/duration.proto";',
        "enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }",
    ]
    for i, (_, ftype, rules, *_rest) in enumerate(CASES):
        lines.append(f"message C{i} {{ {ftype} v = 1 [{F} = {rules}]; }}")
    lines.append(
        "message Msg {\n"
        f"  option {M} = {{cel: ["
        '{id: "a-le-b", message: "a must not exceed b", expression: "this.a <= this.b"}, '
        '{expression: "this.a != 7"}]};\n'
        "  int32 a = 1; int32 b = 2;\n}"
    )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return build_pool(tmp_path_factory.mktemp("dialect"), _proto(), "dialect/v1/dialect.proto")


def _message(pool, i: int, value):
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"dialect.v1.C{i}"))
    msg = cls()
    if isinstance(value, list):
        msg.v.extend(value)
    elif isinstance(value, dict):
        msg.v.update(value)
    elif hasattr(value, "SerializeToString"):
        msg.v.MergeFromString(value.SerializeToString())  # another pool's Timestamp class
    else:
        msg.v = value
    return msg


@pytest.mark.parametrize("i, case", list(enumerate(CASES)), ids=[c[0] for c in CASES])
def test_rule_kind_gives_upstreams_id_and_message(pool, i, case):
    _, _, _, bad, good, rule_id, message = case
    got = [(v.path, v.rule_id, v.message) for v in validate_message(_message(pool, i, bad))]
    assert got == [("v", rule_id, message)]
    assert validate_message(_message(pool, i, good)) == []


@pytest.mark.parametrize("i, case", list(enumerate(CASES)), ids=[c[0] for c in CASES])
def test_a_fields_compiled_rules_answer_as_the_interpreted_ones(pool, i, case):
    # The plan compiles a singular field's rules once per type (_value_check); the element
    # rules of repeated fields and maps still read them per call (_check_value): both must
    # give the same violations for the same value, set or not.
    from protomolt_jobs.workflow import validation

    _, _, _, bad, good, _, _ = case
    msg = _message(pool, i, good)
    (fp,) = validation._plan(msg.DESCRIPTOR).fields
    if fp.check is None:
        assert fp.fd.is_repeated or fp.is_map
        return
    zero = type(msg)()
    for m in (_message(pool, i, bad), msg, zero):
        value = m.v
        for present in {True, m.HasField("v") if fp.has_presence else True}:
            compiled: list = []
            interpreted: list = []
            fp.check(value, present, "v", compiled)
            validation._check_value(fp.fd, fp.rules, value, present, "v", interpreted)
            assert compiled == interpreted


def test_message_rules_with_and_without_an_id(pool):
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("dialect.v1.Msg"))
    got = [(v.path, v.rule_id, v.message) for v in validate_message(cls(a=7, b=1))]
    assert got == [
        ("", "a-le-b", "a must not exceed b"),
        ("", "this.a != 7", '"this.a != 7" returned false'),
    ]
    assert validate_message(cls(a=1, b=2)) == []


def test_no_message_carries_the_cel_environment(pool, tmp_path):
    # An expression that fails at evaluation: the violation names the expression and the
    # error, never the activation (the value of `this`, `now`).
    source = (
        'syntax = "proto3";\npackage boom.v1;\n'
        'import "ai/pipestream/proto/validate/v1/validate.proto";\n'
        f'message B {{ string secret = 1 [{F} = {{cel: {{id: "b", expression: "this.nope == 1"}}}}]; }}\n'
    )
    p = build_pool(tmp_path, source, "boom/v1/boom.proto")
    cls = message_factory.GetMessageClass(p.FindMessageTypeByName("boom.v1.B"))
    (v,) = validate_message(cls(secret="hunter2-secret"))
    assert v.rule_id == "b" and v.message.startswith('"this.nope == 1" could not be evaluated: ')
    assert "hunter2-secret" not in v.message and "activation" not in v.message
    assert len(v.message) < 400


def test_every_rule_kind_of_the_dialect_is_in_the_table():
    from protomolt_jobs.pb.ai.pipestream.proto.validate.v1 import validate_pb2

    covered = {c[0] for c in CASES}
    missing = []
    for set_name in (
        "string",
        "int32",
        "double",
        "bool",
        "bytes",
        "enum",
        "repeated",
        "map",
        "timestamp",
        "duration",
    ):
        rules = getattr(validate_pb2.FieldRules(), set_name).DESCRIPTOR
        for f in rules.fields:
            if f.name in ("items", "keys", "values"):
                continue  # element rules: the same checks, at element paths
            name = f"{set_name}.{f.name}"
            parts = {
                (c.split(".")[0], p)
                for c in covered
                if "." in c
                for p in c.split(".", 1)[1].split("_")
            } | {(c.split(".")[0], c.split(".", 1)[1]) for c in covered if "." in c}
            if (set_name, f.name) not in parts:
                missing.append(name)
    assert missing == []


def test_a_blank_expression_is_skipped_and_a_bad_one_refused(tmp_path):
    source = (
        'syntax = "proto3";\npackage blank.v1;\n'
        'import "ai/pipestream/proto/validate/v1/validate.proto";\n'
        f'message A {{ string s = 1 [{F} = {{cel: {{id: "x", expression: " "}}}}]; }}\n'
        f'message B {{ string s = 1 [{F} = {{cel: {{expression: "this ++"}}}}]; }}\n'
    )
    p = build_pool(tmp_path, source, "blank/v1/blank.proto")
    a = message_factory.GetMessageClass(p.FindMessageTypeByName("blank.v1.A"))
    assert validate_message(a(s="anything")) == []
    with pytest.raises(RuleError, match="this \\+\\+"):
        compile_rules(p.FindMessageTypeByName("blank.v1.B"))


def test_format_directives_as_upstream_renders_them():
    from celpy import celtypes

    from protomolt_jobs.workflow.validation_cel import cel_format

    args = celtypes.ListType(
        [
            celtypes.DoubleType(5.0),
            celtypes.DoubleType(2.5),
            celtypes.IntType(3),
            celtypes.DoubleType(1.234),
            celtypes.StringType("hi"),
            celtypes.IntType(5),
            celtypes.BoolType(True),
        ]
    )
    text = celtypes.StringType("%s|%s|%d|%.2f|%x|%b|%q|%s|%s|%%")
    # A whole double prints without a fraction; an unknown verb is copied and takes no
    # argument; a missing argument is null.
    assert cel_format(text, args) == "5|2.5|3|1.23|6869|101|%q|true|null|%"


TAXONOMY_SOURCE = (
    'syntax = "proto3";\npackage ai.pipestream.proto.types.v1;\n'
    'import "ai/pipestream/proto/validate/v1/validate.proto";\n'
    "message TreePath { repeated string segments = 1; }\n"
    "message Doc {\n"
    f'  TreePath category = 1 [{F} = {{taxonomy: "products"}}];\n'
    f'  repeated TreePath tags = 2 [{F} = {{taxonomy: "products"}}];\n'
    "}\n"
)


def test_a_taxonomy_on_a_tree_path_fails_closed_as_upstreams_unmounted(tmp_path):
    """Upstream's ProtoValidator with nothing mounted (the default): a non-empty path is
    ``taxonomy.unmounted``; an empty path is left to the type's own rules."""
    p = build_pool(tmp_path, TAXONOMY_SOURCE, "ai/pipestream/proto/types/v1/taxonomy.proto")
    doc = message_factory.GetMessageClass(
        p.FindMessageTypeByName("ai.pipestream.proto.types.v1.Doc")
    )
    assert validate_message(doc()) == []
    msg = doc()
    msg.category.segments.extend(["media", "books"])
    msg.tags.add()  # an empty path: nothing to check
    msg.tags.add().segments.append("media")
    got = [(v.path, v.rule_id, v.message) for v in validate_message(msg)]
    unmounted = 'taxonomy "products" is not mounted; declared membership cannot be checked'
    assert got == [
        ("category", "taxonomy.unmounted", unmounted),
        ("tags[1]", "taxonomy.unmounted", unmounted),
    ]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (
            f'string code = 1 [{F} = {{taxonomy: "products"}}];',
            (
                'taxonomy "products" declared on field bad.v1.Bad.code: only fields of '
                "ai.pipestream.proto.types.v1.TreePath take a taxonomy rule"
            ),
        ),
        (
            f'map<string, string> codes = 1 [{F} = {{taxonomy: "products"}}];',
            "only fields of ai.pipestream.proto.types.v1.TreePath take a taxonomy rule",
        ),
        (
            f'repeated string codes = 1 [{F} = {{repeated: {{items: {{taxonomy: "p"}}}}}}];',
            (
                "taxonomy on field bad.v1.Bad.codes must be declared on the TreePath field itself, "
                "not on repeated items or map entries"
            ),
        ),
    ],
)
def test_a_taxonomy_anywhere_but_a_tree_path_field_refuses_the_schema(tmp_path, field, message):
    """Upstream refuses such a schema (a rule that would silently check nothing)."""
    source = (
        'syntax = "proto3";\npackage bad.v1;\n'
        'import "ai/pipestream/proto/validate/v1/validate.proto";\n'
        f"message Bad {{ {field} }}\n"
    )
    p = build_pool(tmp_path, source, "bad/v1/bad.proto")
    with pytest.raises(RuleError) as info:
        compile_rules(p.FindMessageTypeByName("bad.v1.Bad"))
    assert message in str(info.value)
