"""decide() as a table: every outcome x attempts left x budget x effect policy, no store."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from protomolt_jobs.worker.budget import CostMeter
from protomolt_jobs.worker.policies import BudgetPolicy, EffectPolicy, Policies, RetryPolicy
from protomolt_jobs.worker.settlement import (
    Failed,
    Finished,
    Halted,
    Lost,
    OverBudget,
    Stopped,
    WriteKind,
    decide,
)

BASE_S = 0.5
BUDGET = "BUDGET: budget.maxCost 10 exceeded: 8 spent after step 'embed', and the next step..."
UNPROVEN = (
    "step 'charge' has effect 'external', an intent and no checkpoint, and its call failed "
    "on the last attempt (GRPC: gRPC UNAVAILABLE from pay:1: down): reconcile-step must say "
    "whether it happened"
)
ENTRY = {"name": "charge", "skipped": False, "response": {}}

OUTCOMES = {
    "finished": Finished({"ok": True}, "3 steps, output t.Out", ENTRY),
    "parked": Halted("parked", "review"),
    "approval": Halted("approval", "review", timers=({"kind": "expire", "afterS": 60.0},)),
    "recovery": Halted("recovery", "charge", "checkpoint-mismatch: the response changed"),
    "over_budget": OverBudget("embed", BUDGET),
    "failed": Failed("charge", "VALIDATION: the verdict says no"),
    "retryable": Failed("charge", "GRPC: gRPC UNAVAILABLE from pay:1: down", retryable=True),
    "stopped": Stopped(),
    "lost": Lost("checkpoint"),
}

#: attempts left -> (attempt, max_attempts)
ATTEMPTS = {"some": (2, 3), "none": (3, 3)}

#: budget.onExceeded -> the run's budget policy
BUDGETS = {
    "pause": lambda: BudgetPolicy(CostMeter(10, {}, "pause")),
    "fail": lambda: BudgetPolicy(CostMeter(10, {}, "fail")),
    "no budget": BudgetPolicy,
}

#: the failing step's effect and what the row holds (intents, checkpoints)
EFFECTS = {
    "idempotent": ("idempotent", {"charge": {"key": "k"}}, []),
    "external, unproven": ("external", {"charge": {"key": "k"}}, []),
    "external, checkpointed": ("external", {"charge": {"key": "k"}}, [ENTRY]),
    "external, no intent": ("external", None, []),
}

ANY = None
# (outcome, attempts left, budget, effect) -> (write kind, step, error, backoff_s); None: no write
TABLE: list[tuple[str, str | None, str | None, str | None, Any]] = [
    ("finished", ANY, ANY, ANY, (WriteKind.COMPLETE, "", "", 0.0)),
    ("parked", ANY, ANY, ANY, (WriteKind.PARK, "review", "", 0.0)),
    ("approval", ANY, ANY, ANY, (WriteKind.PARK_APPROVAL, "review", "", 0.0)),
    ("recovery", ANY, ANY, ANY, (WriteKind.RECOVERY, "charge", OUTCOMES["recovery"].reason, 0.0)),
    ("over_budget", ANY, "pause", ANY, (WriteKind.BUDGET_PAUSE, "embed", BUDGET, 0.0)),
    ("over_budget", ANY, "fail", ANY, (WriteKind.FAIL, "embed", BUDGET, 0.0)),
    ("over_budget", ANY, "no budget", ANY, (WriteKind.FAIL, "embed", BUDGET, 0.0)),
    ("failed", ANY, ANY, ANY, (WriteKind.FAIL, "charge", "VALIDATION: the verdict says no", 0.0)),
    # 0.5 * 2^(2-1): the attempt that just failed is the second
    ("retryable", "some", ANY, ANY, (WriteKind.RETRY, "charge", OUTCOMES["retryable"].detail, 1.0)),
    ("retryable", "none", ANY, "external, unproven", (WriteKind.RECOVERY, "charge", UNPROVEN, 0.0)),
    ("retryable", "none", ANY, "idempotent", (WriteKind.DEAD, "charge", OUTCOMES["retryable"].detail, 0.0)),
    ("retryable", "none", ANY, "external, checkpointed", (WriteKind.DEAD, "charge", OUTCOMES["retryable"].detail, 0.0)),
    ("retryable", "none", ANY, "external, no intent", (WriteKind.DEAD, "charge", OUTCOMES["retryable"].detail, 0.0)),
    ("stopped", ANY, ANY, ANY, (WriteKind.STOP, "", "", 0.0)),
    ("lost", ANY, ANY, ANY, None),
]  # fmt: skip


@dataclass(frozen=True)
class _Job:
    attempt: int
    max_attempts: int
    job_id: uuid.UUID = field(default_factory=uuid.uuid4)


@dataclass(frozen=True)
class _Row:
    effect_intents: dict[str, Any] | None
    checkpoints: list[dict[str, Any]] | None
    status: str = "RUNNING"


class _Rows:
    """A RowReader over one row, counting its reads."""

    def __init__(self, row: _Row | None = None, error: Exception | None = None) -> None:
        self.row = row
        self.error = error
        self.reads = 0

    def job_get(self, job_id: uuid.UUID) -> _Row | None:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return self.row


def _effects(effect: str) -> tuple[EffectPolicy, _Rows]:
    declared, intents, checkpoints = EFFECTS[effect]
    rows = _Rows(_Row(intents, checkpoints))
    definition = {"steps": [{"name": "embed"}, {"name": "charge", "effect": declared}]}
    return EffectPolicy.for_run(definition, rows), rows


def _expected(outcome: str, attempts: str, budget: str, effect: str) -> Any:
    rows = [
        row[4]
        for row in TABLE
        if row[0] == outcome
        and row[1] in (ANY, attempts)
        and row[2] in (ANY, budget)
        and row[3] in (ANY, effect)
    ]
    assert len(rows) == 1, f"the table must give one write for {outcome, attempts, budget, effect}"
    return rows[0]


CASES = list(itertools.product(OUTCOMES, ATTEMPTS, BUDGETS, EFFECTS))


@pytest.mark.parametrize(("outcome", "attempts", "budget", "effect"), CASES)
def test_decide(outcome: str, attempts: str, budget: str, effect: str) -> None:
    attempt, max_attempts = ATTEMPTS[attempts]
    effects, rows = _effects(effect)
    policies = Policies(RetryPolicy(BASE_S), BUDGETS[budget](), effects)
    write = decide(OUTCOMES[outcome], _Job(attempt, max_attempts), policies)
    expected = _expected(outcome, attempts, budget, effect)
    if expected is None:
        assert write is None
    else:
        assert write is not None
        assert (write.kind, write.step, write.error, write.backoff_s) == expected
    # The row is read only on the exhausted path of a step declared external.
    exhausted_external = (
        outcome == "retryable" and attempts == "none" and EFFECTS[effect][0] == "external"
    )
    assert rows.reads == (1 if exhausted_external else 0)


def test_the_completion_carries_the_result_and_the_held_entry() -> None:
    write = decide(OUTCOMES["finished"], _Job(1, 3), Policies(RetryPolicy(BASE_S)))
    assert (write.result, write.verdict, write.final_entry) == (
        {"ok": True},
        "3 steps, output t.Out",
        ENTRY,
    )


def test_a_dead_write_names_the_attempts_the_job_had() -> None:
    write = decide(OUTCOMES["retryable"], _Job(5, 5), Policies(RetryPolicy(BASE_S)))
    assert (write.kind, write.max_attempts) == (WriteKind.DEAD, 5)


def test_the_backoff_doubles_per_attempt_and_is_capped() -> None:
    failed = OUTCOMES["retryable"]
    backoffs = [
        decide(failed, _Job(a, 1000), Policies(RetryPolicy(BASE_S))).backoff_s for a in (1, 2, 3)
    ]
    assert backoffs == [0.5, 1.0, 2.0]
    assert decide(failed, _Job(500, 1000), Policies(RetryPolicy(1.0))).backoff_s == float(2**20)


def test_an_unreadable_row_leaves_an_exhausted_external_failure_dead(caplog) -> None:
    rows = _Rows(error=RuntimeError("connection lost"))
    definition = {"steps": [{"name": "charge", "effect": "external"}]}
    policies = Policies(RetryPolicy(BASE_S), effects=EffectPolicy.for_run(definition, rows))
    write = decide(OUTCOMES["retryable"], _Job(3, 3), policies)
    assert write.kind is WriteKind.DEAD
    assert rows.reads == 1
    assert "could not read the row's intents" in caplog.text


def test_a_failure_with_no_step_reads_nothing() -> None:
    rows = _Rows(_Row({"": {"key": "k"}}, []))
    definition = {"steps": [{"name": "charge", "effect": "external"}]}
    policies = Policies(RetryPolicy(BASE_S), effects=EffectPolicy.for_run(definition, rows))
    failed = Failed("", "WORKFLOW: unexpected error in the worker: KeyError: 'x'", retryable=True)
    assert decide(failed, _Job(3, 3), policies).kind is WriteKind.DEAD
    assert rows.reads == 0


def test_an_approval_park_carries_its_timers_to_the_write():
    job = _Job(1, 3)
    write = decide(OUTCOMES["approval"], job, Policies(RetryPolicy(BASE_S), BudgetPolicy()))
    assert write.timers == ({"kind": "expire", "afterS": 60.0},)
