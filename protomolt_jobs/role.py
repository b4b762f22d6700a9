"""The jobs role: durable workflow runs mounted into any ProtoMolt host.

Role ``jobs``, requires ``registry`` (its :class:`WorkflowRepository`, read at wire).

- **wire**: take the first contributed repository (none is
  ``jobs requires a co-mounted registry contributing a WorkflowRepository``), read the
  ``[jobs]`` settings into a :class:`~protomolt_jobs.config.JobsConfig`, build the engine's
  ``Runtime`` over the node's shared type pool and channel factory, and contribute six
  actions: the job verbs plus ``run-workflow``, ``check-workflow`` and ``replay-check``, and a
  :class:`~protomolt_jobs.hooks.contract.RefusalRecorder` (:class:`JobRefusals`) that writes
  each refused call naming a job into that job's transition log. Nothing is opened.
- **start** (only with ``jobs.dsn``): migrate, open the store's pool, bind the verbs, start
  the sweeper, the relay and the request consumer when ``jobs.kafka_bootstrap`` is set
  (topics ensured first; otherwise one log line says the Kafka lanes are off), and the
  worker last. Without ``jobs.dsn`` the verbs stay mounted and answer ``unavailable``.
- **close**: the exact reverse (worker first, so nothing claims work mid-shutdown; the relay
  last of the duties, so it drains what the others wrote), then the pool. Idempotent.

The runtime is built by :meth:`protomolt_jobs.app.JobsApp.open` (the one composition root,
shared with the worker process and the benchmark). This module imports nothing from
``protomolt_jobs.host``.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import descriptor_pb2

from protomolt_jobs.app import JobsApp, node_floors
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import StoreError
from protomolt_jobs.hooks.contract import (
    Action,
    ArtifactStore,
    ComposerError,
    FileDescriptorContribution,
    JobViews,
    PrincipalGroups,
    Refusal,
    RefusalRecorder,
    StepAuthorizer,
    TypePool,
    WireContext,
    WorkflowActivation,
    WorkflowRepository,
)
from protomolt_jobs.hooks.hookspecs import hookimpl
from protomolt_jobs.runs.artifact_store import FileArtifactStore
from protomolt_jobs.runs.inspector import JobInspector
from protomolt_jobs.runs.retention import Bounds
from protomolt_jobs.telemetry import metrics
from protomolt_jobs.verbs import (
    CheckWorkflowAction,
    GetWorkflowAction,
    JobsBackend,
    ReplayCheckAction,
    RunWorkflowAction,
    TestWorkflowAction,
    jobs_actions,
)
from protomolt_jobs.worker.grants import GrantPolicy
from protomolt_jobs.workflow.types import Runtime

__all__ = ["ROLE", "JobRefusals", "JobsModule", "JobsMount", "protomolt_role_module"]

log = logging.getLogger("protomolt_jobs.jobs_role")

#: The role name.
ROLE = "jobs"
#: The wire error when no registry contributes a repository (exact upstream text).
MISSING_REGISTRY = "jobs requires a co-mounted registry contributing a WorkflowRepository"


class JobsModule:
    """The jobs :class:`~protomolt_jobs.hooks.contract.RoleModule`."""

    role = ROLE
    requires = frozenset({"registry"})
    #: Environment aliases of ``[jobs]`` keys (the reference's name); the host applies them.
    env_aliases: Mapping[str, str] = {"PROTOMOLT_JOBS_KAFKA": "kafka_bootstrap"}
    #: The ``[jobs]`` key naming the PostgreSQL DSN: when it is unset the host may provide
    #: an embedded PostgreSQL through it (``serve``, ``demo``).
    database_setting = "dsn"

    def startup_notes(self, settings: Mapping[str, Any]) -> list[str]:
        """Lines the host prints when a node with this role starts (after a successful
        :meth:`check_settings`)."""
        if JobsConfig.from_mapping(settings).kafka_bootstrap:
            return []
        note = (
            "no broker configured (jobs.kafka_bootstrap): the Kafka lanes are off; "
            "events wait in the outbox as PENDING"
        )
        return [note]

    def spawn_processes(self, settings: Mapping[str, Any], count: int) -> Any:
        """``serve --processes N``: ``count`` ``python -m protomolt_jobs.worker`` processes
        beside the node's own worker, with the node's ``[jobs]`` keys (the broker lanes stay
        in the node; the node's own sweeper sweeps for all of them).

        :returns: the started :class:`~protomolt_jobs.worker.processes.WorkerProcesses`
            (``pids``, ``stop(timeout_s)``).
        :raises RuntimeError: a worker process did not start.
        """
        import os

        from protomolt_jobs.worker.processes import WorkerProcesses

        jobs = JobsConfig.from_mapping(settings)
        skip = {"dsn", "worker_id", "kafka_bootstrap", "request_topic"}
        argv = ["--dsn", str(jobs.dsn), "--no-sweeper"]
        for key, value in settings.items():
            if key in skip:
                continue
            if isinstance(value, dict | list | tuple):
                # queues, queue_limits, fairness_weights: JSON, which the child's --set reads
                # for these keys (a child serving "default" instead would claim another queue).
                text = json.dumps(value)
            else:
                text = str(value).lower() if isinstance(value, bool) else str(value)
            argv += ["--set", f"{key}={text}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_JOBS_")}
        group = WorkerProcesses(count, args=argv, worker_id=f"{jobs.worker_id}-w", env=env)
        group.start()
        return group

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """Early validation of the ``[jobs]`` table (the host calls it when it loads the node
        configuration, before anything starts).

        :raises ConfigError: naming the key and the expected form (a policy floor's key too).
        """
        node_floors(JobsConfig.from_mapping(settings))

    def wire(self, ctx: WireContext) -> JobsMount:
        """Contribute the six actions; open nothing.

        :raises ComposerError: no co-mounted registry contributed a WorkflowRepository.
        :raises ConfigError: a ``[jobs]`` setting is malformed (names the key).
        """
        repository = ctx.contributions.first(WorkflowRepository)
        if repository is None:
            raise ComposerError(MISSING_REGISTRY)
        config = JobsConfig.from_mapping(ctx.settings)

        type_pool = ctx.contributions.first(TypePool)
        if type_pool is None:
            # A host without a shared pool: the role keeps its own.
            type_pool = TypePool()
        runtime = Runtime(
            pool=type_pool.pool,
            channel_factory=ctx.channels.channel,
            structured_generator=config.structured_generator,
        )
        backend = JobsBackend(configured=config.configured)
        backend.grant_policy = lambda: _grant_policy(config, ctx)
        backend.loop_extend_cap = config.loop_extend_cap
        backend.lease_s = config.lease_seconds
        floors = node_floors(config)
        for action in jobs_actions(backend, runtime, floors):
            ctx.contributions.contribute(Action, action)
        ctx.contributions.contribute(Action, RunWorkflowAction(runtime, repository, floors))
        ctx.contributions.contribute(
            Action,
            CheckWorkflowAction(
                runtime,
                repository,
                floors,
                retention_bounds=Bounds.of(config),
                run_retention_s=config.run_retention_seconds,
            ),
        )
        ctx.contributions.contribute(Action, ReplayCheckAction(backend, runtime, repository))
        # the registry's PUT reads it (jobs.require_workflow_tests)
        ctx.contributions.contribute(
            WorkflowActivation, WorkflowActivation(require_tests=config.require_workflow_tests)
        )
        ctx.contributions.contribute(
            Action,
            TestWorkflowAction(
                runtime,
                repository,
                max_attempts=config.max_attempts,
                backoff_base_s=config.backoff_base_seconds,
            ),
        )
        ctx.contributions.contribute(
            Action, GetWorkflowAction(repository, run_retention_s=config.run_retention_seconds)
        )
        mount = JobsMount(
            config=config,
            repository=repository,
            runtime=runtime,
            backend=backend,
            type_pool=type_pool,
            descriptors=lambda: ctx.contributions.all(FileDescriptorContribution),
            grants=lambda: _grant_policy(config, ctx),
            artifact_store=ctx.contributions.first(ArtifactStore)
            or FileArtifactStore(ctx.data_dir / "jobs" / "artifacts"),
        )
        # The host serves /metrics; the role contributes what only it can count.
        ctx.contributions.contribute(
            metrics.StoreCollector,
            metrics.StoreCollector(_StoreView(mount), mount.components_running),
        )
        # Read-only job views for an operator surface (the dashboard); changes go through verbs.
        ctx.contributions.contribute(
            JobViews,
            JobInspector(
                lambda: mount.store,
                runtime,
                floors,
                grant_policy=lambda: _grant_policy(config, ctx),
            ),
        )
        # Refused calls naming a job go into its history (DESIGN.md section 19).
        ctx.contributions.contribute(RefusalRecorder, JobRefusals(lambda: mount.store))
        return mount


def _grant_policy(config: JobsConfig, ctx: WireContext) -> GrantPolicy:
    """The worker's grant policy: ``[[jobs.grants]]``, the host's ``StepAuthorizer``
    contributions (``protomolt_authorize_step``) and its ``PrincipalGroups`` (``[node.groups]``)."""
    groups = ctx.contributions.first(PrincipalGroups)
    return GrantPolicy(
        config.grants,
        authorizers=ctx.contributions.all(StepAuthorizer),
        groups_of=groups.groups_of if groups is not None else None,
    )


class JobsMount:
    """The started (or startable) jobs role: a thin adapter over
    :class:`~protomolt_jobs.app.JobsApp`. ``close()`` is idempotent and safe before
    ``start()``.

    :ivar app: the jobs runtime while started, else None.
    """

    def __init__(
        self,
        *,
        config: JobsConfig,
        repository: WorkflowRepository,
        runtime: Any,
        backend: JobsBackend,
        type_pool: TypePool,
        descriptors: Any,
        grants: Any = None,
        artifact_store: Any = None,
    ) -> None:
        self.artifact_store = artifact_store
        self.config = config
        self.repository = repository
        self.runtime = runtime
        self.backend = backend
        self.type_pool = type_pool
        self._descriptors = descriptors
        self._grants = grants
        self.app: JobsApp | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def store(self) -> Any:
        """The open store while started, else None."""
        return self.app.store if self.app is not None else None

    @property
    def submitter(self) -> Any:
        """The submitter while started, else None."""
        return self.app.submitter if self.app is not None else None

    @property
    def components(self) -> list[tuple[str, Any]]:
        """The duties in start order (``name`` -> service)."""
        return [(s.name, s) for s in self.app.services] if self.app is not None else []

    def start(self) -> None:
        """Open the store and start the duties (see the module docstring).

        :raises StoreError: the database cannot be reached or migrated.
        :raises ConfigError: a component refused the configuration.
        """
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
        self._register_descriptors()
        if not self.config.configured:
            log.info(
                "jobs role mounted without a database: the verbs answer unavailable "
                "(set jobs.dsn or PROTOMOLT_JOBS_DSN)",
                extra={"action": "jobs_unconfigured"},
            )
            return
        try:
            try:
                app = JobsApp.open(
                    self.config,
                    runtime=self.runtime,
                    repository=self.repository,
                    grants=self._grants() if self._grants is not None else None,
                    artifact_store=self.artifact_store,
                )
            except StoreError as exc:
                # Say which setting leads there: the driver's text names neither key nor
                # variable.
                raise StoreError(
                    f"jobs.dsn (protomolt.toml [jobs] dsn or PROTOMOLT_JOBS_DSN) does not lead "
                    f"to a usable database: {exc}"
                ) from exc
            with self._lock:
                self.app = app
                closed = self._closed
            if closed:
                app.close()
                return
            self.backend.bind(app.store, app.submitter)
            app.start()
        except BaseException:  # close what started, re-raised
            self.close()
            raise

    def health(self) -> dict[str, dict[str, Any]]:
        """Readiness by component (see :meth:`JobsApp.health`); without ``jobs.dsn`` the role
        has nothing running and nothing to report; closed or not yet started it is DOWN."""
        if not self.config.configured:
            return {}
        app = self.app
        if app is None or self._closed:
            return {"runtime": {"status": "DOWN", "state": "STOPPED"}}
        return app.health()

    def components_running(self) -> dict[str, bool]:
        """``{component: ok}`` for ``/metrics``: a duty is ok while it (and every part of
        it, such as the worker's claim loops) runs (its service health)."""
        return {name: component.health().ok for name, component in self.components}

    def _register_descriptors(self) -> None:
        contributions = tuple(self._descriptors())
        if not contributions:
            return
        available = {
            descriptor_pb2.FileDescriptorProto.FromString(c.serialized).name: c.serialized
            for c in contributions
        }
        # The host normally added them already; adding again is a no-op.
        for contribution in contributions:
            self.type_pool.add_file(contribution.serialized, available=available)

    def close(self) -> None:
        """Stop the duties in reverse start order (worker first), unbind the verbs, close
        the pool. Idempotent; errors are logged and the rest still closes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            app, self.app = self.app, None
        if app is not None:
            app.close()
        self.backend.unbind()
        if self._started and self.config.configured:
            log.info("jobs role closed", extra={"action": "jobs_closed"})


class JobRefusals:
    """The jobs role's :class:`~protomolt_jobs.hooks.contract.RefusalRecorder`: a refused call
    whose input names a job (``jobId``) is recorded in that job's hash-chained transition log
    (kind ``denied``, actor the principal, reason ``permission-denied: <verb> needs scope
    '<scope>'``; ``store/audit.py``); any other refusal (no job, an id that is not a job's,
    no database) is logged (action ``permission_denied``). Never raises.

    :param store: the role's open store, or None while it has none.
    """

    def __init__(self, store: Callable[[], Any]) -> None:
        self._store = store

    def record_refusal(self, refusal: Refusal) -> None:
        """Record ``refusal`` in its job's history, or log it (see the class docstring)."""
        need = f"scope '{refusal.scope}'" if refusal.scope else "every scope"
        reason = f"permission-denied: {refusal.verb} needs {need}"
        if self._recorded(refusal, reason):
            return
        log.info(
            "refused %s to %s: it needs %s",
            refusal.verb,
            refusal.principal,
            need,
            extra={
                "action": "permission_denied",
                "principal": refusal.principal,
                "verb": refusal.verb,
                "scope": refusal.scope,
                "job_id": refusal.job_id,
            },
        )

    def _recorded(self, refusal: Refusal, reason: str) -> bool:
        store = self._store()
        if refusal.job_id is None or store is None:
            return False
        try:
            key = uuid.UUID(refusal.job_id)
        except ValueError:
            return False  # not a job's id: the verb refuses it too; logged
        try:
            return bool(store.transition_record_denied(key, actor=refusal.principal, reason=reason))
        except (StoreError, ValueError) as exc:
            log.warning(
                "a refusal of %s to %s could not be recorded in job %s's history: %s",
                refusal.verb,
                refusal.principal,
                key,
                exc,
                extra={"action": "refusal_not_recorded", "job_id": str(key)},
            )
            return False


class _StoreView:
    """The mount's current store for the metrics collector (None before start: unavailable)."""

    def __init__(self, mount: JobsMount) -> None:
        self._mount = mount

    def metrics_counts(self) -> tuple[dict[tuple[str, str], int], int]:
        store = self._mount.store
        if store is None:
            raise StoreError("the jobs store is not open")
        return store.metrics_counts()


@hookimpl
def protomolt_role_module() -> JobsModule:
    """The jobs role (entry point ``protomolt.roles: jobs``)."""
    return JobsModule()
