"""The writes a segment makes while it runs: its checkpoints and its effect intents.

:class:`CheckpointWriter` gives the engine its two callbacks for one claimed run:

- ``on_checkpoint(entry)``: the fenced ``job_checkpoint`` (one transaction with its
  STEP_CHECKPOINT event), then the budget's meter. The workflow's last step is the exception:
  its entry is *held* and written by ``job_complete(..., final_entry=entry)`` in the
  completion's transaction (STEP_CHECKPOINT then COMPLETED, one commit fewer per job). On any
  other outcome :meth:`CheckpointWriter.finish` stores it with ``job_checkpoint`` first, and
  the job then settles as usual: one place for every settlement but the completion.
  Only an entry that can end a completed run is held: the main steps' entries are counted
  (a graph's compensation entries are neither counted nor held), and a failed entry is never
  held (a completed run's last entry is never a failure: a handled failure's dependant ends
  after it). So a compensation, and the failure that led to it, are stored as soon as they
  end, and a crash later in the compensations never calls a finished one again. Nor is an
  entry that asks for artifact rows (``store/artifact_rows.py``: a last step declaring
  ``outputs``, ``receipt``, ``validates`` or ``consumes``): ``job_checkpoint`` writes it with
  its rows, then the run completes.
- ``on_intent(step, key)``: the fenced ``job_intent`` before an ``effect: "external"`` step's
  call (a pending cancel or pause applies there, before the call).

A write that comes back CANCELLED or PAUSED raises ``ControlApplied`` (the write is stored;
the run stops writing, like on a lost lease); a write that matches no row raises
``LeaseLost``. Either marks the :class:`~.heartbeat.LeaseGuard` lost first, and once it is
lost the callbacks refuse before touching the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from protomolt_jobs import crashpoints
from protomolt_jobs.errors import ControlApplied, LeaseLost, StoreError
from protomolt_jobs.store.artifact_rows import has_artifact_rows
from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.heartbeat import LeaseGuard
from protomolt_jobs.worker.policies import BudgetPolicy
from protomolt_jobs.worker.settlement import Failed, Finished, LogContext, Lost, Outcome, Stopped

__all__ = ["CheckpointStore", "CheckpointWriter"]

log = logging.getLogger("protomolt_jobs.worker")


class CheckpointStore(Protocol):
    """The fenced writes of a running segment (``JobStore``'s)."""

    def job_checkpoint(self, lease: Lease, entry: dict[str, Any]) -> None: ...

    def job_intent(self, lease: Lease, step: str, intent: dict[str, Any]) -> None: ...


class CheckpointWriter:
    """The checkpoint and intent writes of one claimed run.

    :param store: the fenced writes.
    :param guard: the run's lease.
    :param ctx: the run's log context.
    :param n_done: main-step checkpoints stored before this segment (compensation entries
        not counted): the index of its first new main step.
    :param n_complete: entries a completed run holds (``CompiledWorkflow.checkpoints_to_complete``:
        every step of a sequential workflow; every step but the compensations of a graph).
    :param compensations: the graph's compensation steps (``CompiledWorkflow.compensations``):
        their entries are stored at once, never counted or held.
    :param budget: meters each stored entry (it may end the run with ``BudgetExceeded``).
    :param generations: the row's ``step_generations`` (``{step: n}``) for intents.
    :param attempt: the job's attempt, stored in each intent.
    """

    def __init__(
        self,
        store: CheckpointStore,
        guard: LeaseGuard,
        ctx: LogContext,
        *,
        n_done: int,
        n_complete: int,
        budget: BudgetPolicy,
        generations: Mapping[str, Any],
        attempt: int,
        compensations: frozenset[str] = frozenset(),
    ) -> None:
        self._store = store
        self._guard = guard
        self._ctx = ctx
        self._budget = budget
        self._generations = generations
        self._attempt = attempt
        self._next = n_done
        self._last = n_complete - 1
        self._compensations = compensations
        self._held: dict[str, Any] | None = None
        self._lock = threading.Lock()  # a graph run's entries are written one at a time, in order

    def on_checkpoint(self, entry: dict[str, Any]) -> None:
        """The engine's ``on_checkpoint``: store ``entry`` (or hold it, the last step's).

        :raises LeaseLost: the lease is gone (``ControlApplied``: an operator's request took
            the job at this write, which is stored).
        :raises BudgetExceeded: the budget ends the run after this entry (it is stored).
        :raises StoreError: the write failed (the engine retries the job).
        """
        with self._lock:
            self._refuse_if_lost("checkpoint")
            crashpoints.reached("before_checkpoint", str(entry.get("name", "")))
            held = self._take()
            if held is not None:
                # Only a graph run gets here (its completion criterion failed after its last
                # main step, and a compensation ended): the held entry goes first.
                self._write(held)
            if self._holds(entry):
                # The last step's entry goes with job_complete (or is stored by finish() before
                # any other settlement): nothing after it can need it stored earlier.
                return
            self._write(entry)
            # After the store: the step's response is kept even when the budget ends the run
            # here (budget.maxCost; see worker/budget.py).
            self._budget.meter_step(entry)

    def on_intent(self, step: str, key: str) -> None:
        """Record the intent of external ``step`` before its call (``job_intent``).

        :param key: the call's idempotency key.
        :raises LeaseLost: as :meth:`on_checkpoint`.
        """
        self._refuse_if_lost("intent")
        intent = {
            "key": key,
            "generation": self._generations.get(step, 0),
            "attempt": self._attempt,
        }
        try:
            self._store.job_intent(self._guard.lease, step, intent)
        except ControlApplied as applied:
            self._guard.status = applied.status
            self._guard.mark_lost("controlled")
            raise
        except LeaseLost:
            self._guard.mark_lost("lease_lost")
            raise
        log.info("intent recorded", extra={"action": "intent_recorded", "step": step, **self._ctx})
        crashpoints.reached("after_intent", step)

    def finish(self, outcome: Outcome) -> Outcome:
        """The held entry, settled with the outcome: a :class:`Finished` run carries it to
        ``job_complete``; before any other settlement it is stored here. A :class:`Lost` or
        :class:`Stopped` run writes nothing of its own.

        :returns: ``outcome`` (with the entry, for ``Finished``); :class:`Lost` when storing it
            found the lease gone; a retryable :class:`Failed` when the store failed (the step's
            response may not have persisted).
        :raises ValueError, TypeError: the store refused the entry (a defect).
        """
        if isinstance(outcome, Finished):
            return replace(outcome, final_entry=self._take())
        if isinstance(outcome, (Lost, Stopped)):
            return outcome
        held = self._take()
        if held is None:
            return outcome
        if self._guard.lost:
            return Lost("checkpoint")
        try:
            self._write(held)
        except LeaseLost:
            return Lost("checkpoint")
        except StoreError as exc:
            detail = (
                "WORKFLOW: checkpoint observer failed; the step's response may not have "
                f"persisted: {exc}"
            )
            return Failed("", detail, retryable=True)
        return outcome

    def _refuse_if_lost(self, operation: str) -> None:
        if self._guard.lost:
            lease = self._guard.lease
            raise LeaseLost(lease.job_id, lease.owner, lease.attempt, operation)

    def _write(self, entry: dict[str, Any]) -> None:
        try:
            self._store.job_checkpoint(self._guard.lease, entry)
        except ControlApplied as applied:
            self._guard.status = applied.status
            self._guard.mark_lost("controlled")
            raise
        except LeaseLost:
            self._guard.mark_lost("lease_lost")
            raise
        step = str(entry.get("name", ""))
        if "iteration" in entry:  # a loop's iteration k > 0: the crash point's detail says it
            step = f"{step}#{entry['iteration']}"
        log.debug(
            "step checkpointed", extra={"action": "step_checkpointed", "step": step, **self._ctx}
        )
        crashpoints.reached("after_checkpoint", step)

    def _holds(self, entry: dict[str, Any]) -> bool:
        # Count one new main-step checkpoint; keep it when it is the workflow's last step's
        # and could end a completed run (a compensation or a failure never does).
        if str(entry.get("name")) in self._compensations:
            return False
        index = self._next
        self._next += 1
        if index == self._last and "failed" not in entry and not has_artifact_rows(entry):
            # an entry with artifact rows is written by its own variant statement
            # (job_checkpoint_artifacts), then the run completes: one statement more, only for
            # a last step that declares artifact keys
            self._held = entry
            return True
        return False

    def _take(self) -> dict[str, Any] | None:
        entry, self._held = self._held, None
        return entry
