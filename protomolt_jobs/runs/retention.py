"""A workflow's own retention: the definition's ``retention`` key, the node's bounds on it,
and what the submitter stamps into the run (docs/workflows.md, *Retention*).

Shapes. ``"retention": "P30D"`` (one duration for every final status) or an object naming
some of ``completed``, ``failed``, ``cancelled``, ``dead``:
``{"completed": "P1D", "failed": "P30D"}``. A duration is ISO-8601 without years or months
(``P1D``, ``PT12H``, ``P2W``; as ``budget.deadline``) or the short form ``<n>s|m|h|d|w``
(``1d``, ``36h``). A status the object leaves out keeps the node's
``jobs.run_retention_seconds`` (as it is when the run is submitted; 0 there means kept).

Bounds. Every duration must lie within ``jobs.workflow_retention_min_seconds`` and
``jobs.workflow_retention_max_seconds`` (:class:`Bounds`); ``check-workflow`` (and so the
registry's PUT) reports a finding of kind :data:`FINDING_KIND`, submit refuses with
``invalid-input``; both name the field and the bound.

The run. :func:`stamp` gives the ``workflow_run.retention`` column (migration 0020): final
status -> seconds; None for a definition without the key, so such runs keep the node-wide
setting exactly as before (nothing else is written for them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.runs.scheduling import FieldError

__all__ = [
    "FINDING_KIND",
    "KEY",
    "STATUSES",
    "Bounds",
    "effective",
    "parse",
    "stamp",
]

#: The definition's key.
KEY = "retention"
#: The ``kind`` of a check-workflow finding about it.
FINDING_KIND = "retention"
#: The object form's keys -> the final status (the row's ``status``) each one governs.
STATUSES: Mapping[str, str] = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "dead": "DEAD",
}

_SHORT = re.compile(r"^(\d{1,9}(?:\.\d{1,9})?)([smhdw])$")
# ISO-8601 without years or months (their length varies), as budget.deadline; no cap here:
# the node's bounds are the cap.
_ISO = re.compile(
    r"^P(?:(?P<w>\d{1,9}(?:\.\d{1,9})?)W)?(?:(?P<d>\d{1,9}(?:\.\d{1,9})?)D)?"
    r"(?:T(?:(?P<h>\d{1,9}(?:\.\d{1,9})?)H)?(?:(?P<m>\d{1,9}(?:\.\d{1,9})?)M)?"
    r"(?:(?P<s>\d{1,9}(?:\.\d{1,9})?)S)?)?$"
)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0, "w": 604_800.0}


@dataclass(frozen=True, slots=True)
class Bounds:
    """The node's bounds on a workflow's retention, seconds (from ``JobsConfig``).

    :ivar min_s: shortest allowed (``jobs.workflow_retention_min_seconds``).
    :ivar max_s: longest allowed (``jobs.workflow_retention_max_seconds``).
    """

    min_s: float
    max_s: float

    @classmethod
    def of(cls, config: Any) -> Bounds:
        """The bounds a ``JobsConfig`` sets."""
        return cls(config.workflow_retention_min_seconds, config.workflow_retention_max_seconds)


def _seconds(field: str, value: Any) -> float:
    if isinstance(value, str):
        short = _SHORT.match(value.strip())
        iso = _ISO.match(value.strip().upper())
        seconds = 0.0
        if short is not None:
            seconds = float(short.group(1)) * _UNIT_S[short.group(2)]
        elif iso is not None and not value.strip().upper().endswith(("P", "T")):
            seconds = sum(
                float(v) * _UNIT_S[k.lower()] for k, v in iso.groupdict().items() if v is not None
            )
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise FieldError(
        field,
        f"'{field}' must be a positive duration: ISO-8601 (P1D, PT12H, P2W) or <n>s|m|h|d|w "
        f"(1d, 36h); got {value!r:.80}",
    )


def _shown(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("m", 60.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse(definition: Any, bounds: Bounds | None = None) -> dict[str, float] | None:
    """The definition's ``retention`` as ``{final status: seconds}`` for the statuses it
    names; None when the definition has no such key (or is not an object).

    :param bounds: the node's bounds; None checks the shape only.
    :raises FieldError: naming the field (``retention``, ``retention.completed``): a value of
        the wrong shape, a status that is not a final one, a duration that does not parse, or
        (with ``bounds``) one outside them, naming the bound's setting and value.
    """
    if not isinstance(definition, dict) or definition.get(KEY) is None:
        return None
    raw = definition[KEY]
    out: dict[str, float] = {}
    if isinstance(raw, str):
        seconds = _seconds(KEY, raw)
        out = {status: seconds for status in STATUSES.values()}
        fields = dict.fromkeys(STATUSES.values(), KEY)
    elif isinstance(raw, dict):
        if not raw:
            raise FieldError(KEY, f"'{KEY}' names no status; give one of {', '.join(STATUSES)}")
        fields = {}
        for key, value in raw.items():
            if key not in STATUSES:
                raise FieldError(
                    f"{KEY}.{key}",
                    f"'{KEY}' keys are final statuses ({', '.join(STATUSES)}); got {key!r:.80}",
                )
            out[STATUSES[key]] = _seconds(f"{KEY}.{key}", value)
            fields[STATUSES[key]] = f"{KEY}.{key}"
    else:
        raise FieldError(
            KEY,
            f"'{KEY}' must be a duration (\"P30D\") or an object of durations by final status "
            f'({{"completed": "P1D", "failed": "P30D"}}); got {raw!r:.80}',
        )
    if bounds is not None:
        for status, seconds in out.items():
            field = fields[status]
            if seconds < bounds.min_s:
                raise FieldError(
                    field,
                    f"'{field}' ({_shown(seconds)}) is below the node's minimum retention "
                    f"jobs.workflow_retention_min_seconds = {bounds.min_s:g} "
                    f"({_shown(bounds.min_s)})",
                )
            if seconds > bounds.max_s:
                raise FieldError(
                    field,
                    f"'{field}' ({_shown(seconds)}) is above the node's maximum retention "
                    f"jobs.workflow_retention_max_seconds = {bounds.max_s:g} "
                    f"({_shown(bounds.max_s)})",
                )
    return out


def stamp(definition: Any, bounds: Bounds, node_default_s: float) -> dict[str, float] | None:
    """The run's ``retention`` column: :func:`parse` (within ``bounds``) with each status the
    definition leaves out set to ``node_default_s`` (left out when that is 0: kept); None for a
    definition without the key.

    :raises FieldError: as :func:`parse`.
    """
    own = parse(definition, bounds)
    if own is None:
        return None
    if node_default_s > 0:
        for status in STATUSES.values():
            own.setdefault(status, float(node_default_s))
    return own


def effective(definition: Any, node_default_s: float) -> dict[str, dict[str, Any]]:
    """What a run of ``definition`` would be kept for, per final status (for display):
    ``{"completed": {"seconds": 86400.0, "source": "workflow"}, "failed": {"seconds":
    2592000.0, "source": "node"}, ...}``; ``seconds`` is None when the run is kept (the node's
    setting is 0). A malformed ``retention`` shows as the node's.
    """
    try:
        own = parse(definition) or {}
    except FieldError:
        own = {}
    out: dict[str, dict[str, Any]] = {}
    for key, status in STATUSES.items():
        if status in own:
            out[key] = {"seconds": own[status], "source": "workflow"}
        else:
            out[key] = {"seconds": float(node_default_s) or None, "source": "node"}
    return out
