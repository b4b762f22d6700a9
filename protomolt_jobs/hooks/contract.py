"""The host contract: what a role module is, what a host hands it, and what roles contribute.

A *role module* (:class:`RoleModule`) has a ``role`` name, the set of roles it ``requires``
(wired before it when they are mounted on the same node), and a two-phase lifecycle:

1. ``wire(ctx)`` builds the role's objects, reads contributions it depends on and
   contributes its own (actions, repositories, descriptors, in-process services). It binds
   no port and starts no thread. It returns a :class:`Mount`.
2. ``Mount.start()`` binds and starts background work, after *every* mounted role has wired,
   so a contribution host (an actions route) sees every contribution before it serves.
   ``Mount.close()`` stops what ``start()`` began; it is idempotent and is called even when
   ``start()`` never ran (a later role failed to wire or start).

Contributions are typed: the kind is a class from this module. The host owns one
:class:`Contributions` registry per boot; it is frozen when the wire phase ends, and a late
``contribute`` raises :class:`ComposerError`. Contributions never cross the network: a role
that needs another role's contribution needs that role co-mounted.

Kinds:

- :class:`Action`: a verb for the host's catalog (contributed at wire).
- :class:`WorkflowRepository`: named workflow definitions (the registry role's store). One
  that also numbers its versions and keeps each one's last test result is a
  :class:`WorkflowVersions` (the registry's is).
- :class:`WorkflowActivation`: the node's activation gate for stored workflows (contributed by
  the jobs role: ``jobs.require_workflow_tests``; read by the registry's ``PUT``).
- :class:`FileDescriptorContribution`: a serialized ``FileDescriptorProto`` the host adds to
  the shared :class:`TypePool` at start, so ``schema.type`` and checkpoints resolve it.
- :class:`TypePool`: the node's shared descriptor pool (contributed by the host itself,
  before any role wires).
- :class:`InProcessService`: gRPC handlers the host serves on its in-process endpoint;
  ``inprocess:NAME`` targets reach them through the :class:`ChannelFactory`.
- :class:`RefusalRecorder`: where the host reports a call it refused for want of a scope
  (a :class:`Refusal`); the jobs role records those naming a job in the job's history.

Authority: every verb declares one of :data:`SCOPES`; the host resolves each caller to an
:class:`Identity` (``[node.tokens]`` and ``[node.groups]``, or a host identity hook,
``protomolt_resolve_identity`` in :mod:`~protomolt_jobs.hooks.hookspecs`) and grants scopes
from ``[node.scopes]``.

This module imports nothing from ``protomolt_jobs.host``: any host that implements the
contract can mount the role.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "JOB_STATUSES_KEY",
    "SCOPES",
    "STEP_DECISIONS",
    "Action",
    "ArtifactStore",
    "ChannelFactory",
    "ComponentHealth",
    "ComposerError",
    "Contributions",
    "FileDescriptorContribution",
    "Identity",
    "InProcessService",
    "InertMount",
    "Mount",
    "PrincipalGroups",
    "Refusal",
    "RefusalRecorder",
    "RoleModule",
    "StepAuthorizer",
    "StepDecision",
    "TypePool",
    "WireContext",
    "WorkflowActivation",
    "WorkflowRepository",
    "WorkflowVersions",
    "artifact_id",
    "artifact_job_prefix",
    "current_groups",
    "current_holds",
    "current_principal",
    "principal_scope",
]

T = TypeVar("T")


class ComposerError(RuntimeError):
    """The node cannot be composed or booted: unknown or duplicate role, a dependency cycle,
    a missing co-mounted contribution, a contribution after the wire phase, or a role whose
    wire or start failed. The message says which role and why."""


# --------------------------------------------------------------------------------------
# Contribution kinds
# --------------------------------------------------------------------------------------


@runtime_checkable
class Action(Protocol):
    """One JSON-object-in, JSON-object-out verb.

    - ``name``: kebab-case, verb first (``submit-workflow``).
    - ``description``: one sentence for a tool-using caller.
    - ``scope``: the scope a caller must hold to run it, one of :data:`SCOPES`
      (``workflow-run``, ``service-invoke``, ``job-control``, ``schema-read`` ...).
    - ``input_schema``: a JSON Schema (draft 2020-12) object describing the input envelope.
    - ``execute(input)``: returns a JSON object; answers with ``ok: false`` are returns, not
      errors. Raises :class:`protomolt_jobs.errors.ActionError` when it cannot answer.
    """

    name: str
    description: str
    scope: str
    input_schema: dict[str, Any]

    def execute(self, input: dict[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class WorkflowRepository(Protocol):
    """Named workflow definitions (the JSON envelope ``run-workflow`` accepts).

    - ``workflow(name)``: the definition, or None when no workflow has that name. A stored
      definition that cannot be read raises (loudly, never "not found").
    - ``names()``: every stored name, sorted.
    - ``put(name, definition)``: store (replace) a definition.
    """

    def workflow(self, name: str) -> dict[str, Any] | None: ...

    def names(self) -> list[str]: ...

    def put(self, name: str, definition: dict[str, Any]) -> None: ...


@runtime_checkable
class WorkflowVersions(Protocol):
    """A :class:`WorkflowRepository` that numbers each stored definition (1, 2, ...) and keeps
    the last test result of each version.

    - ``stored(name, version=None)``: ``{"name", "version", "definition", "storedAt",
      "storedBy", "lastTest", "latestVersion"}`` of that version (None: the current one), or
      None when there is no such workflow or version. ``version`` is None (and ``lastTest``
      None) for a definition stored without a record (a file copied in by hand).
      ``lastTest`` is ``{"ok", "passed", "failed", "cases": [{"name", "passed",
      "difference"?, "step"?}], "error"?, "at", "by", "via"}`` or None (never tested).
    - ``record_test(name, version, answer, by=..., via=...)``: replace that version's
      ``lastTest`` with a ``test-workflow`` answer's summary, run by principal ``by``
      through ``via`` (``put``, ``test-workflow``); False when the version is not stored.
    """

    def stored(self, name: str, version: int | None = None) -> dict[str, Any] | None: ...

    def record_test(
        self, name: str, version: int, answer: dict[str, Any], *, by: str, via: str
    ) -> bool: ...


@dataclasses.dataclass(frozen=True)
class WorkflowActivation:
    """The node's rule for storing (activating) a workflow definition.

    :ivar require_tests: ``jobs.require_workflow_tests``: a definition whose ``tests`` cases
        fail, or that has none, is refused at ``PUT``.
    """

    require_tests: bool = False


@runtime_checkable
class JobViews(Protocol):
    """Read-only views of one job for operator surfaces (the dashboard, the demo), contributed
    by the jobs role under this kind. Every *change* still goes through the catalog verbs.

    - ``step_names(job_id)``: the snapshotted definition's step names in definition order.
    - ``step_graph(job_id)``: a graph workflow's steps with what each waits for (``[]`` for a
      sequential one).
    - ``answer_type(job_id, step_name)``: the protobuf message descriptor ``complete-step``
      must send for that step, or None.
    - ``statuses(job_ids)``: job summaries (camelCase dicts), read without payloads.
    - ``events(job_id)``: the job's outbox rows in order, each with ``seq``, ``event_type``,
      ``status``, ``created_at`` and a decoded ``detail`` dict.
    - ``approval(job_id, step_name)``: an approval step's approvers, quorum and decisions and
      the votes on its current opening (``{step, roles, principals, quorum, decisions, veto,
      votes, tally}``), or None.

    Each raises the role's store error when its store is unavailable.
    """

    def step_names(self, job_id: str) -> list[str]: ...

    def step_graph(self, job_id: str) -> list[dict[str, Any]]: ...

    def answer_type(self, job_id: str, step_name: str) -> Any: ...

    def statuses(self, job_ids: list[str]) -> list[dict[str, Any]]: ...

    def events(self, job_id: str) -> list[Any]: ...

    def approval(self, job_id: str, step_name: str) -> dict[str, Any] | None: ...


#: The scope names verbs and routes declare, and ``[node.scopes]`` grants:
#:
#: - ``workflow-run``: submit a job, run a workflow synchronously;
#: - ``service-invoke``: read jobs (``get-job``, ``list-jobs``, ``job-history``);
#: - ``job-complete``: answer a parked step (``complete-step``), report a running step's
#:   progress (``report-progress``);
#: - ``job-control``: the operator verbs (cancel, pause, resume, requeue, retry, reconcile,
#:   migrate a checkpoint);
#: - ``schema-read``: verify a workflow, read the registry's workflows;
#: - ``workflow-write``: store a workflow in the registry (``PUT /protomolt/workflows/{name}``);
#: - ``job-approve``: vote on an approval step;
#: - ``job-input``: supply an input path a parked run waits for (``supply-input``).
SCOPES: frozenset[str] = frozenset(
    {
        "workflow-run",
        "service-invoke",
        "job-complete",
        "job-control",
        "schema-read",
        "workflow-write",
        "job-approve",
        "job-input",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Who presents a token, as an identity provider (or the node's own tables) says.

    :param principal: the caller's name, the actor the transition log records (lower-case
        letters, digits, ``.``, ``_``, ``-``; at most 64; never ``api``, ``anonymous``,
        ``operator`` or ``sweeper``).
    :param groups: the groups the principal belongs to (``editor``); ``[node.scopes]`` grants
        scopes to groups and principals alike.
    """

    principal: str
    groups: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A call the host refused because the caller lacks the scope it needs.

    :param principal: the caller's principal (the actor to record).
    :param verb: the verb (``cancel-job``) or route (``PUT /protomolt/workflows/x``) refused.
    :param scope: the scope it needs.
    :param job_id: the input's ``jobId`` when the input names one (a string, not checked), else
        None.
    """

    principal: str
    verb: str
    scope: str
    job_id: str | None = None


#: The decisions a grant check gives (:class:`StepDecision`).
#: An operator verb's input schema names the job statuses it acts on under this key (a JSON
#: Schema extension keyword, ignored by validators): a surface reads it from the manifest to
#: offer the verb only where it applies (the dashboard's action buttons).
JOB_STATUSES_KEY = "x-jobStatuses"

STEP_DECISIONS = ("allow", "deny", "needs-approval")


@dataclasses.dataclass(frozen=True, slots=True)
class StepDecision:
    """Whether a step that declares ``capabilities`` may run (docs/approvals.md, *Capabilities
    and grants*).

    :param decision: ``allow`` (the step runs; the decision is stored in its checkpoint entry),
        ``deny`` (the job fails with ``PERMISSION: <reason> (decision <id>)``, never retried) or
        ``needs-approval`` (the run, sequential or graph, parks on the step's grant gate, whose
        approvers are those of the ``[[jobs.grants]]`` needs-approval entries that apply; with
        none, or for a compensation step of a failing graph run, the step is denied naming
        why).
    :param reason: why, for people: stored with the decision (at most 1000 characters).
    :param decision_id: the deciding engine's id for this decision (a policy rule, an OPA
        decision id), stored with it; non-blank, at most 200 characters.
    :raises ValueError: an unknown decision, a blank id, or text too long.
    """

    decision: str
    reason: str
    decision_id: str

    def __post_init__(self) -> None:
        if self.decision not in STEP_DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(STEP_DECISIONS)}")
        if not isinstance(self.reason, str) or len(self.reason) > 1000:
            raise ValueError("reason must be a string of at most 1000 characters")
        if not isinstance(self.decision_id, str) or not self.decision_id.strip():
            raise ValueError("decision_id must be a non-blank string")
        if len(self.decision_id) > 200:
            raise ValueError("decision_id must be at most 200 characters")


@runtime_checkable
class StepAuthorizer(Protocol):
    """Decides whether a step may use its capabilities (contribution kind; the host contributes
    one when a plugin implements ``protomolt_authorize_step``). The jobs worker asks it after
    the claim and before the step's call; the first contributed authorizer that answers wins,
    and ``[[jobs.grants]]`` decides when none does.

    - ``authorize_step(job, step, capabilities)``: ``job`` is ``{"jobId", "workflowName",
      "submittedBy" (or None), "attempt"}``; ``step`` the step's name; ``capabilities`` its
      declared names (sorted). Returns a :class:`StepDecision`, or None (no opinion).
    """

    def authorize_step(
        self, job: Mapping[str, Any], step: str, capabilities: tuple[str, ...]
    ) -> StepDecision | None: ...


@runtime_checkable
class ArtifactStore(Protocol):
    """Where artifact bytes live (contribution kind; the host contributes one when a plugin
    implements ``protomolt_artifact_store``, else the jobs role keeps a file store under the
    node's data directory: ``<data_dir>/jobs/artifacts``). Keys are relative paths of
    ``[A-Za-z0-9._-]`` segments joined by ``/``; an artifact's uri is ``artifact://<key>``
    (docs/artifacts.md).

    - ``put(key, data)``: store ``data`` (bytes) under ``key`` (replacing any); returns the uri.
    - ``get(key)``: the bytes, or None when the key is missing.
    - ``exists(key)``: whether it is there.
    - ``delete(key)``: remove it; False when it was already missing (never an error: a missing
      key counts as pruned).

    Each may raise ``OSError`` (or the backend's error) when the store cannot be reached; a
    malformed key, or one a file store would follow out of its root (a symbolic link), is
    ``ValueError``: the pruner then keeps the key and forgets it, a publication refuses it.
    """

    def put(self, key: str, data: bytes) -> str: ...

    def get(self, key: str) -> bytes | None: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> bool: ...


def artifact_id(
    job_id: Any, step: str, iteration: int, port: str, attempt: Any, sha256: str
) -> str:
    """An artifact's id (docs/artifacts.md), the one the engine, the store's rows and the read
    verbs use: a UUID whose first 16 hex digits are the job id's (so ``get-artifact`` finds the
    run by the id alone, as ``list-jobs idPrefix`` does) and whose last 16 are SHA-256 over
    step, iteration, port, the producing attempt and the content hash (a retried step's new
    output is a different artifact; the same content written again by the same attempt is the
    same one).

    :raises ValueError: ``job_id`` is not a UUID.
    """
    att = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0
    job_hex = uuid.UUID(str(job_id)).hex
    tail = hashlib.sha256(f"{step}/{iteration}/{port}/{att}/{sha256}".encode()).hexdigest()
    return str(uuid.UUID(job_hex[:16] + tail[:16]))


def artifact_job_prefix(artifact_id: str) -> str:
    """The id prefix (16 hex digits) of the run an artifact id belongs to.

    :raises ValueError: not a UUID.
    """
    return uuid.UUID(artifact_id).hex[:16]


@dataclasses.dataclass(frozen=True)
class PrincipalGroups:
    """The groups of a principal as the node knows them (contribution kind; the host
    contributes one from ``[node.groups]``): ``[[jobs.grants]] groups`` match a submitter
    through it.

    :param groups_of: ``principal -> frozenset of group names`` (empty when none).
    """

    groups_of: Callable[[str], frozenset[str]]


@runtime_checkable
class RefusalRecorder(Protocol):
    """Records refusals (contribution kind). The host calls every contributed recorder once
    per refused call, in the thread that served the call, before the caller gets its
    ``permission-denied``; a recorder must return promptly and never raise (the host logs and
    ignores an exception, so a recorder's failure never turns a refusal into an error).

    - ``record_refusal(refusal)``: record or log one :class:`Refusal`.
    """

    def record_refusal(self, refusal: Refusal) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class FileDescriptorContribution:
    """A serialized ``google.protobuf.FileDescriptorProto`` for the node's type pool.

    Its imports must be contributed too, or be files of the default pool (well-known types and
    generated modules); the host adds dependencies first.
    """

    serialized: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.serialized, (bytes, bytearray)) or not self.serialized:
            raise ValueError(
                "FileDescriptorContribution.serialized must be the non-empty bytes of a "
                "serialized FileDescriptorProto"
            )


class TypePool:
    """The node's shared descriptor pool (``google.protobuf.descriptor_pool.DescriptorPool``).

    The host contributes one before any role wires. Roles read message types from ``pool``;
    the host adds every :class:`FileDescriptorContribution` at start through :meth:`add_file`.

    :param pool: the descriptor pool; a fresh empty pool when None.
    """

    def __init__(self, pool: Any = None) -> None:
        from google.protobuf import descriptor_pool

        self.pool = pool if pool is not None else descriptor_pool.DescriptorPool()
        self._lock = threading.Lock()

    def add_file(self, serialized: bytes, *, available: Mapping[str, bytes] | None = None) -> str:
        """Add one serialized ``FileDescriptorProto``, its imports first.

        An import missing from the pool is taken from ``available`` (file name -> serialized
        proto, e.g. the other contributions), else from the default pool (well-known types,
        generated modules). Adding a file that is already present with the same content is a
        no-op.

        :param serialized: bytes of a ``FileDescriptorProto``.
        :param available: other files that may satisfy imports, by file name.
        :returns: the file's name (``pkg/v1/thing.proto``).
        :raises ValueError: unreadable bytes, an import found nowhere, or a conflicting
            definition already in the pool.
        """
        from google.protobuf import descriptor_pb2

        with self._lock:
            return self._add(bytes(serialized), dict(available or {}), set(), descriptor_pb2)

    def _add(
        self, serialized: bytes, available: dict[str, bytes], visiting: set[str], pb2: Any
    ) -> str:
        from google.protobuf import descriptor_pool

        proto = pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(serialized)
        except Exception as exc:  # the protobuf runtime raises DecodeError or others
            raise ValueError(
                f"contributed file descriptor is not a FileDescriptorProto: {exc}"
            ) from exc
        name = proto.name
        if not name:
            raise ValueError("contributed file descriptor has no name")
        if self._has(name):
            return name
        if name in visiting:
            raise ValueError(f"file descriptor import cycle through {name}")
        visiting.add(name)
        for dep in proto.dependency:
            if self._has(dep):
                continue
            if dep in available:
                self._add(available[dep], available, visiting, pb2)
                continue
            try:
                default_file = descriptor_pool.Default().FindFileByName(dep)
            except KeyError:
                raise ValueError(
                    f"file descriptor {name} imports {dep}, which is neither contributed nor "
                    "in the default pool"
                ) from None
            self._add(default_file.serialized_pb, available, visiting, pb2)
        try:
            self.pool.Add(proto)
        except Exception as exc:  # TypeError on conflicts in the upb runtime
            raise ValueError(f"cannot add file descriptor {name} to the type pool: {exc}") from exc
        return name

    def _has(self, name: str) -> bool:
        try:
            self.pool.FindFileByName(name)
        except KeyError:
            return False
        return True


@dataclasses.dataclass(frozen=True, slots=True)
class InProcessService:
    """gRPC handlers the host serves on its in-process endpoint, reachable as
    ``inprocess:<name>`` through the node's :class:`ChannelFactory`.

    :param name: a stable endpoint name (``parse``); targets snapshotted into job rows keep
        working across restarts because the name does not change per boot.
    :param handlers: ``grpc.GenericRpcHandler`` objects (e.g. from
        ``grpc.method_handlers_generic_handler``).
    """

    name: str
    handlers: Sequence[Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("InProcessService.name must be a non-blank string")
        if not self.handlers:
            raise ValueError(f"InProcessService {self.name!r} has no handlers")


@runtime_checkable
class ChannelFactory(Protocol):
    """Opens gRPC channels for step targets.

    ``channel(target, tls)``: ``inprocess:NAME`` resolves to the host's in-process endpoint;
    anything else is ``host:port`` (secure when ``tls``). The factory owns the returned
    channel (it may hand the same one to every caller and closes it when the node closes);
    callers must not close it.
    """

    def channel(self, target: str, tls: bool) -> Any: ...


# --------------------------------------------------------------------------------------
# The registry and the wire context
# --------------------------------------------------------------------------------------


class Contributions:
    """Typed contributions of one boot: a multimap from kind (a class) to values, in
    contribution order, frozen after the wire phase.

    Thread-safe. Kinds are compared by identity: contribute and read with the same class.
    """

    def __init__(self) -> None:
        self._by_kind: dict[type, list[Any]] = {}
        self._frozen = False
        self._lock = threading.Lock()

    def contribute(self, kind: type[T], value: T) -> None:
        """Add ``value`` under ``kind``.

        :raises ComposerError: after the wire phase completed
            (``contribution of <Kind> after the wire phase completed``).
        :raises ValueError: ``value`` is None.
        :raises TypeError: ``value`` is not a ``kind`` (protocol kinds check the members).
        """
        if value is None:
            raise ValueError("contribution must not be null")
        if not isinstance(kind, type):
            raise TypeError(f"contribution kind must be a class; got {kind!r}")
        if not isinstance(value, kind):
            raise TypeError(
                f"contribution of {kind.__name__} must be a {kind.__name__}; "
                f"got {type(value).__name__}"
            )
        with self._lock:
            if self._frozen:
                raise ComposerError(
                    f"contribution of {kind.__name__} after the wire phase completed"
                )
            self._by_kind.setdefault(kind, []).append(value)

    def all(self, kind: type[T]) -> tuple[T, ...]:
        """Every contribution of ``kind``, in contribution order (possibly empty)."""
        with self._lock:
            return tuple(self._by_kind.get(kind, ()))

    def first(self, kind: type[T]) -> T | None:
        """The first contribution of ``kind``, or None."""
        with self._lock:
            values = self._by_kind.get(kind)
            return values[0] if values else None

    def freeze(self) -> None:
        """End the wire phase: later ``contribute`` calls raise :class:`ComposerError`."""
        with self._lock:
            self._frozen = True

    @property
    def frozen(self) -> bool:
        """True once the wire phase has completed."""
        return self._frozen


@dataclasses.dataclass(frozen=True)
class WireContext:
    """What the host hands a role at wire.

    :param node_id: short id unique to this boot (log correlation; not for endpoint names).
    :param data_dir: the node's data directory (exists; roles keep files in a subdirectory
        named after themselves).
    :param settings: this role's configuration section (``[<role>]`` of ``protomolt.toml``
        with ``PROTOMOLT_<ROLE>_<KEY>`` overrides applied); values may be strings.
    :param contributions: the boot's registry (open for contributions during wire).
    :param channels: the node's channel factory for step targets.
    """

    node_id: str
    data_dir: Path
    settings: Mapping[str, Any]
    contributions: Contributions
    channels: ChannelFactory


# --------------------------------------------------------------------------------------
# Role modules and mounts
# --------------------------------------------------------------------------------------


#: One role's readiness by component: ``{"database": {"status": "UP"}, "relay": {"status":
#: "DOWN", "state": "BACKING_OFF", "lastError": "..."}}``. Each value is a JSON object with
#: at least ``"status": "UP" | "DOWN"``; the rest is the component's own detail.
ComponentHealth = dict[str, dict[str, Any]]


@runtime_checkable
class Mount(Protocol):
    """A wired role: ``start()`` binds and starts work (called once, after every role
    wired); ``close()`` stops it, is idempotent and is called even if ``start()`` never ran;
    ``health()`` says whether each of its background components (and what they depend on,
    such as a database) is ready, by name (:data:`ComponentHealth`; ``{}``: nothing runs in
    the background). It is called by ``/health`` and gRPC health on every probe, from any
    thread, and must answer within about a second."""

    def start(self) -> None: ...

    def close(self) -> None: ...

    def health(self) -> ComponentHealth: ...


@runtime_checkable
class RoleModule(Protocol):
    """One mountable role.

    - ``role``: stable lowercase name (``jobs``), the vocabulary of ``[node] roles``.
    - ``requires``: roles wired before this one when they are mounted on the node; a
      required role that is not mounted is not an ordering error (the module decides whether
      it can do without it, usually by looking for its contribution).
    - ``wire(ctx)``: phase one (see the module docstring); raising aborts the boot.
    """

    role: str
    requires: frozenset[str]

    def wire(self, ctx: WireContext) -> Mount: ...


class InertMount:
    """A mount with optional start and close callables; ``close`` runs at most once.

    :param start: called by :meth:`start` (None: nothing to start).
    :param close: called by the first :meth:`close` (None: nothing to close).
    """

    def __init__(
        self,
        start: Callable[[], None] | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._start = start
        self._close = close
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._start is not None:
            self._start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._close is not None:
            self._close()

    def health(self) -> ComponentHealth:
        """Nothing runs in the background: always ``{}``."""
        return {}


# -- the principal of a verb call -------------------------------------------------------------

#: Who runs the verb in this context (the transition log's actor of an operator action).
_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "protomolt_principal", default="operator"
)


def current_principal() -> str:
    """The principal of the verb call running in this context: the name of the API token the
    caller presented (``[node.tokens]``) or the one an identity hook gave it, ``api`` for the
    node's single ``api_token``, ``anonymous`` on a node without tokens, ``operator`` outside
    any surface (in-process)."""
    return _PRINCIPAL.get()


#: The groups of the principal of the verb call running in this context.
_GROUPS: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "protomolt_groups", default=frozenset()
)


def current_groups() -> frozenset[str]:
    """The groups (``[node.groups]`` or an identity hook) of :func:`current_principal`:
    what an approval step's ``approvers.roles`` are matched against. Empty outside any
    surface and for a principal in no group."""
    return _GROUPS.get()


def _every_scope(scope: str) -> bool:
    return True


#: Whether the principal of the verb call running in this context holds a scope.
_HOLDS: contextvars.ContextVar[Callable[[str], bool]] = contextvars.ContextVar(
    "protomolt_holds", default=_every_scope
)


def current_holds(scope: str) -> bool:
    """True when the principal of the verb call running in this context holds ``scope`` (a
    verb that runs under one scope but may do more for a caller holding another asks this:
    ``test-workflow`` records a stored version's test result only for a caller holding
    ``workflow-write``). Outside any surface (in-process): every scope."""
    return _HOLDS.get()(scope)


@contextlib.contextmanager
def principal_scope(
    name: str, groups: Iterable[str] = (), holds: Callable[[str], bool] | None = None
) -> Iterator[None]:
    """Run the body as ``name`` in ``groups``, holding the scopes ``holds`` says (absent:
    every scope); the host's catalog wraps each verb call in it."""
    token = _PRINCIPAL.set(name)
    group_token = _GROUPS.set(frozenset(groups))
    holds_token = _HOLDS.set(holds or _every_scope)
    try:
        yield
    finally:
        _HOLDS.reset(holds_token)
        _GROUPS.reset(group_token)
        _PRINCIPAL.reset(token)
