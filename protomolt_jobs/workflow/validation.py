"""Declared validation rules (the house ``ai.pipestream.proto.validate.v1`` dialect), enforced.

Rules live in descriptor options: ``FieldRules`` on ``FieldOptions`` extension 59100481 and
``MessageRules`` on ``MessageOptions`` extension 59100482. They are read **by extension
number**: the options of any descriptor (generated, or built at run time from a descriptor set
in a separate :class:`~google.protobuf.descriptor_pool.DescriptorPool`) are serialized and
re-parsed into the default pool's ``FieldOptions``/``MessageOptions``, where the generated
``validate_pb2`` extensions are registered. So a descriptor set made for the Java ProtoMolt
validates the same here.

Semantics (docs/contract.md has the full table):

- ``required``: a string/bytes is non-empty, a number/enum non-zero, a bool true, a message
  field set, a collection non-empty. When it fails, the field's other rules are not reported.
- ``ignore_if_zero``: every rule of the field is skipped for the zero value.
- Implicit-presence scalars are checked at their zero value; fields with explicit presence
  (messages, ``optional``, oneof members) are checked only when set.
- Collection size rules apply to empty collections too; ``repeated.items`` and
  ``map.keys``/``map.values`` apply to each element.
- Set sub-messages are walked (except well-known ``google.protobuf`` types and fields marked
  ``inspect_only``). Paths: ``a.b``, ``a[2]``, ``a["k"]``, ``a["k"]#key``; ``""`` for message rules.
- Rule ids and messages are upstream's (docs/contract.md has the table): combined bounds are
  one rule (``int32.gte_lte``), reversed bounds mean "outside" (``..._exclusive``), an
  empty value breaks ``string.<format>_empty``, a CEL rule without an id is identified by
  its expression.
- CEL rules (with ``now`` and upstream's function library, :mod:`.validation_cel`) bind
  ``this`` to the field value or to the message (a dict built with
  ``MessageToDict(preserving_proto_field_name, always_print_fields_with_no_presence,
  use_integers_for_enums)``, so enums are numbers and int64 values are strings). A bool result
  passes when true; a string result fails when non-empty and is the message; an evaluation
  error is a violation (fail closed).

- ``taxonomy`` binds only a field (singular or repeated) of
  ``ai.pipestream.proto.types.v1.TreePath``, as upstream's: declared anywhere else (another
  type, a map, ``items``/``keys``/``values``) the schema does not compile. No taxonomy catalogue
  is mounted here, so a non-empty path fails closed (``taxonomy.unmounted``); an empty one is
  left to the type's own rules.

A schema whose rules cannot be compiled (a CEL expression that does not parse, a bad
``pattern``, a ``skip_when`` naming no bool field, a misplaced ``taxonomy``) raises
:class:`RuleError`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import ipaddress
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import celpy
import pycountry
from celpy import celtypes
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.pb.ai.pipestream.proto.validate.v1 import validate_pb2
from protomolt_jobs.workflow import celenv, validation_cel
from protomolt_jobs.workflow.proto_json import message_to_dict

log = logging.getLogger("protomolt_jobs.validation")

#: Extension numbers of the house dialect (stable; shared with upstream ProtoMolt).
FIELD_RULES_EXTENSION = 59100481
MESSAGE_RULES_EXTENSION = 59100482

#: Compiled rule plans kept (one per message type per pool).
PLAN_CACHE_SIZE = 2048
#: The only message type a ``taxonomy`` rule may be declared on (upstream's canonical path).
TREE_PATH_TYPE = "ai.pipestream.proto.types.v1.TreePath"

FieldRules = validate_pb2.FieldRules
MessageRules = validate_pb2.MessageRules


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    :ivar path: field path (``a.b[2]``, ``m["k"]``); ``""`` for a message-level rule.
    :ivar rule_id: ``required``, ``<set>.<rule>`` (``string.uuid``, ``int32.gte``), or a CEL
        rule's own id.
    :ivar message: human-readable reason, e.g. ``field is required``.
    """

    path: str
    rule_id: str
    message: str


class RuleError(ProtomoltJobsError, ValueError):
    """A message type declares rules that cannot be compiled.

    :ivar where: ``full.Message.field`` (or the message name) carrying the rule.
    """

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"validation rule on {where}: {problem}")


def summarize(violations: Iterable[Violation]) -> str:
    """Render violations as ``"path: message; path: message"`` (message rules: ``": msg"``)."""
    return "; ".join(f"{v.path}: {v.message}" for v in violations)


def validate_message(msg: Message) -> list[Violation]:
    """Check ``msg`` against the rules its descriptor declares, walking set sub-messages.

    :param msg: any protobuf message (generated class or built from a runtime pool).
    :returns: violations in field order, message-level rules last; empty when valid.
    :raises RuleError: when the schema's rules cannot be compiled.
    """
    out: list[Violation] = []
    _validate(msg, "", out)
    return out


def compile_rules(descriptor: Descriptor) -> None:
    """Compile the rules of ``descriptor`` and every message type it reaches, eagerly.

    Lets a verifier reject a schema with broken rules before any message exists.

    :raises RuleError: naming the field or message whose rule does not compile.
    """
    seen: set[str] = set()
    stack = [descriptor]
    while stack:
        d = stack.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        plan = _plan(d)
        for fp in plan.fields:
            if fp.fd.message_type is not None and not _is_wkt(fp.fd.message_type):
                stack.append(fp.fd.message_type)


# --------------------------------------------------------------------------- rule plans


@dataclass(frozen=True)
class _CelRule:
    id: str
    message: str
    expression: str
    #: its compiled program and whether it reads ``now``, found once with the plan
    program: Any = field(default=None, compare=False, repr=False)
    uses_now: bool = False


#: A singular field's rules compiled with its plan: ``(value, present, path, out)``; it does
#: what ``_check_value(fd, rules, value, present, path, out)`` does, with every read of the
#: rule messages (``HasField``, ``ListFields``, bounds, flags) made once per message type.
_ValueCheck = Callable[[Any, bool, str, list["Violation"]], None]


@dataclass(frozen=True)
class _FieldPlan:
    fd: FieldDescriptor
    rules: FieldRules | None
    is_map: bool
    walk: bool  # message-valued and its own rules are enforced
    name: str = ""
    has_presence: bool = False
    check: _ValueCheck | None = None  # a singular field's compiled rules (None: no rules)


@dataclass(frozen=True)
class _MessagePlan:
    descriptor: Descriptor
    fields: tuple[_FieldPlan, ...]
    cel: tuple[_CelRule, ...]
    skip_when: str


_plans: OrderedDict[tuple[int, str], _MessagePlan] = OrderedDict()
_plans_lock = threading.Lock()


def _plan(descriptor: Descriptor) -> _MessagePlan:
    key = (id(descriptor.file.pool), descriptor.full_name)
    with _plans_lock:
        plan = _plans.get(key)
        # The identity check guards against a recycled id() of a collected pool.
        if plan is not None and plan.descriptor is descriptor:
            _plans.move_to_end(key)
            return plan
    plan = _compile(descriptor)
    with _plans_lock:
        _plans[key] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def _options(descriptor: Any, cls: type[Message], where: str) -> Message:
    # Re-parse the options bytes in the default pool, where validate_pb2 registered the
    # extensions: works whichever pool built the descriptor.
    if not descriptor.has_options:
        return cls()
    raw = descriptor.GetOptions().SerializeToString()
    try:
        return cls.FromString(raw)
    except DecodeError as exc:
        raise RuleError(where, f"options do not parse: {exc}") from exc


def _field_rules(fd: FieldDescriptor) -> FieldRules | None:
    opts = _options(fd, descriptor_pb2.FieldOptions, fd.full_name)
    if not opts.HasExtension(validate_pb2.field):
        return None
    return opts.Extensions[validate_pb2.field]


def _compile(descriptor: Descriptor) -> _MessagePlan:
    opts = _options(descriptor, descriptor_pb2.MessageOptions, descriptor.full_name)
    mrules = (
        opts.Extensions[validate_pb2.message]
        if opts.HasExtension(validate_pb2.message)
        else MessageRules()
    )
    cel = tuple(
        c for c in (_compile_cel(descriptor.full_name, r) for r in mrules.cel) if c is not None
    )
    if mrules.skip_when:
        target = descriptor.fields_by_name.get(mrules.skip_when)
        if target is None or target.type != FieldDescriptor.TYPE_BOOL or target.is_repeated:
            raise RuleError(
                descriptor.full_name,
                f"skip_when names {mrules.skip_when!r}, which is not a singular bool field",
            )
    fields = []
    for fd in descriptor.fields:
        rules = _field_rules(fd)
        is_map = _is_map(fd)
        if rules is not None:
            _check_field_rules(fd.full_name, rules)
            _check_taxonomy(fd, rules, is_map)
        value_type = fd.message_type
        if is_map:
            value_type = fd.message_type.fields_by_name["value"].message_type
        walk = (
            value_type is not None
            and not _is_wkt(value_type)
            and not (rules is not None and rules.inspect_only)
        )
        if rules is not None or walk:
            check = None
            if rules is not None and not is_map and not fd.is_repeated:
                check = _value_check(fd, rules)
            fields.append(
                _FieldPlan(
                    fd=fd,
                    rules=rules,
                    is_map=is_map,
                    walk=walk,
                    name=fd.name,
                    has_presence=fd.has_presence,
                    check=check,
                )
            )
    return _MessagePlan(
        descriptor=descriptor, fields=tuple(fields), cel=cel, skip_when=mrules.skip_when
    )


def _compile_cel(where: str, rule: Any) -> _CelRule | None:
    """Compile one CEL rule; None for a blank expression (upstream skips those). A rule
    without an ``id`` is identified by its expression, as upstream does."""
    if not rule.expression.strip():
        return None
    rule_id = rule.id or rule.expression
    try:
        compiled = validation_cel.program(rule.expression)
    except celenv.CelCompileError as exc:
        raise RuleError(where, f"CEL rule {rule_id!r}: {exc}") from exc
    return _CelRule(
        id=rule_id,
        message=rule.message,
        expression=rule.expression,
        program=compiled,
        uses_now=_NOW.search(rule.expression) is not None,
    )


def _check_field_rules(where: str, rules: FieldRules) -> None:
    for r in rules.cel:
        _compile_cel(where, r)
    if rules.HasField("string") and rules.string.HasField("pattern"):
        try:
            _regex(rules.string.pattern)
        except re.error as exc:
            raise RuleError(where, f"string.pattern {rules.string.pattern!r}: {exc}") from exc
    for sub in ("repeated", "map"):
        if rules.HasField(sub):
            part = getattr(rules, sub)
            for nested in ("items", "keys", "values"):
                if nested in part.DESCRIPTOR.fields_by_name and part.HasField(nested):
                    _check_field_rules(where, getattr(part, nested))


def _check_taxonomy(fd: FieldDescriptor, rules: FieldRules, is_map: bool) -> None:
    """A ``taxonomy`` rule binds only the TreePath field itself (upstream's rule: declared
    elsewhere it would silently check nothing, so the schema is refused)."""
    nested = [
        getattr(getattr(rules, sub), part)
        for sub, parts in (("repeated", ("items",)), ("map", ("keys", "values")))
        if rules.HasField(sub)
        for part in parts
        if getattr(rules, sub).HasField(part)
    ]
    if any(n.taxonomy for n in nested):
        raise RuleError(
            fd.full_name,
            f"taxonomy on field {fd.full_name} must be declared on the TreePath field itself, "
            "not on repeated items or map entries",
        )
    if rules.taxonomy and (
        is_map or fd.message_type is None or fd.message_type.full_name != TREE_PATH_TYPE
    ):
        raise RuleError(
            fd.full_name,
            f'taxonomy "{rules.taxonomy}" declared on field {fd.full_name}: only fields of '
            f"{TREE_PATH_TYPE} take a taxonomy rule",
        )


def _taxonomy(name: str, value: Any, path: str, out: list[Violation]) -> None:
    """A declared taxonomy on one TreePath value: an empty path is left to the type's own
    rules; any other fails closed, since no taxonomy catalogue is mounted here."""
    segments = getattr(value, "segments", None)
    if not segments:
        return
    out.append(
        _v(
            path,
            "taxonomy.unmounted",
            f'taxonomy "{name}" is not mounted; declared membership cannot be checked',
        )
    )


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.is_repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _is_wkt(descriptor: Descriptor) -> bool:
    return descriptor.full_name.startswith("google.protobuf.")


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# --------------------------------------------------------------------------- evaluation


def _validate(msg: Message, prefix: str, out: list[Violation]) -> None:
    plan = _plan(msg.DESCRIPTOR)
    skip_fields = bool(plan.skip_when) and bool(getattr(msg, plan.skip_when))
    if not skip_fields:
        for fp in plan.fields:
            path = f"{prefix}.{fp.name}" if prefix else fp.name
            if fp.is_map:
                _check_map(fp, getattr(msg, fp.fd.name), path, out)
            elif fp.fd.is_repeated:
                _check_repeated(fp, getattr(msg, fp.fd.name), path, out)
            else:
                _check_singular(fp, msg, path, out)
    if plan.cel:
        this = _message_dict(msg, reads=len(plan.cel))
        for rule in plan.cel:
            _run_cel(rule, this, prefix, out)


def _check_singular(fp: _FieldPlan, msg: Message, path: str, out: list[Violation]) -> None:
    name = fp.name
    present = msg.HasField(name) if fp.has_presence else True
    value = getattr(msg, name)
    if fp.check is not None:
        fp.check(value, present, path, out)
    if fp.walk and present:
        _validate(value, path, out)


def _check_repeated(fp: _FieldPlan, values: Any, path: str, out: list[Violation]) -> None:
    rules = fp.rules
    if rules is not None:
        n = len(values)
        if rules.ignore_if_zero and n == 0:
            return
        if rules.required and n == 0:
            out.append(Violation(path, "required", "field is required"))
            return
        if rules.HasField("repeated"):
            rr = rules.repeated
            if rr.HasField("min_items") and n < rr.min_items:
                out.append(
                    _v(path, "repeated.min_items", f"must have at least {rr.min_items} items")
                )
            if rr.HasField("max_items") and n > rr.max_items:
                out.append(
                    _v(path, "repeated.max_items", f"must have at most {rr.max_items} items")
                )
            if rr.unique and not _all_unique(values):
                out.append(_v(path, "repeated.unique", "repeated values must be unique"))
            if rr.HasField("items"):
                for i, item in enumerate(values):
                    _check_value(fp.fd, rr.items, item, True, f"{path}[{i}]", out)
        if rules.taxonomy:
            for i, item in enumerate(values):
                _taxonomy(rules.taxonomy, item, f"{path}[{i}]", out)
        if rules.cel:
            this = celtypes.ListType([_cel_value(fp.fd, v) for v in values])
            for r in rules.cel:
                _run_cel(r, this, path, out)
    if fp.walk:
        for i, item in enumerate(values):
            _validate(item, f"{path}[{i}]", out)


def _check_map(fp: _FieldPlan, mapping: Any, path: str, out: list[Violation]) -> None:
    rules = fp.rules
    entry = fp.fd.message_type
    key_fd = entry.fields_by_name["key"]
    value_fd = entry.fields_by_name["value"]
    keys = sorted(mapping.keys())
    if rules is not None:
        n = len(keys)
        if rules.ignore_if_zero and n == 0:
            return
        if rules.required and n == 0:
            out.append(Violation(path, "required", "field is required"))
            return
        if rules.HasField("map"):
            mr = rules.map
            if mr.HasField("min_pairs") and n < mr.min_pairs:
                out.append(_v(path, "map.min_pairs", f"must have at least {mr.min_pairs} entries"))
            if mr.HasField("max_pairs") and n > mr.max_pairs:
                out.append(_v(path, "map.max_pairs", f"must have at most {mr.max_pairs} entries"))
            for k in keys:
                at = f"{path}[{_key_repr(k)}]"
                if mr.HasField("keys"):
                    _check_value(key_fd, mr.keys, k, True, f"{at}#key", out)
                if mr.HasField("values"):
                    _check_value(value_fd, mr.values, mapping[k], True, at, out)
        if rules.cel:
            this = celtypes.MapType(
                {celenv.to_cel(k): _cel_value(value_fd, mapping[k]) for k in keys}
            )
            for r in rules.cel:
                _run_cel(r, this, path, out)
    if fp.walk:
        for k in keys:
            _validate(mapping[k], f"{path}[{_key_repr(k)}]", out)


def _key_repr(key: Any) -> str:
    if isinstance(key, str):
        return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(key).lower() if isinstance(key, bool) else str(key)


def _all_unique(values: Any) -> bool:
    seen: list[Any] = []
    for v in values:
        key = v.SerializeToString(deterministic=True) if isinstance(v, Message) else v
        if key in seen:
            return False
        seen.append(key)
    return True


def _is_zero(fd: FieldDescriptor, value: Any, present: bool) -> bool:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return not present
    if fd.has_presence and not present:
        return True
    return not value


def _check_value(
    fd: FieldDescriptor,
    rules: FieldRules,
    value: Any,
    present: bool,
    path: str,
    out: list[Violation],
) -> None:
    """Check one value (a singular field, or one element of a collection) against ``rules``."""
    zero = _is_zero(fd, value, present)
    if rules.ignore_if_zero and zero:
        return
    if rules.required and zero:
        out.append(Violation(path, "required", "field is required"))
        return
    if fd.has_presence and not present:
        return
    check = _TYPE_CHECKS.get(fd.type)
    if check is not None:
        check(fd, rules, value, path, out)
    if rules.cel:
        this = _cel_value(fd, value)
        for r in rules.cel:
            _run_cel(r, this, path, out)
    if rules.taxonomy:
        # Only a singular TreePath field gets here (compile refuses every other place).
        _taxonomy(rules.taxonomy, value, path, out)


def _value_check(fd: FieldDescriptor, rules: FieldRules) -> _ValueCheck:
    """``_check_value(fd, rules, ...)`` compiled: the rule messages are read here, once."""
    is_message = fd.type == FieldDescriptor.TYPE_MESSAGE
    has_presence = fd.has_presence
    ignore_if_zero = rules.ignore_if_zero
    required = rules.required
    plan_type = _TYPE_PLANS.get(fd.type)
    typed = plan_type(fd, rules) if plan_type is not None else None
    # compiled as _check_field_rules checked them (a blank text is skipped, as _run_cel does)
    cel = tuple(c for c in (_compile_cel(fd.full_name, r) for r in rules.cel) if c is not None)
    taxonomy = rules.taxonomy

    def check(value: Any, present: bool, path: str, out: list[Violation]) -> None:
        if is_message:
            zero = not present
        else:
            zero = (has_presence and not present) or not value
        if ignore_if_zero and zero:
            return
        if required and zero:
            out.append(Violation(path, "required", "field is required"))
            return
        if has_presence and not present:
            return
        if typed is not None:
            typed(value, path, out)
        if cel:
            this = _cel_value(fd, value)
            for r in cel:
                _run_cel(r, this, path, out)
        if taxonomy:
            _taxonomy(taxonomy, value, path, out)

    return check


def _v(path: str, rule_id: str, message: str) -> Violation:
    return Violation(path, rule_id, message)


# --- numbers


def _fmt(x: Any) -> str:
    """A bound as upstream prints it: Java's ``Long.toString`` / ``Double.toString``."""
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        if 1e-3 <= abs(x) < 1e7 or x == 0:
            return repr(x) if x != int(x) else f"{x:.1f}"
        mantissa, _, exponent = repr(x).partition("e")
        if not exponent:
            digits = f"{x:e}"
            mantissa, _, exponent = digits.partition("e")
            mantissa = repr(float(mantissa))
        elif "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}E{int(exponent)}"
    return str(x)


def _range(
    prefix: str,
    path: str,
    value: Any,
    r: Any,
    fmt: Callable[[Any], str],
    out: list,
    *,
    floating: bool = False,
    key: Callable[[Any], Any] = lambda v: v,
) -> None:
    """Upstream's bounds. One bound fires its own rule (``int32.gte``, "must be >= 0"); a
    lower and an upper bound collapse into one rule (``int32.gte_lte``, "must be gte 0 and lte
    10"), and reversed bounds (upper below lower) mean *outside* the range
    (``int32.gt_lt_exclusive``, "must be gt 10 or lt 0"). Floating bounds say
    "must be within gt/lt range"; a NaN satisfies no bound."""
    _range_with(prefix, path, value, _bounds(r), fmt, out, floating=floating, key=key)


def _bounds(r: Any) -> tuple[str | None, str | None, Any, Any]:
    """A range rule's ``(lower name, upper name, lower, upper)`` (None where unset)."""
    lower_name = "gt" if r.HasField("gt") else ("gte" if r.HasField("gte") else None)
    upper_name = "lt" if r.HasField("lt") else ("lte" if r.HasField("lte") else None)
    lower = getattr(r, lower_name) if lower_name else None
    upper = getattr(r, upper_name) if upper_name else None
    return lower_name, upper_name, lower, upper


def _range_with(
    prefix: str,
    path: str,
    value: Any,
    bounds: tuple[str | None, str | None, Any, Any],
    fmt: Callable[[Any], str],
    out: list,
    *,
    floating: bool = False,
    key: Callable[[Any], Any] = lambda v: v,
) -> None:
    """:func:`_range` over bounds read once (:func:`_bounds`)."""
    lower_name, upper_name, lower, upper = bounds
    if lower_name is None and upper_name is None:
        return
    v = key(value)

    def above(bound: Any) -> bool:
        return v >= key(bound) if lower_name == "gte" else v > key(bound)

    def below(bound: Any) -> bool:
        return v <= key(bound) if upper_name == "lte" else v < key(bound)

    if lower_name and upper_name:
        exclusive = key(upper) < key(lower)
        ok = (above(lower) or below(upper)) if exclusive else (above(lower) and below(upper))
        if not ok:
            rule_id = f"{prefix}.{lower_name}_{upper_name}" + ("_exclusive" if exclusive else "")
            if floating:
                message = f"must be within {lower_name}/{upper_name} range"
            else:
                joiner = "or" if exclusive else "and"
                message = f"must be {lower_name} {fmt(lower)} {joiner} {upper_name} {fmt(upper)}"
            out.append(_v(path, rule_id, message))
    elif lower_name:
        if not above(lower):
            sym = ">=" if lower_name == "gte" else ">"
            out.append(_v(path, f"{prefix}.{lower_name}", f"must be {sym} {fmt(lower)}"))
    elif upper_name and not below(upper):
        sym = "<=" if upper_name == "lte" else "<"
        out.append(_v(path, f"{prefix}.{upper_name}", f"must be {sym} {fmt(upper)}"))


def _numeric(set_name: str) -> Callable[..., None]:
    floating = set_name in ("double", "float")

    def check(fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list) -> None:
        if not rules.HasField(set_name):
            return
        r = getattr(rules, set_name)
        if r.HasField("const") and value != r.const:
            out.append(_v(path, f"{set_name}.const", f"must equal {_fmt(r.const)}"))
        _range(set_name, path, value, r, _fmt, out, floating=floating)
        if len(getattr(r, "in")) and value not in list(getattr(r, "in")):
            out.append(_v(path, f"{set_name}.in", "must be one of the allowed values"))
        if len(r.not_in) and value in list(r.not_in):
            out.append(_v(path, f"{set_name}.not_in", "must not be one of the forbidden values"))
        if floating and r.finite and not math.isfinite(value):
            out.append(_v(path, f"{set_name}.finite", "must be finite"))

    return check


#: Marks a ``const`` the rules do not set.
_UNSET_CONST = object()


def _numeric_plan(set_name: str) -> Callable[..., Callable[..., None] | None]:
    """:func:`_numeric`'s check compiled per field: ``(fd, rules) -> check(value, path, out)``,
    None when ``rules`` has no ``set_name`` rules (the check would return at once)."""
    floating = set_name in ("double", "float")

    def plan(fd: FieldDescriptor, rules: FieldRules) -> Callable[..., None] | None:
        if not rules.HasField(set_name):
            return None
        r = getattr(rules, set_name)
        const = r.const if r.HasField("const") else _UNSET_CONST
        allowed = list(getattr(r, "in"))
        forbidden = list(r.not_in)
        finite = floating and r.finite
        bounds = _bounds(r)

        def check(value: Any, path: str, out: list) -> None:
            if const is not _UNSET_CONST and value != const:
                out.append(_v(path, f"{set_name}.const", f"must equal {_fmt(const)}"))
            _range_with(set_name, path, value, bounds, _fmt, out, floating=floating)
            if allowed and value not in allowed:
                out.append(_v(path, f"{set_name}.in", "must be one of the allowed values"))
            if forbidden and value in forbidden:
                out.append(
                    _v(path, f"{set_name}.not_in", "must not be one of the forbidden values")
                )
            if finite and not math.isfinite(value):
                out.append(_v(path, f"{set_name}.finite", "must be finite"))

        return check

    return plan


def _check_bool(fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list) -> None:
    if rules.HasField("bool") and rules.bool.HasField("const") and value != rules.bool.const:
        out.append(_v(path, "bool.const", f"must equal {str(rules.bool.const).lower()}"))


def _check_enum(fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list) -> None:
    if not rules.HasField("enum"):
        return
    r = rules.enum
    if r.HasField("const") and value != r.const:
        out.append(_v(path, "enum.const", f"must equal {r.const}"))
    if r.defined_only and value not in fd.enum_type.values_by_number:
        out.append(_v(path, "enum.defined_only", f"must be a defined enum value, got {value}"))
    if len(getattr(r, "in")) and value not in list(getattr(r, "in")):
        out.append(_v(path, "enum.in", "must be one of the allowed values"))
    if len(r.not_in) and value in list(r.not_in):
        out.append(_v(path, "enum.not_in", "must not be one of the forbidden values"))


def _check_bytes(fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list) -> None:
    if not rules.HasField("bytes"):
        return
    r = rules.bytes
    n = len(value)
    if r.HasField("len") and n != r.len:
        out.append(_v(path, "bytes.len", f"length must be exactly {r.len} bytes"))
    if r.HasField("min_len") and n < r.min_len:
        out.append(_v(path, "bytes.min_len", f"length must be at least {r.min_len} bytes"))
    if r.HasField("max_len") and n > r.max_len:
        out.append(_v(path, "bytes.max_len", f"length must be at most {r.max_len} bytes"))
    if r.HasField("prefix") and not value.startswith(r.prefix):
        out.append(_v(path, "bytes.prefix", "must start with the required bytes"))
    if r.HasField("suffix") and not value.endswith(r.suffix):
        out.append(_v(path, "bytes.suffix", "must end with the required bytes"))
    if r.HasField("contains") and r.contains not in value:
        out.append(_v(path, "bytes.contains", "must contain the required bytes"))


# --- strings

#: ISO 4217 currency codes and ISO 3166-1 alpha-2 region codes (pycountry's ISO data), as
#: upstream checks them: membership, not only the shape.
_ISO_4217 = frozenset(c.alpha_3 for c in pycountry.currencies)
_ISO_3166_ALPHA2 = frozenset(c.alpha_2 for c in pycountry.countries)


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\s]+$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$"
)
_MIME = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"
)
_LANGUAGE_TAG = re.compile(
    r"^(?:[A-Za-z]{2,3}|[A-Za-z]{5,8})(?:-[A-Za-z]{4})?(?:-(?:[A-Za-z]{2}|\d{3}))?"
    r"(?:-(?:[A-Za-z0-9]{5,8}|\d[A-Za-z0-9]{3}))*(?:-[A-WY-Za-wy-z0-9](?:-[A-Za-z0-9]{2,8})+)*"
    r"(?:-[Xx](?:-[A-Za-z0-9]{1,8})+)?$"
)
_PHONE_STRIP = re.compile(r"[\s().\-]")
_PHONE = re.compile(r"^\+?[1-9]\d{6,14}$")
_SLUG = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FQN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PATH_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DECIMAL = re.compile(r"^\d+(?:\.\d+)?$")
_AUTHORITY = re.compile(r"^(\[[^\]]+\]|[^:/\[\]\s]+):(\d+)$")


def _is_hostname(s: str) -> bool:
    s = s.removesuffix(".")
    if not s or len(s) > 253:
        return False
    labels = s.split(".")
    # An all-numeric last label is an IP address, not a host name.
    return all(_LABEL.match(lb) for lb in labels) and not labels[-1].isdigit()


def _is_ip(s: str, version: int | None = None) -> bool:
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        return False
    return version is None or addr.version == version


def _is_date(s: str) -> bool:
    if not _DATE.match(s):
        return False
    try:
        _dt.date.fromisoformat(s)
    except ValueError:
        return False
    return True


def _is_date_time(s: str) -> bool:
    if not _DATE_TIME.match(s):
        return False
    try:
        _dt.datetime.fromisoformat(s.upper())
    except ValueError:
        return False
    return True


def _is_base64(s: str) -> bool:
    if len(s) % 4:
        return False
    try:
        base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _is_gtin(s: str) -> bool:
    if not s.isascii() or not s.isdigit() or len(s) not in (8, 12, 13, 14):
        return False
    digits = [int(c) for c in s]
    body, check = digits[:-1], digits[-1]
    total = sum(d * (3 if i % 2 == 0 else 1) for i, d in enumerate(reversed(body)))
    return (10 - total % 10) % 10 == check


def _is_endpoint(s: str) -> bool:
    m = _AUTHORITY.match(s)
    if m:
        host, port = m.group(1), int(m.group(2))
        if not 1 <= port <= 65535:
            return False
        if host.startswith("["):
            return _is_ip(host[1:-1], 6)
        return _is_hostname(host) or _is_ip(host, 4)
    return bool(_URI.match(s)) and "://" in s


#: format rule -> (predicate, what the value must be)
_FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "uuid": (lambda s: bool(_UUID.match(s)), "a valid UUID"),
    "email": (validation_cel.email_ok, "a valid email address"),
    "hostname": (validation_cel.hostname_ok, "a valid hostname"),
    "uri": (lambda s: validation_cel.uri_ok(s, absolute=True), "an absolute URI"),
    "ip": (_is_ip, "a valid IP address"),
    "ipv4": (lambda s: _is_ip(s, 4), "a valid IPv4 address"),
    "ipv6": (lambda s: _is_ip(s, 6), "a valid IPv6 address"),
    "date": (_is_date, "an ISO-8601 calendar date"),
    "date_time": (_is_date_time, "an RFC 3339 date-time"),
    "mime_type": (lambda s: bool(_MIME.match(s)), "an IANA media type (type/subtype)"),
    "language_tag": (lambda s: bool(_LANGUAGE_TAG.match(s)), "a BCP 47 language tag"),
    "currency_code": (lambda s: s in _ISO_4217, "an ISO 4217 currency code"),
    "phone_number": (lambda s: bool(_PHONE.match(_PHONE_STRIP.sub("", s))), "a telephone number"),
    "sha256_hex": (
        lambda s: bool(re.fullmatch(r"[0-9a-f]{64}", s)),
        "a lowercase hex SHA-256 digest",
    ),
    "sha1_hex": (lambda s: bool(re.fullmatch(r"[0-9a-f]{40}", s)), "a lowercase hex SHA-1 digest"),
    "hex": (lambda s: bool(re.fullmatch(r"[0-9a-f]+", s)), "lowercase hexadecimal"),
    "base64": (_is_base64, "base64"),
    "slug": (lambda s: bool(_SLUG.match(s)), "a lowercase slug (a-z0-9 with interior ., _ or -)"),
    "region_code": (lambda s: s in _ISO_3166_ALPHA2, "an ISO 3166-1 alpha-2 region code"),
    "protobuf_fqn": (lambda s: bool(_FQN.match(s)), "a valid protobuf fully-qualified name"),
    "path_safe_name": (
        lambda s: bool(_PATH_SAFE.match(s)),
        "a path-safe name (a letter or digit, then letters, digits, ., _ or -)",
    ),
    "gtin": (_is_gtin, "a GTIN (8, 12, 13, or 14 digits with a valid check digit)"),
    "decimal": (lambda s: bool(_DECIMAL.match(s)), "an unsigned decimal string"),
    "endpoint_address": (
        _is_endpoint,
        "a host:port pair with a valid port or an absolute URI",
    ),
    "identifier": (
        lambda s: bool(_IDENT.match(s)),
        "a bare identifier (a letter or underscore, then letters, digits, or underscores)",
    ),
}


def _java_list(values: Iterable[str]) -> str:
    """A list as Java's ``List.toString`` prints it: ``[a, b]``."""
    return "[" + ", ".join(values) + "]"


def _check_string(fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list) -> None:
    if not rules.HasField("string"):
        return
    r = rules.string
    # One ListFields() instead of a HasField or getattr per rule (36 of them): only the rules
    # the schema sets are looked at, in the same order as always.
    _string_with(r, {f.name: v for f, v in r.ListFields()}, value, path, out)


def _string_plan(fd: FieldDescriptor, rules: FieldRules) -> Callable[..., None] | None:
    """:func:`_check_string` compiled per field (its ``ListFields`` read once); None when
    ``rules`` has no string rules."""
    if not rules.HasField("string"):
        return None
    r = rules.string
    present = {f.name: v for f, v in r.ListFields()}

    def check(value: Any, path: str, out: list) -> None:
        _string_with(r, present, value, path, out)

    return check


def _string_with(r: Any, present: dict[str, Any], value: Any, path: str, out: list) -> None:
    """The string rules ``r`` (whose set fields are ``present``) on ``value``."""
    get = present.get
    n = len(value)  # Python str length counts code points, as the dialect does
    if "const" in present and value != r.const:
        out.append(_v(path, "string.const", f'must equal "{r.const}"'))
    if "len" in present and n != r.len:
        out.append(_v(path, "string.len", f"length must be exactly {r.len}"))
    if "min_len" in present and n < r.min_len:
        out.append(_v(path, "string.min_len", f"length must be at least {r.min_len}"))
    if "max_len" in present and n > r.max_len:
        out.append(_v(path, "string.max_len", f"length must be at most {r.max_len}"))
    if "pattern" in present and not _regex(r.pattern).search(value):
        out.append(_v(path, "string.pattern", "value does not match pattern"))
    if "prefix" in present and not value.startswith(r.prefix):
        out.append(_v(path, "string.prefix", f'must start with "{r.prefix}"'))
    if "suffix" in present and not value.endswith(r.suffix):
        out.append(_v(path, "string.suffix", f'must end with "{r.suffix}"'))
    if "contains" in present and r.contains not in value:
        out.append(_v(path, "string.contains", f'must contain "{r.contains}"'))
    if "not_contains" in present and r.not_contains in value:
        out.append(_v(path, "string.not_contains", f'must not contain "{r.not_contains}"'))
    allowed = list(get("in", ()))
    if allowed and value not in allowed:
        out.append(_v(path, "string.in", f"must be one of {_java_list(allowed)}"))
    if "not_in" in present and value in list(r.not_in):
        out.append(_v(path, "string.not_in", f"must not be one of {_java_list(r.not_in)}"))
    if present.keys() & _FORMATS.keys():
        for name, (ok, what) in _FORMATS.items():
            if not get(name):
                continue
            if not value:
                # As upstream (and protovalidate): an empty value is a rule of its own.
                out.append(_v(path, f"string.{name}_empty", "value is empty"))
            elif not ok(value):
                out.append(_v(path, f"string.{name}", f"value must be {what}"))


# --- timestamps and durations (message-typed, checked as values)


def _ts_nanos(m: Any) -> int:
    return m.seconds * 1_000_000_000 + m.nanos


def _java_instant(nanos: int) -> str:
    """A timestamp as Java's ``Instant.toString`` prints it (fraction in groups of three)."""
    seconds, frac = divmod(nanos, 1_000_000_000)
    text = _dt.datetime.fromtimestamp(seconds, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        digits = f"{frac:09d}"
        if digits[3:] == "000000":
            digits = digits[:3]
        elif digits[6:] == "000":
            digits = digits[:6]
        text += "." + digits
    return text + "Z"


def _java_duration(nanos: int) -> str:
    """A duration as Java's ``Duration.toString`` prints it: ``PT1H30M``, ``PT0.5S``."""
    if nanos == 0:
        return "PT0S"
    sign = "-" if nanos < 0 else ""
    hours, rem = divmod(abs(nanos), 3_600_000_000_000)
    minutes, rem = divmod(rem, 60_000_000_000)
    secs, frac = divmod(rem, 1_000_000_000)
    out = "PT"
    if hours:
        out += f"{sign}{hours}H"
    if minutes:
        out += f"{sign}{minutes}M"
    if secs or frac:
        fraction = f".{frac:09d}".rstrip("0") if frac else ""
        out += f"{sign}{secs}{fraction}S"
    return out


def _check_message_value(
    fd: FieldDescriptor, rules: FieldRules, value: Any, path: str, out: list
) -> None:
    name = fd.message_type.full_name
    if name == "google.protobuf.Timestamp" and rules.HasField("timestamp"):
        r, set_name, render = rules.timestamp, "timestamp", _java_instant
    elif name == "google.protobuf.Duration" and rules.HasField("duration"):
        r, set_name, render = rules.duration, "duration", _java_duration
    else:
        return
    _range(set_name, path, value, r, lambda b: render(_ts_nanos(b)), out, key=_ts_nanos)
    if set_name == "timestamp":
        v = _ts_nanos(value)
        now = time.time_ns()
        if r.HasField("lt_now") and r.lt_now and not v < now:
            out.append(_v(path, "timestamp.lt_now", "must be in the past"))
        if r.HasField("gt_now") and r.gt_now and not v > now:
            out.append(_v(path, "timestamp.gt_now", "must be in the future"))
        if r.HasField("within") and abs(v - now) > _ts_nanos(r.within):
            within = _java_duration(_ts_nanos(r.within))
            out.append(_v(path, "timestamp.within", f"must be within {within} of now"))


_TYPE_CHECKS: dict[int, Callable[..., None]] = {
    FieldDescriptor.TYPE_STRING: _check_string,
    FieldDescriptor.TYPE_INT32: _numeric("int32"),
    FieldDescriptor.TYPE_SINT32: _numeric("int32"),
    FieldDescriptor.TYPE_SFIXED32: _numeric("int32"),
    FieldDescriptor.TYPE_INT64: _numeric("int64"),
    FieldDescriptor.TYPE_SINT64: _numeric("int64"),
    FieldDescriptor.TYPE_SFIXED64: _numeric("int64"),
    FieldDescriptor.TYPE_UINT32: _numeric("uint32"),
    FieldDescriptor.TYPE_FIXED32: _numeric("uint32"),
    FieldDescriptor.TYPE_UINT64: _numeric("uint64"),
    FieldDescriptor.TYPE_FIXED64: _numeric("uint64"),
    FieldDescriptor.TYPE_DOUBLE: _numeric("double"),
    FieldDescriptor.TYPE_FLOAT: _numeric("float"),
    FieldDescriptor.TYPE_BOOL: _check_bool,
    FieldDescriptor.TYPE_ENUM: _check_enum,
    FieldDescriptor.TYPE_BYTES: _check_bytes,
    FieldDescriptor.TYPE_MESSAGE: _check_message_value,
}


def _plain_plan(check: Callable[..., None]) -> Callable[..., Callable[..., None]]:
    def plan(fd: FieldDescriptor, rules: FieldRules) -> Callable[..., None]:
        def bound(value: Any, path: str, out: list) -> None:
            check(fd, rules, value, path, out)

        return bound

    return plan


#: Field type -> ``(fd, rules) -> check(value, path, out)`` or None (no rules of the type):
#: :data:`_TYPE_CHECKS` compiled per field (strings and numbers read their rules once).
_TYPE_PLANS: dict[int, Callable[..., Callable[..., None] | None]] = {
    **{t: _plain_plan(c) for t, c in _TYPE_CHECKS.items()},
    FieldDescriptor.TYPE_STRING: _string_plan,
    **{
        t: _numeric_plan(set_name)
        for t, set_name in (
            (FieldDescriptor.TYPE_INT32, "int32"),
            (FieldDescriptor.TYPE_SINT32, "int32"),
            (FieldDescriptor.TYPE_SFIXED32, "int32"),
            (FieldDescriptor.TYPE_INT64, "int64"),
            (FieldDescriptor.TYPE_SINT64, "int64"),
            (FieldDescriptor.TYPE_SFIXED64, "int64"),
            (FieldDescriptor.TYPE_UINT32, "uint32"),
            (FieldDescriptor.TYPE_FIXED32, "uint32"),
            (FieldDescriptor.TYPE_UINT64, "uint64"),
            (FieldDescriptor.TYPE_FIXED64, "uint64"),
            (FieldDescriptor.TYPE_DOUBLE, "double"),
            (FieldDescriptor.TYPE_FLOAT, "float"),
        )
    },
}


# --- CEL


def _message_dict(msg: Message, *, reads: int = 1) -> celenv.Deferred:
    # Deferred: cel-cpp reads the JSON document as it is; CEL values only if cel-python must
    # answer (to_cel cannot fail on MessageToDict's output, so converting late is safe).
    # ``reads``: how many rules will read it (two or more: it enters cel-cpp once).
    return celenv.deferred_json(
        message_to_dict(msg, preserving_proto_field_name=True, use_integers_for_enums=True),
        reads=reads,
    )


def _cel_value(fd: FieldDescriptor, value: Any) -> celtypes.Value:
    """A field value as CEL sees it: a Timestamp or Duration as a CEL timestamp or duration
    (so ``this < now`` compares times, as upstream binds them), anything else as its JSON."""
    if isinstance(value, Message):
        name = value.DESCRIPTOR.full_name
        if name == "google.protobuf.Timestamp":
            return celtypes.TimestampType(
                _dt.datetime.fromtimestamp(value.seconds, _dt.UTC)
                + _dt.timedelta(microseconds=value.nanos // 1000)
            )
        if name == "google.protobuf.Duration":
            return celtypes.DurationType(value.seconds, value.nanos)
    return celenv.to_cel(_plain(fd, value))


def _plain(fd: FieldDescriptor, value: Any) -> Any:
    """A field value (or element) as a JSON-shaped Python value for CEL."""
    if isinstance(value, Message):
        return message_to_dict(value, preserving_proto_field_name=True, use_integers_for_enums=True)
    return value


#: cel-python appends the activation (every bound value) to some error texts: never shown.
_ACTIVATION_DUMP = re.compile(r"\s*\(?\s*(?:in|with) (?:activation|container)\b.*$", re.DOTALL)


_CEL_CLASS = re.compile(r"'?<class 'celpy\.celtypes\.(\w+?)Type'>'?")
_CEL_VALUE = re.compile(r"\b[A-Z]\w*Type\(")


def _without_values(text: str) -> str:
    """cel-python's error text with every value it quotes (``StringType('...')``) replaced by
    ``<value>``: a violation never repeats the data it was about, nor the environment."""
    out = []
    pos = 0
    for m in _CEL_VALUE.finditer(text):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[pos : m.start()] + "<value>")
        pos = i
    out.append(text[pos:])
    return "".join(out)


def _eval_detail(exc: BaseException) -> str:
    detail = str(exc.args[0]) if exc.args else type(exc).__name__
    detail = _ACTIVATION_DUMP.sub("", detail)
    detail = _CEL_CLASS.sub(lambda m: m.group(1).lower(), detail)
    return _without_values(detail)[:300]


_NOW = re.compile(r"\bnow\b")


def _run_cel(
    rule: Any, this: celtypes.Value | celenv.Deferred, path: str, out: list[Violation]
) -> None:
    expression = rule.expression
    compiled = None
    if type(rule) is _CelRule:  # compiled with its plan: a non-blank text, id, program
        rule_id, compiled, uses_now = rule.id, rule.program, rule.uses_now
    else:
        if not expression.strip():
            return
        rule_id = rule.id or expression  # upstream: an id-less rule is identified by its text
        uses_now = _NOW.search(expression) is not None
    activation: dict[str, Any] = {"this": this}
    if uses_now:
        # Only when used: a time in the activation keeps cel-cpp's fast path from answering.
        activation["now"] = celtypes.TimestampType(_dt.datetime.now(_dt.UTC))
    try:
        if compiled is None:
            compiled = validation_cel.program(expression)
        result = compiled.evaluate(activation)
    except celenv.CelCompileError as exc:
        raise RuleError(path or "<message>", f"CEL rule {rule_id!r}: {exc}") from exc
    except celpy.CELEvalError as exc:
        result = exc
    except Exception as exc:  # noqa: BLE001 - cel-python raises plain errors for some faults; fail closed
        result = celpy.CELEvalError(f"{type(exc).__name__}: {exc}")
    if isinstance(result, celpy.CELEvalError):
        detail = _eval_detail(result)
        out.append(_v(path, rule_id, f'"{expression}" could not be evaluated: {detail}'))
    elif isinstance(result, celtypes.BoolType | bool):
        if not result:
            out.append(_v(path, rule_id, rule.message or f'"{expression}" returned false'))
    elif isinstance(result, celtypes.StringType | str):
        if str(result):
            out.append(_v(path, rule_id, str(result)))
    else:
        out.append(_v(path, rule_id, "CEL rule must return bool or string"))
