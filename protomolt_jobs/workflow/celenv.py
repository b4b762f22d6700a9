"""The process-wide CEL environment (cel-python) and its compiled-program cache.

cel-python keeps parser state class-wide, and mixing runner classes in one process breaks
``program()`` (LIBRARIES.md section 2), so every CEL user in protomolt-jobs (validation rules,
the workflow engine's gates and mapping rules, the submit rule) compiles through this module:
one :class:`celpy.Environment` whose parser makes the transpiler's trees, one
:class:`Program` per expression text. Activations are dicts of CEL values (see :func:`to_cel`).

**Compiled evaluation** (DESIGN.md section 17). cel-python's interpreter walks the parse tree
on every evaluation (0.25-2 ms). A :class:`Program` answers in three tiers, fastest first:

1. **cel-cpp** (Google's runtime, the ``cel-expr-python`` wrapper; LIBRARIES.md section 2):
   the expression compiled once per set of activation names, evaluated over plain Python
   values in ~5-10 microseconds. It answers only where it cannot differ from cel-python: the
   activation holds strings, ints, bools, bytes, lists and maps (no doubles, uints or times),
   the text has no double or uint literal or conversion (cel-cpp compares an int with a
   double, which cel-python 0.5 refuses), no ``matches`` (RE2 against Python's ``re``) and
   no time functions, and the result is a value (an error, a timestamp
   or a type goes to the next tier). ``tests/unit/test_celenv.py`` checks its answers
   against the interpreter's on generated activations.
2. **cel-python's transpiled code** (the ``CompiledRunner``'s Python, 4-7x faster than the
   interpreter) for what cel-cpp does not answer.
3. **cel-python's interpreter** when that fails, for the exact verdict and error text.

Two things of ``CompiledRunner`` itself are not usable as they are:

- its ``evaluate`` runs the code in the *module globals* of ``celpy.evaluation`` and stores
  the activation there, so two threads evaluating at once would read each other's
  activations; a Program runs the same code object in a globals dict of its own thread;
- its errors lose the interpreter's text (every failure reads ``evaluation error``) and it
  logs each one at ERROR. So when the compiled code fails (an evaluation error, or an
  expression the transpiler cannot handle), the Program evaluates the same parse tree with
  cel-python's interpreter, which gives the verdict and the error text exactly as before.
  Failing evaluations are rare on the hot path (a gate or rule that errors fails the step);
  every successful one is compiled.

**Deferred values.** An activation may bind a name to a :class:`Deferred` instead of a CEL
value: its source (a message, a JSON document) is turned into cel-cpp's plain values, or into
cel-python's CEL values, only when an expression reads the name and only in the form the tier
that answers needs, once per Deferred. A workflow step binds every earlier message and
``target``, and a ~1 KB message costs more to convert than the expression costs to evaluate.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import celpy
import celpy.evaluation
from celpy import celtypes
from celpy.evaluation import CELEvalError

import protomolt_jobs
from protomolt_jobs.errors import ProtomoltJobsError

try:  # Google's cel-cpp (cel-expr-python): the fast path; without it, cel-python's own code
    from cel_expr_python import cel as _cx
    from cel_expr_python.ext import ext_strings as _cx_strings
except ImportError:  # pragma: no cover - a dependency; the slower paths still answer
    _cx = None
    _cx_strings = None

log = logging.getLogger("protomolt_jobs.workflow.celenv")

_lock = threading.Lock()
_env: celpy.Environment | None = None

#: Distinct expression texts kept compiled. Rules come from schemas, so the set is small.
PROGRAM_CACHE_SIZE = 4096


class CelCompileError(ProtomoltJobsError, ValueError):
    """A CEL expression does not parse or compile.

    :ivar expression: the expression text.
    :ivar detail: cel-python's description of the problem.
    """

    def __init__(self, expression: str, detail: str) -> None:
        self.expression = expression
        self.detail = detail
        super().__init__(f'CEL expression "{expression}" does not compile: {detail}')


def environment() -> celpy.Environment:
    """Return the process-wide :class:`celpy.Environment` (built on first use, ~100 ms).

    Its runner class is ``CompiledRunner``, so the parser makes the transpiler's tree nodes
    (the class-wide choice LIBRARIES.md section 2 warns about); the interpreter reads those
    trees too. Build programs with :func:`program` or :class:`Program`, never ``program()``
    on this environment (its runner is not thread-safe).
    """
    global _env
    if _env is None:
        with _lock:
            if _env is None:
                _env = celpy.Environment(runner_class=celpy.CompiledRunner)
    return _env


_local = threading.local()


def _globals() -> dict[str, Any]:
    """This thread's globals for compiled code: ``celpy.evaluation``'s names (the transpiled
    code calls ``celpy.evaluation.*``, ``celpy.celtypes.*``, ``operator.*``) and the
    ``protomolt_jobs`` package (custom functions are called by their module path)."""
    g = getattr(_local, "globals", None)
    if g is None:
        g = dict(celpy.evaluation.__dict__)
        g["protomolt_jobs"] = protomolt_jobs
        _local.globals = g
    return g


class Program:
    """One compiled CEL expression (see the module doc): ``evaluate(activation)`` runs the
    transpiled code, and on a failure the interpreter for the exact verdict and message.

    :param ast: the expression's parse tree (``environment().compile(text)``).
    :param functions: extra functions by name (e.g. the strings extension); they must be
        module-level functions (the transpiled code calls them by module path).
    :ivar ast: the parse tree.
    """

    __slots__ = ("_base", "_code", "_fast", "_functions", "_interpreted", "ast", "text")

    def __init__(
        self, ast: Any, functions: dict[str, Any] | None = None, *, text: str | None = None
    ) -> None:
        self.ast = ast
        self.text = text
        self._functions = functions
        self._interpreted: celpy.Runner | None = None
        #: cel-cpp programs by the activation's names (None: cel-cpp cannot compile it).
        self._fast: dict[tuple[str, ...], Any] = {}
        try:
            runner = celpy.CompiledRunner(environment(), ast, functions)
            self._code: Any = runner.tp.executable_code
            self._base: Any = runner.tp.base_activation
        except Exception:  # noqa: BLE001 - a construct the transpiler cannot handle: interpret
            self._code = None
            self._base = None

    def evaluate(self, activation: dict[str, Any]) -> Any:
        """Evaluate over ``activation`` (names -> CEL values or :class:`Deferred` values).

        :returns: the CEL value.
        :raises CELEvalError: as cel-python's interpreter does (it may also return one).
        """
        if _cx is not None and self.text is not None:
            value = self._evaluate_fast(activation)
            if value is not _NO_ANSWER:
                return value
        activation = {n: v.cel() if type(v) is Deferred else v for n, v in activation.items()}
        if self._code is not None:
            g = _globals()
            act = self._base.clone()
            act.identifiers.load_values(activation)
            g["base_activation"] = act
            try:
                exec(self._code, g)  # noqa: S102 - cel-python's transpiled expression
                value = g["CEL"]
            except Exception:  # noqa: BLE001 - the interpreter gives the verdict below
                value = None
            else:
                if not isinstance(value, CELEvalError):
                    return value
            finally:
                g["base_activation"] = g["CEL"] = None
        return self._interpreter().evaluate(activation)

    def _evaluate_fast(self, activation: dict[str, Any]) -> Any:
        """cel-cpp over plain values; ``_NO_ANSWER`` when it cannot answer exactly as
        cel-python would (an error, a value kind it does not take or give back)."""
        names = tuple(activation)
        entry = self._fast.get(names, _NO_ANSWER)
        if entry is _NO_ANSWER:
            # Only the names the text mentions are declared and converted: a gate's
            # activation carries the input and every earlier step, validation adds ``now``.
            text = self.text
            assert text is not None  # only called when there is a text (see evaluate)
            used = tuple(n for n in names if re.search(rf"\b{re.escape(n)}\b", text))
            expr = _cx_compile(text, used, strings=self._functions is not None)
            entry = None if expr is None else (expr, used)
            self._fast[names] = entry
        if entry is None:
            return _NO_ANSWER
        expr, used = entry
        try:
            if len(used) == 1:
                # One name read (a gate over the input, a selector over one step, a message
                # rule over ``this``): a deferred value keeps its cel-cpp activation, so its
                # plain value is converted into cel-cpp once, not once per expression.
                n = used[0]
                v = activation[n]
                if type(v) is Deferred:
                    act = v.cx_activation(n)
                    if act is not None:
                        return _from_cx(expr.eval(activation=act))
            data = {}
            for n in used:
                v = activation[n]
                data[n] = v.plain() if type(v) is Deferred else _plain(v)
        except Unrepresentable:
            return _NO_ANSWER
        return _from_cx(expr.eval(data=data))

    def _interpreter(self) -> celpy.Runner:
        runner = self._interpreted
        if runner is None:
            runner = celpy.InterpretedRunner(environment(), self.ast, self._functions)
            self._interpreted = runner
        return runner


@lru_cache(maxsize=PROGRAM_CACHE_SIZE)
def program(text: str) -> Program:
    """Compile ``text`` once and return its :class:`Program`; later calls hit the cache.

    :param text: a CEL expression.
    :returns: a program whose ``evaluate(activation: dict[str, CEL value])`` gives a CEL value.
    :raises CelCompileError: when ``text`` is not a valid CEL expression.
    """
    if not isinstance(text, str) or not text.strip():
        raise CelCompileError(str(text), "the expression is empty")
    env = environment()
    try:
        # The Lark parser is shared class-wide; compile under the lock.
        with _lock:
            ast = env.compile(text)
    except celpy.CELParseError as exc:
        raise CelCompileError(text, _parse_detail(exc)) from exc
    except Exception as exc:  # cel-python raises assorted types for unsupported syntax
        raise CelCompileError(text, f"{type(exc).__name__}: {exc}") from exc
    return Program(ast, text=text)


# -- the fast path: cel-cpp (cel-expr-python) over plain values ---------------------------------

_NO_ANSWER = object()
_cx_envs: dict[tuple[tuple[str, ...], bool], Any] = {}


class Unrepresentable(ProtomoltJobsError):
    """An activation value cel-cpp would read differently from cel-python (uint, time): raised
    by the plain conversions (a :class:`Deferred`'s ``to_plain`` too); cel-python answers."""


_UNSET = object()


class Deferred:
    """An activation value converted on first use (see the module doc).

    ``to_cel(source)`` must give the CEL value cel-python evaluates over; ``to_plain(source)``
    the plain value cel-cpp reads the same way (``to_plain(s) == plain of to_cel(s)``), or
    raise :class:`Unrepresentable`. Each runs at most once. ``to_cel`` runs only when
    cel-python answers, so it must not fail where an eager conversion would have reported an
    error earlier (callers defer only sources whose conversion cannot fail).

    :param source: what is converted (a message, a JSON document).
    :param reads: how many expressions are known to read it (validation's message rules):
        from two on, the first read already builds its cel-cpp activation.
    """

    __slots__ = ("_cel", "_cx_act", "_eager", "_plain", "_to_cel", "_to_plain", "source")

    def __init__(
        self,
        source: Any,
        to_cel: Callable[[Any], Any],
        to_plain: Callable[[Any], Any],
        *,
        reads: int = 1,
    ) -> None:
        self.source = source
        self._to_cel = to_cel
        self._to_plain = to_plain
        self._cel: Any = _UNSET
        self._plain: Any = _UNSET
        self._cx_act: tuple[str, Any] | None = None
        self._eager = reads > 1

    def cel(self) -> Any:
        """The CEL value (converted once)."""
        value = self._cel
        if value is _UNSET:
            value = self._cel = self._to_cel(self.source)
        return value

    def cx_activation(self, name: str) -> Any:
        """A cel-cpp activation binding ``name`` to :meth:`plain`, from the second read under
        that name on (None the first time: building one costs about what it saves on one
        evaluation), or from the first when more reads are known to come (``reads``). A
        cel-cpp activation serves any expression, whichever environment compiled it.

        :raises Unrepresentable: as :meth:`plain`.
        """
        held = self._cx_act
        if (held is not None and held[0] == name) or (held is None and self._eager):
            act = held[1] if held is not None else None
            if act is None:
                act = _cx_bare_env().Activation({name: self.plain()})
                self._cx_act = (name, act)
            return act
        self._cx_act = (name, None)
        return None

    def plain(self) -> Any:
        """The plain value for cel-cpp (converted once).

        :raises Unrepresentable: cel-cpp could read it differently (every call).
        """
        value = self._plain
        if value is _UNSET:
            try:
                value = self._to_plain(self.source)
            except Unrepresentable:
                self._plain = _NO_ANSWER
                raise
            self._plain = value
        elif value is _NO_ANSWER:
            raise Unrepresentable("not representable for cel-cpp")
        return value


def deferred_json(value: Any, *, reads: int = 1) -> Deferred:
    """A JSON-shaped value (as :func:`to_cel` takes) bound lazily: :func:`to_cel` for
    cel-python, :func:`json_plain` for cel-cpp (``reads``: as :class:`Deferred`)."""
    return Deferred(value, to_cel, json_plain, reads=reads)


#: Texts cel-cpp could answer differently from cel-python 0.5: double or uint literals and
#: conversions (cel-cpp compares an int with a double, which cel-python refuses), regular
#: expressions (RE2 against Python's ``re``: ``\\d``, ``$`` before a newline), and time
#: (time zones, ``getHours()`` and friends).
_DIVERGENT = re.compile(
    r"\d\.\d|\.\d|\d[eE][+-]?\d|\d[uU]\b|\b(?:double|uint|timestamp|duration)\s*\("
    r"|\bmatches\s*\(|\.get[A-Z]\w*\s*\("
)


_cx_bare: Any = None


def _cx_bare_env() -> Any:
    """A cel-cpp environment without declarations, for activations (see ``cx_activation``)."""
    global _cx_bare
    env = _cx_bare
    if env is None:
        with _lock:
            if _cx_bare is None:
                _cx_bare = _cx.NewEnv()
            env = _cx_bare
    return env


def _cx_compile(text: str, names: tuple[str, ...], *, strings: bool) -> Any:
    """The cel-cpp program of ``text`` with ``names`` declared dynamic; None when cel-cpp
    refuses it or could answer differently (cel-python then answers, with its messages)."""
    if _DIVERGENT.search(text):
        return None
    key = (names, strings)
    env = _cx_envs.get(key)
    if env is None:
        with _lock:
            env = _cx_envs.get(key)
            if env is None:
                env = _cx.NewEnv(
                    variables={n: _cx.Type.DYN for n in names},
                    extensions=[_cx_strings.ExtStrings()] if strings else [],
                )
                if len(_cx_envs) > PROGRAM_CACHE_SIZE:
                    _cx_envs.clear()
                _cx_envs[key] = env
    try:
        return env.compile(text)
    except Exception:  # noqa: BLE001 - cel-cpp rejects it (syntax, an unknown function, ...)
        return None


def _plain(value: Any) -> Any:
    """A CEL value (celpy types) as the plain Python value cel-cpp reads the same way."""
    if value is None:
        return None
    kind = type(value)
    if kind is celtypes.StringType or kind is str:
        if "\x00" in value:
            # cel-expr-python reads strings as C strings: "a\x00b" would be "a" there.
            raise Unrepresentable("string with NUL")
        return str(value)
    if kind is celtypes.BoolType or kind is bool:
        return bool(value)
    if kind is celtypes.IntType or kind is int:
        return int(value)
    if kind is celtypes.MapType or kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is celtypes.ListType or kind is list:
        return [_plain(v) for v in value]
    if kind is celtypes.BytesType or kind is bytes:
        if b"\x00" in value:
            raise Unrepresentable("bytes with NUL")  # C strings there too, as above
        return bytes(value)
    # Doubles (cel-cpp compares an int with a double where cel-python 0.5 fails: CEL's
    # heterogeneous numbers), uints (cel-cpp would read an int64), timestamps, durations,
    # types: cel-python answers.
    raise Unrepresentable(kind.__name__)


def json_plain(value: Any) -> Any:
    """The plain value of ``to_cel(value)`` for cel-cpp, built without CEL values (the same as
    ``_plain(to_cel(value))``).

    :raises Unrepresentable: a double, a NUL in a string or bytes, an int outside int64, or a
        value :func:`to_cel` does not take (cel-python then converts and answers).
    """
    kind = type(value)  # exact JSON types first (MessageToDict's output), isinstance below
    if kind is str:
        if "\x00" in value:
            raise Unrepresentable("string with NUL")
        return value
    if kind is dict:
        return {json_plain(k): json_plain(v) for k, v in value.items()}
    if kind is list:
        return [json_plain(v) for v in value]
    if kind is bool or value is None:
        return value
    if kind is int and -(2**63) <= value < 2**63:
        return value
    if isinstance(value, bytes | bytearray):
        if b"\x00" in value:
            raise Unrepresentable("bytes with NUL")
        return bytes(value)
    if isinstance(value, dict):
        return {json_plain(k): json_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_plain(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float):
        raise Unrepresentable("double")
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise Unrepresentable("int out of range")  # to_cel raises; cel-python reports it
        return int(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise Unrepresentable("string with NUL")
        return str(value)
    raise Unrepresentable(type(value).__name__)


def _cx_int(value: int) -> celtypes.IntType:
    # cel-cpp's ints are int64 already: IntType(value) would check the range again through a
    # decorator it builds per call (~6 microseconds, more than the evaluation).
    return int.__new__(celtypes.IntType, value)


_CX_FALSE, _CX_TRUE = celtypes.BoolType(False), celtypes.BoolType(True)


def _cx_bool(value: bool) -> celtypes.BoolType:
    # Gates, filters and message rules answer a bool: the two CEL bools are made once
    # (BoolType's ``__new__`` is Python code, about a microsecond per call).
    return _CX_TRUE if value else _CX_FALSE


#: cel-cpp result kinds by name (one ``name()`` call is cheaper than a chain of Type ``==``).
_FROM_CX_BY_NAME: dict[str, Callable[[Any], Any]] = {
    "BOOL": _cx_bool,
    "STRING": celtypes.StringType,
    "INT": _cx_int,
}


def _from_cx(result: Any) -> Any:
    """A cel-cpp result as the CEL value cel-python would give, or ``_NO_ANSWER``."""
    kind = result.type()
    convert = _FROM_CX_BY_NAME.get(kind.name())
    if convert is not None:
        return convert(result.value())
    if kind == _cx.Type.BOOL:
        return celtypes.BoolType(result.value())
    if kind == _cx.Type.STRING:
        return celtypes.StringType(result.value())
    if kind == _cx.Type.INT:
        return _cx_int(result.value())
    if kind == _cx.Type.DOUBLE:
        return celtypes.DoubleType(result.value())
    if kind == _cx.Type.UINT:
        return celtypes.UintType(result.value())
    if kind == _cx.Type.BYTES:
        return celtypes.BytesType(bytes(result.value()))
    if kind == _cx.Type.NULL:
        return None
    name = kind.name()
    if name.startswith(("list", "map", "LIST", "MAP")):
        try:
            return to_cel(_plain_result(result.plain_value()))
        except (ValueError, TypeError):
            return _NO_ANSWER
    # errors (cel-python gives the verdict and its message), timestamps, types, messages
    return _NO_ANSWER


def _plain_result(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {_plain_result(k): _plain_result(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_result(v) for v in value]
    if isinstance(value, bool | int | float | str | bytes) or value is None:
        return value
    raise TypeError(type(value).__name__)


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
