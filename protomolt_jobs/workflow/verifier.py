"""Static verification of a compiled workflow (reference section 2.3 and 2.4).

Nothing runs: the verifier walks the steps in order with a static scope (``input`` plus each
earlier step's output type) and reports :class:`Finding` records. Kinds: ``workflow`` (names),
``unsupported`` (``structured``, ``edge``, ``fanOut``: not run by this engine yet), ``method``
(streaming), ``completion``, ``rule``, ``celRule``, ``when`` and ``output``.

CEL has no static type checker in cel-python, so CEL is checked by compiling it and by one trial
evaluation over default instances of the scope: an undeclared name, or a gate/filter whose
value is not a boolean, is reported; errors that depend on data (an unset message) are not.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from celpy import celtypes
from google.protobuf import descriptor as _d

from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.envelope import message_class, parse_workflow
from protomolt_jobs.workflow.types import (
    EXTERNAL,
    CompiledWorkflow,
    Finding,
    Runtime,
    WorkflowParseError,
)

__all__ = ["check", "verify"]

log = logging.getLogger("protomolt_jobs.workflow")

_RESERVED = {"input", "target"}
_CEL_TYPE_NAMES = {
    celtypes.BoolType: "bool",
    celtypes.IntType: "int",
    celtypes.UintType: "uint",
    celtypes.DoubleType: "double",
    celtypes.StringType: "string",
    celtypes.BytesType: "bytes",
    celtypes.ListType: "list",
    celtypes.MapType: "map",
    celtypes.TimestampType: "google.protobuf.Timestamp",
    celtypes.DurationType: "google.protobuf.Duration",
    type(None): "null_type",
}


def _trial_scope(
    scope: Mapping[str, _d.Descriptor], target: _d.Descriptor | None
) -> dict[str, Any]:
    activation = {name: _cel.message_to_cel(message_class(desc)()) for name, desc in scope.items()}
    if target is not None:
        activation["target"] = _cel.message_to_cel(message_class(target)())
    return activation


def _check_cel(text: str, activation: Mapping[str, Any], boolean: bool) -> str | None:
    """Compile ``text`` and try it once over default values; the problem, or None."""
    try:
        _cel.compile_expression(text)
    except _cel.CelError as exc:
        return str(exc)
    try:
        result = _cel.evaluate(text, activation)
    except _cel.CelError as exc:
        detail = str(exc)
        marker = "undeclared reference to '"
        if marker in detail:
            name = detail.split(marker, 1)[1].split("'", 1)[0]
            return f"undeclared reference to '{name}'"
        return None  # depends on data the trial does not have
    if boolean and not isinstance(result, celtypes.BoolType | bool):
        kind = _CEL_TYPE_NAMES.get(type(result), type(result).__name__)
        return f"a filter must be a boolean expression; this is {kind}"
    return None


def _check_mapping(
    step: str,
    kind_prefix: str | None,
    rules: Sequence[mapping.TextRule],
    cel_rules: Sequence[mapping.CelRule],
    scope: Mapping[str, _d.Descriptor],
    target: _d.Descriptor,
) -> list[Finding]:
    """Findings for text and CEL rules building ``target``; ``kind_prefix`` None means the
    step kinds (``rule``/``celRule``), else every finding gets that kind (``output``)."""
    out: list[Finding] = []
    rule_kind = kind_prefix or "rule"
    cel_kind = kind_prefix or "celRule"
    for rule in rules:
        error = mapping.check_text_rule(rule.text, scope, target)
        if error:
            out.append(Finding(step, rule_kind, f"{error} ({rule.text})"))
    if not cel_rules:
        return out
    activation = _trial_scope(scope, target)
    for crule in cel_rules:
        label = crule.target
        if crule.filter.strip():
            error = _check_cel(crule.filter, activation, boolean=True)
            if error:
                out.append(Finding(step, cel_kind, f"filter: {error} ({label})"))
        if crule.selector.strip():
            error = _check_cel(crule.selector, activation, boolean=False)
            if error:
                out.append(Finding(step, cel_kind, f"selector: {error} ({label})"))
        try:
            mapping.check_target_path(target, crule.target)
        except mapping.MappingError as exc:
            out.append(Finding(step, cel_kind, f"target: {exc} ({label})"))
        for fb in crule.fallback:
            error = mapping.check_unscoped_rule(fb, target)
            if error:
                out.append(Finding(step, cel_kind, f"fallback '{fb}': {error} ({label})"))
    return out


#: Findings per compiled workflow: compiled workflows are immutable and shared by every job that
#: carries the same definition, so the worker verifies each definition once per process.
_verified: weakref.WeakKeyDictionary[CompiledWorkflow, tuple[Finding, ...]] = (
    weakref.WeakKeyDictionary()
)
_verified_lock = threading.Lock()


def verify(workflow: CompiledWorkflow) -> list[Finding]:
    """Statically verify ``workflow`` (memoised per compiled workflow).

    :returns: findings in step order, the output mapping's last; empty when it verifies.
    """
    with _verified_lock:
        hit = _verified.get(workflow)
    if hit is not None:
        return list(hit)
    findings = _verify(workflow)
    with _verified_lock:
        _verified[workflow] = tuple(findings)
    return findings


def _verify(workflow: CompiledWorkflow) -> list[Finding]:
    findings: list[Finding] = []
    scope: dict[str, _d.Descriptor] = {"input": workflow.input_type}
    for step in workflow.steps:
        name = step.name
        if not mapping.identifier(name) or name in _RESERVED:
            findings.append(
                Finding(
                    name, "workflow", "step name must be an identifier other than 'input'/'target'"
                )
            )
            continue
        if name in scope:
            findings.append(Finding(name, "workflow", "duplicate step name"))
            continue
        if step.unsupported:
            for key in step.unsupported:
                findings.append(
                    Finding(
                        name, "unsupported", f"'{key}' steps are not supported by this engine yet"
                    )
                )
            if step.output_type is not None:
                scope[name] = step.output_type
            continue
        method = step.method
        assert method is not None and step.input_type is not None and step.output_type is not None
        if method.client_streaming or method.server_streaming:
            findings.append(
                Finding(
                    name,
                    "method",
                    f"{method.full_name} is not unary; workflows call unary methods "
                    "(streaming is a later phase)",
                )
            )
        if step.completion not in ("", EXTERNAL):
            findings.append(
                Finding(
                    name,
                    "completion",
                    f"completion must be '' (invoke) or 'external'; got '{step.completion}'",
                )
            )
        findings.extend(
            _check_mapping(name, None, step.rules, step.cel_rules, scope, step.input_type)
        )
        if step.when.strip():
            error = _check_cel(step.when, _trial_scope(scope, step.input_type), boolean=True)
            if error:
                findings.append(Finding(name, "when", f"{error} ({step.when})"))
        scope[name] = step.output_type
    if workflow.output is not None:
        out = workflow.output
        findings.extend(
            Finding("", "output", f.error)
            for f in _check_mapping("", "output", out.rules, out.cel_rules, scope, out.type)
        )
    return findings


def check(obj: Any, runtime: Runtime) -> list[Finding]:
    """Parse and verify ``obj``; never raises.

    :returns: findings; a parse failure is one finding of kind ``workflow`` with its step.
    """
    try:
        workflow = parse_workflow(obj, runtime)
    except WorkflowParseError as exc:
        return [Finding(exc.step, "workflow", exc.message)]
    except Exception as exc:  # a checker answers, whatever it is given
        log.warning(
            "workflow check failed unexpectedly",
            exc_info=True,
            extra={"action": "workflow_check_crashed"},
        )
        return [
            Finding("", "workflow", f"workflow could not be parsed: {type(exc).__name__}: {exc}")
        ]
    try:
        return verify(workflow)
    except Exception as exc:
        log.warning(
            "workflow verification failed unexpectedly",
            exc_info=True,
            extra={"action": "workflow_verify_crashed"},
        )
        return [
            Finding("", "workflow", f"workflow could not be verified: {type(exc).__name__}: {exc}")
        ]
