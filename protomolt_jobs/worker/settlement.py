"""How a claimed job's segment ends: its :data:`Outcome`, and the :class:`Write` that
:func:`decide` picks for it (``settler.py`` writes it).

A segment ends in exactly one of these outcomes, and the job settles with exactly one fenced
write:

=========================================== ==============================================
outcome                                     write
=========================================== ==============================================
:class:`Finished`                           ``job_complete`` (verdict ``"<n> steps, output
                                            <type>"``, n counts every step), with the last
                                            step's held checkpoint entry
:class:`Halted` ``parked``                  ``job_park`` (no lease, no permit after)
:class:`Halted` ``approval``                ``job_park_approval`` (WAITING with ``wait_kind``
                                            ``approval``: ``approve-step`` votes decide)
:class:`Halted` ``input``                   ``job_park_input`` (WAITING with ``wait_kind``
                                            ``input``: ``supply-input`` fills the path)
:class:`Halted` ``loop``                    ``job_loop_pause`` (a loop exhausted with
                                            ``onExhausted: "park"``: PAUSED, error ``LOOP:``)
:class:`Halted` ``recovery``                ``job_recovery_required`` (a step's state cannot
                                            be proven)
:class:`OverBudget`                         ``job_budget_pause`` when ``budget.onExceeded``
                                            is ``pause``, else ``job_fail``
:class:`Failed`, not retryable              ``job_fail`` with ``"<KIND>: <message>"`` and
(VALIDATION, GATE, MAPPING, WORKFLOW,       the failing step
EXTERNAL, other gRPC codes, a bad row)
:class:`Failed`, retryable,                 ``job_retry`` after ``base * 2^(attempt-1)``
``attempt < max_attempts``
:class:`Failed`, retryable,                 ``job_dead`` with the error verbatim, or
``attempt >= max_attempts``                 ``job_recovery_required`` when the failing step
                                            is external with an intent and no checkpoint
                                            (its effect is unproven)
:class:`Stopped` (a cancel or pause reached ``job_stop``
the job before its step started)
:class:`Lost`                               nothing (``action="lease_lost"``)
=========================================== ==============================================

Retryable (:class:`~.policies.RetryPolicy`): gRPC ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``,
``RESOURCE_EXHAUSTED``; kind ``DEADLINE``; a store failure inside the checkpoint callback (the
response may not have persisted, so the work is not judged failed); an unexpected error in the
engine (a defect: bounded by ``max_attempts``, never a dead loop).

:func:`decide` is pure: it looks at the outcome, the job's attempts and the run's policies and
writes nothing (its one read is the effect policy's, on the exhausted path of an external step).
:class:`~.settler.Settler` then writes the decision (``settler.py``).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, assert_never, overload

from protomolt_jobs.worker.policies import Policies

__all__ = [
    "AttemptedJob",
    "Failed",
    "Finished",
    "Halted",
    "LogContext",
    "Lost",
    "Outcome",
    "OverBudget",
    "Settlement",
    "Stopped",
    "Write",
    "WriteKind",
    "decide",
]

#: What the worker logs with every record about a job: ``job_id``, ``worker_id``, ``attempt``.
LogContext = dict[str, Any]


class Settlement(str, enum.Enum):
    """How one execution of a claimed job ended (what the worker wrote)."""

    COMPLETED = "completed"
    PARKED = "parked"
    RETRIED = "retried"
    DEAD = "dead"
    FAILED = "failed"
    #: The lease was lost or released: nothing was written.
    ABANDONED = "abandoned"
    #: The settling write failed with a StoreError; the sweeper will take the job.
    UNSETTLED = "unsettled"
    #: An operator's cancel or pause stopped the job (CANCELLED or PAUSED).
    CONTROLLED = "controlled"
    #: A step's state cannot be proven: RECOVERY_REQUIRED, waiting for an operator.
    RECOVERY_REQUIRED = "recovery_required"


# -- outcomes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """The segment ran to the end (the engine's ``Completed``).

    :ivar result: the output's proto3 JSON.
    :ivar verdict: ``"<n> steps, output <type>"``.
    :ivar final_entry: the last step's checkpoint entry, held back to ride the completion's
        transaction (None when every step was stored before this segment).
    """

    result: dict[str, Any]
    verdict: str
    final_entry: dict[str, Any] | None = None


@dataclass(frozen=True)
class Halted:
    """The segment stopped at a step on purpose: ``parked`` (an external step waits for
    ``complete-step``), ``approval`` (an approval step waits for ``approve-step`` votes) or
    ``recovery`` (the step's state cannot be proven; ``reason`` says why) or ``loop`` (a loop
    exhausted with ``onExhausted: "park"``; ``reason`` is the stored error) or ``input`` (the
    step needs input paths the run lacks; ``reason`` names them and their owners).
    """

    how: Literal["parked", "approval", "recovery", "loop", "input"]
    step: str
    reason: str = ""
    #: an approval step's timers, offsets from the park (``Parked.timers``).
    timers: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Failed:
    """The run failed: ``detail`` is the text stored on the job (``"<KIND>: <message>"``).

    :ivar step: the failing step, ``""`` when none.
    :ivar retryable: retried (with backoff, up to ``max_attempts``) rather than judged.
    """

    step: str
    detail: str
    retryable: bool = False


@dataclass(frozen=True)
class OverBudget:
    """The run's ``budget.maxCost`` is spent (``detail`` names the budget) after ``step``."""

    step: str
    detail: str


@dataclass(frozen=True)
class Stopped:
    """An operator's cancel or pause reached the job before its step started (the heartbeat
    brought it while the job waited for its permit)."""


@dataclass(frozen=True)
class Lost:
    """The lease is no longer ours (lost, released, or taken by an operator's request at a
    checkpoint): nothing more is written.

    :ivar operation: where the run learnt it (``segment``, ``checkpoint``), for the log.
    """

    operation: str = "segment"


#: How a segment ended.
Outcome = Finished | Halted | Failed | OverBudget | Stopped | Lost


# -- the write ----------------------------------------------------------------------------------


class WriteKind(enum.Enum):
    """The settling writes (each maps to one fenced store method: ``settler.py``)."""

    COMPLETE = "complete"
    PARK = "park"
    PARK_APPROVAL = "park_approval"
    PARK_INPUT = "park_input"
    RECOVERY = "recovery"
    BUDGET_PAUSE = "budget_pause"
    LOOP_PAUSE = "loop_pause"
    FAIL = "fail"
    RETRY = "retry"
    DEAD = "dead"
    STOP = "stop"


@dataclass(frozen=True)
class Write:
    """One settling write: its kind and the values it stores (River's ``JobSetState*``
    parameters). Build it with the class methods.

    :ivar step: the step the write is about, ``""`` when none.
    :ivar error: the stored error (FAILED, DEAD, a retry) or reason (RECOVERY_REQUIRED, a
        budget pause).
    :ivar backoff_s: a retry's delay, seconds.
    :ivar max_attempts: DEAD: the attempts the job had (logged).
    """

    kind: WriteKind
    step: str = ""
    error: str = ""
    backoff_s: float = 0.0
    max_attempts: int = 0
    result: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""
    final_entry: dict[str, Any] | None = None
    timers: tuple[dict[str, Any], ...] = ()

    @classmethod
    def complete(
        cls, result: dict[str, Any], verdict: str, final_entry: dict[str, Any] | None
    ) -> Write:
        return cls(WriteKind.COMPLETE, result=result, verdict=verdict, final_entry=final_entry)

    @classmethod
    def park(cls, step: str) -> Write:
        return cls(WriteKind.PARK, step=step)

    @classmethod
    def park_approval(cls, step: str, timers: tuple[dict[str, Any], ...] = ()) -> Write:
        return cls(WriteKind.PARK_APPROVAL, step=step, timers=timers)

    @classmethod
    def park_input(cls, step: str, reason: str) -> Write:
        return cls(WriteKind.PARK_INPUT, step=step, error=reason)

    @classmethod
    def recovery(cls, step: str, reason: str) -> Write:
        return cls(WriteKind.RECOVERY, step=step, error=reason)

    @classmethod
    def budget_pause(cls, step: str, detail: str) -> Write:
        return cls(WriteKind.BUDGET_PAUSE, step=step, error=detail)

    @classmethod
    def loop_pause(cls, step: str, detail: str) -> Write:
        return cls(WriteKind.LOOP_PAUSE, step=step, error=detail)

    @classmethod
    def fail(cls, step: str, detail: str) -> Write:
        return cls(WriteKind.FAIL, step=step, error=detail)

    @classmethod
    def retry(cls, step: str, detail: str, backoff_s: float) -> Write:
        return cls(WriteKind.RETRY, step=step, error=detail, backoff_s=backoff_s)

    @classmethod
    def dead(cls, step: str, detail: str, max_attempts: int) -> Write:
        return cls(WriteKind.DEAD, step=step, error=detail, max_attempts=max_attempts)

    @classmethod
    def stop(cls) -> Write:
        return cls(WriteKind.STOP)


class AttemptedJob(Protocol):
    """What :func:`decide` reads of a claimed job (a ``JobRecord``)."""

    @property
    def job_id(self) -> uuid.UUID: ...

    @property
    def attempt(self) -> int: ...

    @property
    def max_attempts(self) -> int: ...


@overload
def decide(outcome: Lost, job: AttemptedJob, policies: Policies) -> None: ...


@overload
def decide(
    outcome: Finished | Halted | Failed | OverBudget | Stopped,
    job: AttemptedJob,
    policies: Policies,
) -> Write: ...


def decide(outcome: Outcome, job: AttemptedJob, policies: Policies) -> Write | None:
    """The settling write of ``outcome`` (the module's table), or None for :class:`Lost`.

    :param job: the claimed job (its attempt, ``max_attempts`` and id).
    :param policies: the run's retry, budget and effect policies.
    """
    match outcome:
        case Lost():
            return None
        case Stopped():
            return Write.stop()
        case Finished(result=result, verdict=verdict, final_entry=entry):
            return Write.complete(result, verdict, entry)
        case Halted(how="parked", step=step):
            return Write.park(step)
        case Halted(how="approval", step=step, timers=timers):
            return Write.park_approval(step, timers)
        case Halted(how="input", step=step, reason=reason):
            return Write.park_input(step, reason)
        case Halted(how="loop", step=step, reason=reason):
            return Write.loop_pause(step, reason)
        case Halted(step=step, reason=reason):
            return Write.recovery(step, reason)
        case OverBudget(step=step, detail=detail) if policies.budget.pauses:
            return Write.budget_pause(step, detail)
        case OverBudget(step=step, detail=detail):
            return Write.fail(step, detail)
        case Failed(step=step, detail=detail, retryable=False):
            return Write.fail(step, detail)
        case Failed(step=step, detail=detail) if policies.retry.attempts_left(
            job.attempt, job.max_attempts
        ):
            return Write.retry(step, detail, policies.retry.backoff_s(job.attempt))
        case Failed(step=step, detail=detail):
            unproven = policies.effects.unproven(job.job_id, step, detail)
            if unproven:
                return Write.recovery(step, unproven)
            return Write.dead(step, detail, job.max_attempts)
    assert_never(outcome)
