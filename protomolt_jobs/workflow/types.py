"""The engine's model: compiled workflows and steps, findings, outcomes and failures.

A :class:`CompiledWorkflow` is the resolved, immutable form of one workflow JSON envelope
(``envelope.parse_workflow`` builds it): descriptors instead of type names, parsed rules
instead of strings. Runs never mutate it, so one compiled workflow is shared by every job
that carries the same definition.

Failures of a run are one exception type, :class:`WorkflowExecutionError`, carrying a
:class:`FailureKind`, the step it belongs to and the reference's message text.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool

from protomolt_jobs.errors import ProtomoltJobsError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from protomolt_jobs.workflow.mapping import CelRule, TextRule

__all__ = [
    "ACCEPT",
    "APPROVAL",
    "DEFAULT_DEADLINE_MS",
    "DEFAULT_DECISIONS",
    "DEFAULT_MAX_PARALLEL",
    "EXTERNAL",
    "ON_DECISION",
    "ApprovalSpec",
    "CompiledWorkflow",
    "Completed",
    "Dependency",
    "EdgeSpec",
    "FailureKind",
    "FanOutSpec",
    "Finding",
    "LoopSpec",
    "Output",
    "Parked",
    "RecoveryRequired",
    "Runtime",
    "Step",
    "StructuredSpec",
    "WorkflowExecutionError",
    "WorkflowParseError",
]

#: The workflow budget when ``deadlineMs`` is absent or <= 0, in milliseconds.
DEFAULT_DEADLINE_MS = 30_000
#: The one completion mode besides invoking: the step parks until ``complete-step``.
EXTERNAL = "external"
#: An approval step: it parks until ``approve-step`` votes reach a decision (docs/approvals.md).
APPROVAL = "approval"
#: The prefix of a decision edge's ``on`` (``"decision:fix"``).
ON_DECISION = "decision:"
#: The decisions of an approval step that does not list its own.
DEFAULT_DECISIONS = ("accept", "reject")
#: The decision that lets a plain (``on: success``) dependant run, and a sequential run go on.
ACCEPT = "accept"
#: Ready steps a graph workflow runs at once when it does not say ``maxParallel``.
DEFAULT_MAX_PARALLEL = 4
#: Dependency edge kinds (``after: [{"step", "on"}]``): the upstream outcome that lets a step run.
ON_SUCCESS, ON_FAILURE, ON_DONE = "success", "failure", "done"


class FailureKind(str, enum.Enum):
    """Why a step failed; the jobs worker decides retry versus verdict from it."""

    GATE = "GATE"
    MAPPING = "MAPPING"
    GRPC = "GRPC"
    VALIDATION = "VALIDATION"
    DEADLINE = "DEADLINE"
    EXTERNAL = "EXTERNAL"
    WORKFLOW = "WORKFLOW"
    #: an approval step decided a decision whose ``end`` is ``fail`` (never retried).
    APPROVAL = "APPROVAL"
    #: a structured-generation step failed (no generator, or the generator failed).
    STRUCTURED = "STRUCTURED"
    #: an edge's source, items path, item cap, projection or collection failed.
    EDGE = "EDGE"
    #: a step's capabilities were not granted (``[[jobs.grants]]`` or ``authorize_step``
    #: denied, or an approver rejected the grant); never retried.
    PERMISSION = "PERMISSION"
    #: a bounded loop ran out of iterations and its ``onExhausted`` says ``fail``.
    LOOP = "LOOP"
    #: a declared output port could not be read, or a consumed artifact is missing, in the
    #: wrong state, or not the one its approvers saw (workflow/artifacts.py); never retried.
    ARTIFACT = "ARTIFACT"
    #: an external step declared a ``receipt`` and its response carries none; never retried.
    RECEIPT = "RECEIPT"

    def __str__(self) -> str:
        return self.value


class WorkflowParseError(ProtomoltJobsError, ValueError):
    """The envelope does not parse or resolve.

    :ivar step: the step the problem belongs to, ``""`` for the workflow itself, ``"output"``
        for the output mapping's CEL rules.
    :ivar message: the reference's message text.
    """

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.message = message


#: gRPC codes whose failure a job retries rather than judges (see
#: :attr:`WorkflowExecutionError.retryable`).
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class WorkflowExecutionError(ProtomoltJobsError):
    """A run failed at a step.

    :ivar kind: the :class:`FailureKind`.
    :ivar step: the step's name (``"output"`` for the output mapping).
    :ivar message: the reference's message text (``str(error)`` is the same text).
    :ivar code: the gRPC status for kind GRPC, else None.
    :ivar store_failure: True when ``on_checkpoint`` raised (the checkpoint may not have
        persisted); the worker treats it as retryable. The original exception is ``__cause__``.
    """

    def __init__(
        self,
        kind: FailureKind,
        step: str,
        message: str,
        code: grpc.StatusCode | None = None,
        store_failure: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.step = step
        self.message = message
        self.code = code
        self.store_failure = store_failure
        #: graph workflows: the final report of the failed run (see ``graph.report``).
        self.report: dict[str, Any] | None = None

    @property
    def retryable(self) -> bool:
        """True for a failure a job retries (with backoff, up to its attempts) rather than
        judges: a DEADLINE, a GRPC failure whose code is in :data:`RETRYABLE_CODES`, or a
        checkpoint that may not have persisted (``store_failure``). The engine's one
        classification: the worker's retry policy and the graph scheduler both ask it."""
        return (
            self.kind is FailureKind.DEADLINE
            or (self.kind is FailureKind.GRPC and self.code in RETRYABLE_CODES)
            or self.store_failure
        )

    @property
    def detail(self) -> str:
        """``"<KIND>: <message>"``, the failure text jobs store and publish."""
        return f"{self.kind.value}: {self.message}"

    def __repr__(self) -> str:
        code = f", code={self.code.name}" if self.code is not None else ""
        return (
            f"WorkflowExecutionError({self.kind.value}, step={self.step!r}{code}: {self.message!r})"
        )


@dataclass(frozen=True)
class Finding:
    """One static verification problem: ``kind`` is ``workflow``, ``method``, ``completion``,
    ``rule``, ``celRule``, ``when``, ``output``, ``validate``, ``verify``, ``graph``, ``edge``,
    ``fanOut``, ``structured``, ``effect-external-in-graph``, ``unsupported``, ``loop`` (a
    bounded loop's bounds, body and worst case: ``loops.findings``), ``resumable`` (a
    resumable step's declaration: ``resumable.findings``), ``artifact`` (the artifact keys:
    ``artifacts.findings``, each naming its path), or (from
    ``verifier.check`` only) ``unknown-key``, or (from ``floors.findings``, the node's policy
    floors) ``weakens_policy``."""

    step: str
    kind: str
    error: str

    def to_json(self) -> dict[str, str]:
        return {"step": self.step, "kind": self.kind, "error": self.error}


@dataclass(frozen=True)
class Runtime:
    """What the host lends the engine.

    :param pool: the host's shared type pool, for the ``{"type": ...}`` schema form.
    :param channel_factory: ``(target, tls) -> grpc.Channel`` for every step target
        (``inprocess:NAME`` and network targets alike; the host hands out its cached,
        node-owned channels). Without one, ``inprocess:`` targets fail and network targets get
        a channel for the segment. The engine does not close channels the factory hands out:
        the factory owns them.
    :param structured_generator: the ``StructuredGenerator`` target for ``structured`` steps.
    """

    pool: descriptor_pool.DescriptorPool | None = None
    channel_factory: Callable[[str, bool], grpc.Channel] | None = None
    #: gRPC target of the ``StructuredGenerator`` (``jobs.structured_generator``) that graph
    #: workflows' ``structured`` steps call; None: those steps fail (STRUCTURED).
    structured_generator: str | None = None
    #: compiled workflows by canonical definition text (see ``envelope.parse_workflow``).
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Dependency:
    """One dependency edge of a graph step: run after ``step`` ended with ``on`` (``success``,
    ``failure`` or ``done``: any end, a skip included)."""

    step: str
    on: str = ON_SUCCESS


@dataclass(frozen=True)
class ApprovalSpec:
    """An approval step's ``approval`` object (docs/approvals.md).

    :ivar roles: groups (``[node.groups]``) whose members may vote.
    :ivar principals: principals who may vote.
    :ivar quorum: distinct principals whose votes for one decision decide it.
    :ivar decisions: the allowed decisions (``accept`` and ``reject`` by default).
    :ivar veto: decisions one vote of which decides at once.
    :ivar distinct_from: approval steps whose voters may not vote here.
    :ivar end: decision -> ``fail`` or ``complete``: the decisions that end the run.
    :ivar expires_s: ``expires`` in seconds (None: the step never expires).
    :ivar on_expire: ``reject``, ``fail`` or ``pause`` (never accept).
    :ivar escalate: ``(after_s, add_roles, add_principals)`` in ``after`` order.
    """

    roles: tuple[str, ...] = ()
    principals: tuple[str, ...] = ()
    quorum: int = 1
    decisions: tuple[str, ...] = DEFAULT_DECISIONS
    veto: tuple[str, ...] = ()
    distinct_from: tuple[str, ...] = ()
    end: tuple[tuple[str, str], ...] = ()
    expires_s: float | None = None
    on_expire: str = "reject"
    escalate: tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...] = ()

    def ending(self, decision: str) -> str:
        """``fail``, ``complete`` or "" (the decision's edges decide) for ``decision``."""
        return dict(self.end).get(decision, "")


@dataclass(frozen=True, eq=False)
class EdgeSpec:
    """Upstream's typed edge: a ``produce_type`` message built from the declared ``sources``
    only (``rules``/``cel_rules``), optionally projected to ``project_to`` and validated."""

    sources: tuple[str, ...]
    produce_type: _descriptor.Descriptor
    rules: tuple[TextRule, ...] = ()
    cel_rules: tuple[CelRule, ...] = ()
    project_to: _descriptor.Descriptor | None = None
    validate: bool = False


@dataclass(frozen=True, eq=False)
class FanOutSpec:
    """Upstream's bounded fan-out: one branch per element of the repeated message field at
    ``items`` inside the edge's produced message; outputs collected in index order into the
    repeated field ``collect_into`` of ``collect_type``."""

    items: str
    max_items: int
    max_concurrency: int
    failure_policy: str  # "FAIL_FAST" or "CONTINUE"
    collect_type: _descriptor.Descriptor
    collect_into: str


@dataclass(frozen=True, eq=False)
class StructuredSpec:
    """A structured-generation step: the configured ``StructuredGenerator`` fills
    ``target_type`` with ``model`` (``max_attempts`` 0 = the generator's default)."""

    target_type: _descriptor.Descriptor
    model: str
    max_attempts: int = 0


#: ``loop.onExhausted`` values: the run fails (kind LOOP), or it pauses for a human.
ON_EXHAUSTED = ("fail", "park")


@dataclass(frozen=True)
class LoopSpec:
    """A step's ``loop`` (docs/workflows.md *Bounded loops*): when the step succeeds, the body
    (``to``, the step and every step between) runs again, at most ``max`` more times.

    :ivar to: the first step of the body (an ancestor of the loop step).
    :ivar max: the iterations after the first (1..20; the verifier reports others).
    :ivar on_exhausted: ``fail`` or ``park``.
    :ivar allow_effects: the body may hold ``effect: "external"`` steps.
    """

    to: str
    max: int
    on_exhausted: str = "fail"
    allow_effects: bool = False


@dataclass(frozen=True)
class ResumableSpec:
    """A step's ``resumable`` (docs/long-steps.md): the engine calls the step again and again,
    each response a progress checkpoint, until ``done`` holds.

    :ivar state: the field holding the state: read from each response, set on the next request
        (the same name in both messages).
    :ivar done: a CEL expression over ``response``: true when the step is finished.
    :ivar progress: a CEL expression over ``response`` giving the percent (0..100), or "".
    """

    state: str
    done: str
    progress: str = ""


#: ``Step.effect`` values (docs/workflows.md *Effects*).
EFFECT_NONE = "none"
EFFECT_IDEMPOTENT = "idempotent"
EFFECT_EXTERNAL = "external"
EFFECTS = (EFFECT_NONE, EFFECT_IDEMPOTENT, EFFECT_EXTERNAL)


@dataclass(frozen=True, eq=False)
class VerifySpec:
    """An ``external`` step's probe: a unary call built from the scope like a step's request
    (``rules``/``cel_rules``), whose response (``response`` in CEL) ``found`` judges; ``receipt``
    (CEL over ``response``, optional) is what the checkpoint keeps as the proof."""

    target: str
    tls: bool
    method: _descriptor.MethodDescriptor
    method_name: str
    rules: tuple[TextRule, ...]
    cel_rules: tuple[CelRule, ...]
    found: str
    receipt: str = ""


@dataclass(frozen=True, eq=False)
class Step:
    """One resolved step. ``method`` is None for a structured step (and ``structured`` is set).

    ``output_type`` is what the step binds in the scope: the method's output, a fan-out's
    collect type, or a structured step's target type. ``depends`` is resolved at parse time:
    ``after`` when given, else the edge's sources (``input`` aside), else the step before it
    (compensation steps aside); a compensation step depends on nothing (it runs only to undo).
    """

    index: int
    name: str
    target: str
    tls: bool
    method: _descriptor.MethodDescriptor | None
    method_name: str
    input_type: _descriptor.Descriptor | None
    output_type: _descriptor.Descriptor | None
    when: str
    rules: tuple[TextRule, ...]
    cel_rules: tuple[CelRule, ...]
    validate: bool
    deadline_ms: int
    completion: str
    #: keys present that this engine does not run (none since graph workflows landed).
    unsupported: tuple[str, ...] = ()
    #: ``after`` as written (None when absent).
    after: tuple[Dependency, ...] | None = None
    #: the resolved dependencies (graph workflows).
    depends: tuple[Dependency, ...] = ()
    #: ``all`` (every dependency edge must match) or ``any`` (one must).
    join: str = "all"
    #: the step that undoes this one when the run fails after it succeeded ("" for none).
    compensate: str = ""
    edge: EdgeSpec | None = None
    fan_out: FanOutSpec | None = None
    structured: StructuredSpec | None = None
    #: ``none``, ``idempotent`` (default) or ``external`` (an intent is recorded before the
    #: call; a resume with the intent and no checkpoint asks ``verify`` or an operator).
    effect: str = EFFECT_IDEMPOTENT
    verify: VerifySpec | None = None
    #: ``adapterVersion`` as declared ("" when absent): recorded in the step's checkpoints.
    adapter_version: str = ""
    #: the ``approval`` object of a ``completion: "approval"`` step (None otherwise).
    approval: ApprovalSpec | None = None
    #: ``capabilities`` as declared (sorted, unique; ``()`` when absent): the worker asks its
    #: grant policy before the step's call; declaring grants nothing.
    capabilities: tuple[str, ...] = ()
    #: the step's ``loop`` (a bounded back-edge to an ancestor), or None.
    loop: LoopSpec | None = None
    #: the step's ``resumable`` (called chunk by chunk), or None.
    resumable: ResumableSpec | None = None
    #: ``reportsProgress``: the call carries a progress token and the service reports its own
    #: progress with ``ReportProgress`` (docs/long-steps.md).
    reports_progress: bool = False
    #: the name of the workflow the step belongs to ("" when unnamed): a label of the step
    #: metrics (``protomolt_jobs_step_duration_seconds{workflow}``).
    workflow: str = ""

    @property
    def external(self) -> bool:
        """True when the step parks for ``complete-step`` instead of calling."""
        return self.completion == EXTERNAL

    @property
    def parks(self) -> bool:
        """True when the step makes no call and parks the run: external or approval."""
        return self.completion in (EXTERNAL, APPROVAL)

    @property
    def full_method(self) -> str:
        """``/<service full name>/<method>``, the gRPC path."""
        assert self.method is not None
        return f"/{self.method.containing_service.full_name}/{self.method.name}"


@dataclass(frozen=True, eq=False)
class Output:
    """The output mapping: a message of ``type`` built by ``rules`` then ``cel_rules``."""

    type: _descriptor.Descriptor
    rules: tuple[TextRule, ...]
    cel_rules: tuple[CelRule, ...]


@dataclass(frozen=True, eq=False)
class CompiledWorkflow:
    """A parsed, resolved workflow. Treat ``definition`` as read-only: it is shared."""

    name: str
    input_type: _descriptor.Descriptor
    steps: tuple[Step, ...]
    output: Output | None
    deadline_ms: int
    definition: dict[str, Any]
    pool: descriptor_pool.DescriptorPool
    #: the files the schema named (their transitive imports included), by file name.
    files: tuple[str, ...] = ()
    #: True when the workflow uses a graph key (``after``, ``join``, ``compensate``, ``edge``,
    #: ``fanOut``, ``structured``, ``loop``, ``maxParallel``, ``completion``): on the graph
    #: executor. False: the sequential runner, exactly as before graphs existed.
    graph: bool = False
    #: ready steps run at once (graph workflows).
    max_parallel: int = DEFAULT_MAX_PARALLEL
    #: ``completion.require`` as written, or None (the default criterion).
    require: tuple[str, ...] | None = None

    @property
    def compensations(self) -> frozenset[str]:
        """Names of the steps some step names in ``compensate`` (they run only to undo)."""
        return frozenset(s.compensate for s in self.steps if s.compensate)

    @property
    def loops(self) -> tuple[Step, ...]:
        """The steps that declare a ``loop``, in declaration order (empty for most)."""
        return tuple(s for s in self.steps if s.loop is not None)

    @property
    def checkpoints_to_complete(self) -> int:
        """How many checkpoint entries a completed run holds: every step for a sequential
        workflow; every step but the compensation steps for a graph workflow; 0 (unknown:
        nothing is counted or held) for a workflow with a loop, whose iterations add
        entries."""
        if any(s.loop is not None for s in self.steps):
            return 0
        if not self.graph:
            return len(self.steps)
        comp = self.compensations
        return sum(1 for s in self.steps if s.name not in comp)

    def step(self, name: str) -> Step | None:
        """The step called ``name``, or None."""
        for s in self.steps:
            if s.name == name:
                return s
        return None


@dataclass(frozen=True)
class Completed:
    """A segment that ran to the end.

    :ivar output: the result message (the output mapping, or the last executed response).
    :ivar output_json: its proto3 JSON (lowerCamelCase, fields without presence printed).
    :ivar output_type: its full type name.
    :ivar steps: ``[{"name", "skipped"}]`` for every replayed, executed and skipped step.
    :ivar report: graph workflows only: ``{"steps": [{"name", "status", "reason"?}],
        "criterion": str}`` (see ``graph.report``); None for a sequential run.
    """

    output: Message
    output_json: dict[str, Any]
    output_type: str
    steps: list[dict[str, Any]]
    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class RecoveryRequired:
    """A segment that stopped because a step's state cannot be proven: an ``external`` step
    with an intent and no checkpoint whose probe is absent or failed, or a checkpoint whose
    fingerprint no longer matches (``reason`` starts with ``checkpoint-mismatch``). An
    operator answers with ``reconcile-step`` or ``migrate-checkpoint``."""

    step: str
    reason: str


@dataclass(frozen=True)
class Parked:
    """A segment that stopped at a step that parks: ``complete-step`` must supply its response
    (``wait_kind`` ``external``), ``approve-step`` votes decide it (``approval``), or
    ``supply-input`` fills the input paths it needs (``input``: ``workflow/inputs.py``)."""

    step: str
    wait_kind: str = EXTERNAL
    #: an approval step's timers (escalations, expiry), offsets from the park in seconds:
    #: ``{"kind": "escalate"|"expire", "afterS", ...}`` (``approval.timers_of``).
    timers: tuple[dict[str, Any], ...] = ()
    #: an ``input`` park's reason: the missing paths and their owners.
    detail: str = ""
