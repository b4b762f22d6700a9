"""``proto_json.message_to_dict``: exactly ``MessageToDict(..., always_print_fields_with_no_presence
=True)`` (values and key order), for flat types by its plan and for any other by MessageToDict."""

from __future__ import annotations

import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    struct_pb2,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import proto_json
from protomolt_jobs.workflow.proto_json import message_to_dict

_F = descriptor_pb2.FieldDescriptorProto


def _pool() -> descriptor_pool.DescriptorPool:
    f = descriptor_pb2.FileDescriptorProto(name="pj.proto", package="pj", syntax="proto3")
    e = f.enum_type.add(name="Kind")
    for i, n in enumerate(["KIND_UNSPECIFIED", "KIND_A", "KIND_B"]):
        e.value.add(name=n, number=i)
    flat = f.message_type.add(name="Flat")
    fields = [
        ("title", _F.TYPE_STRING, _F.LABEL_OPTIONAL),
        ("big_count", _F.TYPE_INT64, _F.LABEL_OPTIONAL),
        ("u64", _F.TYPE_UINT64, _F.LABEL_OPTIONAL),
        ("n", _F.TYPE_INT32, _F.LABEL_OPTIONAL),
        ("u32", _F.TYPE_UINT32, _F.LABEL_OPTIONAL),
        ("s32", _F.TYPE_SINT32, _F.LABEL_OPTIONAL),
        ("flag", _F.TYPE_BOOL, _F.LABEL_OPTIONAL),
        ("kind", _F.TYPE_ENUM, _F.LABEL_OPTIONAL),
        ("tags", _F.TYPE_STRING, _F.LABEL_REPEATED),
        ("ids", _F.TYPE_INT64, _F.LABEL_REPEATED),
        ("kinds", _F.TYPE_ENUM, _F.LABEL_REPEATED),
    ]
    for i, (name, kind, label) in enumerate(fields, start=1):
        fd = flat.field.add(name=name, number=20 - i, type=kind, label=label)  # numbers reversed
        if kind == _F.TYPE_ENUM:
            fd.type_name = ".pj.Kind"
    # a real oneof, then proto3 optional (a synthetic oneof: declared last)
    flat.oneof_decl.add(name="choice")
    flat.field.add(name="left", number=31, type=_F.TYPE_STRING, oneof_index=0)
    flat.field.add(name="right", number=32, type=_F.TYPE_INT64, oneof_index=0)
    flat.oneof_decl.add(name="_maybe")
    flat.field.add(
        name="maybe",
        number=30,
        type=_F.TYPE_STRING,
        label=_F.LABEL_OPTIONAL,
        oneof_index=1,
        proto3_optional=True,
    )
    words = f.message_type.add(name="Words")
    words.field.add(name="text_value", number=2, type=_F.TYPE_STRING)
    words.field.add(name="count", number=1, type=_F.TYPE_INT64)
    words.field.add(name="parts", number=3, type=_F.TYPE_STRING, label=_F.LABEL_REPEATED)
    nested = f.message_type.add(name="Nested")
    nested.field.add(name="inner", number=1, type=_F.TYPE_MESSAGE, type_name=".pj.Flat")
    nested.field.add(name="ratio", number=2, type=_F.TYPE_DOUBLE)
    nested.field.add(name="blob", number=3, type=_F.TYPE_BYTES)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return pool


POOL = _pool()
Flat = message_factory.GetMessageClass(POOL.FindMessageTypeByName("pj.Flat"))
Words = message_factory.GetMessageClass(POOL.FindMessageTypeByName("pj.Words"))
Nested = message_factory.GetMessageClass(POOL.FindMessageTypeByName("pj.Nested"))
OPTIONS = [(p, e) for p in (False, True) for e in (False, True)]


def _same(msg, preserving: bool, enums: bool) -> None:
    want = json_format.MessageToDict(
        msg,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=preserving,
        use_integers_for_enums=enums,
    )
    got = message_to_dict(msg, preserving_proto_field_name=preserving, use_integers_for_enums=enums)
    assert got == want
    assert list(got) == list(want)  # the key order too
    assert json_format.MessageToJson(msg) is not None


@pytest.mark.parametrize(("preserving", "enums"), OPTIONS)
def test_empty_and_full_flat_messages(preserving, enums):
    _same(Flat(), preserving, enums)
    full = Flat(
        title="t",
        big_count=-(2**40),
        u64=2**63,
        n=-3,
        u32=7,
        s32=-9,
        flag=True,
        kind=2,
        tags=["a", ""],
        ids=[1, -2],
        kinds=[1, 0, 2],
        maybe="",
        right=5,
    )
    _same(full, preserving, enums)
    _same(Flat(left="x", kind=7), preserving, enums)  # an open enum's unknown number


@settings(max_examples=60, deadline=None)
@given(
    title=st.text(max_size=5),
    big=st.integers(-(2**63), 2**63 - 1),
    n=st.integers(-(2**31), 2**31 - 1),
    flag=st.booleans(),
    kind=st.integers(0, 3),
    tags=st.lists(st.text(max_size=3), max_size=3),
    maybe=st.none() | st.text(max_size=3),
    opts=st.sampled_from(OPTIONS),
)
def test_any_flat_message(title, big, n, flag, kind, tags, maybe, opts):
    msg = Flat(title=title, big_count=big, n=n, flag=flag, kind=kind, tags=tags)
    if maybe is not None:
        msg.maybe = maybe
    _same(msg, *opts)


@pytest.mark.parametrize(("preserving", "enums"), OPTIONS)
def test_other_types_are_rendered_by_message_to_dict(preserving, enums):
    _same(Nested(inner=Flat(title="x", ids=[3]), ratio=0.5, blob=b"\x00\x01"), preserving, enums)
    _same(Nested(), preserving, enums)
    s = struct_pb2.Struct()
    s.update({"a": 1, "b": [True, None]})
    _same(s, preserving, enums)
    _same(struct_pb2.Value(string_value="v"), preserving, enums)


@pytest.mark.parametrize(("preserving", "enums"), OPTIONS)
def test_flat_types_take_the_plan_not_message_to_dict(monkeypatch, preserving, enums):
    monkeypatch.setattr(proto_json, "_slow", lambda *a: pytest.fail("took MessageToDict"))
    for msg in (Words(), Words(text_value="a", count=2**62, parts=["x", "y"])):
        got = message_to_dict(msg, preserving_proto_field_name=preserving)
        monkeypatch.undo()
        _same(msg, preserving, False)
        monkeypatch.setattr(proto_json, "_slow", lambda *a: pytest.fail("took MessageToDict"))
        assert got["count"] == str(msg.count)
    if enums:
        message_to_dict(Flat(kind=1, title="t"), use_integers_for_enums=True)
