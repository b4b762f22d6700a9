"""One segment of one claimed job, and its settlement.

For a claimed row the executor:

1. tracks the lease with the heartbeat (before anything can block, so a wait for a permit
   never lets the lease expire);
2. parses and verifies the stored definition snapshot and parses the stored input. A
   snapshot that is unreadable, does not parse or does not verify, or an input that is not
   proto3 JSON for the input type, FAILS the job with the reference's texts
   (``WORKFLOW: stored workflow ...``, ``MAPPING: stored input is not valid proto3 JSON for
   <type>: <reason>``). Nothing in a claimed row can crash the executor: a row the store
   could not decode (``JobRecord.unreadable``), checkpoints that are not an array, or any
   other surprise while reading the row FAILS the job (fenced) with a ``WORKFLOW:`` text;
3. takes the per-target permit for the next unexecuted step's target (none when every step
   is already checkpointed);
4. runs ``run_segment`` from the stored checkpoints, checkpointing each new step through the
   fenced ``job_checkpoint`` write, except the workflow's last step: its entry is held and
   written by ``job_complete(..., final_entry=entry)`` in the completion's transaction
   (STEP_CHECKPOINT then COMPLETED, one commit); on any other outcome it is stored with
   ``job_checkpoint`` first and the job then settles as usual;
5. settles with exactly one fenced write:

   =========================================== ==========================================
   outcome                                     write
   =========================================== ==========================================
   Completed                                   ``job_complete`` (verdict ``"<n> steps,
                                               output <type>"``, n counts every step)
   Parked(step)                                ``job_park`` (no lease, no permit after)
   retryable, ``attempt < max_attempts``       ``job_retry`` after ``base * 2^(attempt-1)``
   retryable, ``attempt >= max_attempts``      ``job_dead`` with the error verbatim, or
                                               ``job_recovery_required`` when the failing
                                               step is external with an intent and no
                                               checkpoint (its effect is unproven)
   VALIDATION (a verdict), GATE, MAPPING,      ``job_fail`` with ``"<KIND>: <message>"``
   WORKFLOW, EXTERNAL, other gRPC codes        and the failing step
   =========================================== ==========================================

   Retryable: gRPC ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``; kind
   ``DEADLINE``; a store failure inside the checkpoint callback (the response may not have
   persisted, so the work is not judged failed).

Lease lost (a fenced write or the heartbeat matched no row, or a graceful stop released
the job): the run is abandoned, nothing more is written, ``action="lease_lost"`` is logged.

Operator control (docs/verbs.md): a cancel or pause recorded on the row is honoured by the
database inside the worker's own next fenced write (migration 0002's trigger), so the worker
learns it from what that write returns: a checkpoint that comes back CANCELLED or PAUSED raises
``ControlApplied`` (the checkpoint is stored; the run stops like on a lost lease, writing
nothing more); a settling write that comes back CANCELLED or PAUSED is the settlement. A job
still waiting for its permit learns of a request from the heartbeat and stops with
``job_stop``. Either way the settlement is ``CONTROLLED``.
A ``StoreError`` while settling is logged and the job is left to the sweeper (its lease
expires; the next claim resumes from the checkpoints).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from protomolt_jobs import crashpoints
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import ControlApplied, LeaseLost, ProtomoltJobsError, StoreError
from protomolt_jobs.worker.budget import BudgetExceeded, CostMeter
from protomolt_jobs.worker.heartbeat import Heartbeat, LeaseGuard
from protomolt_jobs.worker.permits import PermitCancelled, TargetPermits

__all__ = ["SegmentExecutor", "Settlement", "backoff_s"]

log = logging.getLogger("protomolt_jobs.worker")

# The exponent is capped (as upstream) so a huge max_attempts cannot overflow the backoff.
_MAX_BACKOFF_EXPONENT = 20


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


def backoff_s(base_s: float, attempt: int) -> float:
    """Retry backoff in seconds: ``base_s * 2^(attempt-1)``, exponent clamped to 0..20.

    :param base_s: ``backoff_base_seconds``.
    :param attempt: the 1-based attempt that just failed.
    """
    exponent = min(max(attempt - 1, 0), _MAX_BACKOFF_EXPONENT)
    return float(base_s) * float(2**exponent)


class _Abandon(ProtomoltJobsError):
    """Internal: the lease is gone; unwind without writing."""


class _Fail(ProtomoltJobsError):
    """Internal: settle the job FAILED with ``detail`` on ``step``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step
        self.detail = detail


class _FinalCheckpoint:
    """The last step's checkpoint entry, held back from ``job_checkpoint`` so that it is
    written by ``job_complete`` in the completion's transaction (one commit fewer per job).

    :param n_done: checkpoints stored before this segment (the index of its first new step).
    :param n_steps: entries a completed run holds (``CompiledWorkflow.checkpoints_to_complete``:
        every step of a sequential workflow; every step but the compensations of a graph).
    """

    def __init__(self, n_done: int, n_steps: int) -> None:
        self._next = n_done
        self._last = n_steps - 1
        self.entry: dict[str, Any] | None = None

    def holds(self, entry: dict[str, Any]) -> bool:
        """Count one new checkpoint; keep it (True) when it is the workflow's last step's."""
        index = self._next
        self._next += 1
        if index == self._last:
            self.entry = entry
            return True
        return False

    def take(self) -> dict[str, Any] | None:
        """The held entry (once), or None."""
        entry, self.entry = self.entry, None
        return entry


class SegmentExecutor:
    """Runs and settles claimed jobs; shared by every claim loop of a worker.

    :param store: the job store.
    :param runtime: the workflow engine's ``Runtime`` (type pool, in-process channels).
    :param config: ``JobsConfig`` (``worker_id``, ``lease_seconds``, ``backoff_base_seconds``).
    :param permits: per-target permits of this process.
    :param heartbeat: the worker's heartbeat (must be running).
    :param draining: set by a graceful stop once the grace period is over; a job tracked
        after that is released at once instead of run.
    """

    def __init__(
        self,
        store: Any,
        *,
        runtime: Any,
        config: JobsConfig,
        permits: TargetPermits,
        heartbeat: Heartbeat,
        draining: threading.Event,
    ) -> None:
        self._store = store
        self._runtime = runtime
        self._config = config
        self._permits = permits
        self._heartbeat = heartbeat
        self._draining = draining
        self.worker_id = config.worker_id

    # -- entry ---------------------------------------------------------------------------

    def execute(self, job: Any) -> Settlement:
        """Run one segment of the claimed ``job`` and settle it.

        Never raises for anything the job or the database does; a defect in the engine is
        settled as a retryable WORKFLOW failure (bounded by ``max_attempts``).

        :raises ValueError, TypeError: when a store write refuses its arguments (a defect in
            the worker, not a settle failure): the claim loop's supervision logs it and
            restarts; the lease expires and the sweeper requeues the job.

        :param job: a claimed ``JobRecord`` (status RUNNING, leased to this worker).
        :returns: what was written.
        """
        lease = job.lease
        ctx = {"job_id": str(job.job_id), "worker_id": self.worker_id, "attempt": job.attempt}
        # Only the row's content is read here, and only in forms that cannot raise: a row
        # whose content is odd is failed by _execute, under the lease, never crashes us.
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
                self.release(guard)
                return Settlement.ABANDONED
            settled = self._execute(job, guard, ctx)
        finally:
            self._heartbeat.untrack(guard)
        if settled is Settlement.CONTROLLED and guard.status == "CANCELLED":
            self._compensate_cancelled(job, guard, ctx)
        return settled

    def _compensate_cancelled(self, job: Any, guard: LeaseGuard, ctx: dict[str, Any]) -> None:
        """A graph run an operator cancelled: run the compensation steps of its succeeded
        steps (reverse completion order), each stored with ``job_compensate``. Best effort
        after the fact: the run is CANCELLED already and holds no lease, so a failure here is
        logged and the remaining compensations are not retried by anyone (docs/workflows.md).
        """
        from protomolt_jobs.workflow import next_target
        from protomolt_jobs.workflow.graph_run import run_compensation

        try:
            workflow, message, _, _ = self._read_row(job, next_target)
            if not workflow.graph or not workflow.compensations:
                return
            row = self._store.job_get(job.job_id)
            if row is None or row.status != "CANCELLED":
                return
            ran = run_compensation(
                workflow,
                message,
                row.checkpoints or [],
                lambda entry: self._store.job_compensate(guard.lease, entry),
                runtime=self._runtime,
                call_permit=lambda t: self._permits.held(t),
            )
        except Exception as exc:  # the job is settled; nothing here may crash the loop
            log.warning(
                "compensating the cancelled job failed",
                exc_info=True,
                extra={"action": "compensation_failed", "error": str(exc), **ctx},
            )
            return
        if ran:
            log.info(
                "cancelled job compensated",
                extra={"action": "job_compensated", "steps": ran, **ctx},
            )

    def release(self, guard: LeaseGuard) -> bool:
        """Graceful stop: give the guard's job back to QUEUED (``job_release``, which also
        gives back the attempt). Only the first caller for a guard writes.

        :returns: True when the release was written.
        """
        if not guard.mark_lost("released"):
            return False
        lease = guard.lease
        ctx = {"job_id": str(lease.job_id), "worker_id": lease.owner, "attempt": lease.attempt}
        try:
            self._store.job_release(lease)
        except LeaseLost:
            # The segment settled (or the sweeper took the job) first: nothing to give back.
            log.info("job settled before its release", extra={"action": "release_skipped", **ctx})
            return False
        except StoreError as exc:
            log.warning(
                "could not release the job; the sweeper will requeue it when its lease expires",
                extra={"action": "release_failed", "error": str(exc), **ctx},
            )
            return False
        log.info("job released back to QUEUED", extra={"action": "job_released", **ctx})
        return True

    # -- the segment ---------------------------------------------------------------------

    def _execute(self, job: Any, guard: LeaseGuard, ctx: dict[str, Any]) -> Settlement:
        from protomolt_jobs.workflow import (
            Completed,
            Parked,
            RecoveryRequired,
            WorkflowExecutionError,
            next_target,
            run_segment,
        )

        try:
            workflow, message, prior, target = self._read_row(job, next_target)
        except _Fail as fail:
            return self._settle_fail(guard, fail.step, fail.detail, ctx)

        final = _FinalCheckpoint(len(prior), workflow.checkpoints_to_complete)
        meter = CostMeter.for_definition(job.workflow_definition)
        if meter is not None:
            meter.grants = lambda: self._store.job_budget_cost_pauses(job.job_id)
        if meter is not None and prior and len(prior) < workflow.checkpoints_to_complete:
            try:
                meter.replay(prior)
                meter.check(str(prior[-1].get("name", "")))
            except BudgetExceeded as exc:
                return self._settle_budget(guard, exc, meter, ctx)
            except StoreError as exc:
                return self._settle_retryable(
                    job, guard, f"WORKFLOW: reading the run's budget grants failed: {exc}", ctx
                )
        try:
            with self._permits.held(
                target, cancelled=lambda: guard.lost or guard.control is not None
            ):
                if guard.lost:
                    raise _Abandon()
                if guard.control is not None:
                    raise PermitCancelled(str(target))
                outcome = run_segment(
                    workflow,
                    message,
                    prior,
                    self._on_checkpoint(guard, ctx, final, meter),
                    runtime=self._runtime,
                    # graph runs: each call holds a permit for its own target
                    call_permit=lambda t: self._permits.held(t, cancelled=lambda: guard.lost),
                    effects=self._effects(job, guard, ctx),
                )
        except (PermitCancelled, _Abandon, LeaseLost):
            if not guard.lost and guard.control is not None:
                return self._stop(guard, ctx)
            return self._abandoned(guard, ctx, "segment")
        except WorkflowExecutionError as exc:
            if guard.lost:
                return self._abandoned(guard, ctx, "checkpoint")
            if isinstance(exc.__cause__, BudgetExceeded):
                # The step's checkpoint is stored; the budget stops the run before the next.
                over = exc.__cause__
                return self._flush(job, guard, ctx, final) or self._settle_budget(
                    guard, over, meter, ctx
                )
            return self._flush(job, guard, ctx, final) or self._settle_failure(job, guard, exc, ctx)
        except StoreError as exc:
            # Only reachable if the engine let the checkpoint callback's error through
            # unwrapped: the response may not have persisted, so retry.
            if guard.lost:
                return self._abandoned(guard, ctx, "checkpoint")
            return self._flush(job, guard, ctx, final) or self._settle_retryable(
                job, guard, f"WORKFLOW: checkpoint failed: {exc}", ctx
            )
        except Exception as exc:  # a defect in the engine: bounded retry, never a dead loop
            if guard.lost:
                return self._abandoned(guard, ctx, "segment")
            log.exception(
                "segment raised an unexpected error",
                extra={"action": "segment_crashed", **ctx},
            )
            detail = f"WORKFLOW: unexpected error in the worker: {type(exc).__name__}: {exc}"
            return self._flush(job, guard, ctx, final) or self._settle_retryable(
                job, guard, detail, ctx
            )

        if guard.lost:
            return self._abandoned(guard, ctx, "segment")
        crashpoints.reached("before_settle", job.workflow_name)
        if isinstance(outcome, Completed):
            verdict = f"{len(outcome.steps)} steps, output {outcome.output_type}"
            final_entry = final.take()
            settled = self._write(
                guard,
                ctx,
                Settlement.COMPLETED,
                "job_completed",
                "job completed",
                lambda: self._store.job_complete(
                    guard.lease,
                    result=outcome.output_json,
                    verdict=verdict,
                    final_entry=final_entry,
                ),
                verdict=verdict,
            )
            if settled is Settlement.COMPLETED and final_entry is not None:
                crashpoints.reached("after_checkpoint", str(final_entry.get("name", "")))
            return settled
        flushed = self._flush(job, guard, ctx, final)
        if flushed is not None:
            return flushed
        if isinstance(outcome, RecoveryRequired):
            return self._write(
                guard,
                ctx,
                Settlement.RECOVERY_REQUIRED,
                "job_recovery_required",
                "job needs recovery: a step's state cannot be proven",
                lambda: self._store.job_recovery_required(
                    guard.lease, outcome.step, outcome.reason
                ),
                step=outcome.step,
                error=outcome.reason,
                level=logging.WARNING,
            )
        if isinstance(outcome, Parked):
            return self._write(
                guard,
                ctx,
                Settlement.PARKED,
                "job_parked",
                "job parked on an external step",
                lambda: self._store.job_park(guard.lease, outcome.step),
                step=outcome.step,
            )
        detail = f"WORKFLOW: the engine returned {type(outcome).__name__}, not Completed or Parked"
        return self._settle_fail(guard, "", detail, ctx)

    def _on_checkpoint(
        self,
        guard: LeaseGuard,
        ctx: dict[str, Any],
        final: _FinalCheckpoint,
        meter: CostMeter | None = None,
    ) -> Callable[[dict[str, Any]], None]:
        lock = threading.Lock()  # a graph run's entries are written one at a time, in order

        def on_checkpoint(entry: dict[str, Any]) -> None:
            with lock:
                if guard.lost:
                    raise LeaseLost(
                        guard.lease.job_id, guard.lease.owner, guard.lease.attempt, "checkpoint"
                    )
                crashpoints.reached("before_checkpoint", str(entry.get("name", "")))
                held = final.take()
                if held is not None:
                    # Only a graph run gets here (a compensation after its last main step):
                    # the held entry was not the last after all, and goes first.
                    self._checkpoint(guard, ctx, held)
                if final.holds(entry):
                    # The last step's entry goes with job_complete (or is flushed before any
                    # other settlement): nothing after it can need it stored earlier.
                    return
                self._checkpoint(guard, ctx, entry)
                if meter is not None:
                    # After the store: the step's response is kept even when the budget ends
                    # the run here (budget.maxCost; see worker/budget.py).
                    meter.add(entry)
                    meter.check(str(entry.get("name", "")))

        return on_checkpoint

    def _effects(self, job: Any, guard: LeaseGuard, ctx: dict[str, Any]) -> Any:
        """The run's ``EffectContext``: idempotency keys (job id, the row's generations), the
        row's intents, and the intent write for external steps (fenced, one statement)."""
        from protomolt_jobs.workflow.effects import EffectContext

        generations = getattr(job, "step_generations", None) or {}
        intents = getattr(job, "effect_intents", None) or {}

        def on_intent(step: str, key: str) -> None:
            if guard.lost:
                raise LeaseLost(
                    guard.lease.job_id, guard.lease.owner, guard.lease.attempt, "intent"
                )
            intent = {"key": key, "generation": generations.get(step, 0), "attempt": job.attempt}
            try:
                self._store.job_intent(guard.lease, step, intent)
            except ControlApplied as applied:
                guard.status = applied.status
                guard.mark_lost("controlled")
                raise
            except LeaseLost:
                guard.mark_lost("lease_lost")
                raise
            log.info("intent recorded", extra={"action": "intent_recorded", "step": step, **ctx})
            crashpoints.reached("after_intent", step)

        return EffectContext(
            job_id=str(job.job_id),
            attempt=int(job.attempt),
            generations=generations,
            intents=intents,
            on_intent=on_intent,
        )

    def _checkpoint(self, guard: LeaseGuard, ctx: dict[str, Any], entry: dict[str, Any]) -> None:
        try:
            self._store.job_checkpoint(guard.lease, entry)
        except ControlApplied as applied:
            guard.status = applied.status
            guard.mark_lost("controlled")
            raise
        except LeaseLost:
            guard.mark_lost("lease_lost")
            raise
        step = str(entry.get("name", ""))
        log.debug("step checkpointed", extra={"action": "step_checkpointed", "step": step, **ctx})
        crashpoints.reached("after_checkpoint", step)

    def _flush(
        self, job: Any, guard: LeaseGuard, ctx: dict[str, Any], final: _FinalCheckpoint
    ) -> Settlement | None:
        """Store a held final checkpoint before any settlement other than completion.

        :returns: None when there was nothing to store or it was stored (settle as usual);
            else what was settled instead: abandoned on a lost lease, or the retry (or DEAD)
            a failed checkpoint write gets inside the engine (the response may not have
            persisted).
        """
        entry = final.take()
        if entry is None:
            return None
        if guard.lost:
            return self._abandoned(guard, ctx, "checkpoint")
        try:
            self._checkpoint(guard, ctx, entry)
        except LeaseLost:
            return self._abandoned(guard, ctx, "checkpoint")
        except StoreError as exc:  # ValueError/TypeError are defects: they propagate
            detail = (
                "WORKFLOW: checkpoint observer failed; the step's response may not have "
                f"persisted: {exc}"
            )
            return self._settle_retryable(job, guard, detail, ctx)
        return None

    # -- snapshot and input --------------------------------------------------------------

    def _read_row(self, job: Any, next_target: Callable[[Any, int], str | None]) -> tuple[Any, ...]:
        """Everything the segment needs from the claimed row: ``(workflow, input message,
        prior checkpoints, target of the next step or None)``.

        :raises _Fail: for anything wrong with the row's content (reference texts where the
            reference has them); an unexpected exception while reading is a WORKFLOW failure
            too, since only the row's content can differ between jobs here.
        """
        unreadable = getattr(job, "unreadable", None)
        if unreadable:
            raise _Fail("", f"WORKFLOW: stored row is not readable JSON: {unreadable}")
        try:
            workflow = self._parse_snapshot(job)
            message = self._parse_input(job, workflow)
            prior = self._prior(job)
            n_steps = len(workflow.steps)
            target = next_target(workflow, len(prior)) if len(prior) < n_steps else None
        except _Fail:
            raise
        except Exception as exc:  # an odd row fails its job, not the loop
            log.warning(
                "reading the claimed row raised",
                exc_info=True,
                extra={"action": "row_unreadable", "job_id": str(job.job_id)},
            )
            raise _Fail(
                "", f"WORKFLOW: stored row could not be read: {type(exc).__name__}: {exc}"
            ) from exc
        return workflow, message, prior, target

    def _parse_snapshot(self, job: Any) -> Any:
        from protomolt_jobs.workflow import WorkflowParseError, parse_workflow, verify

        definition = job.workflow_definition
        if isinstance(definition, (str, bytes, bytearray)):
            try:
                definition = json.loads(definition)
            except ValueError as exc:
                raise _Fail(
                    "", f"WORKFLOW: stored workflow definition is not readable JSON: {exc}"
                ) from exc
        if not isinstance(definition, dict):
            raise _Fail("", "WORKFLOW: stored workflow definition is not a JSON object")
        try:
            workflow = parse_workflow(definition, self._runtime)
        except WorkflowParseError as exc:
            step = getattr(exc, "step", "") or ""
            where = f" (step '{step}')" if step else ""
            raise _Fail(
                step, f"WORKFLOW: stored workflow does not parse{where}: {_message(exc)}"
            ) from exc
        findings = verify(workflow)
        if findings:
            n = len(findings)
            listed = "".join(f"; [{f.kind}] {f.step}: {f.error}" for f in findings)
            noun = "finding" if n == 1 else "findings"
            raise _Fail(
                findings[0].step or "",
                f"WORKFLOW: stored workflow does not verify ({n} {noun}){listed}",
            )
        return workflow

    def _parse_input(self, job: Any, workflow: Any) -> Any:
        from protomolt_jobs.workflow import WorkflowParseError, parse_input

        type_name = workflow.input_type.full_name
        raw = job.input
        if isinstance(raw, (str, bytes, bytearray)):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise _Fail(
                    "", f"MAPPING: stored input is not valid proto3 JSON for {type_name}: {exc}"
                ) from exc
        try:
            return parse_input(workflow, raw)
        except WorkflowParseError as exc:
            # parse_input says "'input' is not valid proto3 JSON for <type>: <reason>"; the
            # stored form names the input once, as the reference does.
            reason = _message(exc)
            said = f"'input' is not valid proto3 JSON for {type_name}: "
            reason = reason.removeprefix(said)
            raise _Fail(
                "", f"MAPPING: stored input is not valid proto3 JSON for {type_name}: {reason}"
            ) from exc

    def _prior(self, job: Any) -> list[dict[str, Any]]:
        prior = job.checkpoints
        if prior is None:
            return []
        if not isinstance(prior, list):
            raise _Fail("", "WORKFLOW: stored checkpoints are not an array")
        return prior

    # -- settlement ----------------------------------------------------------------------

    def _settle_failure(
        self, job: Any, guard: LeaseGuard, exc: Any, ctx: dict[str, Any]
    ) -> Settlement:
        kind = getattr(exc.kind, "value", str(exc.kind))
        detail = f"{kind}: {_message(exc)}"
        if exc.retryable:
            return self._settle_retryable(job, guard, detail, ctx, exc.step or "")
        return self._settle_fail(guard, exc.step or "", detail, ctx)

    def _settle_retryable(
        self, job: Any, guard: LeaseGuard, detail: str, ctx: dict[str, Any], step: str = ""
    ) -> Settlement:
        if job.attempt >= job.max_attempts:
            unproven = self._unproven_effect(job, step)
            if unproven:
                # an external step's call failed after its intent (a deadline, an unreachable
                # server mid-call): it may have acted; with no attempt left to ask its probe,
                # an operator must say (issue #17), never a dead letter
                reason = (
                    f"step '{step}' has effect 'external', an intent and no checkpoint, and its "
                    f"call failed on the last attempt ({detail}): reconcile-step must say "
                    "whether it happened"
                )
                return self._write(
                    guard,
                    ctx,
                    Settlement.RECOVERY_REQUIRED,
                    "job_recovery_required",
                    "job needs recovery: a step's state cannot be proven",
                    lambda: self._store.job_recovery_required(guard.lease, step, reason),
                    step=step,
                    error=reason,
                    level=logging.WARNING,
                )
            return self._write(
                guard,
                ctx,
                Settlement.DEAD,
                "job_dead",
                "job is DEAD: retries exhausted",
                lambda: self._store.job_dead(guard.lease, detail, step),
                error=detail,
                max_attempts=job.max_attempts,
                level=logging.WARNING,
            )
        delay_s = backoff_s(self._config.backoff_base_seconds, job.attempt)
        return self._write(
            guard,
            ctx,
            Settlement.RETRIED,
            "job_retry_scheduled",
            "job requeued after a retryable failure",
            lambda: self._store.job_retry(guard.lease, delay_s, detail),
            error=detail,
            backoff_s=delay_s,
        )

    def _unproven_effect(self, job: Any, step: str) -> bool:
        """True when ``step`` has an intent in the row and no checkpoint (read once, on the
        exhausted path only, and only when the job's definition declares ``step`` external:
        a workflow without effects settles with no statement more)."""
        definition = getattr(job, "workflow_definition", None)
        steps = definition.get("steps") if isinstance(definition, dict) else None
        if not step or not isinstance(steps, list):
            return False
        if not any(
            isinstance(s, dict) and s.get("name") == step and s.get("effect") == "external"
            for s in steps
        ):
            return False
        try:
            row = self._store.job_get(job.job_id)
        except Exception:  # cannot tell: the settlement below still applies
            log.warning("could not read the row's intents", exc_info=True)
            return False
        intents = getattr(row, "effect_intents", None) or {}
        if step not in intents:
            return False
        done = row.checkpoints if isinstance(row.checkpoints, list) else []
        return not any(isinstance(c, dict) and c.get("name") == step for c in done)

    def _settle_budget(
        self,
        guard: LeaseGuard,
        over: BudgetExceeded,
        meter: CostMeter | None,
        ctx: dict[str, Any],
    ) -> Settlement:
        """The cost budget is spent: FAILED, or PAUSED when ``budget.onExceeded`` says so."""
        if meter is None or meter.on_exceeded != "pause":
            return self._settle_fail(guard, over.step, over.detail, ctx)
        return self._write(
            guard,
            ctx,
            Settlement.CONTROLLED,
            "job_paused_by_budget",
            "job PAUSED by its budget",
            lambda: self._store.job_budget_pause(guard.lease, over.detail, over.step),
            step=over.step,
            error=over.detail,
            level=logging.WARNING,
        )

    def _settle_fail(
        self, guard: LeaseGuard, step: str, detail: str, ctx: dict[str, Any]
    ) -> Settlement:
        return self._write(
            guard,
            ctx,
            Settlement.FAILED,
            "job_failed",
            "job FAILED",
            lambda: self._store.job_fail(guard.lease, detail, step),
            step=step,
            error=detail,
            level=logging.WARNING,
        )

    def _write(
        self,
        guard: LeaseGuard,
        ctx: dict[str, Any],
        settlement: Settlement,
        action: str,
        message: str,
        write: Callable[[], Any],
        *,
        level: int = logging.INFO,
        **fields: Any,
    ) -> Settlement:
        if guard.lost:
            return self._abandoned(guard, ctx, "settle")
        guard.settling = True
        try:
            status = write()
        except LeaseLost:
            guard.mark_lost("lease_lost")
            return self._abandoned(guard, ctx, "settle")
        except StoreError as exc:
            # Only the database's failures: a ValueError/TypeError (the store refused the
            # write's arguments) is a defect in our code and propagates to the claim loop,
            # whose supervision logs its traceback; the sweeper requeues the job either way.
            log.error(
                "settling the job failed; the sweeper will requeue it when its lease expires",
                extra={
                    "action": "settle_failed",
                    "settlement": settlement.value,
                    "error": str(exc),
                    **ctx,
                },
            )
            return Settlement.UNSETTLED
        if status in ("CANCELLED", "PAUSED"):
            guard.status = status
            if not (settlement is Settlement.CONTROLLED and status == "PAUSED"):
                return self._controlled(ctx, status, settlement.value)
        log.log(level, message, extra={"action": action, **fields, **ctx})
        return settlement

    def _stop(self, guard: LeaseGuard, ctx: dict[str, Any]) -> Settlement:
        """A request reached the job before its step started: apply it (``job_stop``)."""
        guard.settling = True
        try:
            status = self._store.job_stop(guard.lease)
        except LeaseLost:
            return self._abandoned(guard, ctx, "stop")
        except StoreError as exc:
            log.error(
                "applying an operator request failed; the sweeper will apply it",
                extra={"action": "control_stop_failed", "error": str(exc), **ctx},
            )
            return Settlement.UNSETTLED
        if status in ("CANCELLED", "PAUSED"):
            guard.status = status
            guard.mark_lost("controlled")
            return self._controlled(ctx, status, "stop")
        # The request was withdrawn meanwhile (resume of a pending pause): give the job back.
        guard.control = None
        self.release(guard)
        return Settlement.ABANDONED

    def _controlled(self, ctx: dict[str, Any], status: str, at: str) -> Settlement:
        action = "job_cancelled" if status == "CANCELLED" else "job_paused"
        log.info(
            "job %s by operator request",
            status,
            extra={"action": action, "applied_at": at, **ctx},
        )
        return Settlement.CONTROLLED

    def _abandoned(self, guard: LeaseGuard, ctx: dict[str, Any], operation: str) -> Settlement:
        if guard.controlled:
            return self._controlled(ctx, guard.status, operation)
        if guard.released:
            log.info(
                "run stopped after its job was released", extra={"action": "run_released", **ctx}
            )
        else:
            guard.mark_lost("lease_lost")
            log.warning(
                "lease lost; the run is abandoned and writes nothing",
                extra={"action": "lease_lost", "operation": operation, **ctx},
            )
        return Settlement.ABANDONED


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return str(message) if message is not None else str(exc)
