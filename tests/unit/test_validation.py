"""The rule validator on message types built at run time from a descriptor set.

A small .proto carrying house-dialect rules is compiled with grpc_tools.protoc into a
FileDescriptorSet and loaded into a fresh DescriptorPool, as the workflow engine does with a
workflow's schema: the rules must fire although no generated Python class exists for it.
"""

from __future__ import annotations

import importlib.resources
import uuid
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from protomolt_jobs.workflow.validation import (
    RuleError,
    Violation,
    compile_rules,
    summarize,
    validate_message,
)

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"

DEMO = """
syntax = "proto3";
package demo.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
import "google/protobuf/timestamp.proto";

enum Kind { KIND_UNSPECIFIED = 0; KIND_A = 1; KIND_B = 2; }

message Line {
  string sku = 1 [(ai.pipestream.proto.validate.v1.field) = {required: true, string: {pattern: "^[A-Z]{3}-[0-9]+$"}}];
  int64 qty = 2 [(ai.pipestream.proto.validate.v1.field) = {int64: {gt: 0, lte: 1000}}];
}

message Order {
  option (ai.pipestream.proto.validate.v1.message) = {
    cel: {id: "b-needs-note", message: "kind B needs a note", expression: "this.kind != 2 || this.note != ''"}
    cel: {id: "string-result", expression: "this.note == 'bad' ? 'note must not be bad' : ''"}
  };
  string id = 1 [(ai.pipestream.proto.validate.v1.field) = {required: true, string: {uuid: true}}];
  string title = 2 [(ai.pipestream.proto.validate.v1.field) = {string: {min_len: 3, max_len: 10}}];
  Kind kind = 3 [(ai.pipestream.proto.validate.v1.field) = {enum: {defined_only: true}}];
  repeated Line lines = 4 [(ai.pipestream.proto.validate.v1.field) = {repeated: {min_items: 1, max_items: 3}}];
  double price = 5 [(ai.pipestream.proto.validate.v1.field) = {double: {gte: 0.5, finite: true}}];
  string email = 6 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {email: true}}];
  repeated string tags = 7 [(ai.pipestream.proto.validate.v1.field) = {repeated: {unique: true, items: {string: {max_len: 4}}}}];
  map<string, int32> counts = 8 [(ai.pipestream.proto.validate.v1.field) = {map: {max_pairs: 2, keys: {string: {min_len: 2}}, values: {int32: {gte: 0}}}}];
  Line primary = 9;
  string note = 10;
  int32 score = 11 [(ai.pipestream.proto.validate.v1.field) = {cel: {id: "score.even", message: "score must be even", expression: "this % 2 == 0"}}];
  optional uint32 retries = 12 [(ai.pipestream.proto.validate.v1.field) = {uint32: {lt: 5}}];
  google.protobuf.Timestamp due = 13 [(ai.pipestream.proto.validate.v1.field) = {timestamp: {lt_now: true}}];
  Line raw = 14 [(ai.pipestream.proto.validate.v1.field) = {inspect_only: true}];
  map<string, Line> by_sku = 15;
}

message Draft {
  option (ai.pipestream.proto.validate.v1.message) = {
    skip_when: "incomplete"
    cel: {id: "reason", message: "an incomplete draft needs a reason", expression: "!this.incomplete || this.reason != ''"}
  };
  bool incomplete = 1;
  string reason = 2;
  string name = 3 [(ai.pipestream.proto.validate.v1.field) = {required: true}];
}

message Formats {
  string host = 1 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {hostname: true}}];
  string ip = 2 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {ip: true}}];
  string day = 3 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {date: true}}];
  string at = 4 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {date_time: true}}];
  string slug = 5 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {slug: true}}];
  string gtin = 6 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {gtin: true}}];
  string endpoint = 7 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {endpoint_address: true}}];
  string b64 = 8 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {base64: true}}];
  string uri = 9 [(ai.pipestream.proto.validate.v1.field) = {ignore_if_zero: true, string: {uri: true}}];
}
"""

BROKEN_CEL = """
syntax = "proto3";
package broken.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message Bad {
  string a = 1 [(ai.pipestream.proto.validate.v1.field) = {cel: {id: "oops", expression: "this.("}}];
}
"""

BROKEN_SKIP = """
syntax = "proto3";
package brokenskip.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message Bad {
  option (ai.pipestream.proto.validate.v1.message) = {skip_when: "name"};
  string name = 1;
}
"""


def build_pool(tmp_path: Path, source: str, name: str) -> descriptor_pool.DescriptorPool:
    """Compile ``source`` with grpc_tools.protoc into a descriptor set; load a fresh pool."""
    from grpc_tools import protoc

    src = tmp_path / "src"
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(source)
    out = tmp_path / f"{name.replace('/', '_')}.pb"
    wkt = str(importlib.resources.files("grpc_tools") / "_proto")
    code = protoc.main(
        [
            "protoc",
            f"-I{src}",
            f"-I{PROTO_ROOT}",
            f"-I{wkt}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            name,
        ]
    )
    assert code == 0, "protoc rejected the test schema"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    pool = build_pool(tmp_path_factory.mktemp("demo"), DEMO, "demo/v1/demo.proto")

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"demo.v1.{name}"))

    return cls


def valid_order(demo):
    order = demo("Order")(id=str(uuid.uuid4()), title="Desk", kind=1, price=1.0)
    order.lines.add(sku="ABC-1", qty=1)
    return order


def found(msg) -> set[tuple[str, str]]:
    return {(v.path, v.rule_id) for v in validate_message(msg)}


def test_runtime_pool_message_classes_are_not_the_generated_ones(demo):
    # The point of the suite: the pool is separate from the default one.
    assert demo("Order").DESCRIPTOR.file.pool is not descriptor_pool.Default()


def test_valid_runtime_message_passes(demo):
    assert validate_message(valid_order(demo)) == []


def test_required_and_uuid(demo):
    order = valid_order(demo)
    order.id = ""
    assert found(order) == {("id", "required")}
    order.id = "x"
    assert validate_message(order) == [Violation("id", "string.uuid", "value must be a valid UUID")]


def test_string_lengths(demo):
    order = valid_order(demo)
    order.title = "ab"
    assert validate_message(order) == [
        Violation("title", "string.min_len", "length must be at least 3")
    ]
    order.title = "x" * 11
    assert found(order) == {("title", "string.max_len")}


def test_implicit_scalar_is_checked_at_its_zero_value(demo):
    # title has min_len 3 and no ignore_if_zero: "" breaks it.
    order = valid_order(demo)
    order.title = ""
    assert found(order) == {("title", "string.min_len")}


def test_enum_defined_only(demo):
    order = valid_order(demo)
    order.kind = 9
    assert found(order) == {("kind", "enum.defined_only")}


def test_repeated_sizes_and_nested_paths(demo):
    order = valid_order(demo)
    order.ClearField("lines")
    assert validate_message(order) == [
        Violation("lines", "repeated.min_items", "must have at least 1 items")
    ]
    for _ in range(3):
        order.lines.add(sku="ABC-2", qty=5)
    order.lines.add(sku="bad", qty=0)
    assert found(order) == {
        ("lines", "repeated.max_items"),
        ("lines[3].sku", "string.pattern"),
        ("lines[3].qty", "int64.gt_lte"),
    }


def test_numeric_bounds_and_finite(demo):
    order = valid_order(demo)
    order.price = 0.25
    assert validate_message(order) == [Violation("price", "double.gte", "must be >= 0.5")]
    order.price = float("inf")
    assert found(order) == {("price", "double.finite")}
    order.price = 1.0
    order.lines[0].qty = 1001
    assert validate_message(order) == [
        Violation("lines[0].qty", "int64.gt_lte", "must be gt 0 and lte 1000")
    ]


def test_ignore_if_zero(demo):
    order = valid_order(demo)
    order.email = ""
    assert validate_message(order) == []
    order.email = "not-an-email"
    assert found(order) == {("email", "string.email")}
    order.email = "ada@example.org"
    assert validate_message(order) == []


def test_repeated_unique_and_items(demo):
    order = valid_order(demo)
    order.tags.extend(["a", "bb", "a", "toolong"])
    assert found(order) == {("tags", "repeated.unique"), ("tags[3]", "string.max_len")}


def test_map_pairs_keys_and_values(demo):
    order = valid_order(demo)
    order.counts["x"] = -1
    order.counts["ok"] = 1
    order.counts["zz"] = 2
    assert found(order) == {
        ("counts", "map.max_pairs"),
        ('counts["x"]#key', "string.min_len"),
        ('counts["x"]', "int32.gte"),
    }


def test_message_valued_map_entries_are_walked(demo):
    order = valid_order(demo)
    order.by_sku["k"].sku = "nope"
    order.by_sku["k"].qty = 1
    assert found(order) == {('by_sku["k"].sku', "string.pattern")}


def test_set_submessage_is_walked_and_unset_is_not(demo):
    order = valid_order(demo)
    assert not order.HasField("primary")
    assert validate_message(order) == []
    order.primary.qty = 3
    assert found(order) == {("primary.sku", "required")}


def test_inspect_only_field_is_not_walked(demo):
    order = valid_order(demo)
    order.raw.sku = "bad"
    assert validate_message(order) == []


def test_field_cel_rule(demo):
    order = valid_order(demo)
    order.score = 3
    assert validate_message(order) == [Violation("score", "score.even", "score must be even")]


def test_explicit_presence_scalar_checked_only_when_set(demo):
    order = valid_order(demo)
    assert validate_message(order) == []
    order.retries = 0
    assert validate_message(order) == []
    order.retries = 7
    assert found(order) == {("retries", "uint32.lt")}


def test_timestamp_lt_now(demo):
    order = valid_order(demo)
    order.due.seconds = 1
    assert validate_message(order) == []
    order.due.seconds = 4_102_444_800  # 2100-01-01
    assert found(order) == {("due", "timestamp.lt_now")}


def test_message_cel_rules_bool_and_string_results(demo):
    order = valid_order(demo)
    order.kind = 2
    assert validate_message(order) == [Violation("", "b-needs-note", "kind B needs a note")]
    order.note = "bad"
    assert validate_message(order) == [Violation("", "string-result", "note must not be bad")]
    assert summarize(validate_message(order)) == ": note must not be bad"


def test_nested_message_cel_path_is_the_field_path(tmp_path):
    source = """
syntax = "proto3";
package nest.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message Inner {
  option (ai.pipestream.proto.validate.v1.message) = {cel: {id: "pos", expression: "this.n > 0"}};
  int32 n = 1;
}
message Outer { Inner inner = 1; }
"""
    pool = build_pool(tmp_path, source, "nest/v1/nest.proto")
    outer = message_factory.GetMessageClass(pool.FindMessageTypeByName("nest.v1.Outer"))()
    outer.inner.n = 0
    assert validate_message(outer) == [Violation("inner", "pos", '"this.n > 0" returned false')]


def test_skip_when_skips_field_rules_but_not_message_rules(demo):
    draft = demo("Draft")()
    assert found(draft) == {("name", "required")}
    draft.incomplete = True
    assert found(draft) == {("", "reason")}
    draft.reason = "waiting on the customer"
    assert validate_message(draft) == []


def test_cel_evaluation_error_is_a_violation_not_an_exception(tmp_path):
    source = """
syntax = "proto3";
package everr.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message M {
  option (ai.pipestream.proto.validate.v1.message) = {cel: {id: "missing", expression: "this.nope == 1"}};
  string a = 1;
}
"""
    pool = build_pool(tmp_path, source, "everr/v1/m.proto")
    msg = message_factory.GetMessageClass(pool.FindMessageTypeByName("everr.v1.M"))()
    [v] = validate_message(msg)
    assert (v.path, v.rule_id) == ("", "missing")
    assert "could not be evaluated" in v.message


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("host", "api.example.com", "-bad-.com"),
        ("ip", "::1", "300.1.1.1"),
        ("day", "2026-07-01", "2026-02-30"),
        ("at", "2026-07-01T10:00:00Z", "2026-07-01 10:00"),
        ("slug", "parse-document", "Parse_Document!"),
        ("gtin", "4006381333931", "4006381333932"),
        ("endpoint", "localhost:8080", "localhost:99999"),
        ("b64", "aGVsbG8=", "aGVsbG8"),
        ("uri", "https://example.com/x", "no scheme here"),
    ],
)
def test_string_formats(demo, field, good, bad):
    fmt = demo("Formats")
    assert validate_message(fmt(**{field: good})) == []
    [v] = validate_message(fmt(**{field: bad}))
    assert v.path == field and v.rule_id.startswith("string.")


def test_two_pools_with_the_same_type_name_keep_their_own_rules(tmp_path):
    def schema(limit: int) -> str:
        return f"""
syntax = "proto3";
package twin.v1;
import "ai/pipestream/proto/validate/v1/validate.proto";
message T {{ string s = 1 [(ai.pipestream.proto.validate.v1.field) = {{string: {{max_len: {limit}}}}}]; }}
"""

    strict = build_pool(tmp_path / "a", schema(1), "twin/v1/t.proto")
    loose = build_pool(tmp_path / "b", schema(5), "twin/v1/t.proto")
    s = message_factory.GetMessageClass(strict.FindMessageTypeByName("twin.v1.T"))(s="abc")
    lo = message_factory.GetMessageClass(loose.FindMessageTypeByName("twin.v1.T"))(s="abc")
    assert found(s) == {("s", "string.max_len")}
    assert validate_message(lo) == []


def test_broken_cel_rule_raises_rule_error_naming_the_field(tmp_path):
    pool = build_pool(tmp_path, BROKEN_CEL, "broken/v1/bad.proto")
    desc = pool.FindMessageTypeByName("broken.v1.Bad")
    with pytest.raises(RuleError, match=r"broken\.v1\.Bad\.a.*oops"):
        compile_rules(desc)
    with pytest.raises(RuleError):
        validate_message(message_factory.GetMessageClass(desc)())


def test_skip_when_naming_a_non_bool_field_raises(tmp_path):
    pool = build_pool(tmp_path, BROKEN_SKIP, "brokenskip/v1/bad.proto")
    with pytest.raises(RuleError, match="skip_when"):
        compile_rules(pool.FindMessageTypeByName("brokenskip.v1.Bad"))


def test_message_without_rules_is_valid(demo):
    from google.protobuf import struct_pb2

    assert validate_message(struct_pb2.Struct()) == []
    compile_rules(demo("Order").DESCRIPTOR)  # reaches Line, Timestamp; all compile
