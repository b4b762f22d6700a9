"""Running a graph workflow inside one segment (one claimed run): ready steps in parallel.

:func:`run_graph` is what ``runner.run_segment`` calls for a workflow with ``graph`` set. The
decisions (what may start, what is skipped and why, how the run ends) are ``graph``'s, and how
one step is built, gated, checked and checkpointed is ``step_run``'s; this module executes
them:

1. **Replay** the stored checkpoints, keyed by step name (they are in completion order): a
   succeeded entry binds its response (parsed strictly as the step's output type), a skipped
   or failed one binds the output type's default. An entry naming no step of the workflow, or
   a step twice, is drift (WORKFLOW). Replayed steps are never called again.
2. **Schedule** on this (the calling) thread: start every ready step, up to ``maxParallel``
   at once, on a thread pool; evaluate ``when`` here first (false: a skipped checkpoint with
   ``condition false: <expr>``); record skips the decision table gives (``upstream <d>
   failed``). Every checkpoint is handed to ``on_checkpoint`` from this thread, one at a time,
   as its step completes, so the stored array is the completion order and the callback needs
   no lock of its own.
3. A step **failure** that some step depends on (``on: failure``/``done``) is handled: its
   entry ``{"name", "skipped": false, "failed": {"kind", "code"?, "message"}}`` is checkpointed
   and the graph goes on. An unhandled failure that a retry could fix (gRPC UNAVAILABLE,
   DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, kind DEADLINE) is not checkpointed: the steps in
   flight finish and are checkpointed, then the error leaves (the job retries and calls that
   step again). Any other unhandled failure is checkpointed as failed; no new step starts;
   the steps in flight finish and are checkpointed; the run **fails** naming it.
4. An **external** step (``effect: "external"``) gets its intent stored on this thread just
   before it starts, as in a sequential run; a step found with an intent and no checkpoint
   (a crash between the two) is not called blindly: its ``verify`` probe decides, else the
   run stops as ``RecoveryRequired`` once the steps in flight are checkpointed, and it never
   completes until ``reconcile-step`` says what happened (``external.py``).
5. **Settle** when nothing runs and nothing can start: an external or approval step that is
   ready, or a step whose grant needs an approval (its *grant gate*, ``step_run.GrantGate``:
   the check ran on the step's thread, the step was not called), or a ready step that waits
   for a missing input (``onMissingInput: "wait"``, ``inputs.check_step``: checked on this
   thread before its intent, so it never started), parks the run (:class:`Parked`); else COMPLETED when the criterion holds; else, before the error
   leaves, the **compensation** steps of every succeeded step that declared ``compensate``
   run one by one in reverse completion order, each checkpointed.
6. A workflow with a ``loop`` has a ``loop_run.LoopRun`` (None otherwise): it re-runs a body,
   blocks the steps waiting on a loop, stamps iterations and checks repeated names on replay.

Steps call through the segment's channels (one per ``(target, tls)``, shared by the threads)
and, when the worker passes ``call_permit``, each call holds the worker's per-target permit
for its own target (a graph run takes no segment-wide permit).

Upstream's ``edge`` steps build their request from the declared sources only; ``fanOut``
steps run one branch per item (``maxConcurrency`` at once, FAIL_FAST or CONTINUE) and collect
the outputs in index order; ``structured`` steps call the ``StructuredGenerator`` configured as
``jobs.structured_generator`` (``Runtime.structured_generator``), and without one fail with
upstream's text.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from protomolt_jobs.workflow import approval, edges, inputs, resumable, retry_scope
from protomolt_jobs.workflow import artifacts as _artifacts
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow import graph as g
from protomolt_jobs.workflow.calls import SegmentChannels
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.external import record_intent, resume_external
from protomolt_jobs.workflow.loop_run import LoopRun
from protomolt_jobs.workflow.step_run import (
    DRIFT,
    GrantGate,
    Scope,
    authorize,
    build_message,
    call_budget_ms,
    check_fingerprint,
    deliver_checkpoint,
    fail,
    gate_open,
    render_checkpoint,
    replay,
    validate_response,
    workflow_output,
)
from protomolt_jobs.workflow.types import (
    EFFECT_EXTERNAL,
    CompiledWorkflow,
    Completed,
    FailureKind,
    Parked,
    Runtime,
    Step,
    WorkflowExecutionError,
)

__all__ = ["run_compensation", "run_graph"]

#: The structured-generation lane's method (proto/ai/pipestream/proto/jobs/v1/structured.proto).
GENERATE_METHOD = "/ai.pipestream.proto.jobs.v1.StructuredGenerator/Generate"


def failed_entry(step: str, exc: WorkflowExecutionError) -> dict[str, Any]:
    """The checkpoint of a failed step: ``{"name", "skipped": false, "failed": {"kind",
    "code"?, "message"}}``."""
    failed: dict[str, Any] = {"kind": exc.kind.value, "message": exc.message}
    if exc.code is not None:
        failed["code"] = exc.code.name
    return {"name": step, "skipped": False, "failed": failed}


def _error_from_entry(step: str, failed: Any) -> WorkflowExecutionError:
    """Rebuild a stored failure (replay of a run that had already failed)."""
    if not isinstance(failed, dict):
        failed = {}
    try:
        kind = FailureKind(failed.get("kind", "WORKFLOW"))
    except ValueError:
        kind = FailureKind.WORKFLOW
    code = None
    if isinstance(failed.get("code"), str):
        code = getattr(grpc.StatusCode, failed["code"], None)
    return WorkflowExecutionError(kind, step, str(failed.get("message", "")), code=code)


class _Run:
    """The state of one graph segment (used from the scheduling thread only, except the
    channel map, which has its own lock)."""

    def __init__(
        self,
        workflow: CompiledWorkflow,
        input_msg: Message,
        on_checkpoint: Callable[[dict[str, Any]], None],
        runtime: Runtime,
        channels: SegmentChannels,
        call_permit: Callable[[str], Any] | None,
    ) -> None:
        self.workflow = workflow
        self.values: dict[str, Message] = {"input": input_msg}
        self.state = g.GraphState(workflow)
        self.errors: dict[str, WorkflowExecutionError] = {}
        self.on_checkpoint = on_checkpoint
        self.runtime = runtime
        self.channels = channels
        self._channel_lock = threading.Lock()
        self.call_permit = call_permit
        self.effects: Any = None  # effects.EffectContext of a job's segment, or None
        self.held: Any = None  # retry_scope.Held of a run a retry-step marked, or None
        self.authorize: Callable[[Step], Any] | None = None  # the job's grant check, or None
        self.grants: dict[str, dict[str, Any]] = {}  # step -> its grant (step_run.authorize)
        #: steps whose grant gate is open (step -> its park), never started again this segment
        self.gates: dict[str, Parked] = {}
        #: External steps' receipts, set on a pool thread before the step's future resolves
        #: and taken by :meth:`succeeded` on this thread.
        self.receipts: dict[str, Any] = {}
        #: Lineage and consumption of steps whose request was built (``artifacts.py``), set on
        #: a pool thread before the step's future resolves and taken by :meth:`succeeded`.
        self.lineage: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        #: the run's entries so far, replayed and new (a publication step checks them)
        self.entries: list[Any] = []
        #: hash the response artifact (``sha256``, ``sizeBytes``, ``inputs``) of each entry
        #: even without ``effects``: a stopped run's compensations (:func:`run_compensation`)
        self.hash_entries = False
        self.deadline = time.monotonic() + workflow.deadline_ms / 1000.0
        #: the run's loops (``loop_run.py``), None for a workflow without ``loop``
        self.loops: LoopRun | None = None
        if workflow.loops:
            self.loops = LoopRun(workflow, self.state, lambda: self.effects)
            self.values.update(self.loops.defaults())

    # -- replay ------------------------------------------------------------------------------

    def replay(self, prior: list[Any]) -> None:
        seen: set[str] = set()
        for i, entry in enumerate(prior):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise fail(
                    FailureKind.WORKFLOW,
                    "",
                    f"checkpoint {i} is not a {{name, skipped, response}} object; {DRIFT}",
                )
            name = entry["name"]
            step = self.workflow.step(name)
            if step is None or step.output_type is None:
                raise fail(
                    FailureKind.WORKFLOW,
                    name,
                    f"checkpoint {i} names step '{name}', which the workflow does not have; "
                    f"{DRIFT}",
                )
            if self.loops is not None:
                self.loops.before_replay(i, step, entry)
            elif name in seen:
                raise fail(
                    FailureKind.WORKFLOW, name, f"checkpoint {i} repeats step '{name}'; {DRIFT}"
                )
            seen.add(name)
            self.entries.append(entry)
            self.replay_entry(i, step, entry)

    def replay_entry(self, i: int, step: Step, entry: dict[str, Any]) -> None:
        """Bind one stored entry (``i``: its place, for messages) and record its outcome."""
        name = step.name
        assert step.output_type is not None
        if "failed" in entry:
            self.values[name] = message_class(step.output_type)()
            exc = _error_from_entry(name, entry["failed"])
            self.errors[name] = exc
            self.state.ended(name, g.FAILED, exc.message)
            self.loop_ended(name)
            return
        check_fingerprint(self.workflow, step, entry)
        replayed = replay(self.workflow, i, step, entry)
        if replayed is None:
            self.values[name] = message_class(step.output_type)()
            self.state.ended(name, g.SKIPPED, str(entry.get("reason", "")))
        else:
            self.values[name] = replayed
            self._decided(step, entry)
        self.loop_ended(name)

    def loop_ended(self, name: str) -> None:
        """Tell the run's loops that ``name`` ended; a loop exhausted with ``fail`` is the
        run's unhandled failure (LOOP, naming the loop step)."""
        error = self.loops.ended(name) if self.loops is not None else None
        if error is not None:
            self.errors[name] = error

    def _decided(self, step: Step, entry: dict[str, Any]) -> None:
        """A replayed step that succeeded; an approval step by its decision (an ``end: fail``
        decision fails it)."""
        decision = approval.decision_of(step, entry)
        if decision is None:
            self.state.ended(step.name, g.SUCCEEDED)
            return
        failure = approval.approval_failure(step, decision)
        if failure is not None:
            self.errors[step.name] = failure
            self.state.ended(step.name, g.FAILED, failure.message, decision)
        else:
            self.state.ended(step.name, g.SUCCEEDED, "", decision)

    # -- checkpoints -------------------------------------------------------------------------

    def record(self, step: Step, entry: dict[str, Any]) -> None:
        """Hand one entry to ``on_checkpoint``; a failure there is the run's (store) failure."""
        if self.loops is not None:
            self.loops.stamp(entry)
        deliver_checkpoint(self.on_checkpoint, step, entry)
        self.entries.append(entry)

    def succeeded(self, step: Step, response: Message) -> None:
        grant = self.grants.get(step.name)
        receipt = self.receipts.pop(step.name, None)
        read, consumed = self.lineage.pop(step.name, (None, None))
        entry = render_checkpoint(
            self.workflow,
            step,
            response,
            self.effects,
            receipt=receipt,
            grant=grant,
            inputs=read,
            consumed=consumed,
            entries=self.entries,
        )
        if self.effects is None and self.hash_entries:
            # a compensation of a stopped run: its response artifact, like every step's
            entry["sha256"], entry["sizeBytes"] = _artifacts.content_sha256(response)
            if read is not None:
                entry["inputs"] = read
        self.values[step.name] = response
        self.record(step, entry)
        self.state.ended(step.name, g.SUCCEEDED)
        self.loop_ended(step.name)

    def skipped(self, step: Step, reason: str) -> None:
        assert step.output_type is not None
        self.values[step.name] = message_class(step.output_type)()
        self.record(step, {"name": step.name, "skipped": True, "reason": reason})
        self.state.ended(step.name, g.SKIPPED, reason)
        self.loop_ended(step.name)

    def failed(self, step: Step, exc: WorkflowExecutionError) -> None:
        assert step.output_type is not None
        self.values[step.name] = message_class(step.output_type)()
        self.errors[step.name] = exc
        self.record(step, failed_entry(step.name, exc))
        self.state.ended(step.name, g.FAILED, exc.message)
        self.loop_ended(step.name)

    # -- one step ----------------------------------------------------------------------------

    def channel(self, step: Step) -> grpc.Channel:
        with self._channel_lock:
            return self.channels.channel(step)

    def call_ms(self, step: Step) -> int:
        """``step``'s call deadline (ms) from what is left of the segment's budget."""
        return call_budget_ms(step, self.deadline)

    def call(self, step: Step, request: Message, call_ms: int, channel: grpc.Channel) -> Message:
        permit = self.call_permit(step.target) if self.call_permit else contextlib.nullcontext()
        with permit:
            return resumable.call(
                channel,
                step,
                request,
                call_ms,
                lambda: self.call_ms(step),
                self.metadata(step),
                self.effects,
                self.loops.iteration(step.name) if self.loops is not None else 0,
                self.workflow,
            )

    def iteration_of(self, name: str) -> int:
        """The iteration of ``name``'s value in the scope (0 outside loops)."""
        return self.loops.iteration(name) if self.loops is not None else 0

    def metadata(self, step: Step) -> list[tuple[str, str]] | None:
        if self.effects is None:
            return None
        return [(fx.IDEMPOTENCY_HEADER, self.key(step))]

    def key(self, step: Step) -> str:
        """``step``'s idempotency key; in a loop's iteration k > 0 it ends with ``:<k>``."""
        key = self.effects.key(step.name)
        return key if self.loops is None else key + self.loops.suffix(step.name)

    def has_intent(self, step: Step) -> bool:
        """Whether the row holds ``step``'s intent for this iteration (its key's)."""
        intent = self.effects.intents.get(step.name)
        return intent is not None and (
            self.loops is None or self.loops.current(step, intent, self.key(step))
        )

    def execute(self, step: Step, scope: dict[str, Message], can_park: bool = False) -> Message:
        """Run one step (on a pool thread): its result, or a WorkflowExecutionError; a
        ``GrantGate`` when ``can_park`` and its grant needs an approval."""
        grant = authorize(step, self.authorize, can_park=can_park)
        if grant is not None:
            self.grants[step.name] = grant
        if step.edge is not None or step.structured is not None:
            if self.effects is not None or self.hash_entries:
                # lineage, as a plain step's: what its request reads (an edge's declared
                # sources, and the gate's names), hashed before the call
                names = g.names_read(step)
                if step.edge is not None:
                    names |= set(step.edge.sources)
                read = _artifacts.inputs_of(step, scope, names, self.iteration_of)
                self.lineage[step.name] = (read, [])
            if step.edge is not None:
                return edges.execute_edge(self, step, scope)
            return self.generate(step, None)
        if step.effect == EFFECT_EXTERNAL and self.effects is not None:
            found = self.resume_external(step, scope)
            if found is not None:
                return found
        consumed = None
        if self.effects is not None:
            consumed = _artifacts.check_consumed(
                self.workflow,
                step,
                list(self.entries),
                self.effects.artifact_bytes,
                self.effects.artifact_rows,
                self.effects.job_id,
            )
        request = build_message(
            step.input_type, step.rules, step.cel_rules, Scope(scope), step.name
        )
        if self.effects is not None or self.hash_entries:
            # lineage: what the request read, hashed before the call
            read = _artifacts.inputs_of(step, scope, g.names_read(step), self.iteration_of)
            self.lineage[step.name] = (read, consumed or [])
        call_ms = self.call_ms(step)
        response = self.call(step, request, call_ms, self.channel(step))
        if step.validate:
            validate_response(step, response)
        return response

    def resume_external(self, step: Step, scope: dict[str, Message]) -> Message | None:
        """An external step about to be called (its intent is stored): note its receipt; when
        the intent was found at the segment's start (no checkpoint), its ``verify`` probe
        decides: the response it proves, or None (call the step).

        :raises RecoveryStop: no probe, or the probe could not tell.
        """
        self.receipts[step.name] = {"idempotencyKey": self.key(step)}
        if not self.has_intent(step):
            return None
        found = resume_external(
            self.workflow, step, Scope(scope), self.channel, self.effects, self.call_ms(step)
        )
        if found is None:
            return None
        response, self.receipts[step.name] = found
        return response

    def generate(self, step: Step, grounding: Message | None) -> Message:
        """A structured step (or one fan-out branch of it): ask the configured
        ``StructuredGenerator`` for a ``targetType`` message (reference 3.5).

        The call is bounded by what is left of the segment's budget (upstream leaves it
        unbounded, gap 6; a claimed run must not hang on it).

        :raises WorkflowExecutionError: STRUCTURED without a generator or when it fails;
            DEADLINE when no budget is left; WORKFLOW when its answer does not parse.
        """
        from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1 import structured_pb2

        spec = step.structured
        assert spec is not None
        target = self.runtime.structured_generator
        if not target:
            raise fail(
                FailureKind.STRUCTURED,
                step.name,
                f"structured step '{step.name}' needs a StructuredGenerator; this runner was "
                "built without one",
            )
        call_ms = self.call_ms(step)
        request = structured_pb2.GenerateStructuredRequest(
            target_type=spec.target_type.full_name,
            model=spec.model,
            max_attempts=spec.max_attempts,
        )
        if grounding is not None:
            request.grounding.Pack(grounding)
        lane = dataclasses.replace(step, target=target, tls=False)
        channel = self.channel(lane)
        call = channel.unary_unary(
            GENERATE_METHOD,
            request_serializer=structured_pb2.GenerateStructuredRequest.SerializeToString,
            response_deserializer=structured_pb2.GenerateStructuredResponse.FromString,
        )
        permit = self.call_permit(target) if self.call_permit else contextlib.nullcontext()
        try:
            with permit:
                answer = call(request, timeout=call_ms / 1000.0)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = exc.details() if callable(getattr(exc, "details", None)) else None
            name = code.name if code is not None else "UNKNOWN"
            raise fail(
                FailureKind.STRUCTURED,
                step.name,
                f"structured generation failed: gRPC {name} from {target}: {details or 'null'}",
            ) from exc
        except ValueError as exc:  # a closed channel
            raise fail(
                FailureKind.STRUCTURED, step.name, f"structured generation failed: {exc}"
            ) from exc
        out = message_class(spec.target_type)()
        try:
            out.ParseFromString(answer.message.value)
        except Exception as exc:  # DecodeError or others from the protobuf runtime
            raise fail(
                FailureKind.WORKFLOW,
                step.name,
                "the coordinator's packed output does not parse as the step's target type",
            ) from exc
        return out

    def gate(self, step: Step) -> bool:
        """``when`` of a step about to start (on the scheduling thread)."""
        return gate_open(step, Scope(dict(self.values)))


def run_graph(
    workflow: CompiledWorkflow,
    input_msg: Message,
    prior: list[Any],
    on_checkpoint: Callable[[dict[str, Any]], None],
    *,
    runtime: Runtime,
    call_permit: Callable[[str], Any] | None = None,
    effects: Any = None,
    held: Any = None,
    check: Callable[[Step], Any] | None = None,
) -> Completed | Parked:
    """Replay ``prior`` and run the rest of a graph workflow (see the module docstring).

    :param check: the job's grant check (``step_run.authorize``), asked on the step's
        thread before a step that declares ``capabilities`` runs; None: nothing is checked.

    :param effects: the job's ``effects.EffectContext`` (idempotency keys, fingerprints), or None.
    :param held: ``retry_scope.Held``: entries replayed when their step is about to start
        instead of running it (a retry-step's kept effects and unchanged-output dependants).

    :param prior: stored checkpoint entries in completion order, keyed by ``name``.
    :param on_checkpoint: called from this thread with each new entry as its step ends.
    :param call_permit: ``target -> context manager`` held around every call (the worker's
        per-target permits), or None.
    :returns: :class:`Completed` (with ``report``) or :class:`Parked`.
    :raises WorkflowExecutionError: the failure that decided the run (with ``report`` set when
        the run failed for good); a store failure in ``on_checkpoint`` (``store_failure``).
    :raises Exception: whatever ``call_permit`` or ``on_checkpoint`` raised that is not an
        ``Exception`` the engine classifies (a lost lease, a cancelled permit wait) leaves
        as is, after the steps in flight end.
    """
    with SegmentChannels(runtime) as channels:
        run = _Run(workflow, input_msg, on_checkpoint, runtime, channels, call_permit)
        run.effects = effects
        run.held = held
        run.authorize = check
        run.replay(prior)
        outcome = _schedule(run)
        if outcome is not None:
            return outcome
        return _settle(run)


def run_compensation(
    workflow: CompiledWorkflow,
    input_msg: Message,
    prior: list[Any],
    on_checkpoint: Callable[[dict[str, Any]], None],
    *,
    runtime: Runtime,
    call_permit: Callable[[str], Any] | None = None,
) -> list[str]:
    """Compensate a graph run that is being stopped for good (a cancel): replay ``prior``,
    then run the compensation step of every succeeded step that declared ``compensate`` and
    has not been compensated yet, in reverse completion order, each checkpointed through
    ``on_checkpoint``. Nothing else runs. Each compensation's entry carries its response
    artifact's ``sha256``, ``sizeBytes`` and ``inputs`` (docs/artifacts.md), as every step's.

    :returns: the compensation steps that ran (succeeded, failed or gated off), in order.
    :raises WorkflowExecutionError: a replay mismatch, a store failure in ``on_checkpoint``,
        or a compensation failing in a way a retry could fix (then call again later: the
        compensations already checkpointed are not repeated).
    """
    if not workflow.graph:
        return []
    with SegmentChannels(runtime) as channels:
        run = _Run(workflow, input_msg, on_checkpoint, runtime, channels, call_permit)
        run.hash_entries = True  # each compensation's entry is its response artifact
        run.replay(retry_scope.settled(workflow, prior))
        before = set(run.state.outcomes)
        _compensate(run)
        return [n for n in run.state.order if n not in before]


def _schedule(run: _Run) -> Parked | None:
    """Start, wait, record, until nothing runs and nothing can start. Parked, or None."""
    state = run.state
    limit = max(1, min(run.workflow.max_parallel, g.MAX_PARALLEL))
    external: list[Step] = []
    fatal: BaseException | None = None
    futures: dict[cf.Future[Message], Step] = {}
    with cf.ThreadPoolExecutor(max_workers=limit, thread_name_prefix="graph-step") as pool:
        try:
            while True:
                if fatal is None:
                    try:
                        _start_ready(run, pool, futures, external, limit)
                    except BaseException as exc:  # noqa: BLE001 - raised once in flight ends
                        fatal = exc
                if not futures:
                    break
                done, _ = cf.wait(list(futures), return_when=cf.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: futures[f].index):
                    step = futures.pop(fut)
                    try:
                        _finish(run, step, fut)
                    except BaseException as exc:  # noqa: BLE001 - kept, raised after draining
                        if fatal is None:
                            fatal = exc
                        state.running.discard(step.name)
        except BaseException as exc:  # noqa: BLE001 - an interrupt: drain, then raise it
            fatal = fatal or exc
            # Let the calls in flight end (their threads cannot be stopped), unrecorded.
            cf.wait(list(futures))
        if fatal is not None:
            raise fatal
    exhausted = run.loops.parked if run.loops is not None else None
    if exhausted is not None and state.unhandled is None:
        return exhausted
    if (external or run.gates) and state.unhandled is None:
        pending = {s.name for s in state.pending()}
        for step in external:
            if step.name in pending:
                return approval.parked(step, run.loops.iteration(step.name) if run.loops else 0)
        for name, parked in run.gates.items():
            if name in pending:
                return parked
    return None


def _start_ready(
    run: _Run,
    pool: cf.ThreadPoolExecutor,
    futures: dict[cf.Future[Message], Step],
    external: list[Step],
    limit: int,
) -> None:
    state = run.state
    loops = run.loops
    while True:
        if loops is not None and loops.parked is not None:
            return  # a loop exhausted with onExhausted "park": nothing new starts
        progressed = loops is not None and loops.restart_due(state.running)
        start, skip = state.next()
        for step, reason in skip:
            run.skipped(step, reason)
            progressed = True
        for step in start:
            if len(futures) >= limit or state.unhandled is not None:
                break
            if step.name in run.gates:
                continue  # waits for its grant gate: the run parks once nothing else can run
            entry = run.held.take(step.name) if run.held is not None else None
            if entry is not None:
                # kept by a retry-step: replayed, not called (it is stored already)
                run.replay_entry(-1, step, entry)
                progressed = True
                continue
            if step.when.strip() and step.structured is None:
                try:
                    go = run.gate(step)
                except WorkflowExecutionError as exc:
                    _failure(run, step, exc)
                    progressed = True
                    continue
                if not go:
                    run.skipped(step, f"{g.CONDITION_FALSE}{step.when}")
                    progressed = True
                    continue
            if step.parks:
                # parks once nothing else can run (its gate, when it has one, said true)
                if step not in external:
                    external.append(step)
                continue
            if step.edge is None and step.structured is None:
                # before its intent: a step that waits for an input has not started
                try:
                    inputs.check_step(run.workflow, step, run.values)
                except inputs.InputWait as wait:
                    run.gates[step.name] = wait.parked  # parks once nothing else can run
                    continue
                except WorkflowExecutionError as exc:
                    _failure(run, step, exc)
                    progressed = True
                    continue
            effects = run.effects
            if step.effect == EFFECT_EXTERNAL and effects is not None and not run.has_intent(step):
                # the intent is stored (one fenced write, on this thread) before the call
                record_intent(effects, step, run.key(step))
            state.running.add(step.name)
            # In the caller's context (a copy per call): the segment's trace span, if any.
            call = contextvars.copy_context().run
            futures[pool.submit(call, run.execute, step, dict(run.values), True)] = step
        if not progressed:
            return


def _failure(run: _Run, step: Step, exc: WorkflowExecutionError) -> None:
    """A step failed: checkpoint it unless a retry should call it again (then raise)."""
    handled = step.name in g.handled_failures(run.workflow)
    if exc.retryable and not handled:
        raise exc
    run.failed(step, exc)


def _finish(run: _Run, step: Step, fut: cf.Future[Message]) -> None:
    try:
        response = fut.result()
    except WorkflowExecutionError as exc:
        _failure(run, step, exc)
        return
    except GrantGate as gate:
        run.gates[step.name] = gate.parked  # not called: parks at the segment's end
        run.state.running.discard(step.name)
        return
    run.succeeded(step, response)


def _settle(run: _Run) -> Completed:
    state = run.state
    completed, sentence = state.verdict()
    if completed:
        succeeded = [n for n in state.order if state.outcomes.get(n) == g.SUCCEEDED]
        last = run.values[succeeded[-1]] if succeeded else run.values["input"]
        output, output_json = workflow_output(run.workflow, Scope(run.values), last)
        return Completed(
            output=output,
            output_json=output_json,
            output_type=output.DESCRIPTOR.full_name,
            steps=[
                {"name": n, "skipped": state.outcomes[n] == g.SKIPPED, "status": state.outcomes[n]}
                for n in state.order
            ],
            report=g.report(state, True, sentence),
        )
    _compensate(run)
    if state.unhandled is not None:
        first = run.errors[state.unhandled]
        error = WorkflowExecutionError(first.kind, first.step, first.message, code=first.code)
    else:
        req = next(
            (n for n in g.required(run.workflow) if state.outcomes.get(n) != g.SUCCEEDED), ""
        )
        error = fail(FailureKind.WORKFLOW, req, f"completion criterion not met: {sentence}")
    error.report = g.report(state, False, sentence)
    raise error


def _compensate(run: _Run) -> None:
    """Run the compensation steps (reverse completion order), each checkpointed; a failing
    compensation is checkpointed as failed and the others still run."""
    for comp in run.state.to_compensate():
        if comp.when.strip():
            try:
                if not run.gate(comp):
                    run.skipped(comp, f"{g.CONDITION_FALSE}{comp.when}")
                    continue
            except WorkflowExecutionError as exc:
                run.failed(comp, exc)
                continue
        try:
            response = run.execute(comp, dict(run.values))
        except WorkflowExecutionError as exc:
            if exc.retryable:
                raise  # the job retries; the compensation runs on the next attempt
            run.failed(comp, exc)
            continue
        run.succeeded(comp, response)
