"""``json_format.MessageToDict`` of flat messages, without its per-field Python walk.

A checkpoint entry renders each step's response as proto3 JSON, and validation's CEL rules
read the message as JSON (``this``): ``MessageToDict`` walks every field through several
Python calls (about 5 us for a 1 KB message of six fields, three to seven times per job).
For a *flat* message type, one whose fields are all strings, bools, integers (enums too, when
rendered as numbers) or repeated ones of those, :func:`message_to_dict` builds the same dict
from one ``ListFields()`` and a plan per type. Any other type (a message, map, bytes, float or
double field, an enum rendered by name, an extension range, a ``google.protobuf`` type) goes
to ``MessageToDict`` itself, as do messages holding extensions.

The result equals ``MessageToDict(msg, always_print_fields_with_no_presence=True, ...)``,
key order included: the fields ``ListFields()`` lists, in its order, then each field without
presence that it left out, at its default, in declaration order.
"""

from __future__ import annotations

import threading
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["message_to_dict"]

_FD = FieldDescriptor
_AS_IS = {_FD.CPPTYPE_STRING, _FD.CPPTYPE_BOOL, _FD.CPPTYPE_INT32, _FD.CPPTYPE_UINT32}
_AS_TEXT = {_FD.CPPTYPE_INT64, _FD.CPPTYPE_UINT64}  # proto3 JSON quotes 64-bit integers

#: per field name: (output name, 0 as is | 1 as text | 2 list as is | 3 list as text)
_Fields = dict[str, tuple[str, int]]
#: fields without presence: (output name, default, repeated)
_Defaults = tuple[tuple[str, Any, bool], ...]

_PLANS_MAX = 512
_plans: dict[tuple[int, bool, bool], tuple[Descriptor, _Fields, _Defaults] | None] = {}
_plans_lock = threading.Lock()


def message_to_dict(
    msg: Message,
    *,
    preserving_proto_field_name: bool = False,
    use_integers_for_enums: bool = False,
    descriptor_pool: Any = None,
) -> dict[str, Any]:
    """``json_format.MessageToDict(msg, always_print_fields_with_no_presence=True, ...)``.

    :param descriptor_pool: passed to ``MessageToDict`` (a flat type holds no ``Any``).
    :returns: the proto3 JSON object (a new dict; lists are new lists).
    :raises Exception: as ``MessageToDict`` does (only it renders types that can fail).
    """
    desc = msg.DESCRIPTOR
    key = (id(desc), preserving_proto_field_name, use_integers_for_enums)
    if key in _plans:
        held = _plans[key]
        stale = held is not None and held[0] is not desc  # a recycled id()
    else:
        held, stale = None, True
    if stale:
        held = _plan(desc, preserving_proto_field_name, use_integers_for_enums)
        with _plans_lock:
            if len(_plans) >= _PLANS_MAX:
                _plans.clear()
            _plans[key] = held
    if held is None or held[0] is not desc:
        return _slow(msg, preserving_proto_field_name, use_integers_for_enums, descriptor_pool)
    _, fields, defaults = held
    out: dict[str, Any] = {}
    for fd, value in msg.ListFields():
        spec = fields.get(fd.name)
        if spec is None or fd.is_extension:
            return _slow(msg, preserving_proto_field_name, use_integers_for_enums, descriptor_pool)
        name, how = spec
        if how == 0:
            out[name] = value
        elif how == 2:
            out[name] = list(value)
        elif how == 1:
            out[name] = str(value)
        else:
            out[name] = [str(v) for v in value]
    for name, default, repeated in defaults:
        if name not in out:
            out[name] = [] if repeated else default
    return out


def _slow(msg: Message, preserving: bool, int_enums: bool, descriptor_pool: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=preserving,
        use_integers_for_enums=int_enums,
        descriptor_pool=descriptor_pool,
    )


def _plan(
    desc: Descriptor, preserving: bool, int_enums: bool
) -> tuple[Descriptor, _Fields, _Defaults] | None:
    """The type's plan, or None when it is not flat (see the module doc)."""
    if desc.full_name.startswith("google.protobuf.") or desc.extension_ranges:
        return None
    fields: _Fields = {}
    defaults: list[tuple[str, Any, bool]] = []
    for fd in desc.fields:
        cpp = fd.cpp_type
        if cpp in _AS_IS and fd.type != _FD.TYPE_BYTES:
            text = False
        elif cpp in _AS_TEXT:
            text = True
        elif cpp == _FD.CPPTYPE_ENUM and int_enums:
            text = False
        else:
            return None  # messages and maps, bytes, floats, enums by name
        name = fd.name if preserving else fd.json_name
        repeated = fd.is_repeated
        fields[fd.name] = (name, (2 if repeated else 0) + (1 if text else 0))
        if not fd.has_presence:
            default = fd.default_value
            defaults.append((name, str(default) if text and not repeated else default, repeated))
    return desc, fields, tuple(defaults)
