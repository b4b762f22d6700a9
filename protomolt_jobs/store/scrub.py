"""Make text storable: PostgreSQL ``text`` and ``jsonb`` refuse some code points.

``text`` cannot hold NUL (U+0000), ``jsonb`` refuses the escape ``\\u0000``, and neither can
hold a lone surrogate (U+D800..U+DFFF: not encodable as UTF-8, so the driver cannot even send
it). A worker's error text, a step name, a verdict or a step's response can carry any of them
(a gRPC status message, a decoded binary field), and a write that fails on them leaves the job
unsettled until the sweeper kills it. So the store replaces each such code point with U+FFFD
REPLACEMENT CHARACTER at the write boundary, in text parameters and recursively in JSON values
(strings and object keys). The replacement is visible on read (the row keeps the rest whole)
and is the same in the row and in the event.

Two keys that differ only in such code points collapse into one after the replacement (the
later one wins, as in a JSON object with a duplicate key).
"""

from __future__ import annotations

import re
from typing import Any, overload

__all__ = ["REPLACEMENT", "needs_scrub", "scrub_json", "scrub_text"]

#: What a refused code point becomes.
REPLACEMENT = "\ufffd"

_REFUSED = re.compile("[\x00\ud800-\udfff]")
# In json.dumps output (ensure_ascii) a refused code point appears as an escape; a match may
# also be an escaped backslash followed by "u0000" (then the walk finds nothing to replace).
_REFUSED_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


@overload
def scrub_text(value: str) -> str: ...
@overload
def scrub_text(value: None) -> None: ...
def scrub_text(value: str | None) -> str | None:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (None stays None)."""
    if value is None or not _REFUSED.search(value):
        return value
    return _REFUSED.sub(REPLACEMENT, value)


def needs_scrub(json_text: str) -> bool:
    """Whether ``json.dumps`` output (ASCII-escaped) may hold a refused code point."""
    return _REFUSED_ESCAPE.search(json_text) is not None


def scrub_json(value: Any) -> Any:
    """A copy of a JSON value with every string and object key passed through
    :func:`scrub_text`; numbers, booleans and null are kept.

    :raises RecursionError: for a value nested deeper than the interpreter's recursion limit.
    """
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrub_text(k) if isinstance(k, str) else k: scrub_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_json(v) for v in value]
    return value
