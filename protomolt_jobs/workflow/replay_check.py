"""Would a run's checkpoints replay under another version of its workflow? (``replay-check``)

A run keeps the definition it was submitted with, so a new version never changes a run by
itself; this module answers what resuming a run under a *candidate* definition would do,
before the candidate is activated (Temporal's replayer for this engine; docs/workflows.md,
*Checking a new version against running jobs*).

:func:`drift` replays a run's stored checkpoint entries against the candidate with the rules
a resumed segment applies, and names the first entry that would not replay:

- **placement** (``step_run.replay``, graph ``replay``): a sequential workflow's entry ``i``
  must belong to the candidate's step ``i``; a graph's entry must name a step the candidate
  has, once (a renamed, removed or reordered step is drift);
- **response**: a stored response must parse strictly as the candidate step's output type
  (a removed or retyped field is drift), as replay parses it;
- **fingerprint** (``effects.mismatch``, the checkpoint-mismatch rule) for entries that carry
  one: the step's ``descriptorSha256`` (its method's request and response types and every
  message they reach) and its ``adapterVersion``. The whole definition's ``definitionSha256``
  is not compared: every candidate differs from the stored version by definition, so it
  would flag every run; the per-step parts say whether *this step's* checkpoint still means
  the same.

A step appended after the last checkpointed one, a changed rule of a step not yet run, or a
new optional field are not drift. Entries the candidate does not reach (a sequential run's
entries past the candidate's last step) are drift: the candidate has no step for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow.step_run import replay
from protomolt_jobs.workflow.types import CompiledWorkflow, WorkflowExecutionError

__all__ = ["Drift", "drift"]


@dataclass(frozen=True, slots=True)
class Drift:
    """The first checkpoint of a run that would not replay under the candidate.

    :ivar checkpoint: the entry's index in the run's checkpoints.
    :ivar step: the step the entry names (``""`` for an entry without a name).
    :ivar rule: ``placement``, ``response`` or ``fingerprint``.
    :ivar reason: what differs, in the words replay would use.
    """

    checkpoint: int
    step: str
    rule: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "rule": self.rule,
            "reason": self.reason,
        }


def drift(candidate: CompiledWorkflow, checkpoints: Sequence[Any]) -> Drift | None:
    """The first of ``checkpoints`` that would not replay under ``candidate``, or None.

    :param candidate: the candidate definition, parsed (``parse_workflow``) and verified.
    :param checkpoints: a run's stored entries, in order (``[{name, skipped?, response?,
        failed?, descriptorSha256?, adapterVersion?, ...}]``).
    :returns: a :class:`Drift`, or None when every entry replays. Never raises for odd
        entries: a malformed one is drift.
    """
    seen: set[str] = set()
    for i, entry in enumerate(checkpoints):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            return Drift(i, "", "placement", f"checkpoint {i} is not a {{name, ...}} object")
        if candidate.graph:
            step = candidate.step(name)
            if step is None:
                return Drift(
                    i, name, "placement", f"the candidate has no step '{name}' (checkpoint {i})"
                )
            if name in seen:
                return Drift(i, name, "placement", f"checkpoint {i} repeats step '{name}'")
            seen.add(name)
        else:
            if i >= len(candidate.steps):
                return Drift(
                    i,
                    name,
                    "placement",
                    f"checkpoint {i} belongs to step '{name}' but the candidate has only "
                    f"{len(candidate.steps)} steps",
                )
            step = candidate.steps[i]
            if step.name != name:
                return Drift(
                    i,
                    name,
                    "placement",
                    f"checkpoint {i} belongs to step '{name}' but the candidate's step {i} is "
                    f"'{step.name}'",
                )
        assert isinstance(entry, dict)
        if ("definitionSha256" in entry or "descriptorSha256" in entry) and (
            "descriptorSha256" in entry or "adapterVersion" in entry
        ):
            changed = _fingerprint(candidate, step, entry)
            if changed is not None:
                return Drift(i, name, "fingerprint", fx.mismatch_reason(name, changed))
        if "failed" in entry or step.output_type is None:
            continue
        try:
            replay(candidate, i, step, entry)
        except WorkflowExecutionError as exc:
            return Drift(i, name, "response", exc.message)
    return None


def _fingerprint(candidate: CompiledWorkflow, step: Any, entry: dict[str, Any]) -> str | None:
    """The per-step fingerprint field of ``entry`` that differs under ``candidate``
    (``descriptorSha256``, ``adapterVersion``), or None."""
    current = fx.fingerprint(candidate).descriptor_sha256.get(step.name, "")
    if "descriptorSha256" in entry and entry["descriptorSha256"] != current:
        return "descriptorSha256"
    if entry.get("adapterVersion") != (step.adapter_version or None):
        return "adapterVersion"
    return None
