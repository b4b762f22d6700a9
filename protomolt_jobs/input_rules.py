"""One input rule for every door: what a job's ids, names and free-form JSON may hold.

The verbs (``verbs/``) and the request topic (``kafka/request_consumer.py``) both call these
checks, so a record the verb would refuse is refused on the topic too, with the same
``invalid-input`` message naming the field. Refused:

- text (a string or an object key, at any depth) holding NUL, which PostgreSQL ``text`` and
  ``jsonb`` cannot store, or a lone surrogate (U+D800-U+DFFF), which UTF-8, protobuf and Kafka
  cannot carry;
- numbers that are NaN or infinite (no JSON or ``jsonb`` form);
- integers beyond +-2**53 (:data:`MAX_JSON_INT`): ``google.protobuf.Struct`` holds numbers as
  doubles, so a larger one could not be shown over gRPC; send such values as strings;
- nesting deeper than :data:`MAX_JSON_DEPTH` (protobuf's JSON parser stops near 100);
- anything that is not JSON (a Python object of another type).

Every check raises :class:`~protomolt_jobs.errors.InvalidInput` with ``details.field`` set to
the top-level field it was given; none recurses (deep input cannot exhaust the stack).
"""

from __future__ import annotations

import math
import re
from typing import Any

from protomolt_jobs.errors import InvalidInput

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "check_json",
    "check_text",
    "has_lone_surrogate",
    "invalid",
    "proto_json_path",
    "text_problem",
]

#: Deepest nesting accepted in free-form objects (protobuf's JSON parser stops near 100).
MAX_JSON_DEPTH = 100
#: Largest integer magnitude accepted in free-form objects: exact in a double (``Struct``).
MAX_JSON_INT = 2**53


def invalid(field: str, message: str, path: str | None = None) -> InvalidInput:
    """An ``invalid-input`` error naming ``field`` (``details.field``) and, when given, the
    offending field inside it (``details.path``, e.g. ``txt`` or ``items[0].name``)."""
    details = {"field": field}
    if path:
        details["path"] = path
    return InvalidInput(message, details)


# protobuf's json_format messages: 'Failed to parse <f> field: ...' wraps a nested failure;
# 'Message type "T" has no field named "<f>" at "T.a.b[0]"' is an unknown field.
_FAILED_FIELD = re.compile(r"^Failed to parse (\S+) field: ")
_UNKNOWN_FIELD = re.compile(r'^Message type "[^"]+" has no field named "([^"]*)" at "([^"]*)"')


def proto_json_path(message: str) -> str | None:
    """The path of the field protobuf's JSON parser refused, from its error ``message``
    (``txt``, ``items[0].nme``, ``meta.count``), or None when the message names none.

    Unknown fields carry the full path (``at "Type.items[0]"``); a value of the wrong type
    names each enclosing field (list indexes are not given there)."""
    names: list[str] = []
    rest = message
    while match := _FAILED_FIELD.match(rest):
        names.append(match.group(1))
        rest = rest[match.end() :]
    unknown = _UNKNOWN_FIELD.match(rest)
    if unknown is not None:
        # "at" holds the enclosing path from the root type; a wrapped parse already named it.
        enclosing = unknown.group(2).split(".", 1)[1] if "." in unknown.group(2) else ""
        return ".".join([p for p in (enclosing, unknown.group(1)) if p])
    return ".".join(names) or None


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (U+D800-U+DFFF), which UTF-8 cannot carry.
    The verbs, the request topic and the host's HTTP route all refuse such text."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def text_problem(text: str) -> str | None:
    """What is wrong with ``text`` as stored text (``"must not contain ..."``), or None."""
    if "\x00" in text:
        return "must not contain NUL characters"
    if has_lone_surrogate(text):
        return "must not contain lone surrogates (U+D800-U+DFFF)"
    return None


def check_text(field: str, value: str) -> str:
    """``value`` when it is storable text.

    :raises InvalidInput: ``Field '<field>' must not contain ...``.
    """
    problem = text_problem(value)
    if problem is not None:
        raise invalid(field, f"Field '{field}' {problem}")
    return value


def check_json(field: str, value: Any) -> None:
    """Refuse what JSON, PostgreSQL ``jsonb`` or ``Struct`` cannot hold (see the module).

    :param field: the top-level field ``value`` sits under (named in the error).
    :raises InvalidInput: naming ``field`` and what it holds.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise invalid(field, f"Field '{field}' is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise invalid(field, f"Field '{field}' must be JSON: object keys are strings")
                problem = text_problem(key)
                if problem is not None:
                    raise invalid(field, f"Field '{field}' {problem}")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                raise invalid(field, f"Field '{field}' {problem}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise invalid(field, f"Field '{field}' must hold only finite numbers")
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not -MAX_JSON_INT <= item <= MAX_JSON_INT:
                raise invalid(
                    field,
                    f"Field '{field}' holds an integer beyond +-2**53 ({MAX_JSON_INT}); "
                    "send larger values as strings",
                )
        else:
            raise invalid(field, f"Field '{field}' must be JSON; it holds a {type(item).__name__}")
