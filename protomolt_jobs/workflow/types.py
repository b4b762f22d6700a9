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

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from protomolt_jobs.workflow.mapping import CelRule, TextRule

__all__ = [
    "DEFAULT_DEADLINE_MS",
    "EXTERNAL",
    "CompiledWorkflow",
    "Completed",
    "FailureKind",
    "Finding",
    "Output",
    "Parked",
    "Runtime",
    "Step",
    "WorkflowExecutionError",
    "WorkflowParseError",
]

#: The workflow budget when ``deadlineMs`` is absent or <= 0, in milliseconds.
DEFAULT_DEADLINE_MS = 30_000
#: The one completion mode besides invoking: the step parks until ``complete-step``.
EXTERNAL = "external"


class FailureKind(str, enum.Enum):
    """Why a step failed; the jobs worker decides retry versus verdict from it."""

    GATE = "GATE"
    MAPPING = "MAPPING"
    GRPC = "GRPC"
    VALIDATION = "VALIDATION"
    DEADLINE = "DEADLINE"
    EXTERNAL = "EXTERNAL"
    WORKFLOW = "WORKFLOW"

    def __str__(self) -> str:
        return self.value


class WorkflowParseError(ValueError):
    """The envelope does not parse or resolve.

    :ivar step: the step the problem belongs to, ``""`` for the workflow itself, ``"output"``
        for the output mapping's CEL rules.
    :ivar message: the reference's message text.
    """

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.message = message


class WorkflowExecutionError(Exception):
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
    ``rule``, ``celRule``, ``when``, ``output`` or ``unsupported``."""

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
    """

    pool: descriptor_pool.DescriptorPool | None = None
    channel_factory: Callable[[str, bool], grpc.Channel] | None = None
    #: compiled workflows by canonical definition text (see ``envelope.parse_workflow``).
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, eq=False)
class Step:
    """One resolved step. ``method`` is None only for steps the verifier rejects as unsupported."""

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
    #: keys present that this engine does not run (``structured``, ``edge``, ``fanOut``).
    unsupported: tuple[str, ...] = ()

    @property
    def external(self) -> bool:
        """True when the step parks for ``complete-step`` instead of calling."""
        return self.completion == EXTERNAL

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
    """

    output: Message
    output_json: dict[str, Any]
    output_type: str
    steps: list[dict[str, Any]]


@dataclass(frozen=True)
class Parked:
    """A segment that stopped at an external step: ``complete-step`` must supply its response."""

    step: str
