"""The policies a settlement consults: retry, budget and effects.

Each is a small value built once per claimed run (:class:`Policies`), asked by
:func:`protomolt_jobs.worker.settlement.decide` and never writing anything:

- :class:`RetryPolicy`: whether a failure is retried (the engine's own classification,
  ``WorkflowExecutionError.retryable``), whether attempts are left, and the backoff.
- :class:`BudgetPolicy`: the run's ``budget.maxCost`` meter (:class:`~.budget.CostMeter`): checked
  when a segment starts and after each checkpoint, and whether an overrun pauses or fails.
- :class:`EffectPolicy`: when an exhausted failure of an ``effect: "external"`` step is
  RECOVERY_REQUIRED instead of DEAD (its call may have acted: issue #17).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from protomolt_jobs.worker.budget import CostMeter
from protomolt_jobs.workflow.types import WorkflowExecutionError

__all__ = [
    "BudgetPolicy",
    "EffectPolicy",
    "JobRow",
    "Policies",
    "RetryPolicy",
    "RowReader",
    "backoff_s",
]

log = logging.getLogger("protomolt_jobs.worker")

# The exponent is capped (as upstream) so a huge max_attempts cannot overflow the backoff.
_MAX_BACKOFF_EXPONENT = 20


def backoff_s(base_s: float, attempt: int) -> float:
    """Retry backoff in seconds: ``base_s * 2^(attempt-1)``, exponent clamped to 0..20.

    :param base_s: ``backoff_base_seconds``.
    :param attempt: the 1-based attempt that just failed.
    """
    exponent = min(max(attempt - 1, 0), _MAX_BACKOFF_EXPONENT)
    return float(base_s) * float(2**exponent)


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures are retried, while attempts are left, after how long.

    :param base_s: ``backoff_base_seconds``: the first retry's delay, seconds.
    """

    base_s: float

    @staticmethod
    def retryable(exc: WorkflowExecutionError) -> bool:
        """Whether the engine's failure is retried rather than judged: the engine's one
        classification (a DEADLINE, gRPC UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED,
        a checkpoint that may not have persisted)."""
        return exc.retryable

    @staticmethod
    def attempts_left(attempt: int, max_attempts: int) -> bool:
        """True while the job has another attempt: ``attempt < max_attempts``."""
        return attempt < max_attempts

    def backoff_s(self, attempt: int) -> float:
        """Seconds before the next attempt after ``attempt`` failed (:func:`backoff_s`)."""
        return backoff_s(self.base_s, attempt)


@dataclass(frozen=True)
class BudgetPolicy:
    """A run's cost budget (``budget.maxCost``; ``worker/budget.py`` has the rule).

    :param meter: the run's meter, or None when its definition has no ``budget.maxCost``
        (nothing is metered, nothing is read).
    """

    meter: CostMeter | None = None

    @classmethod
    def for_run(cls, definition: Mapping[str, Any], grants: Callable[[], int]) -> BudgetPolicy:
        """The policy of a stored definition.

        :param grants: ``() -> int``: the run's resumed ``maxCost`` pauses (one statement,
            ``JobStore.job_budget_cost_pauses``), asked only once the plain ceiling is reached.
        """
        meter = CostMeter.for_definition(definition)
        if meter is not None:
            meter.grants = grants
        return cls(meter)

    @property
    def pauses(self) -> bool:
        """True when an overrun PAUSES the run (``budget.onExceeded: pause``), False when it
        FAILS it."""
        return self.meter is not None and self.meter.on_exceeded == "pause"

    def resume(self, prior: Sequence[Any], n_complete: int) -> None:
        """A segment starts from ``prior``: may its next step run? Checked only when some
        steps are done and some are left (``0 < len(prior) < n_complete``; a loop's
        ``n_complete`` is 0, unknown: checked whenever some steps are done). Entries that are
        not JSON objects are not metered: the engine's replay fails the run naming them.

        :param n_complete: checkpoints a completed run holds.
        :raises BudgetExceeded: the budget is spent (or a step's cost cannot be metered).
        :raises StoreError: reading the run's grants failed.
        """
        if self.meter is None or not prior or 0 < n_complete <= len(prior):
            return
        self.meter.replay(prior)
        last = prior[-1]
        self.meter.check(str(last.get("name", "")) if isinstance(last, Mapping) else "")

    def meter_step(self, entry: Mapping[str, Any]) -> None:
        """Meter one stored checkpoint, then check the next step may start.

        :raises BudgetExceeded: as :meth:`resume`.
        :raises StoreError: reading the run's grants failed.
        """
        if self.meter is None:
            return
        self.meter.add(entry)
        self.meter.check(str(entry.get("name", "")))


class JobRow(Protocol):
    """What the worker reads of a job's row besides the claimed record (a ``JobRecord``):
    the effect policy and compensation."""

    @property
    def status(self) -> str:
        """The job's status."""

    @property
    def effect_intents(self) -> Mapping[str, Any] | None:
        """``{step: intent}`` of the row's external steps, or None."""

    @property
    def checkpoints(self) -> Sequence[Any] | None:
        """The row's checkpoint entries, or None."""


class RowReader(Protocol):
    """Reads one job's row (``JobStore.job_get``)."""

    def job_get(self, job_id: uuid.UUID) -> JobRow | None:
        """The row, or None for an unknown id.

        :raises StoreError: on a database failure.
        """


@dataclass(frozen=True)
class EffectPolicy:
    """When an exhausted retryable failure is RECOVERY_REQUIRED instead of DEAD.

    The rule: the failing step is declared ``effect: "external"``, and the row holds an intent
    for it and no checkpoint of it (the call may have acted; with no attempt left to ask its
    probe, an operator must say). The row is read once, on that path only (a workflow without
    external steps settles with no statement more); a failed read means DEAD as before.

    :param external: names of the definition's ``effect: "external"`` steps.
    :param rows: where the row is read (the store); None reads nothing (nothing is unproven).
    """

    external: frozenset[str] = frozenset()
    rows: RowReader | None = None

    @classmethod
    def for_run(cls, definition: Mapping[str, Any], rows: RowReader) -> EffectPolicy:
        """The policy of a stored definition (its ``steps[].effect``)."""
        steps = definition.get("steps")
        return cls(_external_steps(steps if isinstance(steps, list) else ()), rows)

    def unproven(self, job_id: uuid.UUID, step: str, detail: str) -> str | None:
        """Why ``step``'s effect cannot be proven (the RECOVERY_REQUIRED reason), or None.

        :param detail: the failure (``"<KIND>: <message>"``), quoted in the reason.
        """
        if not step or step not in self.external or self.rows is None:
            return None
        try:
            row = self.rows.job_get(job_id)
        except Exception:  # cannot tell: the job goes DEAD as it would without effects
            log.warning("could not read the row's intents", exc_info=True)
            return None
        if row is None or step not in (row.effect_intents or {}):
            return None
        done = row.checkpoints if isinstance(row.checkpoints, list) else []
        if any(isinstance(c, dict) and c.get("name") == step for c in done):
            return None
        return (
            f"step '{step}' has effect 'external', an intent and no checkpoint, and its "
            f"call failed on the last attempt ({detail}): reconcile-step must say "
            "whether it happened"
        )


def _external_steps(steps: Iterable[Any]) -> frozenset[str]:
    return frozenset(
        s["name"]
        for s in steps
        if isinstance(s, dict) and s.get("effect") == "external" and isinstance(s.get("name"), str)
    )


@dataclass(frozen=True)
class Policies:
    """The policies of one claimed run, as :func:`~.settlement.decide` consults them."""

    retry: RetryPolicy
    budget: BudgetPolicy = field(default_factory=BudgetPolicy)
    effects: EffectPolicy = field(default_factory=EffectPolicy)
