"""Artifacts of a run, the engine's side: content hashes, lineage recorded when a request is
built, declared output ports, validators and publication checks (issue 29; docs/artifacts.md).

The response artifact of a step **is its checkpoint entry**: every new entry of a job's run
carries ``sha256`` (hex SHA-256 of the response's deterministic proto3 binary serialization),
``sizeBytes`` (that serialization's length) and ``inputs`` (``[{step, iteration, sha256}]``:
the scope names the request's rules and gate read, an edge step's declared sources too,
hashed the same way **when the request is built, before the call**). A skipped or failed
entry has none of them. Entries stored before
these fields read as artifacts without a hash.

The definition keys read here (``workflow/keys.py``; docs/workflows.md *Artifacts*):

- ``outputs``: ``{port: {"uri": CEL, "sha256": CEL, "mediaType"?: CEL|text, "sizeBytes"?:
  CEL}}``, each CEL over ``response``. A step that declares them stores
  ``"artifacts": [{port, kind: "file", uri, sha256, mediaType?, sizeBytes?}]`` in its entry
  (the same statement as the checkpoint: the entry is the row).
- ``receipt``: CEL over ``response`` on an ``effect: "external"`` step, the provider's
  evidence of the effect (a message id). Empty or absent: the step fails ``RECEIPT`` (never
  retried): a run whose required effect has no receipt does not complete.
- ``validates``: ``["step" | "step.port"]``: when this step succeeds, those artifacts are
  ``verified`` (the state is derived from the entries, actor ``worker:<step>``).
- ``consumes``: ``{"step" | "step.port": {"state": "verified"|"promoted", "approvedBy"?:
  approval step}}``: checked before the call; on success the artifact is ``promoted``.

No store here: the worker's checkpoint writes the entry as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from protomolt_jobs.hooks.contract import artifact_id
from protomolt_jobs.hooks.contract import artifact_job_prefix as job_prefix
from protomolt_jobs.workflow import cel as _cel
from protomolt_jobs.workflow import cel_check
from protomolt_jobs.workflow import graph as _graph
from protomolt_jobs.workflow.types import (
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    FailureKind,
    Finding,
    Step,
    WorkflowExecutionError,
)

__all__ = [
    "PORT_URI_MAX_BYTES",
    "STATES",
    "ArtifactSpec",
    "artifact_id",
    "check_consumed",
    "content_sha256",
    "entry_hashes",
    "findings",
    "inputs_of",
    "job_prefix",
    "port_records",
    "receipt_value",
    "spec",
    "validated",
]

#: Artifact states, in the order a publication moves through them.
STATES = ("draft", "verified", "promoted", "retracted", "pruned")
#: Where a step's response artifact lives (its port).
RESPONSE = "response"
#: The port of an external step's receipt.
RECEIPT = "receipt"
#: The uri scheme of the node's byte store (``runs.artifact_store.SCHEME``; this layer may not
#: import it): a uri of this scheme that the store refuses is never published unchecked.
STORE_SCHEME = "artifact://"


@dataclass(frozen=True)
class Consumed:
    """One ``consumes`` entry: the artifact reference, the state it must be in, the approval
    step whose reviewers must have seen its hash ("" for none)."""

    ref: str
    state: str
    approved_by: str = ""


@dataclass(frozen=True)
class ArtifactSpec:
    """A step's artifact keys (all empty for a step that declares none)."""

    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    receipt: str = ""
    validates: tuple[str, ...] = ()
    consumes: tuple[Consumed, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.outputs or self.receipt or self.validates or self.consumes)


_NONE = ArtifactSpec()
_CACHE: weakref.WeakKeyDictionary[CompiledWorkflow, dict[str, ArtifactSpec]] = (
    weakref.WeakKeyDictionary()
)


def _raw_steps(workflow: CompiledWorkflow) -> list[dict[str, Any]]:
    definition = getattr(workflow, "definition", None)
    if not isinstance(definition, dict):
        return []
    steps = definition.get("steps")
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def spec(workflow: CompiledWorkflow) -> dict[str, ArtifactSpec]:
    """``{step: ArtifactSpec}`` for the steps that declare artifact keys (read once per
    compiled workflow from its definition; malformed values are the verifier's findings and
    read as absent here)."""
    try:
        cached = _CACHE.get(workflow)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    out: dict[str, ArtifactSpec] = {}
    for raw in _raw_steps(workflow):
        name = raw.get("name")
        if not isinstance(name, str):
            continue
        outputs = raw.get("outputs")
        outputs = (
            {k: v for k, v in (outputs or {}).items() if isinstance(k, str) and isinstance(v, dict)}
            if isinstance(outputs, dict)
            else {}
        )
        receipt = raw.get("receipt") if isinstance(raw.get("receipt"), str) else ""
        validates = raw.get("validates")
        validated = (
            tuple(v for v in validates if isinstance(v, str)) if isinstance(validates, list) else ()
        )
        consumes = raw.get("consumes")
        consumed: list[Consumed] = []
        if isinstance(consumes, dict):
            for ref, want in consumes.items():
                if isinstance(ref, str) and isinstance(want, dict):
                    consumed.append(
                        Consumed(
                            ref,
                            str(want.get("state", "verified")),
                            str(want.get("approvedBy", "") or ""),
                        )
                    )
        found = ArtifactSpec(outputs, receipt or "", validated, tuple(consumed))
        if not found.empty:
            out[name] = found
    with contextlib.suppress(TypeError):  # a workflow that cannot be weakly referenced
        _CACHE[workflow] = out
    return out


def of(workflow: CompiledWorkflow, step: str) -> ArtifactSpec:
    """``step``'s artifact keys (an empty spec when it declares none)."""
    return spec(workflow).get(step, _NONE)


def content_sha256(msg: Message) -> tuple[str, int]:
    """``(hex SHA-256, size in bytes)`` of ``msg``'s deterministic binary serialization: the
    same for a response as called and as replayed from its proto3-JSON checkpoint."""
    data = msg.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest(), len(data)


def inputs_of(
    step: Step,
    values: Mapping[str, Message],
    names: set[str],
    iteration_of: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """The lineage of ``step``'s request: ``[{step, iteration, sha256}]`` for each scope name
    its rules and gate read (``names``: ``graph.names_read``) that is bound, sorted by name.
    Computed when the request is built, before the call."""
    out: list[dict[str, Any]] = []
    for name in sorted(names):
        value = values.get(name)
        if value is None or name == step.name:
            continue
        sha, _ = content_sha256(value)
        k = iteration_of(name) if iteration_of is not None and name != "input" else 0
        out.append({"step": name, "iteration": k, "sha256": sha})
    return out


def _text(value: Any) -> str:
    plain = _cel.from_cel(value)
    if plain is None:
        return ""
    if isinstance(plain, bytes):
        return plain.hex()
    return str(plain)


#: The longest port ``uri`` (UTF-8 bytes) a step may give: ``workflow_artifact``'s uri index
#: (a btree) refuses an entry over about 2.7 KB, which failed the checkpoint's statement.
PORT_URI_MAX_BYTES = 2600


def port_records(workflow: CompiledWorkflow, step: Step, response: Message) -> list[dict[str, Any]]:
    """The declared output ports of ``step`` over ``response``:
    ``[{port, kind: "file", uri, sha256, mediaType?, sizeBytes?}]`` (sorted by port: a stored definition keeps no key order).

    :raises WorkflowExecutionError: ARTIFACT naming the port when a port's expression fails or
        yields no ``uri`` or ``sha256``, or a ``uri`` over :data:`PORT_URI_MAX_BYTES` (never
        retried: the same response would fail again).
    """
    declared = of(workflow, step.name).outputs
    if not declared:
        return []
    activation = {"response": _cel.bind_message(response)}
    out: list[dict[str, Any]] = []
    for port in sorted(declared):
        rule = declared[port]
        rec: dict[str, Any] = {"port": port, "kind": "file"}
        for key in ("uri", "sha256", "mediaType", "sizeBytes"):
            expr = rule.get(key)
            if not isinstance(expr, str) or not expr:
                continue
            if key == "mediaType" and "response" not in expr:
                rec[key] = expr  # a literal media type
                continue
            try:
                value = _text(_cel.evaluate(expr, activation))
            except Exception as exc:  # CelError, or a value CEL cannot hold
                raise WorkflowExecutionError(
                    FailureKind.ARTIFACT,
                    step.name,
                    f"output port '{port}' of step '{step.name}': {key} failed: {exc}",
                ) from exc
            # ASCII digits only: str.isdigit() is also true of "\u00b2", which int() refuses
            digits = key == "sizeBytes" and value.isascii() and value.isdigit()
            rec[key] = int(value) if digits else value
        for key in ("uri", "sha256"):
            if not rec.get(key):
                raise WorkflowExecutionError(
                    FailureKind.ARTIFACT,
                    step.name,
                    f"output port '{port}' of step '{step.name}' has no {key} in the response",
                )
        if len(rec["uri"].encode("utf-8", "surrogatepass")) > PORT_URI_MAX_BYTES:
            raise WorkflowExecutionError(
                FailureKind.ARTIFACT,
                step.name,
                f"output port '{port}' of step '{step.name}': uri is longer than "
                f"{PORT_URI_MAX_BYTES} bytes",
            )
        out.append(rec)
    return out


def receipt_value(workflow: CompiledWorkflow, step: Step, response: Message) -> str | None:
    """The provider's evidence of an external step's effect (its ``receipt`` CEL over the
    response), or None when the step declares none.

    :raises WorkflowExecutionError: RECEIPT when it is declared and yields nothing (the effect
        has no receipt: the run does not complete; never retried).
    """
    expr = of(workflow, step.name).receipt
    if not expr or step.effect != EFFECT_EXTERNAL:
        return None
    try:
        value = _text(_cel.evaluate(expr, {"response": _cel.bind_message(response)}))
    except Exception as exc:  # CelError
        raise WorkflowExecutionError(
            FailureKind.RECEIPT, step.name, f"the receipt of step '{step.name}' failed: {exc}"
        ) from exc
    if not value:
        raise WorkflowExecutionError(
            FailureKind.RECEIPT,
            step.name,
            f"effect '{step.name}' has no receipt ({expr} is empty): the run does not complete",
        )
    return value


def entry_hashes(entry: Any) -> dict[str, str]:
    """``{ref: sha256}`` of what one checkpoint entry produced: ``step`` (its response) and
    ``step.port`` per declared port (entries without hashes give nothing)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return {}
    name = entry["name"]
    out: dict[str, str] = {}
    if isinstance(entry.get("sha256"), str):
        out[name] = entry["sha256"]
    for rec in entry.get("artifacts") or ():
        if isinstance(rec, dict) and isinstance(rec.get("port"), str):
            out[f"{name}.{rec['port']}"] = str(rec.get("sha256", ""))
    return out


def current_hashes(entries: list[Any]) -> dict[str, str]:
    """``{ref: sha256}`` over a run's entries, the later entry of a step winning."""
    out: dict[str, str] = {}
    for entry in entries:
        out.update(entry_hashes(entry))
    return out


def states(entries: list[Any], workflow: CompiledWorkflow | None) -> dict[str, str]:
    """``{ref: state}`` derived from the entries: ``verified`` once a step whose
    ``validates`` names the ref succeeded, ``promoted`` once a step whose ``consumes`` names it
    succeeded (refs not named: ``draft``)."""
    out: dict[str, str] = {}
    if workflow is None:
        return out
    declared = spec(workflow)
    for entry in entries:
        if not isinstance(entry, dict) or "failed" in entry or entry.get("skipped") is True:
            continue
        s = declared.get(str(entry.get("name")))
        if s is None:
            continue
        for ref in s.validates:
            if out.get(ref) != "promoted":
                out[ref] = "verified"
        for c in s.consumes:
            out[c.ref] = "promoted"
    return out


def _uris(entries: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        for rec in entry.get("artifacts") or ():
            if isinstance(rec, dict) and isinstance(rec.get("uri"), str):
                out[f"{entry.get('name')}.{rec.get('port')}"] = rec["uri"]
    return out


def _resolve(ref: str, entries: list[Any]) -> dict[str, Any] | None:
    """The current artifact ``ref`` names among ``entries``: ``{ref, step, iteration, port,
    kind, attempt, sha256}`` (the later entry of a step wins), or None (none, or no hash)."""
    step, _, port = ref.partition(".")
    for entry in reversed(entries):
        if not isinstance(entry, dict) or entry.get("name") != step:
            continue
        if "failed" in entry or entry.get("skipped") is True:
            return None
        sha = entry_hashes(entry).get(ref)
        if not sha:
            return None
        k = entry.get("iteration", 0)
        return {
            "ref": ref,
            "step": step,
            "iteration": k if isinstance(k, int) and not isinstance(k, bool) else 0,
            "port": port or RESPONSE,
            "kind": "file" if port else RESPONSE,
            "attempt": entry.get("attempt", 0),
            "sha256": sha,
        }
    return None


def validated(workflow: CompiledWorkflow, step: Step, entries: list[Any]) -> list[dict[str, Any]]:
    """What a validator step that just succeeded verifies: its ``validates`` refs resolved
    against the run's entries (:func:`_resolve`; a ref with no hashed artifact is left out)."""
    out = []
    for ref in of(workflow, step.name).validates:
        found = _resolve(ref, entries)
        if found is not None:
            out.append(found)
    return out


def check_consumed(
    workflow: CompiledWorkflow,
    step: Step,
    entries: list[Any],
    read: Callable[[str], bytes | None] | None = None,
    rows: Callable[[], Mapping[str, str]] | None = None,
    job_id: str = "",
) -> list[dict[str, Any]]:
    """Before a publication step's call: each artifact it ``consumes`` must be in the
    required state and, with ``approvedBy``, have the hash the approvers saw (the approval
    entry's ``seenArtifacts``); a port whose bytes the node's ``ArtifactStore`` holds
    (``read(uri)``: the bytes, None when missing; it raises ValueError for a uri that is not
    the store's, or an ``artifact://`` one whose key the store refuses, which is refused
    here) is hashed again, so bytes changed after the review are refused too; and an
    artifact an operator retracted (``rows()``: ``{artifactId: state}`` of the run's
    ``workflow_artifact`` rows, read once, only for a step that consumes) is refused, and
    one an operator promoted (``promote-artifact``) counts as ``promoted``. Returns
    what was consumed: ``[{ref, sha256, step, iteration, port, kind, attempt}]``.

    :raises WorkflowExecutionError: ARTIFACT naming the reference (never retried).
    """
    consumed = of(workflow, step.name).consumes
    if not consumed:
        return []
    hashes = current_hashes(entries)
    state = states(entries, workflow)
    try:
        stored = dict(rows()) if rows is not None else {}
    except Exception as exc:
        raise WorkflowExecutionError(
            FailureKind.WORKFLOW,
            step.name,
            f"the artifacts '{step.name}' consumes could not be read: {exc}",
            store_failure=True,
        ) from exc
    approvals = {str(e.get("name")): e for e in entries if isinstance(e, dict) and "decision" in e}
    out: list[dict[str, Any]] = []
    for c in consumed:
        sha = hashes.get(c.ref)
        if sha is None:
            raise WorkflowExecutionError(
                FailureKind.ARTIFACT, step.name, f"consumed artifact '{c.ref}' does not exist"
            )
        found = _resolve(c.ref, entries) or {}
        row_state = ""
        if stored and found:
            aid = artifact_id(
                job_id, found["step"], found["iteration"], found["port"], found["attempt"], sha
            )
            row_state = stored.get(aid, "")
            if row_state == "retracted":
                raise WorkflowExecutionError(
                    FailureKind.ARTIFACT,
                    step.name,
                    f"consumed artifact '{c.ref}' was retracted (artifact {aid})",
                )
        have = state.get(c.ref, "draft")
        rank = {"draft": 0, "verified": 1, "promoted": 2}
        if rank.get(row_state, -1) > rank.get(have, -1):
            have = row_state  # an operator's promote-artifact (its row wins)
        if rank.get(have, -1) < rank.get(c.state, 1):
            raise WorkflowExecutionError(
                FailureKind.ARTIFACT,
                step.name,
                f"consumed artifact '{c.ref}' is {have}; '{step.name}' needs it {c.state}",
            )
        if c.approved_by:
            decided = approvals.get(c.approved_by)
            seen = (decided or {}).get("seenArtifacts")
            if not isinstance(seen, dict) or c.ref not in seen:
                raise WorkflowExecutionError(
                    FailureKind.ARTIFACT,
                    step.name,
                    f"consumed artifact '{c.ref}' has no hash recorded by approval "
                    f"'{c.approved_by}'",
                )
            if seen[c.ref] != sha:
                raise WorkflowExecutionError(
                    FailureKind.ARTIFACT,
                    step.name,
                    f"consumed artifact '{c.ref}' is {sha[:12]}, but approval "
                    f"'{c.approved_by}' saw {str(seen[c.ref])[:12]}: refusing to publish "
                    "what was not approved",
                )
        uri = _uris(entries).get(c.ref)
        if read is not None and uri is not None:
            try:
                data = read(uri)
            except ValueError as exc:
                if str(uri).startswith(STORE_SCHEME):  # the store's, but it refuses the key
                    raise WorkflowExecutionError(
                        FailureKind.ARTIFACT,
                        step.name,
                        f"consumed artifact '{c.ref}': its bytes at {uri} cannot be read again "
                        f"({exc}): refusing to publish what cannot be checked",
                    ) from exc
                data = b""  # not the store's uri: nothing to re-hash
                uri = None
            if uri is not None:
                if data is None:
                    raise WorkflowExecutionError(
                        FailureKind.ARTIFACT,
                        step.name,
                        f"consumed artifact '{c.ref}': its bytes at {uri} are missing",
                    )
                now = hashlib.sha256(data).hexdigest()
                if now != sha:
                    raise WorkflowExecutionError(
                        FailureKind.ARTIFACT,
                        step.name,
                        f"consumed artifact '{c.ref}': the bytes at {uri} are {now[:12]}, not "
                        f"the {sha[:12]} recorded (and approved): refusing to publish what was "
                        "not approved",
                    )
        out.append({**found, "ref": c.ref, "sha256": sha})
    return out


def seen_artifacts(entries: list[Any]) -> dict[str, str]:
    """What reviewers saw: ``{ref: sha256}`` of every artifact in the entries a waiting
    approval step was shown (recorded in its decision entry as ``seenArtifacts``)."""
    return current_hashes(entries)


def canonical_sha256(value: Any) -> tuple[str, int]:
    """``(hex SHA-256, size)`` of ``value``'s canonical JSON (sorted keys, no spaces): the hash
    of a receipt artifact."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest(), len(data)


def _cel_problem(text: str, step: Step | None) -> str | None:
    """Why ``text`` (a port or receipt expression over ``response``) cannot work: it does not
    compile, or the type checker finds it reads what the step's response type does not have;
    None when it checks (or cannot be checked here)."""
    try:
        _cel.compile_expression(text)
    except _cel.CelError as exc:
        return str(exc)
    output = getattr(step, "output_type", None)
    if output is None:
        return None
    return cel_check.type_error(text, {"response": output}, None, boolean=False)


def _before(workflow: CompiledWorkflow) -> dict[str, frozenset[str]]:
    """Step -> the steps that run before it: a graph's ancestors, a sequential run's earlier
    steps."""
    if getattr(workflow, "graph", None):
        return _graph.ancestors(workflow)
    order = [s.name for s in workflow.steps]
    return {name: frozenset(order[:i]) for i, name in enumerate(order)}


def findings(workflow: CompiledWorkflow) -> list[Finding]:
    """Findings about the artifact keys, each naming its path (``steps[i].outputs.<port>``,
    ``steps[i].validates[j]``, ``steps[i].consumes.<ref>``, ``steps[i].receipt``): malformed
    values, expressions that do not compile or read a field the step's response lacks (they
    would fail the step only after its call), references to no step or port, or to a step
    that does not run before the referring one; any artifact key on a compensation step, and
    ``consumes`` on a ``completion: "external"`` step (nothing checks it before the answer) or
    on an edge or structured step (the check runs only before a plain call)."""
    out: list[Finding] = []
    raws = _raw_steps(workflow)
    by_name = {s.name: s for s in workflow.steps}
    before = _before(workflow) if any("validates" in r or "consumes" in r for r in raws) else {}

    def runs_before(ref: str, name: str) -> bool:
        return ref.partition(".")[0] in before.get(name, frozenset())

    approvals = {s.name for s in workflow.steps if s.approval is not None}
    ports = {
        str(r.get("name")): set(r["outputs"]) if isinstance(r.get("outputs"), dict) else set()
        for r in raws
    }

    def ref_ok(ref: str) -> bool:
        step, _, port = ref.partition(".")
        return step in by_name and (not port or port in ports.get(step, set()))

    compensations: frozenset[str] = getattr(workflow, "compensations", None) or frozenset()
    for i, raw in enumerate(raws):
        name = str(raw.get("name", ""))
        if name in compensations:
            for key in ("outputs", "receipt", "validates", "consumes"):
                if key in raw:
                    out.append(
                        Finding(
                            name,
                            "artifact",
                            f"steps[{i}].{key}: '{name}' is a compensation step: its entry is "
                            "its response artifact only (no ports, receipt, validation or "
                            "publication; docs/artifacts.md)",
                        )
                    )
        step_of = by_name.get(name)
        if "consumes" in raw and step_of is not None and step_of.external:
            out.append(
                Finding(
                    name,
                    "artifact",
                    f"steps[{i}].consumes: '{name}' is a completion: \"external\" step: no call "
                    "of the engine's to check the consumed artifacts before; publish from a "
                    "call step",
                )
            )
        elif (
            "consumes" in raw
            and step_of is not None
            and (step_of.edge is not None or step_of.structured is not None)
        ):
            # the graph run checks consumes only before a plain call (graph_run._Run.execute);
            # an edge or structured step's success would promote what nothing checked
            kind = "an edge" if step_of.edge is not None else "a structured"
            out.append(
                Finding(
                    name,
                    "artifact",
                    f"steps[{i}].consumes: '{name}' is {kind} step: the consumed artifacts are "
                    "checked only before a plain call step's call; publish from a call step",
                )
            )
        if "outputs" in raw:
            outputs = raw["outputs"]
            if not isinstance(outputs, dict):
                out.append(Finding(name, "artifact", f"steps[{i}].outputs must be an object"))
            else:
                for port, rule in outputs.items():
                    where = f"steps[{i}].outputs.{port}"
                    if port == RESPONSE or port == RECEIPT:
                        out.append(Finding(name, "artifact", f"{where}: '{port}' is reserved"))
                    if not isinstance(rule, dict):
                        out.append(Finding(name, "artifact", f"{where} must be an object"))
                        continue
                    for key in ("uri", "sha256"):
                        if not isinstance(rule.get(key), str) or not rule.get(key):
                            out.append(
                                Finding(name, "artifact", f"{where}.{key} must be a CEL string")
                            )
                    for key in ("mediaType", "sizeBytes"):
                        if key in rule and (not isinstance(rule[key], str) or not rule[key]):
                            out.append(Finding(name, "artifact", f"{where}.{key} must be a string"))
                    for key in ("uri", "sha256", "mediaType", "sizeBytes"):
                        text = rule.get(key)
                        if not isinstance(text, str) or not text:
                            continue
                        if key == "mediaType" and "response" not in text:
                            continue  # a literal media type (port_records)
                        problem = _cel_problem(text, by_name.get(name))
                        if problem:
                            out.append(Finding(name, "artifact", f"{where}.{key}: {problem}"))
                    for key in rule:
                        if key not in ("uri", "sha256", "mediaType", "sizeBytes"):
                            out.append(
                                Finding(name, "artifact", f"{where}.{key} is not a port key")
                            )
        if "receipt" in raw:
            if not isinstance(raw["receipt"], str) or not raw["receipt"]:
                out.append(Finding(name, "artifact", f"steps[{i}].receipt must be a CEL string"))
            elif problem := _cel_problem(raw["receipt"], by_name.get(name)):
                out.append(Finding(name, "artifact", f"steps[{i}].receipt: {problem}"))
            elif by_name.get(name) is not None and by_name[name].effect != EFFECT_EXTERNAL:
                out.append(
                    Finding(
                        name,
                        "artifact",
                        f'steps[{i}].receipt needs effect: "external" (a receipt proves an '
                        "external effect)",
                    )
                )
        if "validates" in raw:
            val = raw["validates"]
            if not isinstance(val, list):
                out.append(Finding(name, "artifact", f"steps[{i}].validates must be a list"))
            else:
                for j, ref in enumerate(val):
                    if not isinstance(ref, str) or not ref_ok(ref):
                        out.append(
                            Finding(
                                name,
                                "artifact",
                                f"steps[{i}].validates[{j}]: {ref!r} names no step or port",
                            )
                        )
                    elif not runs_before(ref, name):
                        out.append(
                            Finding(
                                name,
                                "artifact",
                                f"steps[{i}].validates[{j}]: {ref.partition('.')[0]!r} does "
                                f"not run before {name!r}",
                            )
                        )
        if "consumes" in raw:
            cons = raw["consumes"]
            if not isinstance(cons, dict):
                out.append(Finding(name, "artifact", f"steps[{i}].consumes must be an object"))
                continue
            for ref, want in cons.items():
                where = f"steps[{i}].consumes.{ref}"
                if not ref_ok(ref):
                    out.append(Finding(name, "artifact", f"{where}: names no step or port"))
                elif not runs_before(ref, name):
                    out.append(
                        Finding(
                            name,
                            "artifact",
                            f"{where}: {ref.partition('.')[0]!r} does not run before {name!r}",
                        )
                    )
                if not isinstance(want, dict):
                    out.append(Finding(name, "artifact", f"{where} must be an object"))
                    continue
                if want.get("state", "verified") not in ("verified", "promoted"):
                    out.append(
                        Finding(name, "artifact", f"{where}.state must be verified or promoted")
                    )
                by = want.get("approvedBy")
                if by is not None and by not in approvals:
                    out.append(
                        Finding(name, "artifact", f"{where}.approvedBy names no approval step")
                    )
                for key in want:
                    if key not in ("state", "approvedBy"):
                        out.append(Finding(name, "artifact", f"{where}.{key} is not a key"))
    return out
