"""Bare type names in ``sources`` schemas, resolved the way upstream's compiler resolves them.

protoc looks a type name up scope by scope, starting inside the service, so in

    package jobs.test;
    message Review { ... }
    service ReviewDesk { rpc Review(Text) returns (Review); }

``Review`` finds the method ``jobs.test.ReviewDesk.Review`` first and the file is refused
("\\"Review\\" is not a message type"). The Java ProtoMolt's compiler looks for types only and
compiles the file. So before the text reaches protoc, every bare (undotted) request or response
type of an ``rpc`` that names a top-level message of the file's own package (declared in any of
the ``sources`` files of that package) is written fully qualified (``.jobs.test.Review``).
Nothing else changes: a name that is dotted, or not a top-level message of the package, is left
to protoc. Line breaks are kept, so the line numbers in protoc's error messages still point
into the caller's text (a column after a rewritten name on the same line moves).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["qualify_rpc_types"]

#: Comments and string literals: blanked before scanning (so braces and keywords inside them
#: do not count), never rewritten.
_OPAQUE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.DOTALL)
_PACKAGE = re.compile(r"\bpackage\s+([A-Za-z_][\w.]*)\s*;")
_DECL = re.compile(r"\b(message|service)\s+([A-Za-z_]\w*)\s*\{")
_RPC = re.compile(
    r"\brpc\s+[A-Za-z_]\w*\s*\(\s*(?:stream\s+)?(?P<req>\.?[A-Za-z_][\w.]*)\s*\)"
    r"\s*returns\s*\(\s*(?:stream\s+)?(?P<resp>\.?[A-Za-z_][\w.]*)\s*\)"
)


def _blank(text: str) -> str:
    """``text`` with comments and strings replaced by spaces (newlines kept): same offsets."""
    return _OPAQUE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _top_level(blank: str) -> list[tuple[str, str, int, int]]:
    """``(kind, name, body_start, body_end)`` of the messages and services at depth 0."""
    found = []
    depth = 0
    pos = 0
    opens: list[tuple[int, tuple[str, str, int] | None]] = []
    decls = {m.end() - 1: (m.group(1), m.group(2), m.end()) for m in _DECL.finditer(blank)}
    for pos, ch in enumerate(blank):
        if ch == "{":
            opens.append((depth, decls.get(pos)))
            depth += 1
        elif ch == "}" and opens:
            depth -= 1
            outer, decl = opens.pop()
            if outer == 0 and decl is not None:
                found.append((decl[0], decl[1], decl[2], pos))
    return found


def qualify_rpc_types(sources: Mapping[str, str]) -> dict[str, str]:
    """Rewrite bare rpc request/response types that name a top-level message of the file's
    package into fully qualified names (see the module doc).

    :param sources: file path -> proto text.
    :returns: a new mapping with the same keys; texts needing no change are returned as given.
    """
    blanks = {name: _blank(text) for name, text in sources.items()}
    packages: dict[str, str] = {}
    messages: dict[str, set[str]] = {}
    shapes: dict[str, list[tuple[str, str, int, int]]] = {}
    for name, blank in blanks.items():
        match = _PACKAGE.search(blank)
        package = match.group(1) if match else ""
        packages[name] = package
        shapes[name] = _top_level(blank)
        messages.setdefault(package, set()).update(
            n for kind, n, _, _ in shapes[name] if kind == "message"
        )
    out: dict[str, str] = {}
    for name, text in sources.items():
        package = packages[name]
        known = messages.get(package, set())
        edits: list[tuple[int, int, str]] = []
        for kind, _, start, end in shapes[name]:
            if kind != "service":
                continue
            for rpc in _RPC.finditer(blanks[name], start, end):
                for group in ("req", "resp"):
                    type_name = rpc.group(group)
                    if "." not in type_name and type_name in known:
                        qualified = f".{package}.{type_name}" if package else f".{type_name}"
                        edits.append((rpc.start(group), rpc.end(group), qualified))
        for start, end, replacement in sorted(edits, reverse=True):
            text = text[:start] + replacement + text[end:]
        out[name] = text
    return out
