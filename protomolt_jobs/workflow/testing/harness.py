"""``test-workflow``'s run of one case: the real engine over a stand-in run row and a virtual
clock, with the mock transport (``transport.py``) instead of gRPC.

What runs is the engine a worker runs: ``runner.run_segment`` (and through it the graph,
sequential and loop runners, the step code, retry scopes and effects' idempotency keys and
fingerprints), from the run row's checkpoints, with an ``EffectContext`` holding the row's
intents. Around it, :func:`run_case` plays the part of the worker's settle loop
(``worker/settlement.py``'s table), in-process:

- Completed: COMPLETED. A parked external step: its next mock's ``response`` is stored as
  ``complete-step`` stores it, and the run goes on. A parked approval step: its next mock's
  ``votes`` are tallied (distinct principals per decision; the first decision to reach the
  quorum, or a ``veto`` decision at once, decides) and the decision entry is stored as
  ``approve-step`` stores it (``approval.decision_entry``); no decision: WAITING.
- A failure the engine calls retryable (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
  DEADLINE) is retried while ``attempt < max_attempts``, after ``base * 2^(attempt-1)`` seconds
  on the virtual clock; exhausted: DEAD. A parked step's answer resets the attempts, as
  ``complete-step`` and ``approve-step`` do. Any other failure: FAILED. A recovery stop:
  RECOVERY_REQUIRED. A loop exhausted with ``onExhausted: park``: PAUSED.
- Events: ``advanceMs`` moves the clock; ``crash`` at ``before_checkpoint`` drops the step's
  checkpoint (its call happened) and ``after_checkpoint`` keeps it, and either ends the segment
  as a killed worker's would: the run re-enters from its stored checkpoints as the next attempt
  (the sweeper's requeue); ``pause`` and ``cancel`` take effect at that checkpoint (the
  checkpoint is stored, as the database's trigger stores it), ``resume`` queues a paused run.

docs/workflows.md *Tests in the definition* lists what this does not model.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow import approval as approvals
from protomolt_jobs.workflow import graph, loops
from protomolt_jobs.workflow.effects import EffectContext
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.inputs import INPUT_WAIT
from protomolt_jobs.workflow.runner import run_segment
from protomolt_jobs.workflow.testing.cases import Case, Event
from protomolt_jobs.workflow.testing.transport import MockTransport, Unmocked, VirtualClock
from protomolt_jobs.workflow.types import (
    CompiledWorkflow,
    Completed,
    Parked,
    RecoveryRequired,
    Runtime,
    WorkflowExecutionError,
)

__all__ = ["MAX_SEGMENTS", "CaseRun", "path_of", "run_case"]

#: Most segments one case runs (retries, re-entries, parks) before it is failed as runaway.
MAX_SEGMENTS = 200


class _Stop(ProtomoltJobsError):
    """Raised from the checkpoint callback: a crash or an operator action ends the segment."""


@dataclass
class CaseRun:
    """What one case did: the stand-in row's final state and the transport's counts.

    :ivar status: the run's final status (a job status).
    :ivar checkpoints: the stored checkpoint entries, in order.
    :ivar calls: step -> calls (a parked step's mocked answer counts as one).
    :ivar error: the stored error (``"<KIND>: <message>"``), or None.
    :ivar error_kind: the failure's kind (``GRPC``), or None.
    :ivar failed_step: the failing step, or None.
    :ivar attempts: segments run: the claims a worker would make (a retry, a re-entry after a
        crash, a resume after a park or a pause each start one).
    :ivar clock_ms: the virtual clock at the end.
    :ivar unmocked: the message naming a step called without a mock, or None.
    :ivar report: a graph run's report (as get-job rebuilds it), else None.
    """

    status: str = "QUEUED"
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    error_kind: str | None = None
    failed_step: str | None = None
    attempts: int = 0
    clock_ms: int = 0
    unmocked: str | None = None
    unmocked_step: str | None = None
    report: dict[str, Any] | None = None


class _Row:
    """The stand-in run row: checkpoints, intents, status, and the case's pending events."""

    def __init__(self, case: Case, clock: VirtualClock) -> None:
        self.checkpoints: list[dict[str, Any]] = []
        self.intents: dict[str, Any] = {}
        self.events = list(case.events)
        self.clock = clock
        self.stop: str | None = None  # "crash" | "pause" | "cancel"
        #: the row's attempt: the retry budget's count (a park's answer resets it to 0, as
        #: the store's job_complete_parked does)
        self.attempt = 0

    def on_intent(self, step: str, key: str) -> None:
        self.intents[step] = {"key": key}

    def on_checkpoint(self, entry: dict[str, Any]) -> None:
        if self.stop is not None:
            raise _Stop(self.stop)  # the segment is over: nothing more is stored
        name = entry.get("name")
        due = self.events[0] if self.events else None
        if due is not None and due.after == name and due.crash == "before_checkpoint":
            self.events.pop(0)
            self.stop = "crash"
            raise _Stop("crash")
        self.checkpoints.append(entry)
        self.fire(name)
        if self.stop is not None:
            raise _Stop(self.stop)

    def on_checkpoint_parked(self, entry: dict[str, Any]) -> None:
        """Store a parked step's answer (complete-step's or approve-step's entry); the run is
        queued with its attempts reset."""
        self.checkpoints.append(entry)
        self.attempt = 0
        self.fire(entry.get("name"))

    def while_paused(self) -> str | None:
        """Apply the at-once events that follow a pause: None once one resumes the run (and
        the at-once events after it), ``"pause"`` when none does, ``"cancel"`` for a cancel."""
        while self.events and self.events[0].after is None:
            ev = self.events.pop(0)
            if ev.advance_ms:
                self.clock.advance(ev.advance_ms)
            elif ev.action == "cancel":
                return "cancel"
            elif ev.action == "resume":
                self.stop = None
                self.fire(None)
                return self.stop
        return "pause"

    def fire(self, name: str | None) -> None:
        """Apply the events due once ``name`` checkpointed (None: at a boundary)."""
        while self.events and self.stop is None:
            ev: Event = self.events[0]
            if ev.after is not None and ev.after != name:
                return
            self.events.pop(0)
            name = None  # an event names its step once; the next one needs its own
            if ev.advance_ms:
                self.clock.advance(ev.advance_ms)
            elif ev.crash:
                self.stop = "crash"
            elif ev.action in ("pause", "cancel"):
                self.stop = ev.action
            # a resume with nothing paused does nothing


def run_case(
    workflow: CompiledWorkflow,
    case: Case,
    *,
    pool: Any = None,
    max_attempts: int = 3,
    backoff_base_s: float = 5.0,
) -> CaseRun:
    """Run ``case`` on ``workflow`` in-process (the module docstring has the rules).

    Never opens a network connection: every channel the engine asks for is the mock
    transport's.

    :param pool: the host's descriptor pool (``Runtime.pool``).
    :param max_attempts: the node's ``jobs.max_attempts``.
    :param backoff_base_s: the node's ``jobs.backoff_base_seconds``.
    """
    job_id = str(uuid.uuid4())
    clock = VirtualClock()
    transport = MockTransport(job_id, tuple(s.name for s in workflow.steps), case.mocks, clock)
    runtime = Runtime(pool=pool, channel_factory=transport.factory)
    row = _Row(case, clock)
    out = CaseRun()
    row.fire(None)
    if row.stop == "cancel":
        out.status = "CANCELLED"
    for _ in range(MAX_SEGMENTS):
        if out.status != "QUEUED":
            break
        if row.stop == "pause":
            row.stop = row.while_paused()
            if row.stop == "pause":
                out.status = "PAUSED"
                break
            continue
        if row.stop == "cancel":
            out.status = "CANCELLED"
            break
        row.stop = None
        out.attempts += 1
        row.attempt += 1
        effects = EffectContext(
            job_id=job_id,
            attempt=row.attempt,
            intents=dict(row.intents),
            on_intent=row.on_intent,
        )
        returned: Any = None
        failure: BaseException | None = None
        try:
            returned = run_segment(
                workflow,
                json_format.ParseDict(case.input, _input_message(workflow)),
                list(row.checkpoints),
                row.on_checkpoint,
                runtime=runtime,
                effects=effects,
            )
        except Exception as exc:  # noqa: BLE001 - classified below, as the worker's _classify does
            failure = exc
        if transport.unmocked is not None:
            out.unmocked, out.unmocked_step = transport.unmocked.message, transport.unmocked.step
            out.status = "FAILED"
            break
        if row.stop is not None:
            if row.stop == "crash":
                row.stop = None  # the worker died: the row is claimed again from checkpoints
            continue
        if failure is not None:
            _settle_failure(out, failure, row.attempt, max_attempts, backoff_base_s, clock)
            continue
        if isinstance(returned, Completed):
            out.status = "COMPLETED"  # the worker's complete clears the last retry's error
            out.error = out.error_kind = out.failed_step = None
        elif isinstance(returned, RecoveryRequired):
            out.status, out.failed_step = "RECOVERY_REQUIRED", returned.step
            out.error = returned.reason
        elif isinstance(returned, Parked):
            try:
                _answer_park(workflow, returned, transport, row, out)
            except Unmocked as exc:
                out.unmocked, out.unmocked_step = exc.message, exc.step
                out.status = "FAILED"
    else:
        out.status, out.error = "FAILED", f"the case ran more than {MAX_SEGMENTS} segments"
    out.checkpoints = row.checkpoints
    out.calls = dict(transport.calls)
    out.clock_ms = clock.now_ms
    if workflow.graph:
        out.report = graph.report_from_checkpoints(workflow, out.checkpoints, out.status, out.error)
    return out


def _input_message(workflow: CompiledWorkflow) -> Any:
    return message_class(workflow.input_type)()


def _settle_failure(
    out: CaseRun,
    failure: BaseException,
    attempt: int,
    max_attempts: int,
    backoff_base_s: float,
    clock: VirtualClock,
) -> None:
    if isinstance(failure, WorkflowExecutionError):
        retryable = failure.retryable
        kind, step = failure.kind.value, failure.step
        detail = f"{kind}: {failure.message}"
    else:  # a defect in the engine: retryable, bounded by max_attempts (as the worker)
        retryable, kind, step = True, "WORKFLOW", ""
        detail = f"WORKFLOW: {type(failure).__name__}: {failure}"
    out.error, out.error_kind, out.failed_step = detail, kind, step
    if retryable and attempt < max_attempts:
        exponent = min(max(attempt - 1, 0), 20)
        clock.advance(backoff_base_s * 1000.0 * 2**exponent)
        return  # QUEUED: the next attempt
    out.status = "DEAD" if retryable else "FAILED"


def _answer_park(
    workflow: CompiledWorkflow, parked: Parked, transport: MockTransport, row: _Row, out: CaseRun
) -> None:
    if parked.wait_kind == INPUT_WAIT:  # supply-input would fill it: the case ends waiting
        out.status, out.failed_step = "WAITING", parked.step
        return
    if parked.wait_kind == loops.LOOP_WAIT:
        out.status, out.failed_step, out.error_kind = "PAUSED", parked.step, "LOOP"
        out.error = f"LOOP: loop '{parked.step}' exhausted its iterations (onExhausted park)"
        return
    step = workflow.step(parked.step)
    assert step is not None
    mock = transport.take(step.name, "parked")
    transport.clock.advance(mock.delay_ms)
    if parked.wait_kind == "approval":
        if mock.votes is None:
            raise Unmocked(step.name, f"approval step '{step.name}' needs 'votes' mocks")
        decided = _tally(step, mock.votes)
        if decided is None:
            out.status = "WAITING"
            return
        decision, tally, voters = decided
        row.on_checkpoint_parked(approvals.decision_entry(step.name, decision, tally, voters))
        return
    if mock.response_json is None:
        raise Unmocked(step.name, f"external step '{step.name}' needs a 'response' mock")
    row.on_checkpoint_parked({"name": step.name, "skipped": False, "response": mock.response_json})


def _tally(
    step: Any, votes: tuple[dict[str, str], ...]
) -> tuple[str, dict[str, int], list[dict[str, Any]]] | None:
    spec = step.approval
    seen: dict[str, str] = {}
    voters: list[dict[str, Any]] = []
    tally: dict[str, int] = {}
    for vote in votes:
        if vote["principal"] in seen:
            continue  # a principal's first vote counts
        seen[vote["principal"]] = vote["decision"]
        voters.append(dict(vote))
        tally[vote["decision"]] = tally.get(vote["decision"], 0) + 1
        if vote["decision"] in spec.veto or tally[vote["decision"]] >= spec.quorum:
            return vote["decision"], tally, voters
    return None


def path_of(workflow: CompiledWorkflow, checkpoints: list[dict[str, Any]]) -> list[str]:
    """The steps that ran, in checkpoint order: a skipped step is left out, a step in a loop's
    body is ``name#k`` (its iteration k, 0 for the first)."""
    around = loops.plan(workflow).around if workflow.loops else {}
    path = []
    for entry in checkpoints:
        name = entry.get("name")
        if not isinstance(name, str) or entry.get("skipped") is True:
            continue
        if around.get(name):
            k = entry.get("iteration", 0)
            path.append(f"{name}#{k if isinstance(k, int) else 0}")
        else:
            path.append(name)
    return path
