"""Static verification of a compiled workflow (reference section 2.3 and 2.4).

Nothing runs: the verifier walks the steps in order with a static scope (``input`` plus each
earlier step's output type) and reports :class:`Finding` records. Kinds: ``workflow`` (names),
``unsupported`` (``structured``, ``edge``, ``fanOut``: not run by this engine yet), ``method``
(streaming), ``completion``, ``rule``, ``celRule``, ``when`` and ``output``.

CEL has no static type checker in cel-python, so CEL is checked by compiling it and by one trial
evaluation over default instances of the scope: an undeclared name, or a gate/filter whose
value is not a boolean, is reported; errors that depend on data (an unset message) are not.

:func:`check` (the doors' check) also reports each key the definition's objects do not know
(kind ``unknown-key``, :mod:`~protomolt_jobs.workflow.keys`); :func:`verify` does not.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from celpy import celtypes
from google.protobuf import descriptor as _d

from protomolt_jobs.workflow import approval as _approval
from protomolt_jobs.workflow import artifacts as _artifacts
from protomolt_jobs.workflow import cancel, cel_check, inputs, keys, loops, mapping, resumable
from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import graph as _graph
from protomolt_jobs.workflow.envelope import MAX_GRAPH_STEPS, message_class, parse_workflow
from protomolt_jobs.workflow.testing import cases as testcases
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
            error = cel_check.type_error(crule.filter, scope, target, boolean=True) or _check_cel(
                crule.filter, activation, boolean=True
            )
            if error:
                out.append(Finding(step, cel_kind, f"filter: {error} ({label})"))
        if crule.selector.strip():
            error = cel_check.type_error(
                crule.selector, scope, target, boolean=False
            ) or _check_cel(crule.selector, activation, boolean=False)
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


_EXTERNAL_IN_GRAPH = (
    "effect 'external' is not supported on an edge, structured or compensation step of a "
    "graph workflow (no single call an intent could stand for)"
)


def verify(workflow: CompiledWorkflow) -> list[Finding]:
    """Statically verify ``workflow`` (memoised per compiled workflow).

    :returns: findings in step order, the output mapping's last; empty when it verifies.
    """
    with _verified_lock:
        hit = _verified.get(workflow)
    if hit is not None:
        return list(hit)
    findings = (
        _verify(workflow)
        + _approval.findings(workflow)
        + resumable.findings(workflow)
        + inputs.findings(workflow)
        + _artifacts.findings(workflow)
    )
    with _verified_lock:
        _verified[workflow] = tuple(findings)
    return findings


def _verify(workflow: CompiledWorkflow) -> list[Finding]:
    if workflow.graph:
        return _graph_effects(workflow) + _verify_graph(workflow)
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
        if step.approval is not None:
            scope[name] = step.output_type  # makes no call: approval.findings checks it
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
            error = cel_check.type_error(
                step.when, scope, step.input_type, boolean=True
            ) or _check_cel(step.when, _trial_scope(scope, step.input_type), boolean=True)
            if error:
                findings.append(Finding(name, "when", f"{error} ({step.when})"))
        if step.validate and step.output_type is not None:
            findings.extend(
                Finding(name, "validate", text)
                for text in cel_check.declared_rule_findings(step.output_type)
            )
        if step.verify is not None:
            findings.extend(_verify_probe(name, step.verify, scope))
        scope[name] = step.output_type
    if workflow.output is not None:
        out = workflow.output
        findings.extend(
            Finding("", "output", f.error)
            for f in _check_mapping("", "output", out.rules, out.cel_rules, scope, out.type)
        )
    return findings


def _graph_effects(workflow: CompiledWorkflow) -> list[Finding]:
    """External steps of a graph: they record intents and verify as in a sequential run
    (graph_run.py), except on an edge, structured or compensation step (no single call an
    intent could stand for); each ``verify`` probe reads the input and the step's ancestors."""
    findings = [
        Finding(s.name, "effect-external-in-graph", _EXTERNAL_IN_GRAPH)
        for s in workflow.steps
        if s.effect == "external"
        and (s.edge is not None or s.structured is not None or s.name in workflow.compensations)
    ]
    types = {s.name: s.output_type for s in workflow.steps if s.output_type is not None}
    ancestors = _graph.ancestors(workflow)
    for s in workflow.steps:
        if s.verify is not None:
            scope = {a: types[a] for a in ancestors.get(s.name, ()) if a in types}
            scope["input"] = workflow.input_type
            findings += _verify_probe(s.name, s.verify, scope)
    return findings


def _verify_probe(name: str, v: Any, scope: Mapping[str, _d.Descriptor]) -> list[Finding]:
    """An external step's ``verify`` probe, checked like a step: its mapping rules build the
    probe method's request from the step's scope; ``found`` (boolean) and ``receipt`` read that
    scope plus ``response`` (the probe's answer). A broken probe found only after a crash would
    send every such run to RECOVERY_REQUIRED instead of deciding: refuse it at the door."""
    findings = [
        Finding(name, "verify", f"rules: {f.error}")
        for f in _check_mapping(name, "verify", v.rules, v.cel_rules, scope, v.method.input_type)
    ]
    probe_scope = {**scope, "response": v.method.output_type}
    activation = _trial_scope(probe_scope, None)
    for key, text, boolean in (("found", v.found, True), ("receipt", v.receipt, False)):
        if not text.strip():
            continue
        error = cel_check.type_error(text, probe_scope, None, boolean=boolean) or _check_cel(
            text, activation, boolean=boolean
        )
        if error:
            findings.append(Finding(name, "verify", f"{key}: {error} ({text})"))
    return findings


# -- graph workflows ---------------------------------------------------------------------------


def _verify_graph(workflow: CompiledWorkflow) -> list[Finding]:
    """Graph workflows: names, then the graph's structure (graph.structure_findings), reads of
    non-ancestors, then each step's own checks against the scope of every step (types), and
    the output mapping."""
    findings: list[Finding] = []
    scope: dict[str, _d.Descriptor] = {"input": workflow.input_type}
    known: set[str] = set()
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
        known.add(name)
        if step.output_type is not None:
            scope[name] = step.output_type
    findings.extend(_graph.structure_findings(workflow, known))
    anc = _graph.ancestors(workflow)
    # a loop body's steps read the loop step (its output of the iteration before)
    also: dict[str, list[str]] = {}
    loop_findings = loops.findings(workflow, MAX_GRAPH_STEPS)
    if workflow.loops and not loop_findings:
        for lp in loops.plan(workflow).loops.values():
            for name in lp.body:
                also.setdefault(name, []).append(lp.step)
    findings.extend(loop_findings)
    findings.extend(_graph.read_findings(workflow, known, anc, also))
    for step in workflow.steps:
        if step.name in known:
            findings.extend(_check_graph_step(workflow, step, scope, anc.get(step.name, ())))
    if workflow.output is not None:
        out = workflow.output
        findings.extend(
            Finding("", "output", f.error)
            for f in _check_mapping("", "output", out.rules, out.cel_rules, scope, out.type)
        )
    return findings


def _reachable(workflow: CompiledWorkflow, desc: _d.Descriptor) -> bool:
    return not workflow.files or desc.file.name in workflow.files


def _check_graph_step(
    workflow: CompiledWorkflow,
    step: Any,
    scope: dict[str, _d.Descriptor],
    ancestors: Any,
) -> list[Finding]:
    name = step.name
    out: list[Finding] = []
    if step.approval is not None:
        return out  # makes no call: approval.findings checks it
    if step.structured is not None:
        out.extend(_check_structured(workflow, step))
    else:
        method = step.method
        assert method is not None and step.input_type is not None
        if method.client_streaming or method.server_streaming:
            out.append(
                Finding(
                    name,
                    "method",
                    f"{method.full_name} is not unary; workflows call unary methods "
                    "(streaming is a later phase)",
                )
            )
        if step.completion not in ("", EXTERNAL):
            out.append(
                Finding(
                    name,
                    "completion",
                    f"completion must be '' (invoke) or 'external'; got '{step.completion}'",
                )
            )
        if step.edge is None:
            out.extend(
                _check_mapping(name, None, step.rules, step.cel_rules, scope, step.input_type)
            )
    if step.edge is not None:
        out.extend(_check_edge(workflow, step, scope, ancestors))
    if step.when.strip() and step.structured is None:
        target = step.input_type
        error = cel_check.type_error(step.when, scope, target, boolean=True) or _check_cel(
            step.when, _trial_scope(scope, target), boolean=True
        )
        if error:
            out.append(Finding(name, "when", f"{error} ({step.when})"))
    return out


def _check_structured(workflow: CompiledWorkflow, step: Any) -> list[Finding]:
    name, spec = step.name, step.structured
    out: list[Finding] = []

    def add(error: str) -> None:
        out.append(Finding(name, "structured", error))

    if not spec.model.strip():
        add("structured step model must not be blank")
    if not 0 <= spec.max_attempts <= 3:
        add(f"structured step maxAttempts must be between 0 and 3; got {spec.max_attempts}")
    if step.when.strip():
        add("structured steps do not support when gates")
    if step.rules or step.cel_rules:
        add(
            "structured steps declare no mapping rules; the coordinator fills the target type "
            "directly"
        )
    if step.validate:
        add(
            "validate is meaningless on a structured step; the coordinator always validates its output"
        )
    if step.deadline_ms > 0:
        add("structured steps do not support per-step deadlines")
    if step.completion:
        add("structured steps do not support completion modes")
    if not _reachable(workflow, spec.target_type):
        add(
            f"target type {spec.target_type.full_name}'s file {spec.target_type.file.name} is not "
            "reachable from the workflow's files; compile and replay fingerprint over the "
            "workflow's file set"
        )
    return out


def _items_type(produce: _d.Descriptor, path: str) -> tuple[_d.Descriptor | None, str]:
    """The element type of the repeated message field at ``path`` in ``produce``, or the
    problem (upstream's EdgeFlow.itemType texts)."""
    current = produce
    segments = path.split(".")
    for i, seg in enumerate(segments):
        fd = current.fields_by_name.get(seg)
        if fd is None:
            return (
                None,
                f"items path '{path}' does not resolve: {current.full_name} has no field '{seg}'",
            )
        last = i == len(segments) - 1
        if not last:
            if fd.is_repeated or fd.message_type is None:
                return (
                    None,
                    f"items path '{path}' walks through '{seg}', which is not a singular message field",
                )
            current = fd.message_type
            continue
        if not fd.is_repeated:
            return None, f"items path '{path}' ends at a non-repeated field"
        if fd.message_type is None or fd.message_type.GetOptions().map_entry:
            return (
                None,
                f"items path '{path}' ends at a non-message field; branches execute on messages",
            )
        return fd.message_type, ""
    return None, f"items path '{path}' does not resolve"


def _check_edge(
    workflow: CompiledWorkflow, step: Any, scope: dict[str, _d.Descriptor], ancestors: Any
) -> list[Finding]:
    name, edge, fan = step.name, step.edge, step.fan_out
    out: list[Finding] = []

    def add(error: str, kind: str = "edge") -> None:
        out.append(Finding(name, kind, error))

    if step.external:
        add("external-completion steps do not carry edges; the completion lane owns their request")
    if step.rules or step.cel_rules:
        add(
            "top-level rules and celRules must be empty when an edge is set; the edge owns "
            "request mapping"
        )
    restricted: dict[str, _d.Descriptor] = {}
    for source in edge.sources:
        if not mapping.identifier(source):
            add(f"edge source '{source}' is not an identifier")
        elif source == "input" or (source in scope and source in ancestors):
            restricted[source] = scope[source]
        else:
            add(f"edge source '{source}' is not 'input' or a prior step")
    for f in _check_mapping(name, None, edge.rules, edge.cel_rules, restricted, edge.produce_type):
        out.append(Finding(name, "edge", f.error))
    if not _reachable(workflow, edge.produce_type):
        add(
            f"produce type {edge.produce_type.full_name}'s file is not reachable from the workflow's files"
        )
    item_type: _d.Descriptor | None = None
    if fan is not None:
        item_type, problem = _items_type(edge.produce_type, fan.items)
        if problem:
            add(problem, "fanOut")
        if not 1 <= fan.max_items <= 1024:
            add(f"fan-out maxItems must be between 1 and 1024; got {fan.max_items}", "fanOut")
        if not 1 <= fan.max_concurrency <= 64:
            add(
                f"fan-out maxConcurrency must be between 1 and 64; got {fan.max_concurrency}",
                "fanOut",
            )
        collect = fan.collect_type
        if not _reachable(workflow, collect):
            add(
                f"collect type {collect.full_name}'s file is not reachable from the workflow's files",
                "fanOut",
            )
        cfd = collect.fields_by_name.get(fan.collect_into)
        branch_out = (
            step.structured.target_type if step.structured is not None else step.method.output_type
        )
        if cfd is None:
            add(f"collect type {collect.full_name} has no field '{fan.collect_into}'", "fanOut")
        elif (
            not cfd.is_repeated
            or cfd.message_type is None
            or cfd.message_type.GetOptions().map_entry
        ):
            add(
                f"collect field '{fan.collect_into}' of {collect.full_name} must be a repeated "
                "message field",
                "fanOut",
            )
        elif cfd.message_type.full_name != branch_out.full_name:
            add(
                f"collect field '{fan.collect_into}' takes {cfd.message_type.full_name} but the "
                f"branch output type is {branch_out.full_name}",
                "fanOut",
            )
    if edge.project_to is not None:
        if step.structured is None and fan is None:
            add(
                "a gRPC step without fan-out takes no projection; the edge value must be the "
                "method request"
            )
        else:
            # This engine reads no projection annotations (the projection protos are not
            # vendored), so no message declares projection sources here.
            add(f"projection target {edge.project_to.full_name} declares no projection sources")
        return out
    if step.structured is None:
        request = step.input_type
        if fan is None:
            if edge.produce_type.full_name != request.full_name:
                add(
                    f"a gRPC step's edge must produce the method's request type "
                    f"{request.full_name}; got {edge.produce_type.full_name}"
                )
        elif item_type is not None and item_type.full_name != request.full_name:
            add(
                f"a fanned-out gRPC step's item type must be the method's request type "
                f"{request.full_name}; got {item_type.full_name}",
                "fanOut",
            )
    return out


def check(obj: Any, runtime: Runtime) -> list[Finding]:
    """Check ``obj`` at a door (``check-workflow``, and through it ``PUT``): its unknown keys
    (:mod:`~protomolt_jobs.workflow.keys`), then parse and verify; never raises.

    Unknown keys are a door's check only: :func:`verify`, which the worker re-runs on every
    claim, does not look at them, so a run stored before a key became unknown keeps running.

    :returns: findings: one of kind ``unknown-key`` per unknown key (even when the definition
        does not parse: a misspelt key is often why), then a parse failure as one finding of
        kind ``workflow`` with its step, or the verifier's findings.
    """
    unknown = keys.findings(obj) + cancel.findings(obj)
    try:
        workflow = parse_workflow(obj, runtime)
    except WorkflowParseError as exc:
        return [*unknown, Finding(exc.step, "workflow", exc.message)]
    except Exception as exc:  # a checker answers, whatever it is given
        log.warning(
            "workflow check failed unexpectedly",
            exc_info=True,
            extra={"action": "workflow_check_crashed"},
        )
        return [
            *unknown,
            Finding("", "workflow", f"workflow could not be parsed: {type(exc).__name__}: {exc}"),
        ]
    try:
        found = [*unknown, *verify(workflow)]
        if isinstance(obj, dict) and "tests" in obj and not found:
            # the cases' mocks are parsed strictly as their steps' output types (DESIGN.md 25)
            found = testcases.findings(workflow, obj["tests"])
        return found
    except Exception as exc:  # a checker answers, whatever it is given
        log.warning(
            "workflow verification failed unexpectedly",
            exc_info=True,
            extra={"action": "workflow_verify_crashed"},
        )
        return [
            *unknown,
            Finding("", "workflow", f"workflow could not be verified: {type(exc).__name__}: {exc}"),
        ]
