"""Mapping rules: how a step's request (or the output) is built from the scope.

Three dialects (reference section 4):

- **scoped text rules** (``rules``): ``target = source``, ``target += source``, ``-target``.
  The source is a literal (``null``, ``true``, ``false``, a number, a ``"string"``) or a
  scoped path ``NAME(.FIELD)*`` where NAME is ``input`` or an earlier step. An absent source
  (unset message or optional field, implicit scalar at zero, a missing Struct key at the end)
  skips the rule: the target keeps what it had (join semantics).
- **CEL rules** (``celRules``): ``{filter?, selector?, target, fallback?}``, applied after the
  text rules with ``target`` bound to the message being built.
- **unscoped in-place rules** (a CEL rule's ``fallback``): paths relative to the message being
  built; an absent source reads as null and clears the target.

Conversions follow the reference (``TypeConverter``) with these Python choices (reference gaps
8, 10, 11): enum fields accept an enum value, its exact name, or a defined number; a string
target accepts numbers and booleans (``42`` -> ``"42"``, ``true`` -> ``"true"``) and enum
values (their name), never bytes or messages; a message written into a ``google.protobuf.Struct``
field is stored as its proto3 JSON object; a list assigned with ``=`` to a repeated target
replaces its elements in every dialect.

Static checking for the verifier (:func:`check_text_rule`, :func:`check_target_path`) works on
descriptors only (reference RuleChecker).
"""

from __future__ import annotations

import base64
import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import cel as _cel

__all__ = [
    "ABSENT",
    "CelRule",
    "MappingError",
    "TextRule",
    "apply_cel_rules",
    "apply_text_rules",
    "check_source_path",
    "check_target_path",
    "check_text_rule",
    "parse_text_rule",
]

_FD = _d.FieldDescriptor

STRUCT = "google.protobuf.Struct"
VALUE = "google.protobuf.Value"
LIST_VALUE = "google.protobuf.ListValue"
ANY = "google.protobuf.Any"
#: Types that absorb any value: the rest of a path through them cannot be checked statically.
_OPAQUE = {STRUCT, ANY, VALUE}

_INT32 = {_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32}
_UINT32 = {_FD.TYPE_UINT32, _FD.TYPE_FIXED32}
_INT64 = {_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64}
_UINT64 = {_FD.TYPE_UINT64, _FD.TYPE_FIXED64}
_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSCOPED_ASSIGN = re.compile(r"^\s*([^=+\s]+)\s*=\s*(.+?)\s*$", re.DOTALL)
_UNSCOPED_APPEND = re.compile(r"^\s*([^+\s]+)\s*\+=\s*(.+?)\s*$", re.DOTALL)
_UNSCOPED_CLEAR = re.compile(r"^\s*-\s*(\S+)\s*$")


class MappingError(ProtomoltJobsError, ValueError):
    """A rule could not be applied; ``str()`` is the reference's message (without the
    ``mapping failed:`` prefix the runner adds)."""


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


#: The value of a source that is not there (the rule is skipped).
ABSENT: Any = _Absent()


@dataclass(frozen=True)
class _EnumValue:
    """An enum field's value as read from a message (so it can be copied into enum fields)."""

    number: int
    name: str | None


@dataclass(frozen=True)
class _Literal:
    value: Any


@dataclass(frozen=True)
class TextRule:
    """One parsed scoped text rule.

    :ivar text: the rule as written (trimmed).
    :ivar op: ``"assign"``, ``"append"`` or ``"clear"``; ``""`` when ``error`` is set.
    :ivar target: the dotted target path, split.
    :ivar source: a scoped path (tuple of segments), a literal, or None for ``clear``.
    :ivar error: the syntax error, when the rule does not parse.
    """

    text: str
    op: str
    target: tuple[str, ...] = ()
    source: tuple[str, ...] | _Literal | None = None
    error: str = ""

    @property
    def target_text(self) -> str:
        return ".".join(self.target)


@dataclass(frozen=True)
class CelRule:
    """One CEL mapping rule: ``filter`` (bool gate), ``selector`` (value), ``target`` path and
    unscoped ``fallback`` rules used when there is no selector."""

    target: str
    filter: str = ""
    selector: str = ""
    fallback: tuple[str, ...] = ()


def _malformed(text: str) -> str:
    return (
        "Rule is not 'target = source.path', 'target += source.path', or '-target' "
        f"(Rule: '{text}')"
    )


def _split_path(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _parse_literal(text: str) -> _Literal | None:
    if text == "null":
        return _Literal(None)
    if text == "true":
        return _Literal(True)
    if text == "false":
        return _Literal(False)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return _Literal(text[1:-1])
    if _NUMBER.fullmatch(text):
        return _Literal(float(text) if "." in text else int(text))
    return None


def parse_text_rule(raw: str) -> TextRule | None:
    """Parse one scoped rule; None for a blank rule (skipped). Syntax errors are kept in
    ``TextRule.error`` so the verifier can report them and the runner can fail on them."""
    text = raw.strip()
    if not text:
        return None
    if text.startswith("-") and "=" not in text:
        path = text[1:].strip()
        if not path:
            return TextRule(text, "", error=_malformed(text))
        return TextRule(text, "clear", _split_path(path))
    if "+=" in text:
        lhs, _, rhs = text.partition("+=")
        op = "append"
    else:
        lhs, sep, rhs = text.partition("=")
        if not sep:
            return TextRule(text, "", error=_malformed(text))
        op = "assign"
    lhs, rhs = lhs.strip(), rhs.strip()
    if not lhs or not rhs:
        return TextRule(text, "", error=_malformed(text))
    literal = _parse_literal(rhs)
    source: tuple[str, ...] | _Literal = literal if literal is not None else _split_path(rhs)
    return TextRule(text, op, _split_path(lhs), source)


# -- reading ---------------------------------------------------------------------------------


def _simple(desc: _d.Descriptor) -> str:
    return desc.name


def _field_value(msg: Message, fd: _d.FieldDescriptor) -> Any:
    """A field's value in the rule language's terms (final segment semantics)."""
    value = getattr(msg, fd.name)
    if _is_map(fd):
        return dict(value)
    if fd.is_repeated:
        if fd.type == _FD.TYPE_ENUM:
            return [_enum_value(fd, v) for v in value]
        return list(value)
    if fd.has_presence:
        if not msg.HasField(fd.name):
            return ABSENT
    elif _is_zero(fd, value):
        # Implicit presence: the zero value reads as not set (reference 4.2).
        return ABSENT
    if fd.type == _FD.TYPE_ENUM:
        return _enum_value(fd, value)
    return value


def _enum_value(fd: _d.FieldDescriptor, number: int) -> _EnumValue:
    ev = fd.enum_type.values_by_number.get(number)
    return _EnumValue(number, ev.name if ev is not None else None)


def _is_zero(fd: _d.FieldDescriptor, value: Any) -> bool:
    if fd.type == _FD.TYPE_MESSAGE:
        return False
    return value == fd.default_value if fd.type != _FD.TYPE_ENUM else value == 0


def _is_map(fd: _d.FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _value_to_json(v: struct_pb2.Value) -> Any:
    return json_format.MessageToDict(v)


def _read_path(root: Any, segments: Sequence[str], path_text: str, rule: str) -> Any:
    """Walk ``segments`` from ``root`` (a message); reference 4.2 semantics."""
    current: Any = root
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if isinstance(current, Message) and current.DESCRIPTOR.full_name == STRUCT:
            current = json_format.MessageToDict(current)
        if isinstance(current, dict):
            if seg not in current:
                if last:
                    return ABSENT
                raise MappingError(
                    f"Cannot resolve path '{path_text}': key '{seg}' not found in struct "
                    f"(Rule: '{rule}')"
                )
            current = current[seg]
            if current is None and last:
                return None
            continue
        if not isinstance(current, Message):
            raise MappingError(
                f"Path '{path_text}' attempts to traverse through non-message or repeated field "
                f"'{segments[i - 1] if i else seg}' (Rule: '{rule}')"
            )
        fd = current.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            raise MappingError(
                f"Field '{seg}' not found in message '{_simple(current.DESCRIPTOR)}' "
                f"(Rule: '{rule}')"
            )
        if last:
            value = _field_value(current, fd)
            return _unpack_if_any(value, current, fd, rule)
        if fd.is_repeated or fd.type != _FD.TYPE_MESSAGE:
            raise MappingError(
                f"Path '{path_text}' attempts to traverse through non-message or repeated field "
                f"'{seg}' (Rule: '{rule}')"
            )
        if not current.HasField(seg):
            return ABSENT
        current = _unpack_if_any(getattr(current, seg), current, fd, rule)
        if current is ABSENT:
            return ABSENT
    return current


def _unpack_if_any(value: Any, parent: Message, fd: _d.FieldDescriptor, rule: str) -> Any:
    if not isinstance(value, Message) or value.DESCRIPTOR.full_name != ANY:
        return value
    pool = parent.DESCRIPTOR.file.pool
    type_name = value.type_url.rsplit("/", 1)[-1]
    try:
        from google.protobuf import message_factory

        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(type_name))
        out = cls()
        if not value.Unpack(out):
            raise ValueError(type_name)
        return out
    except Exception as exc:  # Unpack raises assorted types; one MappingError
        raise MappingError(
            f"Failed to unpack Any field '{fd.name}' (type url '{value.type_url}'); register the "
            f"type's descriptor with the DescriptorRegistry to unpack it (Rule: '{rule}')"
        ) from exc


def resolve_source(scope: Mapping[str, Message], rule: TextRule) -> Any:
    """The value a scoped rule reads: a Python value, a message, a list, or :data:`ABSENT`.

    :raises MappingError: unknown source name, unknown field, bad traversal.
    """
    src = rule.source
    if isinstance(src, _Literal):
        return src.value
    assert isinstance(src, tuple)
    name = src[0]
    if name not in scope:
        names = ", ".join(scope)
        raise MappingError(
            f"Unknown source '{name}'; the scope has [{names}] (Rule: '{rule.text}')"
        )
    if len(src) == 1:
        return scope[name]
    return _read_path(scope[name], src[1:], ".".join(src), rule.text)


# -- writing ---------------------------------------------------------------------------------


def _convert(value: Any, fd: _d.FieldDescriptor, rule: str) -> Any:
    """Convert a rule value into something assignable to ``fd`` (one element for repeated)."""
    t = fd.type
    name = fd.name
    if t == _FD.TYPE_MESSAGE:
        return _convert_message(value, fd, rule)
    if isinstance(value, Message):
        raise MappingError(
            f"Cannot convert value of type {value.DESCRIPTOR.full_name} to field type "
            f"{_kind(fd)} (field '{name}')"
        )
    if isinstance(value, dict | list):
        raise MappingError(
            f"Cannot convert value of type {type(value).__name__} to field type {_kind(fd)} "
            f"(field '{name}')"
        )
    if t == _FD.TYPE_ENUM:
        return _convert_enum(value, fd)
    if isinstance(value, _EnumValue):
        if t == _FD.TYPE_STRING and value.name is not None:
            return value.name
        raise MappingError(
            f"Cannot convert an enum value to field type {_kind(fd)} (field '{name}')"
        )
    if t in _INT32 or t in _UINT32 or t in _INT64 or t in _UINT64:
        bits = (
            "int32"
            if t in _INT32
            else "uint32"
            if t in _UINT32
            else "int64"
            if t in _INT64
            else "uint64"
        )
        return _convert_int(value, bits, name)
    if t in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
        if isinstance(value, bool):
            raise MappingError(f"Cannot convert a boolean to {_kind(fd)} for field {name}")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise MappingError(
                    f"Cannot parse '{value}' as {_kind(fd)} for field {name}"
                ) from None
        raise MappingError(f"Cannot convert value of type {type(value).__name__} to {_kind(fd)}")
    if t == _FD.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return value.strip().lower() == "true"
        raise MappingError(
            f"Cannot convert value of type {type(value).__name__} to BOOL for field {name}"
        )
    if t == _FD.TYPE_STRING:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            return str(int(value)) + ".0" if value.is_integer() else repr(value)
        if isinstance(value, datetime.datetime | datetime.timedelta):
            return str(value)
        raise MappingError(
            f"Cannot convert value of type {type(value).__name__} to field type STRING "
            f"(field '{name}')"
        )
    if t == _FD.TYPE_BYTES:
        if isinstance(value, bytes):
            return value
        raise MappingError(
            f"Cannot convert value of type {type(value).__name__} to field type BYTES "
            f"(field '{name}')"
        )
    raise MappingError(f"Cannot convert value to field type {_kind(fd)} (field '{name}')")


def _kind(fd: _d.FieldDescriptor) -> str:
    names = {
        _FD.TYPE_DOUBLE: "DOUBLE",
        _FD.TYPE_FLOAT: "FLOAT",
        _FD.TYPE_BOOL: "BOOLEAN",
        _FD.TYPE_STRING: "STRING",
        _FD.TYPE_BYTES: "BYTE_STRING",
        _FD.TYPE_ENUM: "ENUM",
        _FD.TYPE_MESSAGE: "MESSAGE",
    }
    if fd.type in names:
        return names[fd.type]
    if fd.type in _INT32 or fd.type in _UINT32:
        return "INT"
    return "LONG"


def _convert_int(value: Any, bits: str, name: str) -> int:
    lo, hi = _RANGES[bits]
    if isinstance(value, bool):
        raise MappingError(f"Cannot convert a boolean to {bits} for field {name}")
    if isinstance(value, _EnumValue):
        value = value.number
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise MappingError(
                f"Value {value} cannot be represented exactly as {bits} for field {name}"
            )
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise MappingError(f"Cannot parse '{value}' as {bits} for field {name}") from None
    if not isinstance(value, int):
        raise MappingError(
            f"Cannot convert value of type {type(value).__name__} to {bits} for field {name}"
        )
    if not lo <= value <= hi:
        raise MappingError(f"Value {value} is out of {bits} range for field {name}")
    return int(value)


def _convert_enum(value: Any, fd: _d.FieldDescriptor) -> int:
    et = fd.enum_type
    if isinstance(value, _EnumValue):
        if value.name is not None and value.name in et.values_by_name:
            return et.values_by_name[value.name].number
        if value.number in et.values_by_number:
            return value.number
        raise MappingError(
            f"Enum value {value.number} is not defined in {et.full_name} (field '{fd.name}')"
        )
    if isinstance(value, str) and value in et.values_by_name:
        return et.values_by_name[value].number
    if isinstance(value, int) and not isinstance(value, bool) and value in et.values_by_number:
        return value
    raise MappingError(
        f"Cannot convert {value!r} to enum {et.full_name} for field '{fd.name}'; "
        "give a value name or a defined number"
    )


def _to_json_value(value: Any) -> Any:
    """A rule value as something ``struct_pb2.Value`` accepts."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, _EnumValue):
        return value.name if value.name is not None else float(value.number)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Message):
        return json_format.MessageToDict(value)
    if isinstance(value, dict):
        return {str(k): _to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json_value(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.timedelta):
        return str(value)
    raise MappingError(f"Cannot convert value of type {type(value).__name__} to a JSON value")


def _convert_message(value: Any, fd: _d.FieldDescriptor, rule: str) -> Message:
    mt = fd.message_type
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(mt)
    out = cls()
    full = mt.full_name
    if isinstance(value, Message):
        src = value.DESCRIPTOR.full_name
        if src == full:
            out.CopyFrom(value) if type(value) is cls else out.MergeFromString(
                value.SerializeToString()
            )
            return out
        if full == ANY:
            out.Pack(value)
            return out
        if full == STRUCT:
            if src == STRUCT:
                out.update(json_format.MessageToDict(value))
            else:
                out.update(json_format.MessageToDict(value))
            return out
        if full == VALUE:
            json_format.ParseDict(_to_json_value(value), out)
            return out
        if src == STRUCT:
            return _struct_into(json_format.MessageToDict(value), out, fd)
        raise MappingError(
            f"Cannot convert value of type {src} to field type MESSAGE ({full}, field '{fd.name}')"
        )
    if full == VALUE:
        json_format.ParseDict(_to_json_value(value), out)
        return out
    if full == LIST_VALUE and isinstance(value, list):
        out.extend(_to_json_value(value))
        return out
    if isinstance(value, dict):
        if full == STRUCT:
            out.update(_to_json_value(value))
            return out
        return _struct_into(value, out, fd)
    if full in _cel.WRAPPERS and value is not None and not isinstance(value, list):
        inner = mt.fields_by_name["value"]
        out.value = _convert(value, inner, rule)
        return out
    raise MappingError(
        f"Cannot convert value of type {type(value).__name__} to field type MESSAGE "
        f"({full}, field '{fd.name}')"
    )


def _struct_into(data: dict, out: Message, fd: _d.FieldDescriptor) -> Message:
    try:
        json_format.ParseDict(data, out, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise MappingError(
            f"Cannot convert a struct to {out.DESCRIPTOR.full_name} for field '{fd.name}': {exc}"
        ) from exc
    return out


def _set_field(msg: Message, fd: _d.FieldDescriptor, value: Any, append: bool, rule: str) -> None:
    name = fd.name
    if value is None:
        if append:
            raise MappingError(f"Cannot append null to field '{name}'")
        msg.ClearField(name)
        return
    if _is_map(fd):
        if not isinstance(value, dict):
            raise MappingError(f"Cannot assign a {type(value).__name__} to map field '{name}'")
        target = getattr(msg, name)
        if not append:
            target.clear()
        vfd = fd.message_type.fields_by_name["value"]
        kfd = fd.message_type.fields_by_name["key"]
        for k, v in value.items():
            key = _convert(k, kfd, rule)
            if vfd.type == _FD.TYPE_MESSAGE:
                target[key].CopyFrom(_convert(v, vfd, rule))
            else:
                target[key] = _convert(v, vfd, rule)
        return
    if fd.is_repeated:
        container = getattr(msg, name)
        if isinstance(value, list):
            items = value
            if not append:
                del container[:]
        else:
            if not append:
                raise MappingError(
                    f"Cannot assign a single value to repeated field '{name}'; use += to append"
                )
            items = [value]
        for item in items:
            if item is None:
                raise MappingError(f"Cannot append null to field '{name}'")
            converted = _convert(item, fd, rule)
            if fd.type == _FD.TYPE_MESSAGE:
                container.add().CopyFrom(converted)
            else:
                container.append(converted)
        return
    if append:
        raise MappingError(f"Cannot append: field '{name}' is not repeated")
    if isinstance(value, list):
        if fd.type == _FD.TYPE_MESSAGE and fd.message_type.full_name in (VALUE, LIST_VALUE):
            getattr(msg, name).CopyFrom(_convert(value, fd, rule))
            return
        raise MappingError(f"Cannot assign a list to singular field '{name}'")
    converted = _convert(value, fd, rule)
    if fd.type == _FD.TYPE_MESSAGE:
        getattr(msg, name).CopyFrom(converted)
    else:
        setattr(msg, name, converted)


def _struct_write(struct: Message, keys: Sequence[str], value: Any, append: bool) -> None:
    """Write into a ``google.protobuf.Struct`` at ``keys`` (nested structs created)."""
    current = struct
    for key in keys[:-1]:
        if key not in current.fields or current.fields[key].WhichOneof("kind") != "struct_value":
            current.fields[key].struct_value.Clear()
        current = current.fields[key].struct_value
    last = keys[-1]
    if value is None and not append:
        current.fields[last].null_value = struct_pb2.NULL_VALUE
        return
    json_value = _to_json_value(value)
    if append:
        existing = current.fields.get(last) if last in current.fields else None
        items: list[Any] = []
        if existing is not None:
            prior = json_format.MessageToDict(existing)
            items = prior if isinstance(prior, list) else [prior]
        items.extend(json_value if isinstance(json_value, list) else [json_value])
        json_format.ParseDict(items, current.fields[last])
        return
    json_format.ParseDict(json_value, current.fields[last])


def write_path(msg: Message, path: Sequence[str], value: Any, append: bool, rule: str) -> None:
    """Assign (or append) ``value`` at the dotted ``path`` inside ``msg``, materialising
    intermediate singular messages.

    :raises MappingError: unknown field, traversal through a non-singular-message field,
        impossible conversion.
    """
    path_text = ".".join(path)
    current = msg
    for i, seg in enumerate(path):
        if current.DESCRIPTOR.full_name == STRUCT:
            _struct_write(current, path[i:], value, append)
            return
        fd = current.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            raise MappingError(
                f"Field '{seg}' not found in message '{_simple(current.DESCRIPTOR)}'"
            )
        if i == len(path) - 1:
            _set_field(current, fd, value, append, rule)
            return
        if fd.is_repeated or fd.type != _FD.TYPE_MESSAGE:
            raise MappingError(
                f"Path '{path_text}' attempts to traverse through non-singular message field '{seg}'"
            )
        current = getattr(current, seg)


def clear_path(msg: Message, path: Sequence[str]) -> None:
    """Clear the field (or Struct key) at ``path``; an unset parent makes it a no-op."""
    current = msg
    for i, seg in enumerate(path):
        if current.DESCRIPTOR.full_name == STRUCT:
            keys = path[i:]
            for key in keys[:-1]:
                if (
                    key not in current.fields
                    or current.fields[key].WhichOneof("kind") != "struct_value"
                ):
                    return
                current = current.fields[key].struct_value
            if keys[-1] in current.fields:
                del current.fields[keys[-1]]
            return
        fd = current.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            raise MappingError(
                f"Field '{seg}' not found in message '{_simple(current.DESCRIPTOR)}'"
            )
        if i == len(path) - 1:
            current.ClearField(seg)
            return
        if fd.is_repeated or fd.type != _FD.TYPE_MESSAGE:
            raise MappingError(
                f"Path '{'.'.join(path)}' attempts to traverse through non-singular message field '{seg}'"
            )
        if not current.HasField(seg):
            return
        current = getattr(current, seg)


def _with_rule(exc: MappingError, rule: str) -> MappingError:
    text = str(exc)
    if "(Rule: '" in text:
        return exc
    return MappingError(f"{text} (Rule: '{rule}')")


# A rule ``field = name.field`` between two fields of the same scalar type (the common case)
# reads and writes the same values through every step of resolve_source and write_path: no
# conversion changes the value, and none can fail. Such rules copy directly; the plan is made
# once per (rule, source type, target type).

#: Scalar types a same-typed copy passes through _convert unchanged (not enums, bytes, floats).
_COPYABLE = {_FD.TYPE_STRING, _FD.TYPE_BOOL} | _INT32 | _UINT32 | _INT64 | _UINT64
_COPY_CACHE_SIZE = 4096
_copies: dict[int, tuple[TextRule, _d.Descriptor, _d.Descriptor, Any]] = {}


def _copy_plan(rule: TextRule, source: _d.Descriptor, target: _d.Descriptor) -> Any:
    """``(source field, target field, repeated, has presence, default)`` or None."""
    if STRUCT in (source.full_name, target.full_name):
        return None
    fs = source.fields_by_name.get(rule.source[1])  # type: ignore[index]
    ft = target.fields_by_name.get(rule.target[0])
    if fs is None or ft is None or fs.type != ft.type or fs.type not in _COPYABLE:
        return None
    if fs.is_repeated != ft.is_repeated:
        return None
    return (fs.name, ft.name, fs.is_repeated, fs.has_presence, fs.default_value)


def _direct_copy(rule: TextRule, msg: Message, scope: Mapping[str, Message]) -> Any:
    """The copy plan of ``rule`` into ``msg`` (see above), or None: the general path."""
    src = rule.source
    if rule.op != "assign" or len(rule.target) != 1 or type(src) is not tuple or len(src) != 2:
        return None
    source = scope.get(src[0])
    if not isinstance(source, Message):
        return None  # an unknown name (the general path says so) or not a message
    sd, td = source.DESCRIPTOR, msg.DESCRIPTOR
    entry = _copies.get(id(rule))
    # The entry holds the rule and both descriptors, so their ids stay theirs while it lives.
    if entry is not None and entry[0] is rule and entry[1] is sd and entry[2] is td:
        return entry[3]
    plan = _copy_plan(rule, sd, td)
    if len(_copies) >= _COPY_CACHE_SIZE:
        _copies.clear()
    _copies[id(rule)] = (rule, sd, td, plan)
    return plan


def _copy(plan: Any, msg: Message, source: Message) -> None:
    """What resolve_source + write_path do for a same-typed scalar copy."""
    src_name, dst_name, repeated, presence, default = plan
    value = getattr(source, src_name)
    if repeated:
        items = list(value)  # first: the source may be the target itself
        container = getattr(msg, dst_name)
        del container[:]
        container.extend(items)
    elif presence:
        if source.HasField(src_name):
            setattr(msg, dst_name, value)
    elif value != default:  # implicit presence: the zero value reads as not set (skipped)
        setattr(msg, dst_name, value)


def apply_text_rules(msg: Message, rules: Sequence[TextRule], scope: Mapping[str, Message]) -> None:
    """Apply scoped text rules, in order, to ``msg`` (mutated in place).

    :raises MappingError: the first rule that fails, with ``(Rule: '<rule>')``.
    """
    for rule in rules:
        if rule.error:
            raise MappingError(rule.error)
        plan = _direct_copy(rule, msg, scope)
        if plan is not None:
            _copy(plan, msg, scope[rule.source[0]])  # type: ignore[index]
            continue
        try:
            if rule.op == "clear":
                clear_path(msg, rule.target)
                continue
            value = resolve_source(scope, rule)
            if value is ABSENT:
                continue
            write_path(msg, rule.target, value, rule.op == "append", rule.text)
        except MappingError as exc:
            raise _with_rule(exc, rule.text) from exc.__cause__


# -- CEL rules -------------------------------------------------------------------------------


def apply_cel_rules(msg: Message, rules: Sequence[CelRule], scope_cel: Mapping[str, Any]) -> None:
    """Apply CEL rules in order; ``target`` is rebound to ``msg``'s current state per rule.

    :param scope_cel: scope names -> activation values (``cel.bind_message`` of each message).
    :raises MappingError: a failing filter, selector, conversion or fallback rule.
    """
    for rule in rules:
        activation = dict(scope_cel)
        activation["target"] = _cel.bind_message(msg)
        try:
            if rule.filter.strip() and not _cel.evaluate_bool(rule.filter, activation):
                continue
            if rule.selector.strip():
                value = _cel.from_cel(_cel.evaluate(rule.selector, activation))
                write_path(msg, _split_path(rule.target), value, False, rule.selector)
            elif rule.fallback:
                apply_unscoped_rules(msg, rule.fallback)
        except _cel.CelError as exc:
            raise MappingError(str(exc)) from exc


# -- unscoped in-place dialect (CEL fallback) ------------------------------------------------


def parse_unscoped_rule(raw: str) -> tuple[str, str, str] | None:
    """``(op, target, source)`` of an unscoped rule, None when blank.

    :raises MappingError: ``Invalid rule syntax (Rule: '<r>')``.
    """
    if not raw.strip():
        return None
    m = _UNSCOPED_ASSIGN.match(raw)
    if m:
        return "assign", m.group(1), m.group(2)
    m = _UNSCOPED_APPEND.match(raw)
    if m:
        return "append", m.group(1), m.group(2)
    m = _UNSCOPED_CLEAR.match(raw)
    if m:
        return "clear", m.group(1), ""
    raise MappingError(f"Invalid rule syntax (Rule: '{raw}')")


def _read_unscoped(msg: Message, path: str, rule: str) -> Any:
    literal = _parse_literal(path)
    if literal is not None:
        return literal.value
    segments = _split_path(path)
    current: Any = msg
    for i, seg in enumerate(segments):
        if isinstance(current, Message) and current.DESCRIPTOR.full_name == STRUCT:
            current = json_format.MessageToDict(current)
        if isinstance(current, dict):
            current = current.get(seg)
            if current is None:
                return None
            continue
        fd = current.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            raise MappingError(
                f"Field '{seg}' not found in message '{_simple(current.DESCRIPTOR)}'"
            )
        if i == len(segments) - 1:
            value = _field_value(current, fd)
            return None if value is ABSENT else value
        if fd.is_repeated or fd.type != _FD.TYPE_MESSAGE:
            raise MappingError(
                f"Path '{path}' attempts to traverse through non-message or repeated field '{seg}'"
            )
        if not current.HasField(seg):
            raise MappingError(f"Path '{path}': intermediate field '{seg}' is not set")
        current = getattr(current, seg)
    return current


def apply_unscoped_rules(msg: Message, rules: Sequence[str]) -> None:
    """Apply in-place rules whose sources are paths of ``msg`` itself (or literals).

    :raises MappingError: ``Failed to execute rule: <r>`` around the cause.
    """
    for raw in rules:
        parsed = parse_unscoped_rule(raw)
        if parsed is None:
            continue
        op, target, source = parsed
        try:
            if op == "clear":
                clear_path(msg, _split_path(target))
                continue
            value = _read_unscoped(msg, source, raw)
            if value is None and op == "assign":
                clear_path(msg, _split_path(target))
                continue
            write_path(msg, _split_path(target), value, op == "append", raw)
        except MappingError as exc:
            raise MappingError(f"Failed to execute rule: {raw.strip()} ({exc})") from exc


# -- static checks (the verifier's RuleChecker) ----------------------------------------------


class _Unverifiable:
    __slots__ = ()


#: A path whose remainder cannot be checked (through Struct/Any/Value or a map).
UNVERIFIABLE: Any = _Unverifiable()


def check_target_path(desc: _d.Descriptor, path: str) -> _d.FieldDescriptor | Any:
    """Resolve ``path`` on ``desc`` statically.

    :returns: the final FieldDescriptor, or :data:`UNVERIFIABLE`.
    :raises MappingError: ``empty path``, ``path '.' names no fields``, ``no field 'f' on T``,
        ``cannot traverse through repeated field 'f'``, ``cannot traverse through non-message
        field 'f'``.
    """
    if not path.strip():
        raise MappingError("empty path")
    segments = [s for s in path.strip().split(".")]
    if all(not s for s in segments):
        raise MappingError(f"path '{path}' names no fields")
    current = desc
    for i, seg in enumerate(segments):
        if current.full_name in _OPAQUE:
            return UNVERIFIABLE
        fd = current.fields_by_name.get(seg)
        if fd is None:
            raise MappingError(f"no field '{seg}' on {current.full_name}")
        if i == len(segments) - 1:
            return fd
        if _is_map(fd):
            return UNVERIFIABLE
        if fd.is_repeated:
            raise MappingError(f"cannot traverse through repeated field '{seg}'")
        if fd.type != _FD.TYPE_MESSAGE:
            raise MappingError(f"cannot traverse through non-message field '{seg}'")
        current = fd.message_type
    return UNVERIFIABLE


def check_source_path(scope: Mapping[str, _d.Descriptor], path: str) -> Any:
    """Resolve a scoped source path statically: a FieldDescriptor, a message Descriptor (bare
    scope name), or :data:`UNVERIFIABLE`.

    :raises MappingError: unknown scope name or a bad path.
    """
    segments = path.split(".")
    name = segments[0]
    if name not in scope:
        raise MappingError(f"unknown source '{name}'; the scope has [{', '.join(scope)}]")
    if len(segments) == 1:
        return scope[name]
    return check_target_path(scope[name], ".".join(segments[1:]))


def check_text_rule(
    raw: str, scope: Mapping[str, _d.Descriptor], target: _d.Descriptor
) -> str | None:
    """One scoped rule against the scope and the type being built; the error or None."""
    rule = parse_text_rule(raw)
    if rule is None:
        return "empty rule"
    if rule.error:
        return "not 'target = source.path', 'target += source.path', or '-target'"
    if rule.op == "clear":
        try:
            check_target_path(target, rule.target_text)
        except MappingError as exc:
            return str(exc)
        return None
    try:
        tfd = check_target_path(target, rule.target_text)
    except MappingError as exc:
        return f"target: {exc}"
    if isinstance(rule.source, _Literal):
        return None
    source_text = ".".join(rule.source or ())
    try:
        sfd = check_source_path(scope, source_text)
    except MappingError as exc:
        return f"source: {exc}"
    if not isinstance(tfd, _d.FieldDescriptor):
        return None
    if rule.op == "append" and not tfd.is_repeated:
        return f"'{rule.target_text}' is singular; += needs a repeated target"
    if not isinstance(sfd, _d.FieldDescriptor):
        return None
    list_sink = tfd.message_type is not None and tfd.message_type.full_name in (VALUE, LIST_VALUE)
    if sfd.is_repeated and not tfd.is_repeated and not list_sink:
        return f"repeated source '{source_text}' cannot land on singular '{rule.target_text}'"
    s_msg = sfd.type == _FD.TYPE_MESSAGE and not _is_map(sfd)
    t_msg = tfd.type == _FD.TYPE_MESSAGE and not _is_map(tfd)
    if s_msg != t_msg:
        absorbing = t_msg and tfd.message_type.full_name in _OPAQUE | set(_cel.WRAPPERS)
        source_opaque = s_msg and sfd.message_type.full_name in {VALUE} | set(_cel.WRAPPERS)
        if not absorbing and not source_opaque:
            return (
                f"cannot convert between message and scalar "
                f"('{source_text}' -> '{rule.target_text}')"
            )
    if s_msg and t_msg:
        st, tt = sfd.message_type.full_name, tfd.message_type.full_name
        if st != tt and tt not in _OPAQUE and st != STRUCT:
            return f"message type mismatch: {st} -> {tt}"
    return None


def check_unscoped_rule(raw: str, target: _d.Descriptor) -> str | None:
    """A CEL ``fallback`` rule checked the way it runs: paths relative to ``target``."""
    try:
        parsed = parse_unscoped_rule(raw)
    except MappingError as exc:
        return str(exc)
    if parsed is None:
        return None
    op, tpath, source = parsed
    try:
        tfd = check_target_path(target, tpath)
    except MappingError as exc:
        return f"target: {exc}"
    if op == "append" and isinstance(tfd, _d.FieldDescriptor) and not tfd.is_repeated:
        return f"'{tpath}' is singular; += needs a repeated target"
    if op != "clear" and _parse_literal(source) is None:
        try:
            check_target_path(target, source)
        except MappingError as exc:
            return f"source: {exc}"
    return None


def identifier(name: str) -> bool:
    """True for ``[A-Za-z_][A-Za-z0-9_]*``."""
    return bool(_IDENT.fullmatch(name))
