"""The known keys of a workflow definition, per object kind, and the walk that names every other.

A definition is JSON: the top level, its steps, their ``after`` entries, ``edge``, ``fanOut``,
``structured`` and ``verify`` objects, the ``celRules`` entries, ``schema``, ``output``,
``completion``, ``scheduling`` and ``budget``. :data:`KINDS` is the one table of what each of
these objects may hold; a key outside it is a typo or a setting this engine does not have, and
silently dropping it is how ``"maxParalel": 2`` used to run with the default of 4.

How the table was made: every key a reader of the definition looks up (``envelope.py``: the
envelope, schema forms, steps, graph keys, ``edge``/``fanOut``/``structured``, effects and
``verify``, ``output``, ``celRules``; ``runs/scheduling.py``: ``scheduling``, ``budget`` and
the steps' ``cost``; ``worker/budget.py`` and ``worker/policies.py`` read only keys already
listed), checked against upstream's envelope (reference/upstream-workflow.md sections 1.2 to
1.7, and the typed ``CompiledWorkflow`` messages of ``host/upstream_service.py``). Every key
upstream's format has is read here too, so none is listed as accepted-and-ignored; should
one be, it goes in :data:`KINDS` with a comment saying so, because refusing a key upstream
accepts would refuse upstream's definitions. ``tests/unit/test_workflow_keys_guide.py``
holds the table to docs/workflows.md (each documented key is known, each known key is
documented) and to upstream's typed messages.

:func:`unknown_keys` walks a definition along the table: it descends only into values of known
keys (a dict, or the dicts of a list), never into an unknown key's value, so its depth is the
table's and a hostile definition cannot make it recurse. Each unknown key gets a suggestion:
an alias from :data:`ALIASES`, else the closest known key of the same kind
(:func:`difflib.get_close_matches`, case and ``_``/``-`` folded first), else a close key of
another kind, said as such (``maxAttempts`` is a key of ``steps[i].structured``, not of a step).

Where it applies (docs/workflows.md *Unknown keys*): at the doors. ``check-workflow`` (and so
``PUT /protomolt/workflows/{name}``) reports a finding of kind ``unknown-key`` per key;
``submit-workflow``, ``run-workflow`` and the request topic refuse the definition. Never in the
worker: a run stored before a key became unknown keeps running (``verifier.verify``, which the
worker's claim re-runs, does not look at keys).
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from protomolt_jobs.workflow.types import Finding

__all__ = [
    "ALIASES",
    "FINDING_KIND",
    "KINDS",
    "LISTED_KEYS",
    "MAX_FINDINGS",
    "Kind",
    "UnknownKey",
    "findings",
    "known_keys",
    "refusal",
    "unknown_keys",
]

#: The ``kind`` of the findings this module makes.
FINDING_KIND = "unknown-key"
#: Most unknown-key findings one definition gets; the last one then counts the rest.
MAX_FINDINGS = 100
#: Most unknown keys a door's refusal names (:func:`refusal`).
LISTED_KEYS = 10
#: Longest key quoted in a message or a path, in characters (a key may be a megabyte long).
_QUOTE_CHARS = 80


@dataclass(frozen=True, slots=True)
class Kind:
    """One object kind of a definition.

    :ivar name: the kind's name in :data:`KINDS` (``step``).
    :ivar noun: an object of this kind in a message (``a step``).
    :ivar where: where objects of this kind sit, for messages (``steps[i].edge``).
    :ivar keys: each known key -> the kind of its value (an object of that kind, or a list
        whose object elements are), or None when the value holds no keys of ours (text,
        numbers, lists of text, the ``sources`` map of file paths).
    """

    name: str
    noun: str
    where: str
    keys: Mapping[str, str | None]
    #: ``keys`` as a set, and the keys whose values are walked: the fast path's view.
    known: frozenset[str] = field(init=False)
    nested: tuple[tuple[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "known", frozenset(self.keys))
        nested = tuple((k, v) for k, v in self.keys.items() if v is not None)
        object.__setattr__(self, "nested", nested)


def _kinds(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


#: Every object kind of a definition and its known keys (the module docstring says how the
#: table was made). A key read anywhere is listed here once, under the kind that holds it.
KINDS: Mapping[str, Kind] = _kinds(
    Kind(
        "workflow",
        "the workflow",
        "the top level",
        {
            # upstream's envelope (reference/upstream-workflow.md 1.2)
            "name": None,
            "schema": "schema",
            "inputType": None,
            "deadlineMs": None,
            "steps": "step",
            "output": "output",
            # graph workflows (DESIGN.md 12; envelope._max_parallel, envelope._require)
            "maxParallel": None,
            "completion": "completion",
            # scheduling defaults and the run budget (DESIGN.md 14; runs/scheduling.py)
            "scheduling": "scheduling",
            "budget": "budget",
            # what cancel-job does by default (issue 27 item 4; workflow/cancel.py)
            "cancel": "cancel",
            # how long finished runs are kept, per final status (issue 30 item 6;
            # runs/retention.py): a duration, or an object of the kind below
            "retention": "retention",
            # tests in the definition (DESIGN.md 25; workflow/testing/cases.py): mocks are
            # keyed by step name, so `mocks` is walked by cases.parse_cases, not here
            "tests": "testCase",
            # input ownership (issue 29 item 6; workflow/inputs.py): input path -> {owner,
            # required?, description?}; its keys are paths, not ours, so the declarations
            # are checked by inputs.findings (kind `inputs`), not walked here
            "inputs": None,
        },
    ),
    Kind(
        "schema",
        "a schema",
        "schema",
        {
            # upstream's three forms (reference 1.3); `sources` maps file paths to proto
            # text, so its keys are paths, not ours
            "type": None,
            "sources": None,
            "root": None,
            "descriptorSetBase64": None,
        },
    ),
    Kind(
        "step",
        "a step",
        "steps[i]",
        {
            # upstream's step (reference 1.4 to 1.6)
            "name": None,
            "target": None,
            "method": None,
            "tls": None,
            "when": None,
            "rules": None,
            "celRules": "celRule",
            "validate": None,
            "deadlineMs": None,
            "completion": None,
            "structured": "structured",
            "edge": "edge",
            "fanOut": "fanOut",
            # graph workflows (DESIGN.md 12; envelope.GRAPH_STEP_KEYS)
            "after": "after",
            "join": None,
            "compensate": None,
            # effects (DESIGN.md 13; envelope._parse_effect)
            "effect": None,
            "verify": "verify",
            "adapterVersion": None,
            # the step's cost against budget.maxCost (DESIGN.md 14; worker/budget.py)
            "cost": None,
            # an approval step's voters, quorum, decisions and timers (docs/approvals.md)
            "approval": "approval",
            # the capabilities the step needs granted before it runs (docs/approvals.md)
            "capabilities": None,
            # a bounded back-edge to an ancestor (DESIGN.md 22; workflow/loops.py)
            "loop": "loop",
            # a step called chunk by chunk, each response a progress checkpoint
            # (DESIGN.md 23; workflow/resumable.py)
            "resumable": "resumable",
            # the service reports its own progress with ReportProgress (DESIGN.md 23;
            # store/progress_token.py)
            "reportsProgress": None,
            # input ownership (issue 29 item 6; workflow/inputs.py): who owns the step's
            # outputs, and whether a missing input fails the step or parks the run
            "owner": None,
            "onMissingInput": None,
            # artifacts (issue 29; workflow/artifacts.py, docs/artifacts.md): named output
            # ports (port names are the author's, so `outputs` is checked by
            # artifacts.findings, not walked here), an external step's receipt, the artifacts
            # a validator step verifies and those a publication step consumes (keys are
            # artifact references)
            "outputs": None,
            "receipt": None,
            "validates": None,
            "consumes": None,
        },
    ),
    Kind(
        "resumable",
        "a resumable spec",
        "steps[i].resumable",
        {"state": None, "done": None, "progress": None},
    ),
    Kind(
        "loop",
        "a loop",
        "steps[i].loop",
        {"to": None, "max": None, "onExhausted": None, "allowEffects": None},
    ),
    Kind("after", "an after entry", "steps[i].after[j]", {"step": None, "on": None}),
    Kind(
        "edge",
        "an edge",
        "steps[i].edge",
        {
            "sources": None,
            "produceType": None,
            "rules": None,
            "celRules": "celRule",
            "projectTo": None,
            "validate": None,
        },
    ),
    Kind(
        "fanOut",
        "a fanOut",
        "steps[i].fanOut",
        {
            "items": None,
            "maxItems": None,
            "maxConcurrency": None,
            "failurePolicy": None,
            "collectType": None,
            "collectInto": None,
        },
    ),
    Kind(
        "structured",
        "a structured spec",
        "steps[i].structured",
        {"targetType": None, "model": None, "maxAttempts": None},
    ),
    Kind(
        "verify",
        "a verify probe",
        "steps[i].verify",
        {
            "method": None,
            "target": None,
            "tls": None,
            "rules": None,
            "celRules": "celRule",
            "found": None,
            "receipt": None,
        },
    ),
    Kind(
        "celRule",
        "a CEL rule",
        "celRules[j]",
        {"filter": None, "selector": None, "target": None, "fallback": None},
    ),
    Kind(
        "approval",
        "an approval",
        "steps[i].approval",
        {
            "approvers": "approvers",
            "quorum": None,
            "decisions": None,
            "veto": None,
            "distinctFrom": None,
            # decision -> "fail" | "complete": its keys are the step's own decisions
            "end": None,
            "expires": None,
            "onExpire": None,
            "escalate": "escalation",
        },
    ),
    Kind(
        "approvers",
        "the approvers",
        "steps[i].approval.approvers",
        {"roles": None, "principals": None},
    ),
    Kind(
        "escalation",
        "an escalation",
        "steps[i].approval.escalate[j]",
        {"after": None, "addRoles": None, "addPrincipals": None},
    ),
    Kind("output", "the output", "output", {"type": None, "rules": None, "celRules": "celRule"}),
    Kind("completion", "the completion", "completion", {"require": None}),
    Kind(
        "scheduling",
        "the scheduling",
        "scheduling",
        {"priority": None, "queue": None, "fairnessKey": None, "dedupKey": None},
    ),
    Kind("budget", "the budget", "budget", {"deadline": None, "maxCost": None, "onExceeded": None}),
    Kind("cancel", "the cancel", "cancel", {"compensate": None, "interruptCalls": None}),
    # issue 30 item 6 (runs/retention.py): durations by final status
    Kind(
        "retention",
        "the retention",
        "retention",
        {"completed": None, "failed": None, "cancelled": None, "dead": None},
    ),
    Kind(
        "testCase",
        "a test case",
        "tests[i]",
        {"name": None, "input": None, "mocks": None, "events": "testEvent", "expect": "testExpect"},
    ),
    Kind(
        "testEvent",
        "a test event",
        "tests[i].events[j]",
        {"after": None, "advanceMs": None, "crash": None, "action": None},
    ),
    Kind(
        "testExpect",
        "a test's expect",
        "tests[i].expect",
        {
            "status": None,
            "path": None,
            "calls": None,
            "skipped": None,
            "errorKind": None,
            "failedStep": None,
        },
    ),
)

#: Misspellings difflib cannot see (another word for the same thing), per kind: unknown key
#: -> the key meant. ``gate`` and ``condition`` are the ones upstream's users write for
#: ``when`` (reference/upstream-workflow.md, gap 13).
ALIASES: Mapping[str, Mapping[str, str]] = {
    "step": {
        "gate": "when",
        "condition": "when",
        "if": "when",
        "dependsOn": "after",
        "needs": "after",
        "timeoutMs": "deadlineMs",
        "timeout": "deadlineMs",
    },
}

#: What to add when a key is suggested from another kind: the setting the author most likely
#: wanted lives outside the definition.
_ELSEWHERE_NOTES = {
    "maxAttempts": "a run's attempts are the node's jobs.max_attempts, stamped into it at submit",
}

#: difflib's similarity a suggestion needs: of the same kind (difflib's default), and of
#: another kind, which must be nearer (a typo, not a different word: ``ceiling`` is not
#: ``scheduling``).
_CUTOFF = 0.6
_CUTOFF_ELSEWHERE = 0.85

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def known_keys(kind: str) -> tuple[str, ...]:
    """The known keys of ``kind`` in table order.

    :raises KeyError: ``kind`` is not in :data:`KINDS`.
    """
    return tuple(KINDS[kind].keys)


@dataclass(frozen=True, slots=True)
class UnknownKey:
    """One key of a definition that :data:`KINDS` does not know.

    :ivar path: where it is (``steps[1].maxAtempts``; a key that is not an identifier is
        quoted: ``steps[0]["a b"]``).
    :ivar key: the key as written.
    :ivar kind: the object kind it was found in (a :data:`KINDS` name).
    :ivar step: the name of the step it belongs to, ``""`` for none (or a step without a name).
    :ivar suggestion: the known key it is closest to, or None.
    :ivar suggested_in: the kinds ``suggestion`` is a key of when it is not a key of ``kind``
        (empty when it is, or when there is no suggestion).
    """

    path: str
    key: str
    kind: str
    step: str
    suggestion: str | None = None
    suggested_in: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """The finding's text: ``unknown key 'maxParalel' at maxParalel: did you mean
        'maxParallel'?``; for a key of another kind, where it belongs; when nothing is close,
        the keys this kind has."""
        kind = KINDS[self.kind]
        head = f"unknown key '{_quote(self.key)}' at {self.path}"
        if self.suggestion is None:
            keys = ", ".join(sorted(kind.keys, key=str.lower))
            return f"{head}: {kind.noun} has the keys {keys}"
        if not self.suggested_in:
            return f"{head}: did you mean '{self.suggestion}'?"
        where = _listed([KINDS[k].where for k in self.suggested_in])
        belongs = f"a key of {where}, not of {kind.noun}"
        if self.suggestion == self.key:
            said = f"{head}: it is {belongs}"
        else:
            said = f"{head}: did you mean '{self.suggestion}'? It is {belongs}"
        note = _ELSEWHERE_NOTES.get(self.suggestion)
        return f"{said}; {note}" if note else said

    def to_finding(self) -> Finding:
        """This key as a verifier :class:`Finding` (kind :data:`FINDING_KIND`)."""
        return Finding(self.step, FINDING_KIND, self.message)


def unknown_keys(definition: Any) -> Iterator[UnknownKey]:
    """Walk ``definition`` along :data:`KINDS` and yield each key it does not know, in
    document order. Never raises: a value of the wrong type is not walked (the parser says
    what is wrong with it), and anything that is not an object yields nothing.

    :param definition: a workflow definition (a JSON object as a dict), or any value.
    """
    yield from _walk(definition, KINDS["workflow"], "", "")


def findings(definition: Any, *, limit: int = MAX_FINDINGS) -> list[Finding]:
    """The unknown-key findings of ``definition``: one per key, at most ``limit``; past it,
    the last finding counts the keys left out.

    :param definition: a workflow definition, or any value (see :func:`unknown_keys`).
    :param limit: most findings returned (at least 1).
    :returns: findings of kind :data:`FINDING_KIND` in document order; empty when every key
        is known.
    """
    out: list[Finding] = []
    if _clean(definition, KINDS["workflow"]):
        return out
    more = 0
    for unknown in unknown_keys(definition):
        if len(out) < limit:
            out.append(unknown.to_finding())
        else:
            more += 1
    if more:
        out[-1] = Finding(
            "",
            FINDING_KIND,
            f"{more + 1} more unknown keys (only the first {limit - 1} are listed)",
        )
    return out


def refusal(definition: Any, *, listed: int = LISTED_KEYS) -> tuple[UnknownKey, str] | None:
    """What a door that refuses unknown keys says (``submit-workflow``, ``run-workflow``).

    :param definition: a workflow definition, or any value (see :func:`unknown_keys`).
    :param listed: most keys named (the rest are counted as "and more").
    :returns: None when every key is known; else the first unknown key (its ``path`` and
        ``step`` name the refusal) and the text ``"an unknown key: <message>"`` or
        ``"unknown keys: <message>; <message>..."``.
    """
    if _clean(definition, KINDS["workflow"]):
        return None
    unknown = list(itertools.islice(unknown_keys(definition), listed + 1))
    if not unknown:
        return None
    text = "; ".join(u.message for u in unknown[:listed])
    if len(unknown) > listed:
        text += "; and more"
    return unknown[0], f"{'an unknown key' if len(unknown) == 1 else 'unknown keys'}: {text}"


def _clean(value: Any, kind: Kind) -> bool:
    """True when ``value`` holds no unknown key: :func:`unknown_keys` yields nothing for it.

    The doors' fast path (every submit makes it): set comparisons of each object's keys,
    without building a path or a message."""
    if isinstance(value, dict):
        if not value.keys() <= kind.known:
            return False
        for key, child in kind.nested:
            inner = value.get(key)
            if inner is not None and not _clean(inner, KINDS[child]):
                return False
        return True
    if isinstance(value, list):
        return all(_clean(item, kind) for item in value if isinstance(item, dict))
    return True


def _walk(value: Any, kind: Kind, path: str, step: str) -> Iterator[UnknownKey]:
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                yield from _walk_object(item, kind, f"{path}[{i}]", step)
    elif isinstance(value, dict):
        yield from _walk_object(value, kind, path, step)


def _walk_object(obj: dict[Any, Any], kind: Kind, path: str, step: str) -> Iterator[UnknownKey]:
    if kind.name == "step":
        name = obj.get("name")
        step = name.strip() if isinstance(name, str) else ""
    for key, value in obj.items():
        key = str(key)
        here = _join(path, key)
        if key not in kind.keys:
            yield _unknown(key, kind, here, step)
            continue
        child = kind.keys[key]
        if child is not None:
            yield from _walk(value, KINDS[child], here, step)


def _join(path: str, key: str) -> str:
    """``path`` and ``key`` as ``a.key``, or ``a["key"]`` when ``key`` is not an identifier
    (a key past :data:`_QUOTE_CHARS` is cut short: a path names a place, it is not data)."""
    if len(key) <= _QUOTE_CHARS and _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    key = _quote(key)
    quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{path}[{quoted}]"


def _fold(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def _closest(key: str, known: Mapping[str, Any], cutoff: float) -> str | None:
    folded = _fold(key)
    for candidate in known:
        if _fold(candidate) == folded:
            return candidate
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def _unknown(key: str, kind: Kind, path: str, step: str) -> UnknownKey:
    alias = ALIASES.get(kind.name, {}).get(key)
    if alias is not None:
        return UnknownKey(path, key, kind.name, step, alias)
    near = _closest(key, kind.keys, _CUTOFF)
    if near is not None:
        return UnknownKey(path, key, kind.name, step, near)
    others = {k: None for other in KINDS.values() if other is not kind for k in other.keys}
    near = _closest(key, others, _CUTOFF_ELSEWHERE)
    if near is None:
        return UnknownKey(path, key, kind.name, step)
    holders = tuple(o.name for o in KINDS.values() if o is not kind and near in o.keys)
    return UnknownKey(path, key, kind.name, step, near, holders)


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _quote(text: str) -> str:
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."
