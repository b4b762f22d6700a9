"""CEL for workflows: gates, CEL mapping rules, and messages turned into CEL values.

Expressions compile through the process-wide environment of :mod:`protomolt_jobs.workflow.celenv` (one
runner class per process, LIBRARIES.md section 2) and are bound to the CEL strings extension
(``lowerAscii``, ``upperAscii``, ``trim``, ``replace``, ``split``, ``substring``, ``charAt``,
``indexOf``, ``lastIndexOf``, ``join``), which cel-python lacks. One program per text, cached.

Messages become CEL maps keyed by proto field name (cel-python has no protobuf values):

- implicit-presence scalars are always present (their zero value when unset), so
  ``input.cheap`` reads ``false``; ``has()`` on them is therefore always true;
- singular message fields and proto3 ``optional`` scalars are present only when set, so
  ``has(input.meta)`` is real presence (reading a field of an unset message is an error);
- repeated fields are lists, maps are maps; 64-bit integers are CEL ints (not strings);
  enums are their numbers; ``Struct``/``Value``/``ListValue`` are their JSON values,
  wrappers their inner value, ``Timestamp``/``Duration`` CEL timestamps/durations.
"""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError
from google.protobuf import descriptor as _d
from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import celenv

__all__ = [
    "CelError",
    "bind_message",
    "compile_expression",
    "evaluate",
    "from_cel",
    "message_to_cel",
]

_FD = _d.FieldDescriptor


class CelError(ProtomoltJobsError, ValueError):
    """A CEL expression failed to compile or evaluate; ``str()`` is the reference's text."""


# -- the strings extension -------------------------------------------------------------------


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return str(v)


def _substring(s: Any, start: Any, end: Any = None) -> celtypes.StringType:
    text = _str(s)
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise IndexError(f"substring({start}, {stop}) out of range for length {len(text)}")
    return celtypes.StringType(text[int(start) : stop])


def _char_at(s: Any, i: Any) -> celtypes.StringType:
    text = _str(s)
    if not 0 <= int(i) <= len(text):
        raise IndexError(f"charAt({i}) out of range for length {len(text)}")
    return celtypes.StringType(text[int(i) : int(i) + 1])


def _index_of(s: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    return celtypes.IntType(_str(s).find(_str(sub), int(start)))


def _last_index_of(s: Any, sub: Any, end: Any = None) -> celtypes.IntType:
    text = _str(s)
    if end is None:
        return celtypes.IntType(text.rfind(_str(sub)))
    return celtypes.IntType(text.rfind(_str(sub), 0, int(end) + len(_str(sub))))


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> celtypes.StringType:
    return celtypes.StringType(_str(s).replace(_str(old), _str(new), int(n)))


def _split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    count = int(n)
    if count == 0:
        return celtypes.ListType([])
    parts = _str(s).split(_str(sep), count - 1 if count > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    return celtypes.StringType(_str(sep).join(_str(x) for x in items))


def _lower_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in _str(s)))


def _upper_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in _str(s)))


def _trim(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_str(s).strip())


#: Module-level functions only: compiled CEL calls them by module path (celenv.Program).
STRINGS_EXTENSION: dict[str, Callable[..., Any]] = {
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "trim": _trim,
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "join": _join,
}

_programs: dict[str, Any] = {}
_programs_lock = threading.Lock()
_ACTIVATION_NOISE = re.compile(r"\s*\(in (?:activation|container) .*$", re.DOTALL)


def compile_expression(text: str) -> Any:
    """Compile ``text`` once (process-wide cache) and return its runner.

    :raises CelError: ``Invalid CEL expression: <detail>`` (blank text:
        ``CEL expression must not be blank``).
    """
    prog = _programs.get(text)
    if prog is not None:
        return prog
    if not isinstance(text, str) or not text.strip():
        raise CelError("CEL expression must not be blank")
    try:
        base = celenv.program(text)
    except celenv.CelCompileError as exc:
        raise CelError(f"Invalid CEL expression: {exc.detail}") from exc
    prog = celenv.Program(base.ast, functions=STRINGS_EXTENSION, text=text)
    with _programs_lock:
        if len(_programs) > celenv.PROGRAM_CACHE_SIZE:
            _programs.clear()
        _programs[text] = prog
    return prog


def clean_error(exc: BaseException) -> str:
    """cel-python's error text without the activation dump it appends."""
    if isinstance(exc, CELEvalError) and exc.args:
        detail = str(exc.args[0])
    else:
        detail = str(exc) or type(exc).__name__
    return _ACTIVATION_NOISE.sub("", detail)


def evaluate(text: str, activation: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` over ``activation`` (names -> CEL values).

    :returns: the CEL value.
    :raises CelError: on a compile error, or ``Failed to evaluate CEL expression: <text>
        (<detail>)`` when evaluation fails.
    """
    prog = compile_expression(text)
    try:
        # No copy: Program.evaluate reads the activation and never changes it.
        result = prog.evaluate(activation)
    except CelError:
        raise
    except Exception as exc:  # celpy raises CELEvalError and assorted Python errors
        raise CelError(f"Failed to evaluate CEL expression: {text} ({clean_error(exc)})") from exc
    if isinstance(result, CELEvalError):
        raise CelError(f"Failed to evaluate CEL expression: {text} ({clean_error(result)})")
    return result


def evaluate_bool(text: str, activation: Mapping[str, Any]) -> bool:
    """Evaluate a boolean expression.

    :raises CelError: as :func:`evaluate`, or ``CEL expression did not return a boolean: <text>``.
    """
    result = evaluate(text, activation)
    if not isinstance(result, celtypes.BoolType | bool):
        raise CelError(f"CEL expression did not return a boolean: {text}")
    return bool(result)


# -- messages -> CEL values ------------------------------------------------------------------

_INT_TYPES = {
    _FD.TYPE_INT32,
    _FD.TYPE_INT64,
    _FD.TYPE_SINT32,
    _FD.TYPE_SINT64,
    _FD.TYPE_SFIXED32,
    _FD.TYPE_SFIXED64,
    _FD.TYPE_ENUM,
}
_UINT_TYPES = {_FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_FIXED32, _FD.TYPE_FIXED64}
#: The well-known wrapper types (``google.protobuf.*Value``): CEL reads them as their value or null.
WRAPPERS = {
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
}


def json_to_cel(value: Any) -> Any:
    """A JSON-shaped Python value (from a Struct) as a CEL value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, Mapping):
        return celtypes.MapType({celtypes.StringType(k): json_to_cel(v) for k, v in value.items()})
    return celtypes.ListType([json_to_cel(v) for v in value])


def _scalar(fd: _d.FieldDescriptor, value: Any) -> Any:
    t = fd.type
    if t in _INT_TYPES:
        return celtypes.IntType(value)
    if t in _UINT_TYPES:
        return celtypes.UintType(value)
    if t in (_FD.TYPE_DOUBLE, _FD.TYPE_FLOAT):
        return celtypes.DoubleType(value)
    if t == _FD.TYPE_BOOL:
        return celtypes.BoolType(value)
    if t == _FD.TYPE_STRING:
        return celtypes.StringType(value)
    if t == _FD.TYPE_BYTES:
        return celtypes.BytesType(value)
    return message_to_cel(value)


def message_to_cel(msg: Message) -> Any:
    """A protobuf message as a CEL value (see the module docstring for the shape)."""
    desc = msg.DESCRIPTOR
    full = desc.full_name
    if full == "google.protobuf.Struct":
        return json_to_cel(_struct_json(msg))
    if full == "google.protobuf.Value":
        return json_to_cel(_value_json(msg))
    if full == "google.protobuf.ListValue":
        return json_to_cel([_value_json(v) for v in msg.values])
    if full in WRAPPERS:
        return _scalar(desc.fields_by_name["value"], msg.value)
    if full == "google.protobuf.Timestamp":
        ts = datetime.datetime.fromtimestamp(msg.seconds, tz=datetime.UTC) + datetime.timedelta(
            microseconds=msg.nanos // 1000
        )
        return celtypes.TimestampType(ts)
    if full == "google.protobuf.Duration":
        return celtypes.DurationType(seconds=msg.seconds, nanos=msg.nanos)
    out: dict[Any, Any] = {}
    for fd in desc.fields:
        name = celtypes.StringType(fd.name)
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            kfd = fd.message_type.fields_by_name["key"]
            out[name] = celtypes.MapType(
                {_scalar(kfd, k): _scalar(vfd, v) for k, v in value.items()}
            )
        elif fd.is_repeated:
            out[name] = celtypes.ListType([_scalar(fd, v) for v in value])
        elif fd.has_presence:
            if msg.HasField(fd.name):
                out[name] = _scalar(fd, value)
        else:
            out[name] = _scalar(fd, value)
    return celtypes.MapType(out)


# -- messages -> cel-cpp's plain values, deferred ---------------------------------------------
#
# The plain form of message_to_cel(msg) (what celenv._plain makes of it), built straight from
# the message by a per-type plan: a ~1 KB message costs about as much to convert to CEL values
# as a whole step's expressions cost to evaluate, and cel-cpp needs only the plain form.

_K_INT, _K_BOOL, _K_STR, _K_BYTES, _K_MSG, _K_OTHER = range(6)
_M_ALWAYS, _M_PRESENCE, _M_REPEATED, _M_MAP = range(4)
#: Well-known types message_to_cel converts specially, not field by field.
_SPECIAL = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    *WRAPPERS,
}
#: Types whose CEL conversion can fail on a value (a Timestamp or Duration out of range).
_FALLIBLE = {"google.protobuf.Timestamp", "google.protobuf.Duration"}


def _kind(fd: _d.FieldDescriptor) -> int:
    t = fd.type
    if t in _INT_TYPES:
        return _K_INT
    if t == _FD.TYPE_BOOL:
        return _K_BOOL
    if t == _FD.TYPE_STRING:
        return _K_STR
    if t == _FD.TYPE_BYTES:
        return _K_BYTES
    if t in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
        return _K_MSG
    return _K_OTHER  # uint, double, float: cel-cpp would read them differently


class _PlainPlan:
    """How to read one message type into plain values; ``deferrable``: its CEL conversion
    cannot fail (no Timestamp or Duration is reachable), so it may run late."""

    __slots__ = ("deferrable", "descriptor", "fields", "special")

    def __init__(self, descriptor: _d.Descriptor) -> None:
        self.descriptor = descriptor
        self.special = descriptor.full_name in _SPECIAL
        #: (name, mode, kind): kind is (key kind, value kind) for a map
        fields: list[tuple[str, int, Any]] = []
        for fd in descriptor.fields:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                entry = fd.message_type
                kind = (_kind(entry.fields_by_name["key"]), _kind(entry.fields_by_name["value"]))
                fields.append((fd.name, _M_MAP, kind))
            elif fd.is_repeated:
                fields.append((fd.name, _M_REPEATED, _kind(fd)))
            elif fd.has_presence:
                fields.append((fd.name, _M_PRESENCE, _kind(fd)))
            else:
                fields.append((fd.name, _M_ALWAYS, _kind(fd)))
        self.fields = tuple(fields)
        self.deferrable = not _reaches(descriptor, _FALLIBLE)


def _reaches(descriptor: _d.Descriptor, names: set[str]) -> bool:
    """Whether a message of ``descriptor`` can hold a message of one of ``names``."""
    seen: set[str] = set()
    stack = [descriptor]
    while stack:
        d = stack.pop()
        if d.full_name in names:
            return True
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        stack.extend(fd.message_type for fd in d.fields if fd.message_type is not None)
    return False


_plain_plans: dict[int, _PlainPlan] = {}
_plain_plans_lock = threading.Lock()


def _plain_plan(descriptor: _d.Descriptor) -> _PlainPlan:
    plan = _plain_plans.get(id(descriptor))
    # The plan holds its descriptor, so an id in the map is not recycled while it is there;
    # the identity check is for the map being cleared and refilled between get and use.
    if plan is not None and plan.descriptor is descriptor:
        return plan
    plan = _PlainPlan(descriptor)
    with _plain_plans_lock:
        if len(_plain_plans) > celenv.PROGRAM_CACHE_SIZE:
            _plain_plans.clear()
        _plain_plans[id(descriptor)] = plan
    return plan


def _plain_scalar(kind: int, value: Any) -> Any:
    if kind == _K_STR:
        if "\x00" in value:
            raise celenv.Unrepresentable("string with NUL")  # cel-cpp reads C strings
        return value
    if kind == _K_INT or kind == _K_BOOL:
        return value
    if kind == _K_MSG:
        return message_to_plain(value)
    if kind == _K_BYTES:
        if b"\x00" in value:
            raise celenv.Unrepresentable("bytes with NUL")
        return value
    raise celenv.Unrepresentable("uint or double")


def message_to_plain(msg: Message) -> dict[str, Any]:
    """``message_to_cel(msg)`` as the plain values cel-cpp reads, without CEL values.

    :raises celenv.Unrepresentable: the message holds a value cel-cpp could read differently
        (a uint, a double, a NUL in a string, a well-known type): cel-python answers.
    """
    plan = _plain_plan(msg.DESCRIPTOR)
    if plan.special:
        full = plan.descriptor.full_name
        if full in WRAPPERS:
            return _plain_scalar(_kind(plan.descriptor.fields_by_name["value"]), msg.value)
        if full == "google.protobuf.Struct":
            return celenv.json_plain(_struct_json(msg))
        if full == "google.protobuf.Value":
            return celenv.json_plain(_value_json(msg))
        if full == "google.protobuf.ListValue":
            return celenv.json_plain([_value_json(v) for v in msg.values])
        raise celenv.Unrepresentable(full)  # a timestamp or duration
    out: dict[str, Any] = {}
    for name, mode, kind in plan.fields:
        value = getattr(msg, name)
        if mode == _M_ALWAYS:
            out[name] = _plain_scalar(kind, value)
        elif mode == _M_REPEATED:
            out[name] = [_plain_scalar(kind, v) for v in value]
        elif mode == _M_PRESENCE:
            if msg.HasField(name):
                out[name] = _plain_scalar(kind, value)
        else:
            kk, vk = kind
            out[name] = {_plain_scalar(kk, k): _plain_scalar(vk, v) for k, v in value.items()}
    return out


def bind_message(msg: Message) -> Any:
    """``msg`` as an activation value: a :class:`celenv.Deferred` (converted only if an
    expression reads it, and only as the tier that answers needs it), or, for a type whose CEL
    conversion can fail (it reaches a Timestamp or Duration), ``message_to_cel(msg)`` now, so
    a failure surfaces where it always did.
    """
    if _plain_plan(msg.DESCRIPTOR).deferrable:
        return celenv.Deferred(msg, message_to_cel, message_to_plain)
    return message_to_cel(msg)


def _value_json(v: Message) -> Any:
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return None
    if kind == "number_value":
        return v.number_value
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return _struct_json(v.struct_value)
    return [_value_json(x) for x in v.list_value.values]


def _struct_json(s: Message) -> dict[str, Any]:
    return {k: _value_json(s.fields[k]) for k in s.fields}


def from_cel(value: Any) -> Any:
    """A CEL result as a plain Python value (bool, int, float, str, bytes, list, dict, None,
    datetime, timedelta); messages never come back from cel-python."""
    if value is None:
        return None
    if isinstance(value, celtypes.BoolType | bool):
        return bool(value)
    if isinstance(value, celtypes.UintType):
        return _Unsigned(int(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, datetime.datetime | datetime.timedelta):
        return value
    if isinstance(value, Mapping):
        return {from_cel(k): from_cel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [from_cel(v) for v in value]
    return value


class _Unsigned(int):
    """An unsigned CEL int, so conversions can tell ``1u`` from ``1``."""
