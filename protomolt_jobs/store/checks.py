"""Argument checks of the store's methods: programming errors of the caller, raised before any
SQL runs, each message naming the field (``"step: must be a non-blank string; got ''"``).

:func:`jsonb` also makes a JSON value storable: it serialises it once, scrubbing what
PostgreSQL refuses (:mod:`~.scrub`).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from protomolt_jobs.store.scrub import needs_scrub, scrub_json

__all__ = [
    "entry_name",
    "jsonb",
    "jsonb_value",
    "non_negative_int",
    "non_negative_seconds",
    "positive_int",
    "positive_seconds",
    "text",
    "uuid",
]


def uuid(field: str, value: Any) -> UUID:
    """``value`` as a UUID (a UUID, or its text).

    :raises ValueError: anything else.
    """
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise ValueError(f"{field}: must be a UUID; got {value!r}")


def text(field: str, value: Any) -> None:
    """:raises ValueError: unless ``value`` is a string with a non-blank character."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field}: must be a non-blank string; got {value!r}")


def positive_int(field: str, value: Any) -> None:
    """:raises ValueError: unless ``value`` is an integer > 0 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}: must be a positive integer; got {value!r}")


def non_negative_int(field: str, value: Any) -> None:
    """:raises ValueError: unless ``value`` is an integer >= 0 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: must be an integer >= 0; got {value!r}")


def positive_seconds(field: str, value: Any) -> None:
    """:raises ValueError: unless ``value`` is a finite number of seconds > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{field}: must be a positive number of seconds; got {value!r}")


def non_negative_seconds(field: str, value: Any) -> None:
    """:raises ValueError: unless ``value`` is a finite number of seconds >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{field}: must be a number of seconds >= 0; got {value!r}")


def entry_name(entry: Any) -> str:
    """The ``name`` of a checkpoint entry.

    :raises TypeError: when ``entry`` is not a JSON object (a dict).
    :raises ValueError: when its ``name`` is not a non-blank string.
    """
    if not isinstance(entry, dict):
        raise TypeError(f"entry: must be a JSON object; got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"entry.name: must be a non-blank string; got {name!r}")
    return name


def jsonb(field: str, value: Any, kind: type) -> Jsonb:
    """``value`` as a ``jsonb`` parameter, serialised now, so a value JSON cannot hold fails
    here with the field's name; strings and keys PostgreSQL refuses (NUL, lone surrogates) are
    scrubbed to U+FFFD first.

    :param kind: the JSON type ``value`` must be (``dict`` or ``list``).
    :raises TypeError: when ``value`` is not a ``kind``.
    :raises ValueError: when it cannot be JSON (NaN, a foreign type, nested too deeply).
    """
    if not isinstance(value, kind):
        raise TypeError(f"{field}: must be a JSON {kind.__name__}; got {type(value).__name__}")
    scrubbed = False
    try:
        encoded = _with_schema_text(value)
        if encoded is None:
            encoded = json.dumps(value, allow_nan=False)
            if needs_scrub(encoded):
                encoded = json.dumps(scrub_json(value), allow_nan=False)
                scrubbed = True
    except RecursionError:
        raise ValueError(f"{field}: not representable as JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}: not representable as JSON: {exc}") from None
    return _Encoded(value, encoded, scrubbed)


class _Encoded(Jsonb):
    """A :func:`jsonb` parameter: its text, and whether scrubbing changed it."""

    __slots__ = ("scrubbed", "text")

    def __init__(self, obj: Any, text: str, scrubbed: bool) -> None:
        super().__init__(obj, dumps=lambda _obj: text)
        self.text = text
        self.scrubbed = scrubbed


def jsonb_value(param: Jsonb) -> Any:
    """The JSON value a :func:`jsonb` parameter stores, as decoding the column's text gives it
    (equal in values; an object's keys in the caller's order, not ``jsonb``'s).

    That is the caller's own object (not a copy) when its text needed no scrub and every part
    of it decodes back to itself (dicts with string keys, lists, strings, ints, bools, None,
    floats written without an exponent, but -0.0); else the parameter's text decoded with its
    numbers as ``jsonb`` prints them (:func:`_as_numeric`), which costs a ``json.loads`` (~22 us
    for a 28 KB definition).

    :raises TypeError: when ``param`` was not made by :func:`jsonb`.
    """
    if not isinstance(param, _Encoded):
        raise TypeError(f"param: a parameter checks.jsonb made; got {type(param).__name__}")
    if not param.scrubbed and _round_trips(param.obj):
        return param.obj
    return json.loads(param.text, parse_float=_as_numeric)


def _as_numeric(text: str) -> float | int:
    """A JSON number with a fraction or exponent as ``jsonb`` gives it back: ``numeric`` keeps
    the digits after the point (``0.5``, ``1.50e1`` -> ``15.0``) and none for an exponent that
    leaves none (``1e+16`` -> ``10000000000000000``, an int), and has no negative zero."""
    exponent = Decimal(text).as_tuple().exponent
    if isinstance(exponent, int) and exponent >= 0:
        return int(Decimal(text))
    value = float(text)
    return value if value else 0.0


def _round_trips(value: Any) -> bool:
    """Whether ``json.loads(json.dumps(value))`` of a JSON-able value, stored as ``jsonb`` and
    read back, equals ``value`` in values and types: a tuple would come back a list, an int
    key a string, ``1e+16`` an int (``jsonb`` prints numbers without exponents), -0.0 0.0."""
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        v = pop()
        kind = type(v)
        if kind is str or kind is int or kind is bool or v is None:
            continue
        if kind is dict:
            for k, item in v.items():
                if type(k) is not str:
                    return False
                push(item)
        elif kind is list:
            stack.extend(v)
        elif kind is float:
            if "e" in repr(v) or (not v and math.copysign(1.0, v) < 0):  # -0.0 reads 0.0
                return False
        else:
            return False
    return True


# -- a workflow definition's descriptor set, escaped once ------------------------------------
#
# A definition with ``"schema": {"descriptorSetBase64": ...}`` carries tens of KB of base64
# that every job of the workflow stores again; JSON-escaping it was most of a submit's
# serialisation (~35 us of ~40 for a 28 KB set). Its JSON text is kept by value (a few
# entries), and the rest of the definition is encoded around an empty placeholder: the text is
# exactly ``json.dumps(value)``, as ``json.dumps`` of an object is its members' texts joined.

#: The shortest ``descriptorSetBase64`` worth keeping (shorter ones are cheap to escape).
_SCHEMA_MIN = 4096
_SCHEMA_TEXTS_MAX = 16
_schema_texts: dict[str, tuple[str, bool]] = {}
_EMPTY_SCHEMA_TEXT = json.dumps({"descriptorSetBase64": ""})


def _with_schema_text(value: Any) -> str | None:
    """``json.dumps(value, allow_nan=False)`` for a definition whose ``schema`` is only a long
    ``descriptorSetBase64`` string; None for anything else, or when either part needs a scrub
    (the caller then encodes the whole value as always)."""
    schema = value.get("schema") if type(value) is dict else None
    if type(schema) is not dict or len(schema) != 1:
        return None
    b64 = schema.get("descriptorSetBase64")
    if type(b64) is not str or len(b64) < _SCHEMA_MIN:
        return None
    rest = json.dumps(
        {k: ({"descriptorSetBase64": ""} if k == "schema" else v) for k, v in value.items()},
        allow_nan=False,
    )
    # Inside a JSON string every quote is escaped, so the placeholder's text occurs once
    # unless another member holds the same object: then encode as always.
    if rest.count(_EMPTY_SCHEMA_TEXT) != 1 or needs_scrub(rest):
        return None
    cached = _schema_texts.get(b64)
    if cached is None:
        text = json.dumps(b64)
        cached = (text, needs_scrub(text))
        if len(_schema_texts) >= _SCHEMA_TEXTS_MAX:
            _schema_texts.clear()
        _schema_texts[b64] = cached
    text, scrub = cached
    if scrub:
        return None
    return rest.replace(_EMPTY_SCHEMA_TEXT, '{"descriptorSetBase64": ' + text + "}")
