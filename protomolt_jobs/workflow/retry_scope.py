"""``retry-step``'s scopes: which checkpoints a retry drops, which it keeps on a condition,
and how a run resolves them (issue 27 item 3; docs/verbs.md ``retry-step``).

A retry names one step ``s``. Its checkpoint is dropped (``s`` runs again); what happens to
the checkpoints of the steps downstream of it (graph: its transitive dependants; sequential:
every later step) depends on the scope:

- ``dependants`` (the default, as before): dropped; they run again.
- ``only``: kept **provisionally**, each marked ``"retryOf": {"step": s, "outputSha256": h}``
  where ``h`` is :func:`output_sha256` of ``s``'s dropped entry. When ``s`` has run again, a
  run replays them if ``s``'s new output has the same hash (nothing downstream is called) and
  runs them again if it differs.

Either way a downstream step declared ``effect: "external"`` whose checkpoint records a result
(neither skipped nor failed) is **never** run again as a side effect: its entry is kept,
marked ``"retryOf": {"step": s, "kept": "effect"}``, and replayed. (Naming such a step itself
runs it again, with its idempotency key unless the operator asks for a new one: the verb's
business, not this module's.)

A marked entry stays in the stored array as written; the run never rewrites it. The array may
therefore hold, for one step, a marked entry and, after it, the entry of the step's new run
(a provisional entry whose retried step's output changed): the later, unmarked entry wins.
:func:`resolve` turns a stored array into what a segment replays (``Resolved.prior``) and
what it takes when it reaches a step (``Held.take``); :func:`settled` is the same view for
readers (reports). An array without ``retryOf`` (every run that no ``only`` retry or kept
effect touched) resolves to None: the runners see it exactly as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow.types import EFFECT_EXTERNAL, CompiledWorkflow

__all__ = [
    "MARKER",
    "SCOPES",
    "Held",
    "LoopRetryError",
    "Resolved",
    "RetryPlan",
    "output_sha256",
    "plan_retry",
    "resolve",
    "settled",
    "unproven_intents",
]

#: The key a kept-on-condition checkpoint entry carries.
MARKER = "retryOf"
#: retry-step's scopes, the default first.
SCOPES = ("dependants", "only")


def output_sha256(entry: Any) -> str:
    """SHA-256 (hex) of what a checkpoint entry says the step produced: its response (canonical
    JSON: sorted keys, no spaces), or that it was skipped, or that it failed. Fingerprints,
    times, attempts and receipts are not part of it."""
    if not isinstance(entry, dict):
        entry = {}
    if "failed" in entry:
        output: Any = {"failed": True}
    elif entry.get("skipped") is True:
        output = {"skipped": True}
    else:
        output = {"response": entry.get("response")}
    text = json.dumps(output, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _name(entry: Any) -> str | None:
    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
        return str(entry["name"])
    return None


def _marker(entry: Any) -> dict[str, Any] | None:
    if isinstance(entry, dict) and isinstance(entry.get(MARKER), dict):
        return dict(entry[MARKER])
    return None


def _strip(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != MARKER}


def _iteration(entry: Any) -> int:
    """A stored entry's loop iteration (0 when it carries none)."""
    k = entry.get("iteration", 0) if isinstance(entry, dict) else 0
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 0


def _key(entry: Any) -> tuple[str | None, int]:
    return _name(entry), _iteration(entry)


def _intent_iteration(name: str, intent: Any) -> int | None:
    """The loop iteration an intent's idempotency key names (``<job>:<step>:<generation>``,
    plus ``:<k>`` in iteration k > 0), or None when its key is not in that form."""
    key = intent.get("key") if isinstance(intent, dict) else None
    if not isinstance(key, str):
        return None
    parts = key.split(":")
    if len(parts) < 3 or parts[1] != name:
        return None
    if len(parts) == 3:
        return 0
    if len(parts) == 4 and parts[3].isdigit():
        return int(parts[3])
    return None


def unproven_intents(
    intents: dict[str, Any], checkpoints: Iterable[Any], *, retried: str
) -> dict[str, Any]:
    """The recorded intents of external steps that no checkpoint proves, except ``retried``'s
    (the operator's retry is its word on that step): what a retry must keep, so the run asks
    the step's probe (or waits as RECOVERY_REQUIRED) instead of calling it blindly.

    An intent is proven by a checkpoint of its step **in the iteration its key names**: in a
    loop run, ``send``'s checkpoint of iteration 0 does not prove the intent of iteration 1
    (key ``...:send:0:1``). An intent whose key is not in the engine's form is proven by any
    checkpoint of its step, as before loops existed.

    :param intents: ``{step: {"key": ..., ...}}`` as stored on the run.
    :param checkpoints: the run's stored entries.
    :param retried: the step the operator retries.
    :returns: the intents to keep, by step.
    """
    done: dict[str, set[int]] = {}
    for entry in checkpoints:
        name, k = _key(entry)
        if name is not None:
            done.setdefault(name, set()).add(k)
    kept: dict[str, Any] = {}
    for name, intent in intents.items():
        if name == retried:
            continue
        iteration = _intent_iteration(name, intent)
        proven = name in done and (iteration is None or iteration in done[name])
        if not proven:
            kept[name] = intent
    return kept


class LoopRetryError(ProtomoltJobsError, ValueError):
    """A retry a workflow with loops cannot keep apart (the message says why)."""


def _records_result(entry: dict[str, Any]) -> bool:
    return "failed" not in entry and entry.get("skipped") is not True


@dataclass(frozen=True)
class RetryPlan:
    """What a retry stores.

    :ivar checkpoints: the array to store (the retried step's entries dropped, downstream ones
        dropped, kept provisionally or kept as effects).
    :ivar dropped: steps whose entries were dropped (they run again), in declaration order.
    :ivar provisional: steps kept on the condition that the retried step's output is unchanged.
    :ivar kept_effects: external-effect steps kept because their result is recorded.
    """

    checkpoints: list[Any]
    dropped: list[str]
    provisional: list[str]
    kept_effects: list[str]


def plan_retry(
    workflow: CompiledWorkflow,
    checkpoints: list[Any],
    step: str,
    *,
    scope: str,
    downstream: Iterable[str],
) -> RetryPlan:
    """The checkpoints a ``retry-step`` of ``step`` with ``scope`` stores (module docstring).

    Entries an earlier retry marked are first settled (:func:`settled`); one still waiting on
    its retried step keeps its mark.

    In a workflow with loops, the retried step's latest entry (its latest iteration's) is
    dropped and only the downstream entries stored after it are dropped or kept on a
    condition; the entries of earlier iterations stay as they are, so the run goes on in that
    iteration with the loop's count kept. A provisional mark then also carries the retried
    step's ``iteration``.

    :param downstream: the steps downstream of ``step`` (``StoredRun.dependants()[step]``).
    :raises LoopRetryError: scope ``only`` would keep two entries of one step on a condition
        (a step upstream of a loop body).
    :raises ValueError: ``scope`` is not one of :data:`SCOPES`.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope: one of {', '.join(SCOPES)}; got {scope!r}")
    below = set(downstream)
    entries = settled(workflow, checkpoints, keep_waiting=True)
    at = next((i for i in range(len(entries) - 1, -1, -1) if _name(entries[i]) == step), None)
    old = entries[at] if at is not None and not _marker(entries[at]) else None
    sha = output_sha256(old) if old is not None else None
    # In a workflow with loops only the step's latest entry (its latest iteration's) is
    # dropped, and only the entries after it are downstream: earlier iterations stay.
    looped = bool(workflow.loops)
    kept: list[Any] = []
    dropped: set[str] = {step}
    provisional: set[str] = set()
    effects: set[str] = set()
    for i, entry in enumerate(entries):
        name = _name(entry)
        if name == step and (not looped or i == at):
            continue
        if name is None or name not in below or (looped and at is not None and i < at):
            kept.append(entry)
            continue
        declared = workflow.step(name)
        if declared is not None and declared.effect == EFFECT_EXTERNAL and _records_result(entry):
            kept.append({**_strip(entry), MARKER: {"step": step, "kept": "effect"}})
            effects.add(name)
        elif _marker(entry) is not None:
            kept.append(entry)  # still waiting on an earlier retry's step: as it was
            provisional.add(name)
        elif scope == "only" and sha is not None:
            if looped and name in provisional:
                raise LoopRetryError(
                    f"retry-step of '{step}' with scope 'only' would keep several iterations of "
                    f"'{name}' on a condition (it is upstream of a loop body); use scope "
                    "'dependants' (the loop runs again from its first iteration)"
                )
            mark: dict[str, Any] = {"step": step, "outputSha256": sha}
            if _iteration(old):
                mark["iteration"] = _iteration(old)
            kept.append({**entry, MARKER: mark})
            provisional.add(name)
        else:
            dropped.add(name)
    # every downstream step not kept runs again, whether or not it had an entry
    dropped |= below - provisional - effects
    order = [s.name for s in workflow.steps]
    return RetryPlan(
        checkpoints=kept,
        dropped=[n for n in order if n in dropped],
        provisional=[n for n in order if n in provisional],
        kept_effects=[n for n in order if n in effects],
    )


@dataclass
class Held:
    """The marked entries a segment replays when it reaches their step, instead of running it.

    :ivar ready: entries replayed whenever their step is reached (kept effects; for a
        sequential run, entries past a gap in the positional prefix).
    :ivar waiting: ``step -> (retried step, output hash, entry)``: replayed only once the
        retried step has run again in this segment with the same output hash.
    """

    ready: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    #: retried step -> whether its new output has the old hash
    decided: dict[str, bool] = field(default_factory=dict)

    def take(self, name: str) -> dict[str, Any] | None:
        """The entry to replay for ``name`` instead of running it, or None (run it).

        Called by the runners when ``name`` is about to start (its gate not yet evaluated)."""
        if name in self.ready:
            return self.ready.pop(name)
        held = self.waiting.get(name)
        if held is None or self.decided.get(held[0]) is not True:
            return None
        del self.waiting[name]
        return held[2]

    def observe(self, entry: dict[str, Any]) -> None:
        """A new checkpoint entry of this segment: decides the entries waiting on its step."""
        name = _name(entry)
        if name is None or name in self.decided:
            return
        hashes = {sha for anchor, sha, _ in self.waiting.values() if anchor == name}
        if hashes:
            self.decided[name] = output_sha256(entry) in hashes

    def wrap(
        self, on_checkpoint: Callable[[dict[str, Any]], None]
    ) -> Callable[[dict[str, Any]], None]:
        """``on_checkpoint`` that also :meth:`observe`\\ s each entry (after storing it)."""

        def observed(entry: dict[str, Any]) -> None:
            on_checkpoint(entry)
            self.observe(entry)

        return observed


@dataclass(frozen=True)
class Resolved:
    """A stored array as a segment runs it: ``prior`` is replayed up front (for a sequential
    run, a positional prefix), ``held`` is consulted as steps are reached."""

    prior: list[dict[str, Any]]
    held: Held


def _split(
    workflow: CompiledWorkflow, checkpoints: list[Any]
) -> tuple[list[Any], list[dict[str, Any]], dict[str, bool]]:
    """(unmarked entries, marked entries not superseded, retried step -> output unchanged)."""
    plain = [e for e in checkpoints if _marker(e) is None]
    # a marked entry is superseded by a later run of its step in the same loop iteration
    # (iteration 0 for a workflow without loops: by name)
    names = {_key(e) for e in plain}
    marked = [e for e in checkpoints if _marker(e) is not None and _key(e) not in names]
    current = {}
    for e in plain:
        if _name(e) is not None:
            current[_name(e)] = e
    decided: dict[str, bool] = {}
    for e in marked:
        mark = _marker(e) or {}
        anchor = mark.get("step")
        if (
            "outputSha256" in mark
            and isinstance(anchor, str)
            and anchor in current
            and _iteration(current[anchor]) == _iteration(mark)
        ):
            same = output_sha256(current[anchor]) == mark["outputSha256"]
            decided[anchor] = decided.get(anchor, True) and same
    return plain, marked, decided


def settled(
    workflow: CompiledWorkflow, checkpoints: list[Any], *, keep_waiting: bool = False
) -> list[Any]:
    """The stored array as it stands for a reader: unmarked entries, marked entries that are
    kept (effects) or whose retried step ran again with the same output (mark removed), and,
    with ``keep_waiting``, those still waiting on their retried step (marked). Entries whose
    retried step's output changed are left out (their step runs, or ran, again)."""
    if not any(_marker(e) is not None for e in checkpoints or []):
        return list(checkpoints or [])
    plain, marked, decided = _split(workflow, checkpoints)
    out = list(plain)
    chosen: dict[int, Any] = {id(e): e for e in plain}
    for e in marked:
        mark = _marker(e) or {}
        anchor = mark.get("step")
        if mark.get("kept") == "effect" or decided.get(str(anchor)) is True:
            out.append(_strip(e))
            chosen[id(e)] = out[-1]
        elif keep_waiting and str(anchor) not in decided:
            out.append(e)
            chosen[id(e)] = e
    if workflow.loops:
        # a loop's entries stay in completion order (replay follows the iterations)
        return [chosen[id(e)] for e in checkpoints if id(e) in chosen]
    return out


def resolve(workflow: CompiledWorkflow, checkpoints: list[Any]) -> Resolved | None:
    """What a segment replays of ``checkpoints`` (module docstring), or None when no entry
    is marked (the array is replayed as it is, as before retry scopes existed).

    A graph run replays the settled entries up front (by name); a sequential run replays the
    longest positional prefix and holds the rest. Entries waiting on a retried step that has
    not run again yet are held until it has.
    """
    if not isinstance(checkpoints, list) or not any(_marker(e) is not None for e in checkpoints):
        return None
    plain, marked, decided = _split(workflow, checkpoints)
    ready: list[dict[str, Any]] = []
    chosen = {id(e) for e in plain}
    held = Held()
    for e in marked:
        mark = _marker(e) or {}
        anchor = str(mark.get("step"))
        if mark.get("kept") == "effect" or decided.get(anchor) is True:
            ready.append(_strip(e))
            chosen.add(id(e))
        elif anchor not in decided and isinstance(mark.get("outputSha256"), str):
            held.waiting[str(_name(e))] = (anchor, mark["outputSha256"], _strip(e))
    entries = [*plain, *ready]
    if workflow.graph and workflow.loops:
        # a loop's replay follows the completion order: each kept entry in its stored place
        in_order = [
            _strip(e) if _marker(e) is not None else e for e in checkpoints if id(e) in chosen
        ]
        return Resolved(prior=in_order, held=held)
    if workflow.graph:
        return Resolved(prior=entries, held=held)
    index = {s.name: i for i, s in enumerate(workflow.steps)}
    by_position = {index[n]: e for e in entries if (n := _name(e)) in index}
    prior: list[dict[str, Any]] = []
    while len(prior) in by_position:
        prior.append(by_position.pop(len(prior)))
    for e in by_position.values():
        held.ready[str(_name(e))] = e
    # an entry naming no step of the workflow stays in the prefix's place: replay reports it
    prior.extend(e for e in entries if _name(e) not in index)
    return Resolved(prior=prior, held=held)
