"""Input ownership: who owns a workflow's inputs, which input paths a step reads, and which of
them a stored input lacks (issue 29 item 6; DESIGN.md section 24; docs/explain.md).

The definition's keys (docs/workflows.md):

- top level ``"inputs": {"<input path>": {"owner", "required"?, "description"?}}``: a dotted
  path of the input type's fields (``report.dataset_uri``), the principal or group that owns
  it (``team:data``, ``user:ana``), whether a step that reads it needs it (default true);
- a step's ``"owner"``: who owns the step's outputs;
- a step's ``"onMissingInput"``: ``"fail"`` (default) or ``"wait"``.

A step *reads* an input path when one of its text rules' sources is ``input.<path>`` or one
of its CEL rules (``filter``, ``selector``) names ``input.<path>``. A declared path is
*needed* by a step when the step reads it, a field under it, or a message holding it. A path
is *absent* by proto3 presence, as the mapping rules read it (``mapping.resolve_source``): an
unset message or optional field, an implicit scalar at zero, an empty repeated field, a
missing Struct key.

:func:`check_step` is the runner's one call per step: it costs a dict lookup for a workflow
without ``inputs`` (nothing else is read, no statement is added). When a needed, required
path is absent, a step with ``onMissingInput: "wait"`` raises :class:`InputWait` (the run
parks WAITING with ``wait_kind = 'input'`` until ``supply-input``), any other step fails with
``MAPPING: missing required input '<path>' (owner <owner>)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.types import (
    FailureKind,
    Finding,
    Parked,
    Step,
    WorkflowExecutionError,
)

__all__ = [
    "DECLARATION_KEYS",
    "INPUT_WAIT",
    "KIND",
    "ON_MISSING",
    "Declared",
    "InputWait",
    "absent",
    "check_step",
    "declared",
    "describe_missing",
    "findings",
    "missing_for",
    "owner_of",
    "read_paths",
    "related",
    "step_owner",
    "step_waits",
]

#: ``workflow_run.wait_kind`` of a run parked for a missing input.
INPUT_WAIT = "input"
#: The values of a step's ``onMissingInput``.
ON_MISSING = ("fail", "wait")
#: The ``kind`` of the verifier's findings on these keys.
KIND = "inputs"
#: ``input.<path>`` inside a CEL expression.
_CEL_INPUT = re.compile(r"(?<![A-Za-z0-9_.])input((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


@dataclass(frozen=True, slots=True)
class Declared:
    """One declared input path.

    :ivar path: dotted field names of the input type.
    :ivar owner: who supplies it (``team:data``); "" when not said.
    :ivar required: a step that needs it cannot run without it.
    :ivar description: free text for the inbox.
    """

    path: str
    owner: str = ""
    required: bool = True
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"path": self.path, "owner": self.owner or None}
        body["required"] = self.required
        if self.description:
            body["description"] = self.description
        return body


class InputWait(ProtomoltJobsError):
    """A step that waits (``onMissingInput: "wait"``) needs input paths the run lacks: the
    run parks (``parked``: ``Parked(step, "input", detail)``)."""

    def __init__(self, parked: Parked, missing: tuple[Declared, ...]) -> None:
        super().__init__(parked.detail)
        self.parked = parked
        self.missing = missing


def declared(definition: Mapping[str, Any]) -> dict[str, Declared]:
    """The definition's ``inputs`` by path (empty when absent). Malformed entries are
    skipped here; the verifier names them (``verifier``: findings of kind ``inputs``)."""
    raw = definition.get("inputs")
    if not isinstance(raw, dict):
        return {}
    out: dict[str, Declared] = {}
    for path, spec in raw.items():
        if not isinstance(path, str) or not path.strip() or not isinstance(spec, dict):
            continue
        owner = spec.get("owner")
        required = spec.get("required", True)
        description = spec.get("description")
        out[path.strip()] = Declared(
            path.strip(),
            owner if isinstance(owner, str) else "",
            required if isinstance(required, bool) else True,
            description if isinstance(description, str) else "",
        )
    return out


def _raw_step(definition: Mapping[str, Any], step: Step) -> Mapping[str, Any]:
    steps = definition.get("steps")
    if isinstance(steps, list) and step.index < len(steps) and isinstance(steps[step.index], dict):
        return steps[step.index]
    return {}


def step_waits(definition: Mapping[str, Any], step: Step) -> bool:
    """True when ``step`` declares ``onMissingInput: "wait"``."""
    return _raw_step(definition, step).get("onMissingInput") == "wait"


def step_owner(definition: Mapping[str, Any], step: Step) -> str:
    """``step``'s ``owner`` (who owns its outputs), "" when not declared."""
    owner = _raw_step(definition, step).get("owner")
    return owner if isinstance(owner, str) else ""


def read_paths(step: Step) -> tuple[str, ...]:
    """The input paths ``step``'s rules read (text rule sources, CEL ``filter``/``selector``),
    without the ``input.`` prefix, in first-read order. A rule reading the whole input reads
    ``""``."""
    seen: dict[str, None] = {}
    for rule in step.rules:
        src = rule.source
        if isinstance(src, tuple) and src and src[0] == "input":
            seen[".".join(src[1:])] = None
    for cel_rule in step.cel_rules:
        for text in (cel_rule.filter, cel_rule.selector):
            for match in _CEL_INPUT.finditer(text or ""):
                seen[match.group(1)[1:]] = None
    return tuple(seen)


def related(declared_path: str, read: str) -> bool:
    """A declared path is needed by a read of ``read``: the same path, a field under it, or a
    message holding it."""
    return (
        read == declared_path
        or read == ""
        or read.startswith(declared_path + ".")
        or declared_path.startswith(read + ".")
    )


def absent(input_msg: Message, path: str) -> bool:
    """True when ``path`` is not present in ``input_msg`` by proto3 presence (as the mapping
    rules read it); an unknown field or a path through an absent Struct key is absent too."""
    rule = mapping.TextRule(f"_ = input.{path}", "assign", ("_",), ("input", *path.split(".")))
    try:
        value = mapping.resolve_source({"input": input_msg}, rule)
    except mapping.MappingError:
        return True
    if value is mapping.ABSENT or value is None:
        return True
    return isinstance(value, (list, dict)) and not value


def owner_of(inputs: Mapping[str, Declared], path: str) -> str:
    """The owner of ``path``: its declaration's, else the nearest declared ancestor's ("")."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        found = inputs.get(".".join(parts[:n]))
        if found is not None and found.owner:
            return found.owner
    return ""


def missing_for(
    definition: Mapping[str, Any], step: Step, input_msg: Message
) -> tuple[Declared, ...]:
    """The required declared paths ``step`` needs that ``input_msg`` lacks, in declaration
    order (empty when the workflow declares no ``inputs``)."""
    inputs = declared(definition)
    if not inputs:
        return ()
    reads = read_paths(step)
    out = []
    for decl in inputs.values():
        if not decl.required or not any(related(decl.path, r) for r in reads):
            continue
        if absent(input_msg, decl.path):
            out.append(decl)
    return tuple(out)


def describe_missing(missing: tuple[Declared, ...]) -> str:
    """``'report.dataset_uri' (owner team:data), 'x' (no owner declared)``."""
    return ", ".join(
        f"'{m.path}' ({'owner ' + m.owner if m.owner else 'no owner declared'})" for m in missing
    )


def check_step(workflow: Any, step: Step, scope: Mapping[str, Message]) -> None:
    """Before ``step``'s request is built: stop when it needs a required input the run lacks.

    A workflow without ``inputs`` returns at once (one dict lookup).

    :raises InputWait: the step declares ``onMissingInput: "wait"``.
    :raises WorkflowExecutionError: MAPPING ``mapping failed: missing required input ...``
        naming each path and its owner, for any other step.
    """
    definition = workflow.definition
    if "inputs" not in definition:
        return
    input_msg = scope.get("input")
    if input_msg is None:
        return
    missing = missing_for(definition, step, input_msg)
    if not missing:
        return
    text = describe_missing(missing)
    if step_waits(definition, step):
        detail = f"waiting for input: {text}"
        raise InputWait(Parked(step.name, INPUT_WAIT, detail=detail), missing)
    raise WorkflowExecutionError(
        FailureKind.MAPPING, step.name, f"mapping failed: missing required input {text}"
    )


#: The keys of one ``inputs`` declaration.
DECLARATION_KEYS = ("owner", "required", "description")


def findings(workflow: Any) -> list[Finding]:
    """The verifier's findings (kind ``inputs``) on ``inputs``, steps' ``owner`` and
    ``onMissingInput``, each naming the path or the step; empty at once for a workflow that
    uses none of them."""
    definition = workflow.definition
    raw_steps = definition.get("steps") if isinstance(definition, dict) else None
    steps = [s for s in raw_steps if isinstance(s, dict)] if isinstance(raw_steps, list) else []
    uses_step_keys = any("owner" in s or "onMissingInput" in s for s in steps)
    if "inputs" not in definition and not uses_step_keys:
        return []
    out: list[Finding] = []
    raw = definition.get("inputs")
    if "inputs" in definition and not isinstance(raw, dict):
        out.append(Finding("", KIND, "'inputs' must be an object of input path -> {owner, ...}"))
        raw = {}
    for path, spec in (raw or {}).items():
        where = f"inputs['{str(path)[:80]}']"
        if not isinstance(path, str) or not path.strip():
            out.append(Finding("", KIND, f"{where}: an input path must be a non-blank string"))
            continue
        try:
            mapping.check_target_path(workflow.input_type, path.strip())
        except mapping.MappingError as exc:
            out.append(
                Finding("", KIND, f"{where}: not a path of {workflow.input_type.full_name}: {exc}")
            )
        if not isinstance(spec, dict):
            out.append(Finding("", KIND, f"{where} must be an object {{owner, required?, ...}}"))
            continue
        for key in spec:
            if key not in DECLARATION_KEYS:
                out.append(
                    Finding(
                        "",
                        KIND,
                        f"{where}: unknown key '{str(key)[:80]}'; an input declares "
                        + ", ".join(DECLARATION_KEYS),
                    )
                )
        owner = spec.get("owner")
        if not isinstance(owner, str) or not owner.strip():
            out.append(Finding("", KIND, f"{where}.owner must be a non-blank string"))
        if "required" in spec and not isinstance(spec["required"], bool):
            out.append(Finding("", KIND, f"{where}.required must be true or false"))
        if "description" in spec and not isinstance(spec["description"], str):
            out.append(Finding("", KIND, f"{where}.description must be a string"))
    for s in steps:
        name = str(s.get("name", ""))
        if "owner" in s and (not isinstance(s["owner"], str) or not s["owner"].strip()):
            out.append(Finding(name, KIND, "'owner' must be a non-blank string"))
        if "onMissingInput" in s:
            value = s["onMissingInput"]
            if value not in ON_MISSING:
                out.append(
                    Finding(name, KIND, f"'onMissingInput' must be 'fail' or 'wait'; got {value!r}")
                )
            elif value == "wait" and not raw:
                out.append(
                    Finding(
                        name,
                        KIND,
                        "'onMissingInput: wait' waits for declared inputs, and the workflow "
                        "declares none ('inputs')",
                    )
                )
    return out
