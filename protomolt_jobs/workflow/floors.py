"""Policy floors: node rules that select steps and set the weakest approval they may have
(DESIGN.md section 20; docs/approvals.md, *Policy floors*).

A floor is one ``[[jobs.approval_floors]]`` table of the node configuration, handed to the
engine as data (the engine never reads the configuration)::

    {"name": "publishing", "when": "capabilities.exists(c, c.startsWith('publish:'))",
     "quorum": 2, "approvers": {"roles": ["editor", "chief-editor"]}, "veto": ["reject"]}

``when`` is a CEL expression over ``step`` (the step's name), ``workflow`` (the definition's
``name``, ``""`` when it has none) and ``capabilities`` (the step's ``capabilities`` list as
written, ``[]`` when absent), compiled once (``celenv``). A selected step must be an approval
step at least as strict as every floor that selects it (the *meet* of the floors; a layer may
only tighten, never loosen). Strictness is this order, all four at once:

- ``quorum``: the step's ``approval.quorum`` >= the floor's;
- ``approvers``: when the floor names approvers, every role and principal the step names (its
  ``approvers`` and every escalation's ``addRoles``/``addPrincipals``) is one the floor names
  (a subset, compared by name: a principal is within the floor only when the floor lists that
  principal); a floor without ``approvers`` leaves them free;
- ``veto``: every decision the step lets one vote decide is in the floor's ``veto``
  (default ``["reject"]``): a veto is a quorum of one for that decision;
- no self-approval: always on (there is no switch to turn off), so nothing to compare.

A definition that breaks one is refused with a :class:`~protomolt_jobs.workflow.types.Finding`
of kind ``weakens_policy`` naming the rule and the step. At decision time (``approve-step``)
the floors in force then are met again: :func:`requirement` gives the quorum, vetoes and
approvers that apply and :func:`policy_sha256` the hash recorded with the decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import celenv
from protomolt_jobs.workflow.types import CompiledWorkflow, Finding, Step

__all__ = [
    "DEFAULT_VETO",
    "FINDING_KIND",
    "Floor",
    "FloorError",
    "Requirement",
    "compile_floors",
    "findings",
    "policy_sha256",
    "requirement",
    "selecting",
]

#: The finding kind of a definition that weakens a floor.
FINDING_KIND = "weakens_policy"
#: The decisions a floor lets decide on one vote when it does not say.
DEFAULT_VETO: tuple[str, ...] = ("reject",)
_KEYS = ("name", "when", "quorum", "approvers", "veto")
_MAX_QUORUM = 1000


class FloorError(ProtomoltJobsError, ValueError):
    """A floor of the configuration is malformed.

    :ivar key: the key as written in the configuration (``jobs.approval_floors[0].quorum``).
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key} {message}")


@dataclass(frozen=True, slots=True)
class Floor:
    """One node rule (see the module docstring).

    :ivar name: the rule's name (unique on the node; refusals name it).
    :ivar when: the CEL selector over ``step``, ``workflow``, ``capabilities``.
    :ivar quorum: the least quorum a selected step may have (>= 1).
    :ivar roles: the roles a selected step's approvers must be within (None: free).
    :ivar principals: the principals they must be within (None: free).
    :ivar veto: the decisions a selected step may let one vote decide.
    """

    name: str
    when: str
    quorum: int = 1
    roles: tuple[str, ...] | None = None
    principals: tuple[str, ...] | None = None
    veto: tuple[str, ...] = DEFAULT_VETO

    @property
    def bounds_approvers(self) -> bool:
        """True when the floor names approvers."""
        return self.roles is not None

    def to_json(self) -> dict[str, Any]:
        """The canonical form (hashed by :func:`policy_sha256`)."""
        body: dict[str, Any] = {
            "name": self.name,
            "when": self.when,
            "quorum": self.quorum,
            "veto": sorted(self.veto),
        }
        if self.bounds_approvers:
            body["approvers"] = {
                "roles": sorted(self.roles or ()),
                "principals": sorted(self.principals or ()),
            }
        return body

    def selects(self, workflow: str, step: str, capabilities: Sequence[str]) -> bool:
        """Whether ``when`` holds for the step. An evaluation error or a value that is not a
        boolean selects it (fail closed: the floor applies)."""
        activation = {
            "step": celenv.to_cel(step),
            "workflow": celenv.to_cel(workflow),
            "capabilities": celenv.to_cel(list(capabilities)),
        }
        try:
            verdict = celenv.program(self.when).evaluate(activation)
        except CELEvalError:
            return True
        if not isinstance(verdict, bool | celtypes.BoolType):
            return True
        return bool(verdict)


def _names(key: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or not all(isinstance(v, str) and v.strip() for v in raw):
        raise FloorError(key, f"must be a list of non-empty names; got {raw!r}"[:200])
    return tuple(v.strip() for v in raw)


def compile_floors(
    raw: Sequence[Mapping[str, Any]], prefix: str = "jobs.approval_floors"
) -> tuple[Floor, ...]:
    """The floors of ``[[jobs.approval_floors]]`` tables, their ``when`` compiled.

    :param raw: the tables as read (TOML or JSON).
    :returns: the floors in configuration order.
    :raises FloorError: naming the key (``jobs.approval_floors[1].when``) and what is wrong:
        an unknown key, a missing or duplicate ``name``, a ``when`` that does not compile, a
        ``quorum`` that is not a whole number from 1 to 1000, an ``approvers`` that is not
        ``{roles = [...], principals = [...]}`` naming at least one, a ``veto`` that is not a
        list of decisions.
    """
    if not isinstance(raw, list | tuple):
        raise FloorError(prefix, "must be a list of tables ([[jobs.approval_floors]])")
    out: list[Floor] = []
    seen: set[str] = set()
    for i, table in enumerate(raw):
        at = f"{prefix}[{i}]"
        if not isinstance(table, Mapping):
            raise FloorError(at, "must be a table")
        for key in table:
            if key not in _KEYS:
                raise FloorError(
                    f"{at}.{key}", f"is not a key of a floor (known: {', '.join(_KEYS)})"
                )
        name = table.get("name")
        if not isinstance(name, str) or not name.strip():
            raise FloorError(f"{at}.name", "is required: a non-empty name refusals name")
        name = name.strip()
        if name in seen:
            raise FloorError(f"{at}.name", f"'{name}' names two floors")
        seen.add(name)
        when = table.get("when")
        if not isinstance(when, str) or not when.strip():
            raise FloorError(
                f"{at}.when",
                "is required: a CEL expression over step, workflow and capabilities",
            )
        try:
            celenv.program(when)
        except celenv.CelCompileError as exc:
            raise FloorError(f"{at}.when", f"does not compile: {exc.detail}") from None
        quorum = table.get("quorum", 1)
        if (
            isinstance(quorum, bool)
            or not isinstance(quorum, int)
            or not 1 <= quorum <= _MAX_QUORUM
        ):
            raise FloorError(
                f"{at}.quorum", f"must be a whole number from 1 to {_MAX_QUORUM}; got {quorum!r}"
            )
        roles: tuple[str, ...] | None = None
        principals: tuple[str, ...] | None = None
        if "approvers" in table:
            approvers = table["approvers"]
            if not isinstance(approvers, Mapping) or set(approvers) - {"roles", "principals"}:
                raise FloorError(
                    f"{at}.approvers", "must be a table {roles = [...], principals = [...]}"
                )
            roles = _names(f"{at}.approvers.roles", approvers.get("roles", []))
            principals = _names(f"{at}.approvers.principals", approvers.get("principals", []))
            if not roles and not principals:
                raise FloorError(f"{at}.approvers", "must name at least one role or principal")
        veto = _names(f"{at}.veto", table.get("veto", list(DEFAULT_VETO)))
        out.append(Floor(name, when.strip(), quorum, roles, principals, veto))
    return tuple(out)


def capabilities_of(workflow: CompiledWorkflow, step: Step) -> tuple[str, ...]:
    """The step's ``capabilities`` as written in the definition (strings only; ``()`` when
    absent). Read from the raw definition so a parser that does not carry them still gets
    them."""
    parsed = getattr(step, "capabilities", None)
    if isinstance(parsed, list | tuple):
        return tuple(c for c in parsed if isinstance(c, str))
    steps = workflow.definition.get("steps") if isinstance(workflow.definition, dict) else None
    if (
        isinstance(steps, list)
        and 0 <= step.index < len(steps)
        and isinstance(steps[step.index], dict)
    ):
        raw = steps[step.index].get("capabilities")
        if isinstance(raw, list):
            return tuple(c for c in raw if isinstance(c, str))
    return ()


def selecting(floors: Sequence[Floor], workflow: CompiledWorkflow, step: Step) -> tuple[Floor, ...]:
    """The floors whose ``when`` selects ``step`` of ``workflow``."""
    if not floors:
        return ()
    caps = capabilities_of(workflow, step)
    return tuple(f for f in floors if f.selects(workflow.name or "", step.name, caps))


@dataclass(frozen=True, slots=True)
class Requirement:
    """The meet of the floors that select one step.

    :ivar rules: the floors' names.
    :ivar quorum: the greatest of their quorums.
    :ivar veto: the decisions every one of them lets one vote decide.
    :ivar floors: the floors themselves.
    """

    rules: tuple[str, ...]
    quorum: int
    veto: frozenset[str]
    floors: tuple[Floor, ...]

    def approver_refusal(self, principal: str, groups: Sequence[str]) -> str | None:
        """Why ``principal`` (in ``groups``) is outside a floor's approvers (None: within
        every floor's)."""
        for f in self.floors:
            if not f.bounds_approvers:
                continue
            if principal in (f.principals or ()) or set(groups) & set(f.roles or ()):
                continue
            allowed = [f"role '{r}'" for r in f.roles or ()] + [
                f"principal '{p}'" for p in f.principals or ()
            ]
            return (
                f"'{principal}' is not within the approvers of policy floor '{f.name}' "
                f"({', '.join(allowed)})"
            )
        return None


def requirement(floors: Sequence[Floor]) -> Requirement | None:
    """The meet of ``floors`` (None when there are none)."""
    if not floors:
        return None
    veto = frozenset(floors[0].veto)
    for f in floors[1:]:
        veto &= frozenset(f.veto)
    return Requirement(
        tuple(f.name for f in floors), max(f.quorum for f in floors), veto, tuple(floors)
    )


def policy_sha256(floors: Sequence[Floor]) -> str:
    """SHA-256 (hex) of the canonical JSON (keys sorted, no spaces) of ``floors`` sorted by
    name: the policy a decision was taken under."""
    body = sorted((f.to_json() for f in floors), key=lambda f: f["name"])
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def findings(workflow: CompiledWorkflow, floors: Sequence[Floor]) -> list[Finding]:
    """``weakens_policy`` findings: each selected step that is not an approval step, or is
    one weaker than a floor that selects it (quorum, approvers, veto), naming the rule."""
    out: list[Finding] = []
    for step in workflow.steps:
        for f in selecting(floors, workflow, step):
            out.extend(_weakened(step, f))
    return out


def _weakened(step: Step, f: Floor) -> list[Finding]:
    spec = step.approval
    rule = f"policy floor '{f.name}' (when: {f.when})"
    if spec is None:
        return [
            Finding(
                step.name,
                FINDING_KIND,
                f"{rule} selects step '{step.name}', which must be an approval step "
                f'(completion: "approval") with approval.quorum >= {f.quorum}',
            )
        ]
    out: list[Finding] = []
    if spec.quorum < f.quorum:
        out.append(
            Finding(
                step.name,
                FINDING_KIND,
                f"{rule}: approval.quorum {spec.quorum} is below the floor's quorum {f.quorum}",
            )
        )
    if f.bounds_approvers:
        roles = set(spec.roles) | {r for _, rs, _ in spec.escalate for r in rs}
        principals = set(spec.principals) | {p for _, _, ps in spec.escalate for p in ps}
        wider = sorted(f"role '{r}'" for r in roles - set(f.roles or ())) + sorted(
            f"principal '{p}'" for p in principals - set(f.principals or ())
        )
        if wider:
            out.append(
                Finding(
                    step.name,
                    FINDING_KIND,
                    f"{rule}: approvers (with escalations) name {', '.join(wider)}, outside the "
                    "floor's approvers",
                )
            )
    looser = sorted(set(spec.veto) - set(f.veto))
    if looser:
        out.append(
            Finding(
                step.name,
                FINDING_KIND,
                f"{rule}: approval.veto lets one vote decide {', '.join(looser)}; the floor "
                f"allows a veto only for {', '.join(sorted(f.veto)) or 'no decision'}",
            )
        )
    return out
