"""The cost budget of a run (``budget.maxCost``), metered at checkpoint boundaries.

Each step may declare ``cost``: a CEL expression over its own ``response`` (the proto3 JSON
of the step's output, e.g. ``"response.count * 2"`` or a constant ``"4"``). The run's spend is
the sum of its checkpointed steps' costs (a skipped step costs 0); it is recomputed from the
checkpoints when a segment starts, so nothing extra is stored.

The rule, checked after each checkpoint and when a segment starts: a next step starts only
while ``spent + largest step cost seen so far <= maxCost`` (a step is assumed to cost as much
as the dearest one before it, so a run stops *before* the step that would overrun, not after).
With ``maxCost = 10`` and steps costing 4, steps 1 and 2 run (spent 8) and the run ends
before step 3 (8 + 4 > 10). Exceeding ends the run as ``budget.onExceeded`` says, with an error
naming ``budget.maxCost``: ``fail`` (FAILED) or ``pause`` (PAUSED, ``JobStore.job_budget_pause``).
``resume-job`` of a run the cost budget paused grants it one more ``maxCost``: the ceiling is
``maxCost * (1 + the run's maxCost pauses)``, the pauses counted from its transition log
(``JobStore.job_budget_cost_pauses``), read only when the plain ceiling is reached, so a run
within its first ``maxCost`` reads nothing more. The whole-run deadline (``budget.deadline``)
is the sweeper's (``JobStore.job_budget_sweep``), not this module's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = ["BudgetExceeded", "CostMeter"]


class BudgetExceeded(ProtomoltJobsError):
    """The run may not start another step; ``detail`` names the budget."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step
        self.detail = detail


class CostMeter:
    """Sums step costs of one run against ``max_cost``.

    :param max_cost: the ceiling (> 0).
    :param costs: step name -> its ``cost`` CEL text.
    """

    def __init__(
        self, max_cost: float, costs: Mapping[str, str], on_exceeded: str = "fail"
    ) -> None:
        self.max_cost = max_cost
        self.costs = dict(costs)
        self.on_exceeded = on_exceeded
        self.spent = 0.0
        self.dearest = 0.0
        #: () -> how many times a maxCost pause was resumed (each grants one more maxCost);
        #: asked once, when the plain ceiling is first reached.
        self.grants: Callable[[], int] | None = None
        self._granted: int | None = None

    @classmethod
    def for_definition(cls, definition: Any) -> CostMeter | None:
        """The meter of a stored definition, or None when it has no ``budget.maxCost``."""
        if not isinstance(definition, dict):
            return None
        budget = definition.get("budget")
        if not isinstance(budget, dict):
            return None
        max_cost = budget.get("maxCost")
        if isinstance(max_cost, bool) or not isinstance(max_cost, (int, float)):
            return None
        costs = {}
        for step in definition.get("steps") or []:
            if isinstance(step, dict) and isinstance(step.get("cost"), str):
                costs[str(step.get("name"))] = step["cost"]
        on_exceeded = "pause" if budget.get("onExceeded") == "pause" else "fail"
        return cls(float(max_cost), costs, on_exceeded)

    def add(self, entry: Mapping[str, Any]) -> float:
        """Meter one checkpoint entry (``{"name", "skipped", "response"?}``).

        :returns: the step's cost.
        :raises BudgetExceeded: the cost expression does not evaluate to a finite number >= 0.
        """
        name = str(entry.get("name", ""))
        expression = self.costs.get(name)
        if expression is None or entry.get("skipped"):
            return 0.0
        from protomolt_jobs.workflow import celenv

        try:
            value = celenv.program(expression).evaluate(
                {"response": celenv.to_cel(entry.get("response") or {})}
            )
            cost = float(value)
        except Exception as exc:  # noqa: BLE001 - CEL evaluation errors and non-numbers alike
            raise BudgetExceeded(
                name,
                f"BUDGET: budget.maxCost cannot be metered: step '{name}' cost "
                f"({expression}) did not evaluate to a number: {exc}",
            ) from None
        if not math.isfinite(cost) or cost < 0:
            raise BudgetExceeded(
                name,
                f"BUDGET: budget.maxCost cannot be metered: step '{name}' cost ({expression}) "
                f"is {cost}, not a finite number >= 0",
            )
        self.spent += cost
        self.dearest = max(self.dearest, cost)
        return cost

    def replay(self, entries: Iterable[Any]) -> None:
        """Meter the checkpoints a segment starts from. An entry that is not a JSON object is
        left to the engine's replay, which fails the run naming it (a budget never crashes the
        claim loop over a row's content)."""
        for entry in entries:
            if isinstance(entry, Mapping):
                self.add(entry)

    def check(self, after: str) -> None:
        """May another step start?

        :param after: the last metered step (named in the error).
        :raises BudgetExceeded: ``spent + dearest > max_cost``.
        """
        if self.spent + self.dearest <= self.max_cost:
            return
        if self._granted is None:
            self._granted = self.grants() if self.grants is not None else 0
        ceiling = self.max_cost * (1 + self._granted)
        if self.spent + self.dearest > ceiling:
            granted = f" (maxCost {self.max_cost:g} x {1 + self._granted} after resumes)"
            raise BudgetExceeded(
                after,
                f"BUDGET: budget.maxCost {self.max_cost:g} exceeded: {self.spent:g} spent "
                f"after step '{after}', and the next step may cost up to {self.dearest:g}"
                + (granted if self._granted else ""),
            )
