"""Static type checking of a workflow's CEL against its descriptors (check-workflow).

The runtime (cel-python over dicts) has no type checker, so an expression such as the gate
``input.missing == 1`` or the selector ``customer.nope`` would only fail when a job runs.
Upstream's verifier compiles every gate, CEL mapping rule and selector with a CEL environment
whose variables are typed as the scope's messages (plus ``target``, the message being built),
and reports the compiler's error. This module does the same with Google's CEL checker
(cel-cpp through ``cel-expr-python``, the runtime DESIGN.md section 17 allows): each scope
name is declared with its message type from the workflow's own descriptor pool.

Finding texts follow upstream's RuleChecker: the compiler's error string (``ERROR:
<input>:1:6: undefined field 'missing'`` plus the source line and a caret), or ``a filter must
be a boolean expression; this is <type>`` for a filter or gate whose type is neither bool nor
dyn. cel-cpp's wording is brought to cel-java's where they differ only in decoration (cel-cpp
adds ``not found in struct '<type>'`` and a status code). Syntax errors and undeclared names
are left to the verifier's own checks, which already report them.

Declared validation rules (a ``validate`` step's output type) are checked as upstream's
ProtoValidator compiles them: message rules with ``this`` typed as the message, field rules
(the field's own ``cel`` and its ``items``/``keys``/``values`` rules) with ``this`` dynamic;
``now`` and ``rule`` are declared for both. A rule whose result can be neither a bool nor a
string is reported as upstream reports it: ``CEL rule must return bool or string, got <type>``.

When the checker is not installed, or cannot build an environment for a pool, every function
here answers "no finding": the trial evaluation in the verifier still runs.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor as _d

try:
    from cel_expr_python import cel as _cx
    from cel_expr_python.ext import ext_strings as _cx_strings
except ImportError:  # pragma: no cover - a dependency; without it nothing is type-checked
    _cx = None
    _cx_strings = None

__all__ = [
    "available",
    "declared_field_rule_error",
    "declared_rule_error",
    "declared_rule_findings",
    "type_error",
]

log = logging.getLogger("protomolt_jobs.workflow.cel_check")

_STATUS = re.compile(r"^\s*[A-Z_]+:\s*(?=ERROR:)")
_STATUS_TAIL = re.compile(r"\s*\[[A-Z_]+\]\s*$")
_STRUCT_TAIL = re.compile(r" not found in struct '[\w.]+'")

#: Errors the verifier's own checks already report in their established wording (a syntax
#: error: "Invalid CEL expression: ..."; an unknown name: "undeclared reference to 'x'").
_LEFT_TO_THE_TRIAL = ("Syntax error", "undeclared reference")

#: A variable declared dynamic (upstream's ``addVar``), not as a message type.
_DYN = "dyn"
#: Result types a validation rule may have (bool passes or fails, string is the message).
_RULE_RESULTS = ("bool", "string", "dyn", "error", "any")

_envs: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()
_ENV_CACHE_SIZE = 256


def available() -> bool:
    """True when the CEL type checker is installed."""
    return _cx is not None


def _pool_of(scope: Mapping[str, _d.Descriptor]) -> Any:
    for desc in scope.values():
        return desc.file.pool
    return None


def _env(pool: Any, variables: tuple[tuple[str, str], ...]) -> Any:
    key = (id(pool), variables)
    with _lock:
        hit = _envs.get(key)
        if hit is not None and hit[0] is pool:
            return hit[1]
    env = _cx.NewEnv(
        pool,
        variables={
            name: _cx.Type.DYN if type_name == _DYN else _cx.Type(type_name)
            for name, type_name in variables
        },
        extensions=[_cx_strings.ExtStrings()],
    )
    with _lock:
        if len(_envs) >= _ENV_CACHE_SIZE:
            _envs.clear()
        _envs[key] = (pool, env)
    return env


def _clean(message: str) -> str:
    text = _STATUS.sub("", message.strip())
    text = _STATUS_TAIL.sub("", text)
    return _STRUCT_TAIL.sub("", text)


def _type_name(t: Any) -> str:
    """cel-cpp's type name (``INT``, ``MAP<STRING, DYN>``) in cel-java's lower case."""
    return str(t).lower()


def _compile(text: str, variables: Mapping[str, _d.Descriptor], *, boolean: bool) -> str | None:
    if _cx is None or not text.strip():
        return None
    pool = _pool_of(variables)
    if pool is None:
        return None
    declared = tuple(sorted((name, desc.full_name) for name, desc in variables.items()))
    try:
        env = _env(pool, declared)
    except Exception as exc:  # noqa: BLE001 - a pool the checker cannot read: no type check
        log.debug("no CEL type check for this pool: %s", exc)
        return None
    try:
        expr = env.compile(text)
    except RuntimeError as exc:
        message = str(exc)
        if any(m in message for m in _LEFT_TO_THE_TRIAL):
            return None
        return _clean(message)
    except Exception as exc:  # noqa: BLE001 - anything else the checker raises is not a finding
        log.debug("CEL type check of %r skipped: %s", text, exc)
        return None
    if boolean:
        try:
            result = _type_name(expr.return_type())
        except Exception:  # noqa: BLE001 - the type is unknown: nothing to report
            return None
        if result.lower() not in ("bool", "dyn", "error"):
            return f"a filter must be a boolean expression; this is {result}"
    return None


def type_error(
    text: str,
    scope: Mapping[str, _d.Descriptor],
    target: _d.Descriptor | None,
    *,
    boolean: bool,
) -> str | None:
    """Type-check one gate, filter or selector against the scope.

    :param scope: name -> message type (``input`` and every prior step).
    :param target: the message being built (declared as ``target``), or None.
    :param boolean: the expression must be a bool (gates and filters).
    :returns: the finding text (upstream's wording), or None when it checks (or cannot be
        checked here).
    """
    variables = dict(scope)
    if target is not None:
        variables["target"] = target
    return _compile(text, variables, boolean=boolean)


def declared_rule_error(
    expression: str, message: _d.Descriptor, ignored_functions: frozenset[str]
) -> str | None:
    """Type-check a message-level validation rule with ``this`` typed as ``message``.

    Calls of the validation function library (``isEmail`` ...), which this checker does not
    declare, are not reported: the error is dropped when it names one of ``ignored_functions``.
    ``now`` is declared a timestamp, ``rule`` dynamic.

    :returns: the compiler's error, ``CEL rule must return bool or string, got <type>``, or
        None when the rule checks (or cannot be checked here).
    """
    if _cx is None:
        return None
    return _rule_error(expression, message.file.pool, message.full_name, ignored_functions)


def declared_field_rule_error(
    expression: str, field: _d.FieldDescriptor, ignored_functions: frozenset[str]
) -> str | None:
    """Type-check a field-level validation rule: ``this`` is dynamic (the field's value, or
    the list or map of a collection), as upstream compiles field rules; ``now`` a timestamp,
    ``rule`` dynamic. What can be found: names that are not declared and results that are
    neither bool nor string.

    :returns: as :func:`declared_rule_error`.
    """
    if _cx is None:
        return None
    return _rule_error(expression, field.containing_type.file.pool, _DYN, ignored_functions)


def _rule_error(
    text: str, pool: Any, this_type: str, ignored_functions: frozenset[str]
) -> str | None:
    if pool is None or not text.strip():
        return None
    declared = (
        ("now", "google.protobuf.Timestamp"),
        ("rule", _DYN),
        ("this", this_type),
    )
    try:
        env = _env(pool, declared)
        expr = env.compile(text)
    except RuntimeError as exc:
        error = _clean(str(exc))
        if any(f"'{name}'" in error for name in ignored_functions):
            return None
        return error
    except Exception as exc:  # noqa: BLE001 - not a finding
        log.debug("CEL type check of %r skipped: %s", text, exc)
        return None
    try:
        result = _type_name(expr.return_type())
    except Exception:  # noqa: BLE001 - the type is unknown: nothing to report
        return None
    if result not in _RULE_RESULTS:
        return f"CEL rule must return bool or string, got {result}"
    return None


def _field_rule_sets(rules: Any) -> list[Any]:
    """The rule sets of one field whose ``cel`` applies: its own, then ``items``, ``keys`` and
    ``values``."""
    out = [rules]
    for sub, parts in (("repeated", ("items",)), ("map", ("keys", "values"))):
        if rules.HasField(sub):
            part = getattr(rules, sub)
            out.extend(getattr(part, n) for n in parts if part.HasField(n))
    return out


def declared_rule_findings(root: _d.Descriptor) -> list[str]:
    """Type-check the validation rules (``ai.pipestream.proto.validate.v1``) of ``root`` and
    every message type it reaches: message rules with ``this`` typed as the message, field
    rules with ``this`` dynamic.

    :returns: finding texts ``"<error> (<Message>: <rule id or expression>)"`` for message
        rules and ``"<error> (<Message.field>: <rule id or expression>)"`` for field rules, in
        walk order.
    """
    if _cx is None:
        return []
    from google.protobuf import descriptor_pb2

    from protomolt_jobs.pb.ai.pipestream.proto.validate.v1 import validate_pb2
    from protomolt_jobs.workflow.validation_cel import FUNCTIONS

    ignored = frozenset(FUNCTIONS)
    out: list[str] = []
    seen: set[str] = set()
    stack = [root]
    while stack:
        desc = stack.pop(0)
        if desc.full_name in seen or desc.full_name.startswith("google.protobuf."):
            continue
        seen.add(desc.full_name)
        if desc.has_options:
            try:
                opts = descriptor_pb2.MessageOptions.FromString(
                    desc.GetOptions().SerializeToString()
                )
            except Exception:  # noqa: BLE001 - unreadable options are the validator's to report
                opts = descriptor_pb2.MessageOptions()
            if opts.HasExtension(validate_pb2.message):
                for rule in opts.Extensions[validate_pb2.message].cel:
                    error = declared_rule_error(rule.expression, desc, ignored)
                    if error:
                        out.append(f"{error} ({desc.full_name}: {rule.id or rule.expression})")
        for field in desc.fields:
            if not field.has_options:
                continue
            try:
                fopts = descriptor_pb2.FieldOptions.FromString(
                    field.GetOptions().SerializeToString()
                )
            except Exception:  # noqa: BLE001 - unreadable options are the validator's to report
                fopts = descriptor_pb2.FieldOptions()
            if not fopts.HasExtension(validate_pb2.field):
                continue
            for rules in _field_rule_sets(fopts.Extensions[validate_pb2.field]):
                for rule in rules.cel:
                    error = declared_field_rule_error(rule.expression, field, ignored)
                    if error:
                        out.append(f"{error} ({field.full_name}: {rule.id or rule.expression})")
        stack.extend(f.message_type for f in desc.fields if f.message_type is not None)
    return out
