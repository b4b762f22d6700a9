"""Scheduling fields of a run: priority, queue, fairness key, dedup key, and the run budget.

A submission may carry ``priority`` (1 highest .. 5, default 3), ``queue`` (the resource class,
default ``default``), ``fairnessKey`` (the tenant or project fair interleaving is across,
default ``default``) and ``dedupKey`` (while a run with that key is not terminal, submitting
another answers the existing run). A workflow definition may set defaults for each in its
``scheduling`` object, and a whole-run ``budget``::

    {"scheduling": {"priority": 2, "queue": "gpu", "fairnessKey": "team-a", "dedupKey": "nightly"},
     "budget": {"deadline": "PT30M", "maxCost": 100, "onExceeded": "fail"},
     "steps": [{"name": "render", ..., "cost": "response.pages * 2"}]}

A value given at submit wins over the workflow's default, which wins over the global default.
Every check raises :class:`FieldError` naming the field (the verbs answer ``invalid-input``;
the submitter answers ``invalid-definition`` for a workflow's own values). See
docs/workflows.md ("Scheduling and budgets").
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = [
    "DEFAULT_FAIRNESS_KEY",
    "DEFAULT_PRIORITY",
    "DEFAULT_QUEUE",
    "MAX_NAME_CHARS",
    "ON_EXCEEDED",
    "PAUSE_SUPPORTED",
    "Budget",
    "FieldError",
    "Scheduling",
    "check_step_costs",
    "parse_budget",
    "parse_duration_s",
    "parse_name",
    "parse_priority",
    "resolve",
]

#: Priority of a run that names none (1 is the highest, 5 the lowest).
DEFAULT_PRIORITY = 3
#: Queue of a run that names none.
DEFAULT_QUEUE = "default"
#: Fairness key of a run that names none.
DEFAULT_FAIRNESS_KEY = "default"
#: Longest queue, fairness key or dedup key, in characters.
MAX_NAME_CHARS = 200
#: What ``budget.onExceeded`` may say.
ON_EXCEEDED = ("fail", "pause")
#: Whether ``onExceeded: "pause"`` is accepted: operator control's PAUSED status (migration
#: 0002, issue #15) has landed and both budget paths pause with it (the sweeper's
#: ``job_budget_expired_pause`` and the worker's ``job_budget_pause``).
PAUSE_SUPPORTED = True

# ISO-8601 durations without years or months (their length varies): PnW, PnDTnHnMnS.
_DURATION = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


class FieldError(ProtomoltJobsError, ValueError):
    """A scheduling value is malformed; ``field`` names it (``priority``, ``budget.deadline``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True, slots=True)
class Scheduling:
    """Where and in which order a run is claimed."""

    priority: int = DEFAULT_PRIORITY
    queue: str = DEFAULT_QUEUE
    fairness_key: str = DEFAULT_FAIRNESS_KEY
    dedup_key: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """A whole-run budget.

    :ivar deadline_s: wall-clock seconds from submit to the end of the run (waits, pauses and
        backoff included), or None.
    :ivar max_cost: the ceiling of the summed step costs, or None.
    :ivar on_exceeded: ``fail`` or ``pause``.
    """

    deadline_s: float | None = None
    max_cost: float | None = None
    on_exceeded: str = "fail"


def parse_priority(field: str, value: Any) -> int:
    """An integer 1..5 (a whole float such as ``2.0`` is accepted, a bool is not).

    :raises FieldError: naming ``field``.
    """
    given = value
    if isinstance(value, str):
        # ASCII digits only, and few of them: str.isdigit() also accepts '²' (which int()
        # refuses) and '١' (which int() reads as 1), and int() refuses over 4300 digits.
        text = value.strip()
        if text.isascii() and text.isdigit():
            value = int(text) if len(text) <= 9 else 0  # out of range either way
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise FieldError(
            field,
            f"'{field}' must be an integer from 1 (highest) to 5 (lowest); got {given!r:.80}",
        )
    return value


def parse_name(field: str, value: Any) -> str:
    """A queue, fairness key or dedup key: a non-blank string of at most 200 characters,
    without NUL or control characters; surrounding blanks are dropped.

    :raises FieldError: naming ``field``.
    """
    if not isinstance(value, str):
        raise FieldError(field, f"'{field}' must be a string; got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise FieldError(field, f"'{field}' must not be blank")
    if len(text) > MAX_NAME_CHARS:
        raise FieldError(field, f"'{field}' must be at most {MAX_NAME_CHARS} characters")
    # C0 and C1 controls and DEL (unicodedata category Cc), and lone surrogates (Cs).
    if any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise FieldError(field, f"'{field}' must not contain control characters or lone surrogates")
    return text


def parse_duration_s(field: str, value: Any) -> float:
    """An ISO-8601 duration (``PT3S``, ``PT1H30M``, ``P1DT2H``, ``P2W``) in seconds, > 0.
    Years and months are refused (their length varies).

    :raises FieldError: naming ``field``.
    """
    match = _DURATION.match(value.strip().upper()) if isinstance(value, str) else None
    if match is None or value.strip().upper() in ("P", "PT") or value.strip().endswith("T"):
        raise FieldError(
            field,
            f"'{field}' must be an ISO-8601 duration such as PT30S, PT1H30M or P1DT2H "
            f"(no years or months); got {value!r}",
        )
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    seconds = (
        parts.get("w", 0.0) * 604_800
        + parts.get("d", 0.0) * 86_400
        + parts.get("h", 0.0) * 3_600
        + parts.get("m", 0.0) * 60
        + parts.get("s", 0.0)
    )
    if not 0 < seconds <= 366 * 86_400:
        raise FieldError(field, f"'{field}' must be above zero and at most 366 days; got {value!r}")
    return seconds


def _scheduling_defaults(definition: Mapping[str, Any]) -> dict[str, Any]:
    block = definition.get("scheduling")
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise FieldError("scheduling", "'scheduling' must be a JSON object")
    from protomolt_jobs.workflow.keys import known_keys  # the one table of definition keys

    known = known_keys("scheduling")
    for key in block:
        if key not in known:
            raise FieldError(
                f"scheduling.{key}",
                f"unknown key 'scheduling.{key}'; 'scheduling' accepts: {', '.join(known)}",
            )
    return block


def resolve(definition: Mapping[str, Any], submitted: Mapping[str, Any]) -> Scheduling:
    """The run's scheduling: each of ``priority``, ``queue``, ``fairnessKey``, ``dedupKey``
    from ``submitted`` when given (not None), else from ``definition["scheduling"]``, else the
    default.

    :raises FieldError: a submitted value is malformed (``field`` is the submitted name, e.g.
        ``priority``) or the workflow's default is (``field`` starts with ``scheduling.``).
    """
    defaults = _scheduling_defaults(definition)
    values: dict[str, Any] = {}
    for key in ("priority", "queue", "fairnessKey", "dedupKey"):
        if submitted.get(key) is not None:
            raw, field = submitted[key], key
        elif defaults.get(key) is not None:
            raw, field = defaults[key], f"scheduling.{key}"
        else:
            continue
        values[key] = parse_priority(field, raw) if key == "priority" else parse_name(field, raw)
    return Scheduling(
        priority=values.get("priority", DEFAULT_PRIORITY),
        queue=values.get("queue", DEFAULT_QUEUE),
        fairness_key=values.get("fairnessKey", DEFAULT_FAIRNESS_KEY),
        dedup_key=values.get("dedupKey"),
    )


def parse_budget(definition: Mapping[str, Any], *, pause_supported: bool) -> Budget | None:
    """The workflow's ``budget`` object, or None when it has none.

    ``deadline``: an ISO-8601 duration; ``maxCost``: a number > 0 (steps declare ``cost``, a
    CEL expression over their response); ``onExceeded``: ``fail`` (default) or ``pause``
    (only where the PAUSED status exists: ``pause_supported``).

    :raises FieldError: naming ``budget.<key>``.
    """
    block = definition.get("budget")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise FieldError("budget", "'budget' must be a JSON object")
    from protomolt_jobs.workflow.keys import known_keys  # the one table of definition keys

    known = known_keys("budget")
    for key in block:
        if key not in known:
            raise FieldError(
                f"budget.{key}", f"unknown key 'budget.{key}'; 'budget' accepts: {', '.join(known)}"
            )
    deadline_s = None
    if block.get("deadline") is not None:
        deadline_s = parse_duration_s("budget.deadline", block["deadline"])
    max_cost = None
    if block.get("maxCost") is not None:
        raw = block["maxCost"]
        if (
            isinstance(raw, bool)
            or not isinstance(raw, (int, float))
            or not math.isfinite(raw)
            or raw <= 0
        ):
            raise FieldError(
                "budget.maxCost", f"'budget.maxCost' must be a number > 0; got {raw!r}"
            )
        max_cost = float(raw)
    on_exceeded = block.get("onExceeded", "fail")
    if on_exceeded not in ON_EXCEEDED:
        raise FieldError(
            "budget.onExceeded",
            f"'budget.onExceeded' must be 'fail' or 'pause'; got {on_exceeded!r}",
        )
    if on_exceeded == "pause" and not pause_supported:
        raise FieldError(
            "budget.onExceeded",
            "'budget.onExceeded' = 'pause' needs the PAUSED status, which this database does "
            "not have yet (migration 0002, operator control); use 'fail'",
        )
    if deadline_s is None and max_cost is None:
        raise FieldError("budget", "'budget' must set 'deadline' or 'maxCost' (or both)")
    return Budget(deadline_s=deadline_s, max_cost=max_cost, on_exceeded=on_exceeded)


def check_step_costs(definition: Mapping[str, Any]) -> None:
    """Every step's ``cost`` (when present) is a CEL expression that compiles.

    :raises FieldError: naming ``steps[i].cost``.
    """
    from protomolt_jobs.workflow import celenv

    for i, step in enumerate(definition.get("steps") or []):
        if not isinstance(step, dict) or step.get("cost") is None:
            continue
        field = f"steps[{i}].cost"
        cost = step["cost"]
        if not isinstance(cost, str) or not cost.strip():
            raise FieldError(field, f"'{field}' must be a CEL expression (a non-blank string)")
        try:
            celenv.program(cost)
        except ValueError as exc:
            raise FieldError(field, f"'{field}' does not compile: {exc}") from None
