"""The process-wide CEL environment (cel-python) and its compiled-program cache.

cel-python keeps parser state class-wide, and mixing runner classes in one process breaks
``program()`` (LIBRARIES.md section 2), so every CEL user in protomolt-jobs (validation rules,
the workflow engine's gates and mapping rules) compiles through this module: one
:class:`celpy.Environment` with the default ``InterpretedRunner``, one program per expression
text. Activations are dicts of CEL values (see :func:`to_cel`).
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes

log = logging.getLogger("protomolt_jobs.workflow.celenv")

_lock = threading.Lock()
_env: celpy.Environment | None = None

#: Distinct expression texts kept compiled. Rules come from schemas, so the set is small.
PROGRAM_CACHE_SIZE = 4096


class CelCompileError(ValueError):
    """A CEL expression does not parse or compile.

    :ivar expression: the expression text.
    :ivar detail: cel-python's description of the problem.
    """

    def __init__(self, expression: str, detail: str) -> None:
        self.expression = expression
        self.detail = detail
        super().__init__(f'CEL expression "{expression}" does not compile: {detail}')


def environment() -> celpy.Environment:
    """Return the process-wide :class:`celpy.Environment` (built on first use, ~100 ms)."""
    global _env
    if _env is None:
        with _lock:
            if _env is None:
                _env = celpy.Environment()
    return _env


@lru_cache(maxsize=PROGRAM_CACHE_SIZE)
def program(text: str) -> celpy.Runner:
    """Compile ``text`` once and return its runner; later calls hit the cache.

    :param text: a CEL expression.
    :returns: a runner whose ``evaluate(activation: dict[str, CEL value])`` gives a CEL value.
    :raises CelCompileError: when ``text`` is not a valid CEL expression.
    """
    if not isinstance(text, str) or not text.strip():
        raise CelCompileError(str(text), "the expression is empty")
    env = environment()
    try:
        # The Lark parser is shared class-wide; compile under the lock.
        with _lock:
            ast = env.compile(text)
            return env.program(ast)
    except celpy.CELParseError as exc:
        raise CelCompileError(text, _parse_detail(exc)) from exc
    except Exception as exc:  # cel-python raises assorted types for unsupported syntax
        raise CelCompileError(text, f"{type(exc).__name__}: {exc}") from exc


def _parse_detail(exc: Exception) -> str:
    """cel-python renders a parse error as the text and a caret line; name the column."""
    lines = str(exc).splitlines()
    for line in lines[1:]:
        if line.strip() == "^":
            return f"syntax error at column {line.index('^') + 1}"
    return lines[0] if lines else type(exc).__name__


def to_cel(value: Any) -> celtypes.Value:
    """Convert a JSON-shaped Python value (dict, list, str, int, float, bool, None, bytes).

    :raises ValueError: for a value cel-python cannot represent.
    """
    if isinstance(value, bytes | bytearray):
        return celtypes.BytesType(bytes(value))
    if isinstance(value, dict):
        return celtypes.MapType({to_cel(k): to_cel(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return celtypes.ListType([to_cel(v) for v in value])
    try:
        return celpy.json_to_cel(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot convert {type(value).__name__} to a CEL value") from exc
