"""Step effects: idempotency keys, intents, verify probes, and checkpoint fingerprints.

DESIGN.md section 13; docs/workflows.md *Effects*. The engine knows nothing of the store: the
worker hands :func:`~protomolt_jobs.workflow.runner.run_segment` an :class:`EffectContext`
(the job's id, attempt, the row's step generations and intents, and ``on_intent``, which
writes an intent under the lease). Without one, a segment runs exactly as before.

- **Idempotency key**: every call carries ``x-protomolt-idempotency-key:
  <job_id>:<step>:<generation>`` (generation 0 until ``retry-step`` grows it); in a loop's
  iteration k > 0, ``<job_id>:<step>:<generation>:<k>`` (``loops.key_suffix``).
- **Intent**: before calling an ``external`` step, ``on_intent(step, key)`` (one fenced write).
  A resumed segment that finds an intent and no checkpoint does not call the step blindly:
  the ``verify`` probe decides, else the run stops as ``RecoveryRequired``.
- **Fingerprints**: every new checkpoint entry carries ``definitionSha256``,
  ``descriptorSha256`` (the method's input and output descriptors and every message type they
  reach), ``requestSha256`` (deterministic serialization of the request), ``adapterVersion``
  (when declared), ``attempt``, ``receipt`` (external steps); the store stamps ``at`` with the
  database's time. The per-step parts are computed once per compiled workflow (cached).
  ``definitionSha256`` covers the definition without its ``tests`` (they never change a run).
  Replay compares an entry's ``definitionSha256``, ``descriptorSha256`` and ``adapterVersion``
  (when present: older entries have none and replay as before).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.message import Message

from protomolt_jobs.workflow.types import EFFECT_EXTERNAL, CompiledWorkflow, Step

__all__ = [
    "IDEMPOTENCY_HEADER",
    "MISMATCH",
    "EffectContext",
    "Fingerprint",
    "fingerprint",
    "idempotency_key",
    "mismatch",
    "stamp",
]

#: The gRPC metadata key every step call carries.
IDEMPOTENCY_HEADER = "x-protomolt-idempotency-key"
#: The reason prefix of a run stopped by a checkpoint whose fingerprint changed.
MISMATCH = "checkpoint-mismatch"
#: Entry fields replay compares (in this order; the first that differs is named).
COMPARED = ("definitionSha256", "descriptorSha256", "adapterVersion")


@dataclass
class EffectContext:
    """What the worker tells the engine about one claimed run.

    :ivar job_id: the run's id (text), the key's first part.
    :ivar attempt: the claim's attempt, recorded in each new entry.
    :ivar generations: ``{step: generation}`` from the row (absent: 0).
    :ivar intents: ``{step: intent}`` from the row (an intent is a JSON object).
    :ivar on_intent: ``(step, key) -> None``: store an intent before an external call
        (raises on a lost lease or a store failure: the step is then not called).
    :ivar loop_extensions: see the field.
    :ivar watch_cancel: ``(fn) -> withdraw``: ``fn`` is called once a cancel of the run is
        requested (at once when one already is); a step without an external effect hands it
        its call's ``cancel``, so the call stops (None: calls are never cancelled).
    """

    job_id: str
    attempt: int = 0
    generations: Mapping[str, Any] = field(default_factory=dict)
    intents: Mapping[str, Any] = field(default_factory=dict)
    on_intent: Callable[[str, str], None] | None = None
    watch_cancel: Callable[[Callable[[], None]], Callable[[], None]] | None = None
    #: ``() -> {loop step: re-runs extend-loop added}``: asked by a graph run whose loop reached
    #: its bound (one read of the row; never for a run without loops). None: no extension.
    loop_extensions: Callable[[], Mapping[str, Any]] | None = None
    #: ``(step, iteration, report) -> None``: store one progress report of a resumable step
    #: (``report``: ``{percent, details, state, adapterVersion, inputSha256, done}``); raises
    #: when the lease is gone or an operator's pause or cancel took the run there
    #: (``workflow/resumable.py``). None: nothing is stored.
    on_progress: Callable[[str, int, Mapping[str, Any]], None] | None = None
    #: ``(step, iteration) -> saved progress or None``: the last report of a resumable step
    #: (an object with ``state``), read once when the step starts. None: never any.
    progress_saved: Callable[[str, int], Any] | None = None
    #: ``(step, iteration, resumable, fingerprints) -> (key, value)``: the metadata
    #: ``protomolt-progress-token`` of a ``reportsProgress`` step's call, carrying the call's
    #: ``fingerprints`` (``{adapterVersion, inputSha256, descriptorSha256,
    #: definitionSha256}``) for its reports to store (store/progress_token.py). None: no
    #: header.
    progress_token: Callable[[str, int, bool, Mapping[str, str]], tuple[str, str]] | None = None
    #: ``(uri) -> bytes or None``: an artifact's bytes from the node's ``ArtifactStore`` (None:
    #: missing; ValueError: not the store's uri), asked by a publication step (``consumes``)
    #: to hash the bytes it publishes again (workflow/artifacts.py). None: not checked.
    artifact_bytes: Callable[[str], bytes | None] | None = None
    #: ``() -> {artifactId: state}`` of the run's ``workflow_artifact`` rows (one read), asked
    #: by a publication step so an artifact an operator retracted is never published. None:
    #: not checked.
    artifact_rows: Callable[[], Mapping[str, str]] | None = None

    def canceller(self, step: Step) -> Callable[[Callable[[], None]], Callable[[], None]] | None:
        """What cancels ``step``'s call on a cancel request: :attr:`watch_cancel` for a step
        without an external effect; None for an ``external`` one (it finishes and is
        recorded)."""
        return None if step.effect == EFFECT_EXTERNAL else self.watch_cancel

    def key(self, step: str) -> str:
        return idempotency_key(self.job_id, step, self.generations.get(step, 0))


def idempotency_key(job_id: str, step: str, generation: Any) -> str:
    """``<job_id>:<step>:<generation>`` (a non-integer generation counts as 0)."""
    gen = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    return f"{job_id}:{step}:{gen}"


@dataclass(frozen=True)
class Fingerprint:
    """The cached per-workflow parts of a step's checkpoint fingerprint."""

    definition_sha256: str
    descriptor_sha256: dict[str, str]


_CACHE: weakref.WeakKeyDictionary[CompiledWorkflow, Fingerprint] = weakref.WeakKeyDictionary()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reached(roots: list[_d.Descriptor]) -> list[_d.Descriptor]:
    seen: dict[str, _d.Descriptor] = {}
    todo = list(roots)
    while todo:
        desc = todo.pop()
        if desc.full_name in seen:
            continue
        seen[desc.full_name] = desc
        for f in desc.fields:
            if f.message_type is not None:
                todo.append(f.message_type)
    return [seen[k] for k in sorted(seen)]


def descriptor_sha256(*types: _d.Descriptor | None) -> str:
    """SHA-256 over the ``DescriptorProto`` of each given type and every message type it
    reaches (sorted by full name; deterministic serialization), each prefixed by its name."""
    h = hashlib.sha256()
    for i, root in enumerate(types):
        h.update(f"#{i}:{root.full_name if root is not None else ''}\n".encode())
    for desc in _reached([t for t in types if t is not None]):
        proto = descriptor_pb2.DescriptorProto()
        desc.CopyToProto(proto)
        h.update(desc.full_name.encode() + b"\n")
        h.update(proto.SerializeToString(deterministic=True))
    return h.hexdigest()


def _step_types(step: Step) -> tuple[_d.Descriptor | None, ...]:
    if step.method is not None:
        return (step.method.input_type, step.method.output_type, step.output_type)
    return (step.input_type, step.output_type)


def fingerprint(workflow: CompiledWorkflow) -> Fingerprint:
    """The workflow's fingerprint parts, computed once per compiled workflow."""
    cached = _CACHE.get(workflow)
    if cached is not None:
        return cached
    definition = workflow.definition
    if isinstance(definition, dict) and "tests" in definition:
        # a definition's tests never change how it runs: editing them is not a new definition
        # for replay (docs/workflows.md, Tests in the definition)
        definition = {k: v for k, v in definition.items() if k != "tests"}
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    fp = Fingerprint(
        definition_sha256=_sha(canonical.encode("utf-8", "surrogatepass")),
        descriptor_sha256={s.name: descriptor_sha256(*_step_types(s)) for s in workflow.steps},
    )
    _CACHE[workflow] = fp
    return fp


def stamp(
    entry: dict[str, Any],
    workflow: CompiledWorkflow,
    step: Step,
    *,
    request: Message | None = None,
    attempt: int | None = None,
    receipt: Any = None,
) -> dict[str, Any]:
    """Add the fingerprint fields to a new checkpoint ``entry`` (in place; returned).

    ``name``, ``skipped`` and ``response`` are left as they are. ``at`` is the store's (the
    database's ``now()``).
    """
    fp = fingerprint(workflow)
    entry["definitionSha256"] = fp.definition_sha256
    entry["descriptorSha256"] = fp.descriptor_sha256.get(step.name, "")
    if request is not None:
        entry["requestSha256"] = _sha(request.SerializeToString(deterministic=True))
    if step.adapter_version:
        entry["adapterVersion"] = step.adapter_version
    if attempt is not None:
        entry["attempt"] = attempt
    if step.effect == EFFECT_EXTERNAL and receipt is not None:
        entry["receipt"] = receipt
    return entry


def refresh(entry: dict[str, Any], workflow: CompiledWorkflow, step: Step) -> dict[str, Any]:
    """A copy of ``entry`` under the current fingerprint (``migrate-checkpoint keep``)."""
    out = dict(entry)
    fp = fingerprint(workflow)
    out["definitionSha256"] = fp.definition_sha256
    out["descriptorSha256"] = fp.descriptor_sha256.get(step.name, "")
    if step.adapter_version:
        out["adapterVersion"] = step.adapter_version
    else:
        out.pop("adapterVersion", None)
    return out


def mismatch(workflow: CompiledWorkflow, step: Step, entry: Mapping[str, Any]) -> str | None:
    """The first fingerprint field of ``entry`` that differs from the current workflow, or
    None. An entry without fingerprint fields (stored before them) never mismatches."""
    if "definitionSha256" not in entry and "descriptorSha256" not in entry:
        return None
    fp = fingerprint(workflow)
    current = {
        "definitionSha256": fp.definition_sha256,
        "descriptorSha256": fp.descriptor_sha256.get(step.name, ""),
        "adapterVersion": step.adapter_version or None,
    }
    for name in COMPARED:
        if name == "adapterVersion":
            if entry.get(name) != current[name]:
                return name
        elif name in entry and entry[name] != current[name]:
            return name
    return None


def mismatch_reason(step: str, changed: str) -> str:
    return f"{MISMATCH}: step '{step}' {changed} changed"


def response_json(msg: Message, pool: Any) -> Any:
    return json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, descriptor_pool=pool
    )


def probe_step(step: Step) -> Step:
    """``step`` re-aimed at its ``verify`` method (for channels and ``call_unary``)."""
    assert step.verify is not None
    v = step.verify
    return dataclasses.replace(
        step,
        target=v.target,
        tls=v.tls,
        method=v.method,
        method_name=v.method_name,
        input_type=v.method.input_type,
    )
