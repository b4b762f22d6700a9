"""One segment of one claimed job, from its claim to its settlement.

For a claimed row, :meth:`SegmentExecutor.execute`:

1. tracks the lease with the heartbeat (before anything can block, so a wait for a permit
   never lets the lease expire);
2. reads the row (:class:`~.claimed_run.ClaimedRun`): the stored definition, parsed and
   verified, the input and the checkpoints. Anything wrong with them FAILS the job with the
   reference's texts (``claimed_run.py`` lists them); nothing in a row can crash the executor;
3. checks the run's cost budget when it resumes (:class:`~.policies.BudgetPolicy`);
4. takes the per-target permit for the next unexecuted step's target (none when every step
   is checkpointed; a graph run takes one per call instead);
5. runs ``run_segment`` from the stored checkpoints, with a
   :class:`~.checkpoints.CheckpointWriter` for its checkpoints and intents;
6. classifies how it ended into one :data:`~.settlement.Outcome` (:meth:`_classify` for
   every exception, in one place), lets the writer store a held last checkpoint
   (:meth:`~.checkpoints.CheckpointWriter.finish`), and settles: :func:`~.settlement.decide`
   picks the write (``settlement.py`` has the table), :class:`~.settler.Settler` writes it;
7. untracks the lease, and compensates a graph run an operator cancelled
   (``compensation.py``).

Operator control (docs/verbs.md): a cancel the heartbeat finds on the row cancels the call in
flight of a step without an external effect (``LeaseGuard.watch_cancel``, handed to the engine
in the ``EffectContext``); the segment then stops with ``job_stop``. A cancel or pause
recorded on the row is also honoured by the
database inside the worker's own next fenced write (migration 0002's trigger), so the worker
learns it from what that write returns (``ControlApplied`` from a checkpoint or intent, a
CANCELLED or PAUSED status from a settling write). A job still waiting for its permit learns
of a request from the heartbeat and stops with ``job_stop``. Either way the settlement is
``CONTROLLED``.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from protomolt_jobs import crashpoints
from protomolt_jobs import workflow as engine
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.runs.artifact_store import key_of
from protomolt_jobs.worker.budget import BudgetExceeded
from protomolt_jobs.worker.checkpoints import CheckpointStore, CheckpointWriter
from protomolt_jobs.worker.claimed_run import ClaimedJob, ClaimedRun, RowError
from protomolt_jobs.worker.compensation import CompensationStore, compensate_stopped
from protomolt_jobs.worker.grants import GrantPolicy
from protomolt_jobs.worker.heartbeat import Heartbeat, LeaseGuard
from protomolt_jobs.worker.permits import PermitCancelled, TargetPermits
from protomolt_jobs.worker.policies import BudgetPolicy, EffectPolicy, Policies, RetryPolicy
from protomolt_jobs.worker.progress import ProgressStore, ProgressWriter
from protomolt_jobs.worker.settlement import (
    Failed,
    Finished,
    Halted,
    LogContext,
    Lost,
    Outcome,
    OverBudget,
    Settlement,
    Stopped,
    decide,
)
from protomolt_jobs.worker.settler import Settler, SettleStore
from protomolt_jobs.workflow import artifacts as engine_artifacts
from protomolt_jobs.workflow import cancel
from protomolt_jobs.workflow import resumable as engine_resumable
from protomolt_jobs.workflow.effects import EffectContext
from protomolt_jobs.workflow.inputs import INPUT_WAIT
from protomolt_jobs.workflow.loops import LOOP_WAIT
from protomolt_jobs.workflow.types import Runtime

__all__ = ["SegmentExecutor", "SegmentStore"]

log = logging.getLogger("protomolt_jobs.worker")


class SegmentStore(SettleStore, CheckpointStore, CompensationStore, ProgressStore, Protocol):
    """Everything a segment asks of the store (``JobStore``): the fenced settling writes,
    checkpoints and intents, the row read and compensation write, and the budget's grants."""

    def job_budget_cost_pauses(self, job_id: uuid.UUID) -> int: ...

    def job_loop_extensions(self, job_id: uuid.UUID) -> dict[str, int]: ...

    def grant_gate_decision(
        self, job_id: uuid.UUID | str, step: str
    ) -> tuple[str, str, int] | None: ...

    def job_submitted_groups(self, job_id: uuid.UUID | str) -> tuple[str, ...] | None: ...


class _Phase(enum.Enum):
    """Where the run was when something raised (what an exception there means)."""

    READ = "read"
    BUDGET = "budget"
    SEGMENT = "segment"


class SegmentExecutor:
    """Runs and settles claimed jobs; shared by every claim loop of a worker.

    :param store: the job store.
    :param runtime: the workflow engine's ``Runtime`` (type pool, in-process channels).
    :param config: ``JobsConfig`` (``worker_id``, ``lease_seconds``, ``backoff_base_seconds``).
    :param permits: per-target permits of this process.
    :param heartbeat: the worker's heartbeat (must be running).
    :param draining: set by a graceful stop once the grace period is over; a job tracked
        after that is released at once instead of run.
    :param grants: the step grant policy (``worker/grants.py``); None: ``config.grants``.
    """

    def __init__(
        self,
        store: SegmentStore,
        *,
        runtime: Runtime,
        config: JobsConfig,
        permits: TargetPermits,
        heartbeat: Heartbeat,
        draining: threading.Event,
        grants: GrantPolicy | None = None,
        artifact_store: Any = None,
    ) -> None:
        self._store = store
        #: the node's ``ArtifactStore`` (publication steps hash the bytes they publish again)
        self._artifact_store = artifact_store
        self._grants = grants or GrantPolicy(config.grants)
        self._runtime = runtime
        self._permits = permits
        self._heartbeat = heartbeat
        self._draining = draining
        self._settler = Settler(store)
        self._retry = RetryPolicy(config.backoff_base_seconds)
        self.worker_id = config.worker_id

    def execute(self, job: ClaimedJob) -> Settlement:
        """Run one segment of the claimed ``job`` and settle it.

        Never raises for anything the job or the database does; a defect in the engine is
        settled as a retryable WORKFLOW failure (bounded by ``max_attempts``).

        :param job: a claimed ``JobRecord`` (status RUNNING, leased to this worker).
        :returns: what was written.
        :raises ValueError, TypeError: when a store write refuses its arguments (a defect in
            the worker, not a settle failure): the claim loop's supervision logs it and
            restarts; the lease expires and the sweeper requeues the job.
        """
        lease = job.lease
        ctx = {"job_id": str(job.job_id), "worker_id": self.worker_id, "attempt": job.attempt}
        # Only the row's content is read here, and only in forms that cannot raise: a row
        # whose content is odd is failed under the lease, never crashes us.
        checkpoints = getattr(job, "checkpoints", None)
        log.info(
            "job claimed",
            extra={
                "action": "job_claimed",
                "workflow_name": job.workflow_name,
                "checkpoints": len(checkpoints) if isinstance(checkpoints, list) else None,
                **ctx,
            },
        )
        crashpoints.reached("after_claim", job.workflow_name)
        guard = self._heartbeat.track(lease)
        try:
            if self._draining.is_set():
                # The stop's release pass may have run before this job was tracked.
                self._settler.release(guard)
                return Settlement.ABANDONED
            outcome, policies = self._run(job, guard, ctx)
            if isinstance(outcome, Lost):
                settled = self._settler.abandon(guard, ctx, outcome.operation)
            else:
                settled = self._settler.apply(decide(outcome, job, policies), guard, ctx)
        finally:
            self._heartbeat.untrack(guard)
        stopped = None
        if settled is Settlement.CONTROLLED and guard.status == "CANCELLED":
            stopped = "CANCELLED"
        elif settled is Settlement.FAILED and isinstance(outcome, OverBudget):
            # The budget stopped the run between steps: no step failed, so the engine ran no
            # compensation; the run is FAILED now, and its succeeded steps are undone here.
            stopped = "FAILED"
        if stopped is not None:
            compensate_stopped(
                job,
                guard.lease,
                ctx,
                status=stopped,
                store=self._store,
                runtime=self._runtime,
                permits=self._permits,
            )
        return settled

    def release(self, guard: LeaseGuard) -> bool:
        """Graceful stop: give the guard's job back to QUEUED (``job_release``, which also
        gives back the attempt). Only the first caller for a guard writes.

        :returns: True when the release was written.
        """
        return self._settler.release(guard)

    # -- the run -------------------------------------------------------------------------------

    def _run(self, job: ClaimedJob, guard: LeaseGuard, ctx: LogContext) -> tuple[Outcome, Policies]:
        """Read the row, check the budget, run the segment: how it ended, and the policies its
        settlement consults.

        :raises Exception: only what :meth:`_classify` leaves to the claim loop's supervision.
        """
        policies = Policies(self._retry)
        writer: CheckpointWriter | None = None
        phase = _Phase.READ
        try:
            run = ClaimedRun.read(job, self._runtime)
            policies = Policies(
                self._retry,
                BudgetPolicy.for_run(
                    run.stored.definition, lambda: self._store.job_budget_cost_pauses(job.job_id)
                ),
                EffectPolicy.for_run(run.stored.definition, self._store),
            )
            phase = _Phase.BUDGET
            policies.budget.resume(run.prior, run.workflow.checkpoints_to_complete)
            phase = _Phase.SEGMENT
            generations = getattr(job, "step_generations", None) or {}
            compensations = run.workflow.compensations
            writer = CheckpointWriter(
                self._store,
                guard,
                ctx,
                n_done=sum(
                    1
                    for e in run.prior
                    if not (isinstance(e, dict) and str(e.get("name")) in compensations)
                ),
                n_complete=run.workflow.checkpoints_to_complete,
                budget=policies.budget,
                generations=generations,
                attempt=job.attempt,
                compensations=compensations,
            )
            effects = EffectContext(
                job_id=str(job.job_id),
                attempt=int(job.attempt),
                generations=generations,
                intents=getattr(job, "effect_intents", None) or {},
                on_intent=writer.on_intent,
                # Only a workflow that asks for it pays for interruptible calls (cancel.py).
                watch_cancel=(
                    guard.watch_cancel if cancel.interrupts_calls(run.stored.definition) else None
                ),
                # read only by a run whose loop reached its bound (workflow/loops.py)
                loop_extensions=(
                    (lambda: self._store.job_loop_extensions(job.job_id))
                    if run.workflow.loops
                    else None
                ),
            )
            if any(s.consumes for s in engine_artifacts.spec(run.workflow).values()):
                # only a workflow with a publication step reads artifact rows and bytes
                effects.artifact_rows = functools.partial(_artifact_rows, self._store, job.job_id)
                if self._artifact_store is not None:
                    effects.artifact_bytes = functools.partial(
                        _artifact_bytes, self._artifact_store
                    )
            if engine_resumable.declared(run.workflow):
                # only a workflow with a resumable step reports progress (worker/progress.py)
                progress = ProgressWriter(
                    self._store,
                    guard,
                    lease_s=self._heartbeat.lease_s,
                    interval_s=self._heartbeat.interval_s,
                    ctx=ctx,
                )
                effects.on_progress = progress.on_progress
                effects.progress_saved = progress.saved
                if engine_resumable.reports(run.workflow):
                    effects.progress_token = progress.token
            check = self._grants.check_for(
                job,
                ctx,
                lambda job_id, step: self._store.grant_gate_decision(job_id, step),
                lambda: self._store.job_submitted_groups(job.job_id),
            )
            returned = self._segment(run, guard, writer, effects, check)
        except Exception as exc:
            classified = self._classify(exc, guard, ctx, phase)
            if classified is None:
                raise
            outcome = classified
        else:
            outcome = self._returned(returned, guard, job)
        if writer is not None:
            outcome = writer.finish(outcome)
        return outcome, policies

    def _segment(
        self,
        run: ClaimedRun,
        guard: LeaseGuard,
        writer: CheckpointWriter,
        effects: EffectContext,
        check: Callable[[Any], Any],
    ) -> object:
        """Take the permit and run the segment: the engine's result, or :class:`Lost` /
        :class:`Stopped` when the job was taken or stopped before its step started."""
        with self._permits.held(run.target, cancelled=lambda: guard.lost or guard.control_pending):
            if guard.lost:
                return Lost("segment")
            if guard.control_pending:
                return Stopped()
            return engine.run_segment(
                run.workflow,
                run.message,
                run.prior,
                writer.on_checkpoint,
                runtime=self._runtime,
                # graph runs: each call holds a permit for its own target
                call_permit=lambda t: self._permits.held(t, cancelled=lambda: guard.lost),
                effects=effects,
                authorize=check,  # asked only for steps that declare capabilities
            )

    @staticmethod
    def _returned(returned: object, guard: LeaseGuard, job: ClaimedJob) -> Outcome:
        """The outcome of a segment that returned."""
        if isinstance(returned, (Lost, Stopped)):
            return returned
        if guard.lost:
            return Lost("segment")
        crashpoints.reached("before_settle", job.workflow_name)
        if isinstance(returned, engine.Completed):
            verdict = f"{len(returned.steps)} steps, output {returned.output_type}"
            return Finished(returned.output_json, verdict)
        if isinstance(returned, engine.RecoveryRequired):
            return Halted("recovery", returned.step, returned.reason)
        if isinstance(returned, engine.Parked):
            if returned.wait_kind == "approval":
                return Halted("approval", returned.step, timers=returned.timers)
            if returned.wait_kind == LOOP_WAIT:
                detail = (
                    f"LOOP: loop '{returned.step}' exhausted its iterations (onExhausted park); "
                    "extend-loop raises its bound, cancel-job ends the run"
                )
                return Halted("loop", returned.step, detail)
            if returned.wait_kind == INPUT_WAIT:
                return Halted("input", returned.step, returned.detail)
            return Halted("parked", returned.step)
        name = type(returned).__name__
        return Failed("", f"WORKFLOW: the engine returned {name}, not Completed or Parked")

    def _classify(
        self, exc: Exception, guard: LeaseGuard, ctx: LogContext, phase: _Phase
    ) -> Outcome | None:
        """The outcome of a run that raised ``exc`` in ``phase``; None for a defect outside
        the engine, which propagates to the claim loop's supervision (as a ``ValueError`` from
        a store write does)."""
        if isinstance(exc, RowError):
            return Failed(exc.step, exc.detail)
        if phase is _Phase.READ:
            return None
        if phase is _Phase.BUDGET:
            if isinstance(exc, BudgetExceeded):
                return OverBudget(exc.step, exc.detail)
            if isinstance(exc, StoreError):
                detail = f"WORKFLOW: reading the run's budget grants failed: {exc}"
                return Failed("", detail, retryable=True)
            return None
        if isinstance(exc, (PermitCancelled, LeaseLost)):
            return Stopped() if not guard.lost and guard.control_pending else Lost("segment")
        if isinstance(exc, engine.WorkflowExecutionError):
            if guard.lost:
                return Lost("checkpoint")
            if guard.cancel_requested and exc.code is grpc.StatusCode.CANCELLED:
                # The cancel stopped the call in flight: job_stop applies it (CANCELLED).
                return Stopped()
            if isinstance(exc.__cause__, BudgetExceeded):
                # The step's checkpoint is stored; the budget stops the run before the next.
                return OverBudget(exc.__cause__.step, exc.__cause__.detail)
            return Failed(exc.step or "", exc.detail, retryable=self._retry.retryable(exc))
        if isinstance(exc, StoreError):
            # Only reachable if the engine let the checkpoint callback's error through
            # unwrapped: the response may not have persisted, so retry.
            if guard.lost:
                return Lost("checkpoint")
            return Failed("", f"WORKFLOW: checkpoint failed: {exc}", retryable=True)
        # A defect in the engine: a bounded retry, never a dead loop.
        if guard.lost:
            return Lost("segment")
        log.exception(
            "segment raised an unexpected error", extra={"action": "segment_crashed", **ctx}
        )
        detail = f"WORKFLOW: unexpected error in the worker: {type(exc).__name__}: {exc}"
        return Failed("", detail, retryable=True)


def _artifact_rows(store: Any, job_id: Any) -> dict[str, str]:
    """``{artifactId: state}`` of the run's ``workflow_artifact`` rows (``artifact_kept``)."""
    read = getattr(store, "artifact_kept", None)
    if read is None:
        return {}
    return {str(r["artifact_id"]): str(r["state"]) for r in read(job_id)}


def _artifact_bytes(store: Any, uri: str) -> bytes | None:
    """The bytes of an ``artifact://`` uri from ``store`` (None: missing).

    :raises ValueError: not an ``artifact://`` uri (not the store's to read).
    """
    key = key_of(uri)
    if key is None:
        raise ValueError(f"not an artifact:// uri: {uri!r}")
    data: bytes | None = store.get(key)
    return data
