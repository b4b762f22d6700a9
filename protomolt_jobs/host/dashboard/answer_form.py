"""The complete-step form of a job page: one input per field of the parked step's answer type,
and the ``response`` object read back from the submitted form."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import descriptor as _d

__all__ = ["answer_from_form", "form_field"]


def form_field(field: _d.FieldDescriptor) -> dict[str, Any]:
    """How one field of the answer type is entered in the form."""
    fd = _d.FieldDescriptor
    kind = "json"
    options: list[str] = []
    if field.is_repeated:
        kind = "json"
    elif field.type == fd.TYPE_BOOL:
        kind = "bool"
    elif field.type == fd.TYPE_STRING:
        kind = "text"
    elif field.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        kind = "number"
    elif field.type in (
        fd.TYPE_INT32,
        fd.TYPE_INT64,
        fd.TYPE_UINT32,
        fd.TYPE_UINT64,
        fd.TYPE_SINT32,
        fd.TYPE_SINT64,
        fd.TYPE_FIXED32,
        fd.TYPE_FIXED64,
        fd.TYPE_SFIXED32,
        fd.TYPE_SFIXED64,
    ):
        kind = "integer"
    elif field.type == fd.TYPE_ENUM:
        kind = "enum"
        options = [v.name for v in field.enum_type.values]
    return {"name": field.json_name, "label": field.name, "kind": kind, "options": options}


def answer_from_form(fields: list[dict[str, Any]], form: dict[str, str]) -> dict[str, Any]:
    """The ``response`` object for complete-step, from the submitted form.

    Values that do not read as their field's kind are passed as the text typed, so the verb,
    not the dashboard, refuses them (with its own ``invalid-input`` message).
    """
    answer: dict[str, Any] = {}
    for field in fields:
        name, kind = field["name"], field["kind"]
        if kind == "bool":
            answer[name] = form.get(name) == "on"
            continue
        raw = form.get(name, "")
        if raw.strip() == "":
            continue
        if kind == "integer":
            try:
                answer[name] = int(raw.strip())
            except ValueError:
                answer[name] = raw
        elif kind == "number":
            try:
                answer[name] = float(raw.strip())
            except ValueError:
                answer[name] = raw
        elif kind == "json":
            try:
                answer[name] = json.loads(raw)
            except (ValueError, RecursionError):  # deep nesting raises RecursionError
                answer[name] = raw
        else:
            answer[name] = raw
    return answer
