"""Deferred activation values (celenv.Deferred, cel.bind_message, celenv.json_plain): the plain
form given to cel-cpp is exactly what the CEL values would have become, conversions happen
only when an expression reads the name, and per-type plans are never shared between types."""

from __future__ import annotations

import datetime

import pytest
from celpy import celtypes
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import cel, celenv

FP = descriptor_pb2.FieldDescriptorProto


def _field(msg, name, number, kind, *, label=FP.LABEL_OPTIONAL, type_name=None, **kw):
    f = msg.field.add(name=name, number=number, type=kind, label=label, **kw)
    if type_name:
        f.type_name = type_name
    return f


def _pool(extra_field: bool = False) -> descriptor_pool.DescriptorPool:
    """``t.Rich`` with every kind of field message_to_cel converts (and ``t.WithTime``);
    ``extra_field``: ``t.Rich`` has one more field (same name, another type)."""
    pool = descriptor_pool.DescriptorPool()
    for mod in (struct_pb2, timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(mod.DESCRIPTOR.serialized_pb)
    f = descriptor_pb2.FileDescriptorProto(name="t/rich.proto", package="t", syntax="proto3")
    f.dependency.extend(
        [
            "google/protobuf/struct.proto",
            "google/protobuf/timestamp.proto",
            "google/protobuf/wrappers.proto",
        ]
    )
    f.enum_type.add(name="Color").value.add(name="COLOR_UNSET", number=0)
    f.enum_type[0].value.add(name="RED", number=1)
    inner = f.message_type.add(name="Inner")
    _field(inner, "s", 1, FP.TYPE_STRING)
    _field(inner, "n", 2, FP.TYPE_INT64)
    rich = f.message_type.add(name="Rich")
    _field(rich, "i32", 1, FP.TYPE_INT32)
    _field(rich, "i64", 2, FP.TYPE_INT64)
    # optional: absent unless set (an implicit-presence double would keep cel-cpp out always)
    _field(rich, "u32", 3, FP.TYPE_UINT32, proto3_optional=True, oneof_index=2)
    _field(rich, "d", 4, FP.TYPE_DOUBLE, proto3_optional=True, oneof_index=3)
    _field(rich, "b", 5, FP.TYPE_BOOL)
    _field(rich, "s", 6, FP.TYPE_STRING)
    _field(rich, "raw", 7, FP.TYPE_BYTES)
    _field(rich, "color", 8, FP.TYPE_ENUM, type_name=".t.Color")
    _field(rich, "inner", 9, FP.TYPE_MESSAGE, type_name=".t.Inner")
    _field(rich, "inners", 10, FP.TYPE_MESSAGE, type_name=".t.Inner", label=FP.LABEL_REPEATED)
    _field(rich, "tags", 11, FP.TYPE_STRING, label=FP.LABEL_REPEATED)
    rich.oneof_decl.add(name="pick")  # synthetic oneofs (``optional``) come last
    for name in ("_opt", "_u32", "_d"):
        rich.oneof_decl.add(name=name)
    _field(rich, "opt", 12, FP.TYPE_STRING, proto3_optional=True, oneof_index=1)
    _field(rich, "sv", 13, FP.TYPE_MESSAGE, type_name=".google.protobuf.StringValue")
    _field(rich, "iv", 14, FP.TYPE_MESSAGE, type_name=".google.protobuf.Int64Value")
    _field(rich, "dv", 15, FP.TYPE_MESSAGE, type_name=".google.protobuf.DoubleValue")
    _field(rich, "meta", 16, FP.TYPE_MESSAGE, type_name=".google.protobuf.Struct")
    for name, number, value_type, value_name in (
        ("counts", 17, FP.TYPE_INT64, None),
        ("byname", 18, FP.TYPE_MESSAGE, ".t.Inner"),
    ):
        entry = rich.nested_type.add(name=f"{name.title()}Entry")
        entry.options.map_entry = True
        _field(entry, "key", 1, FP.TYPE_STRING)
        _field(entry, "value", 2, value_type, type_name=value_name)
        _field(
            rich,
            name,
            number,
            FP.TYPE_MESSAGE,
            label=FP.LABEL_REPEATED,
            type_name=f".t.Rich.{entry.name}",
        )
    _field(rich, "pick_s", 19, FP.TYPE_STRING, oneof_index=0)
    _field(rich, "pick_inner", 20, FP.TYPE_MESSAGE, type_name=".t.Inner", oneof_index=0)
    if extra_field:
        _field(rich, "extra", 21, FP.TYPE_STRING)
    timed = f.message_type.add(name="WithTime")
    _field(timed, "s", 1, FP.TYPE_STRING)
    _field(timed, "at", 2, FP.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    pool.Add(f)
    return pool


POOL = _pool()
Rich = message_factory.GetMessageClass(POOL.FindMessageTypeByName("t.Rich"))
WithTime = message_factory.GetMessageClass(POOL.FindMessageTypeByName("t.WithTime"))

# A NUL now and then (cel-cpp would cut the string short): most messages stay plain.
_text = st.integers(0, 14).flatmap(
    lambda i: st.just("a\x00") if i == 0 else st.text(alphabet="abé", max_size=4)
)
_int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def rich_messages(draw):
    m = Rich()
    # Each field is left unset (its default) or set, so defaults and values both show up.
    if draw(st.booleans()):
        m.i32 = draw(st.integers(-(2**31), 2**31 - 1))
    if draw(st.booleans()):
        m.i64 = draw(_int64)
    if draw(st.integers(0, 4)) == 0:
        m.u32 = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 4)) == 0:
        m.d = draw(st.floats(allow_nan=False))
    m.b = draw(st.booleans())
    m.s = draw(_text)
    if draw(st.booleans()):
        m.raw = draw(st.binary(max_size=3))
    m.color = draw(st.sampled_from([0, 1, 7]))  # 7: an open enum's unknown number
    if draw(st.booleans()):
        m.inner.s = draw(_text)
        m.inner.n = draw(_int64)
    for _ in range(draw(st.integers(0, 2))):
        m.inners.add(s=draw(_text))
    m.tags.extend(draw(st.lists(_text, max_size=3)))
    if draw(st.booleans()):
        m.opt = draw(_text)
    if draw(st.booleans()):
        m.sv.value = draw(_text)
    if draw(st.booleans()):
        m.iv.value = draw(_int64)
    if draw(st.integers(0, 4)) == 0:
        m.dv.value = 1.5
    if draw(st.integers(0, 3)) == 0:
        m.meta.update({"k": draw(st.sampled_from(["v", 1, True, None]))})
    for k in draw(st.lists(st.sampled_from(["x", "y", "z\x00"]), max_size=2)):
        m.counts[k] = draw(_int64)
    if draw(st.booleans()):
        m.byname["k"].s = draw(_text)
    which = draw(st.sampled_from([None, "s", "inner"]))
    if which == "s":
        m.pick_s = draw(_text)
    elif which == "inner":
        m.pick_inner.n = 1
    return m


def _plain_of_cel(value):
    try:
        return celenv._plain(value)
    except celenv.Unrepresentable:
        return celenv.Unrepresentable


def _plain_direct(fn, value):
    try:
        return fn(value)
    except celenv.Unrepresentable:
        return celenv.Unrepresentable


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=rich_messages())
def test_message_to_plain_is_the_plain_form_of_message_to_cel(msg):
    expected = _plain_of_cel(cel.message_to_cel(msg))
    assert _plain_direct(cel.message_to_plain, msg) == expected


def test_message_to_plain_answers_for_plain_kinds_and_refuses_doubles_and_uints():
    m = Rich(i64=2**40, s="x", color=1, tags=["a"])
    m.counts["k"] = 3
    m.sv.value = "w"
    m.meta.update({"k": "v"})
    plain = cel.message_to_plain(m)
    assert plain["i64"] == 2**40 and plain["counts"] == {"k": 3} and plain["sv"] == "w"
    assert plain["meta"] == {"k": "v"} and "inner" not in plain and "opt" not in plain
    for bad in (Rich(d=0.5), Rich(u32=1), Rich(s="a\x00")):
        with pytest.raises(celenv.Unrepresentable):
            cel.message_to_plain(bad)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | _text
    | st.binary(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_json)
def test_json_plain_is_the_plain_form_of_to_cel(value):
    try:
        converted = celenv.to_cel(value)
    except ValueError:
        # to_cel refuses (an int beyond int64): json_plain must not answer for it either.
        assert _plain_direct(celenv.json_plain, value) is celenv.Unrepresentable
        return
    assert _plain_direct(celenv.json_plain, value) == _plain_of_cel(converted)


class _Counting:
    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, value):
        self.calls += 1
        return self.fn(value)


def test_a_deferred_value_converts_only_what_is_read_and_only_once():
    to_cel = _Counting(cel.message_to_cel)
    to_plain = _Counting(cel.message_to_plain)
    read = celenv.Deferred(Rich(i64=4), to_cel, to_plain)
    unread_cel = _Counting(cel.message_to_cel)
    unread_plain = _Counting(cel.message_to_plain)
    unread = celenv.Deferred(Rich(), unread_cel, unread_plain)
    for _ in range(3):
        assert cel.evaluate("a.i64 + 1", {"a": read, "b": unread}) == 5
    assert (to_plain.calls, to_cel.calls) == (1, 0)  # cel-cpp answered from the plain form
    assert (unread_plain.calls, unread_cel.calls) == (0, 0)
    # A double keeps cel-cpp out: cel-python answers from CEL values of every bound name.
    cel_side = _Counting(cel.message_to_cel)
    plain_side = _Counting(cel.message_to_plain)
    doubled = celenv.Deferred(Rich(d=1.5), cel_side, plain_side)
    for _ in range(2):
        assert cel.evaluate(
            "a.d * 2.0 == 3.0 && has(b.inner) == false", {"a": doubled, "b": unread}
        )
    assert (plain_side.calls, cel_side.calls) == (0, 1)  # the text has a double literal
    assert unread_cel.calls == 1


def test_a_deferred_value_gives_the_same_answers_and_errors_as_cel_values():
    msg = Rich(i64=3, s="a\x00b", tags=["x"])
    cases = ["a.i64 * 2", "size(a.s)", "a.tags[0] + a.s", "a.nope", "a.tags[4]", "a.d + 1.0"]
    for text in cases:
        outcomes = []
        for value in (cel.message_to_cel(msg), cel.bind_message(msg)):
            try:
                outcomes.append(("ok", cel.evaluate(text, {"a": value})))
            except cel.CelError as exc:
                outcomes.append(("error", str(exc)))
        assert outcomes[0] == outcomes[1], text


def test_types_that_reach_a_timestamp_are_converted_at_once():
    # Their conversion can fail (a time out of datetime's range): it must fail where it
    # always did (binding the scope: "gate failed", "mapping failed"), not inside a rule.
    ok = WithTime(s="x")
    ok.at.seconds = 60
    bound = cel.bind_message(ok)
    assert not isinstance(bound, celenv.Deferred)
    assert bound[celtypes.StringType("at")] == celtypes.TimestampType(
        datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC)
    )
    bad = WithTime()
    bad.at.seconds = 300_000_000_000
    with pytest.raises((ValueError, OverflowError)):
        cel.bind_message(bad)
    assert isinstance(cel.bind_message(Rich()), celenv.Deferred)


def test_types_of_the_same_name_in_two_pools_do_not_share_a_plan():
    other = message_factory.GetMessageClass(_pool(extra_field=True).FindMessageTypeByName("t.Rich"))
    assert "extra" in cel.message_to_plain(other(extra="e"))
    assert "extra" not in cel.message_to_plain(Rich())
    assert "extra" in cel.message_to_plain(other())
    assert cel._plain_plan(other.DESCRIPTOR) is not cel._plain_plan(Rich.DESCRIPTOR)
