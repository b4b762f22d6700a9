"""``t.Rich``: a message type with every kind of field the CEL conversions and the mapping
rules handle, built at run time in a private pool, and a hypothesis strategy of its values."""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from hypothesis import strategies as st

FP = descriptor_pb2.FieldDescriptorProto


def _field(msg, name, number, kind, *, label=FP.LABEL_OPTIONAL, type_name=None, **kw):
    f = msg.field.add(name=name, number=number, type=kind, label=label, **kw)
    if type_name:
        f.type_name = type_name
    return f


def rich_pool(extra_field: bool = False) -> descriptor_pool.DescriptorPool:
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
    _field(rich, "two_words", 22, FP.TYPE_INT64)  # JSON name "twoWords"
    if extra_field:
        _field(rich, "extra", 21, FP.TYPE_STRING)
    timed = f.message_type.add(name="WithTime")
    _field(timed, "s", 1, FP.TYPE_STRING)
    _field(timed, "at", 2, FP.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    pool.Add(f)
    return pool


POOL = rich_pool()
Rich = message_factory.GetMessageClass(POOL.FindMessageTypeByName("t.Rich"))
WithTime = message_factory.GetMessageClass(POOL.FindMessageTypeByName("t.WithTime"))

# A NUL now and then (cel-cpp would cut the string short): most messages stay plain.
texts = st.integers(0, 14).flatmap(
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
    m.s = draw(texts)
    if draw(st.booleans()):
        m.raw = draw(st.binary(max_size=3))
    m.color = draw(st.sampled_from([0, 1, 7]))  # 7: an open enum's unknown number
    if draw(st.booleans()):
        m.inner.s = draw(texts)
        m.inner.n = draw(_int64)
    for _ in range(draw(st.integers(0, 2))):
        m.inners.add(s=draw(texts))
    m.tags.extend(draw(st.lists(texts, max_size=3)))
    if draw(st.booleans()):
        m.opt = draw(texts)
    if draw(st.booleans()):
        m.sv.value = draw(texts)
    if draw(st.booleans()):
        m.iv.value = draw(_int64)
    if draw(st.integers(0, 4)) == 0:
        m.dv.value = 1.5
    if draw(st.integers(0, 3)) == 0:
        m.meta.update({"k": draw(st.sampled_from(["v", 1, True, None]))})
    for k in draw(st.lists(st.sampled_from(["x", "y", "z\x00"]), max_size=2)):
        m.counts[k] = draw(_int64)
    if draw(st.booleans()):
        m.byname["k"].s = draw(texts)
    which = draw(st.sampled_from([None, "s", "inner"]))
    if which == "s":
        m.pick_s = draw(texts)
    elif which == "inner":
        m.pick_inner.n = 1
    return m
