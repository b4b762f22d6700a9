"""The two-phase composer: find roles, order them, wire all, freeze, start all, close in reverse.

Boot, in order (the eggsample host sequence, then the ProtoMolt lifecycle):

1. **Load.** A ``pluggy.PluginManager("protomolt")`` gets the hookspecs, the
   ``protomolt.roles`` entry points (a plugin that fails to import is an error only when the
   node mounts its role) and any ``extra_plugins``; ``check_pending()`` rejects a hook
   implementation that matches no spec.
2. **Collect.** Every plugin's ``protomolt_role_module()``; two modules claiming one role is
   ``two modules claim role <r>: <A> and <B>``.
3. **Order.** The configured roles in order, each preceded (depth first) by the roles it
   ``requires`` that are also mounted. A required role that is installed but not mounted is
   skipped (the module decides whether it can do without it); an unknown role, mounted or
   required, and a cycle are errors.
4. **Wire** each role with a :class:`~protomolt_jobs.hooks.contract.WireContext`. The host
   contributes the shared :class:`~protomolt_jobs.hooks.contract.TypePool` first.
5. **Freeze** the contributions; build the catalog from the contributed actions (with the
   contributed refusal recorders), register the in-process services with the node's
   :class:`~protomolt_jobs.host.channels.Channels`, and build the node's
   :class:`~protomolt_jobs.host.authority.Authority` from its token tables and any plugin's
   ``protomolt_resolve_identity``.
6. ``Node.start()``: add the contributed file descriptors to the type pool, start the
   in-process endpoint, start every mount in wire order.
7. ``Node.close()``: close every wired mount in reverse order (close failures are logged, not
   raised), then the in-process endpoint. A failure in 4-6 closes what was wired and raises.

Lifecycle order comes from ``requires``, never from pluggy's registration order.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any, Self

import pluggy

from protomolt_jobs.hooks import hookspecs
from protomolt_jobs.hooks.contract import (
    Action,
    ArtifactStore,
    ComposerError,
    Contributions,
    FileDescriptorContribution,
    InProcessService,
    Mount,
    PrincipalGroups,
    RefusalRecorder,
    RoleModule,
    StepAuthorizer,
    StepDecision,
    TypePool,
    WireContext,
)
from protomolt_jobs.host.authority import Authority
from protomolt_jobs.host.catalog import Catalog
from protomolt_jobs.host.channels import Channels
from protomolt_jobs.host.nodeconfig import NodeConfig

__all__ = ["ENTRY_POINT_GROUP", "ComposerError", "Node", "compose", "discover"]

log = logging.getLogger("protomolt_jobs.composer")

#: Entry-point group through which installed distributions provide roles.
ENTRY_POINT_GROUP = "protomolt.roles"


# --------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------


def _plugin_manager(
    plugin_manager: pluggy.PluginManager | None,
    extra_plugins: Iterable[Any],
    mounted: Sequence[str],
) -> pluggy.PluginManager:
    if plugin_manager is None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        _load_entry_points(pm, mounted)
    else:
        pm = plugin_manager
        if not hasattr(pm.hook, "protomolt_role_module"):
            pm.add_hookspecs(hookspecs)
    for plugin in extra_plugins:
        if not pm.is_registered(plugin):
            pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ComposerError(f"a role plugin implements an unknown hook: {exc}") from exc
    return pm


def _load_entry_points(pm: pluggy.PluginManager, mounted: Sequence[str]) -> None:
    seen: set[tuple[str, str]] = set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if (ep.name, ep.value) in seen or pm.get_plugin(ep.name) is not None:
            continue
        seen.add((ep.name, ep.value))
        try:
            plugin = ep.load()
        except Exception as exc:  # any import failure of a third-party plugin: judged below
            if ep.name in mounted:
                raise ComposerError(
                    f"role plugin {ep.name} ({ep.value}) failed to load: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            # An installed role this node does not mount must not stop the boot.
            log.warning(
                "role plugin %s (%s) failed to load and is skipped: %s",
                ep.name,
                ep.value,
                exc,
                extra={"action": "role_plugin_load_failed", "role": ep.name},
            )
            continue
        pm.register(plugin, name=ep.name)


def discover(
    *,
    plugin_manager: pluggy.PluginManager | None = None,
    extra_plugins: Iterable[Any] = (),
    mounted: Sequence[str] = (),
) -> dict[str, RoleModule]:
    """Every installed role module by role name.

    :param plugin_manager: a prepared manager (its plugins are used as they are; entry points
        are not loaded); None: a fresh manager loading the ``protomolt.roles`` entry points.
    :param extra_plugins: more plugin objects or modules to register.
    :param mounted: roles the node mounts (a plugin of another role may fail to import).
    :raises ComposerError: a plugin failed validation or to load, returned no role module, or
        two modules claim one role.
    """
    return _role_modules(_plugin_manager(plugin_manager, extra_plugins, mounted))


def _role_modules(pm: pluggy.PluginManager) -> dict[str, RoleModule]:
    """Every role module the plugins of ``pm`` provide (see :func:`discover`)."""
    modules: dict[str, RoleModule] = {}
    owners: dict[str, str] = {}
    # Call each implementation on its own (keyword-free hook) so a duplicate role names both
    # plugins; pm.hook.protomolt_role_module() would return an anonymous list.
    for impl in pm.hook.protomolt_role_module.get_hookimpls():
        module: RoleModule | None = impl.function()  # type: ignore[assignment]  # pluggy: untyped
        if module is None:
            continue
        owner = f"{impl.plugin_name} ({type(module).__module__}.{type(module).__qualname__})"
        role = getattr(module, "role", None)
        requires = getattr(module, "requires", None)
        if not isinstance(role, str) or not role or not callable(getattr(module, "wire", None)):
            raise ComposerError(
                f"plugin {owner} returned no role module (it needs role: str, "
                "requires: frozenset[str] and wire(ctx))"
            )
        if (
            requires is None
            or isinstance(requires, str)
            or not all(isinstance(r, str) for r in requires)
        ):
            raise ComposerError(
                f"role {role} ({owner}) must declare requires as a set of role names"
            )
        if role in modules:
            raise ComposerError(f"two modules claim role {role}: {owners[role]} and {owner}")
        modules[role] = module
        owners[role] = owner
    return modules


def order_roles(selected: Sequence[str], modules: dict[str, RoleModule]) -> list[str]:
    """Wire order: ``selected`` in order, each after the mounted roles it requires.

    :raises ComposerError: ``unknown role <r>, known roles: [...]``,
        ``role <r> requires unknown role <x>, known roles: [...]``,
        ``role dependency cycle through [...]``.
    """
    known = sorted(modules)
    for role in selected:
        if role not in modules:
            raise ComposerError(f"unknown role {role}, known roles: {known}")
    chosen = set(selected)
    ordered: list[str] = []
    placed: set[str] = set()
    visiting: list[str] = []

    def visit(role: str) -> None:
        if role in placed:
            return
        if role in visiting:
            cycle = [*visiting[visiting.index(role) :], role]
            raise ComposerError(f"role dependency cycle through {cycle}")
        visiting.append(role)
        for required in sorted(modules[role].requires):
            if required not in modules:
                raise ComposerError(
                    f"role {role} requires unknown role {required}, known roles: {known}"
                )
            if required in chosen:
                visit(required)
        visiting.pop()
        placed.add(role)
        ordered.append(role)

    for role in selected:
        visit(role)
    return ordered


# --------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------


class Node:
    """A composed node: wired roles, frozen contributions, the catalog, the type pool and
    the channels. ``start()`` once, ``close()`` any number of times (also as a context
    manager)."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        node_id: str,
        roles: list[str],
        mounts: list[tuple[str, Mount]],
        contributions: Contributions,
        catalog: Catalog,
        type_pool: TypePool,
        channels: Channels,
        authority: Authority | None = None,
    ) -> None:
        self.config = config
        self.node_id = node_id
        #: Mounted roles in wire (and start) order.
        self.roles = roles
        self.contributions = contributions
        self.catalog = catalog
        self.type_pool = type_pool
        self.channels = channels
        #: Who may call what: the resolver every surface of this node asks.
        self.authority = authority if authority is not None else Authority.from_config(config)
        self._mounts = mounts
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

    def mount(self, role: str) -> Mount:
        """The mount of ``role`` (for operators and tests).

        :raises KeyError: the node does not mount ``role``.
        """
        for name, mount in self._mounts:
            if name == role:
                return mount
        raise KeyError(f"role {role} is not mounted on this node")

    def start(self) -> None:
        """Add contributed descriptors to the type pool, start the in-process endpoint and
        every mount in wire order.

        :raises ComposerError: something failed to start; everything is closed first.
        """
        with self._lock:
            if self._closed:
                raise ComposerError("node is closed; compose a new one")
            if self._started:
                return
            self._started = True
        try:
            self._add_descriptors()
            self.channels.start()
            for role, mount in self._mounts:
                log.info("starting role %s", role, extra={"action": "role_start", "role": role})
                try:
                    mount.start()
                except ComposerError:
                    raise
                except Exception as exc:  # a role's failure names the role
                    raise ComposerError(
                        f"node boot failed: role {role} failed to start: {exc}"
                    ) from exc
        except BaseException:  # close what started, re-raised
            self.close()
            raise
        log.info(
            "node %s started with roles %s",
            self.node_id,
            ", ".join(self.roles),
            extra={"action": "node_started", "roles": self.roles},
        )

    def close(self) -> None:
        """Close every mount in reverse wire order, then the in-process endpoint. Close
        failures are logged, never raised. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for role, mount in reversed(self._mounts):
            try:
                mount.close()
            except Exception:  # one role's failing close must not keep the others open
                log.exception(
                    "role %s failed to close",
                    role,
                    extra={"action": "role_close_failed", "role": role},
                )
        try:
            self.channels.close()
        except Exception:  # the last close step: log it, the node is closed either way
            log.exception(
                "in-process endpoint failed to close", extra={"action": "channels_close_failed"}
            )
        log.info("node %s closed", self.node_id, extra={"action": "node_closed"})

    def health(self) -> dict[str, Any]:
        """Readiness of the node: ``{"status": "UP"|"DOWN", "components": {role: {"status":
        ..., "components": {name: {...}}}}}``. UP only while started, not closed, and every
        component of every mounted role is UP (a role's database probe included). A role
        whose mount predates ``Mount.health`` reports nothing and counts as UP.
        """
        roles: dict[str, Any] = {}
        up = self._started and not self._closed
        for role, mount in self._mounts:
            probe = getattr(mount, "health", None)
            try:
                components = dict(probe()) if probe is not None else {}
            except Exception as exc:  # a role's broken probe makes it DOWN, never a 500
                log.exception("role %s health failed", role, extra={"action": "role_health_failed"})
                components = {"health": {"status": "DOWN", "error": f"{type(exc).__name__}: {exc}"}}
            role_up = all(c.get("status") == "UP" for c in components.values())
            entry: dict[str, Any] = {"status": "UP" if role_up else "DOWN"}
            if components:
                entry["components"] = components
            roles[role] = entry
            up = up and role_up
        return {"status": "UP" if up else "DOWN", "components": roles}

    def _add_descriptors(self) -> None:
        files = self.contributions.all(FileDescriptorContribution)
        available: dict[str, bytes] = {}
        from google.protobuf import descriptor_pb2

        for contribution in files:
            proto = descriptor_pb2.FileDescriptorProto.FromString(contribution.serialized)
            available[proto.name] = contribution.serialized
        for contribution in files:
            try:
                self.type_pool.add_file(contribution.serialized, available=available)
            except ValueError as exc:
                raise ComposerError(f"node boot failed: {exc}") from exc

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Node({self.node_id}, roles={self.roles})"


class _HookAuthorizer:
    """The plugins' ``protomolt_authorize_step`` as a :class:`StepAuthorizer` contribution."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._hook = pm.hook.protomolt_authorize_step

    def authorize_step(
        self, job: Mapping[str, Any], step: str, capabilities: tuple[str, ...]
    ) -> StepDecision | None:
        answer = self._hook(job=job, step=step, capabilities=capabilities)
        if answer is not None and not isinstance(answer, StepDecision):
            raise TypeError(f"protomolt_authorize_step returned {type(answer).__name__}")
        return answer


def _contribute_grant_sources(contributions: Contributions, config: Any, pm: Any) -> None:
    """What a role needs to check step grants: the principals' ``[node.groups]`` (always), and
    the plugins' ``protomolt_authorize_step`` when one implements it."""
    table = {
        name: frozenset(members)
        for name, members in (getattr(config, "groups", None) or {}).items()
    }

    def groups_of(principal: str) -> frozenset[str]:
        return frozenset(name for name, members in table.items() if principal in members)

    contributions.contribute(PrincipalGroups, PrincipalGroups(groups_of))
    if pm.hook.protomolt_authorize_step.get_hookimpls():
        contributions.contribute(StepAuthorizer, _HookAuthorizer(pm))


def compose(
    config: NodeConfig,
    *,
    plugin_manager: pluggy.PluginManager | None = None,
    extra_plugins: Iterable[Any] = (),
) -> Node:
    """Discover, order and wire the configured roles; return the (not yet started) node.

    :param config: the node configuration (roles, data dir, role sections).
    :param plugin_manager: a prepared ``PluginManager("protomolt")`` whose plugins are the
        installed roles (entry points are then not loaded); None loads ``protomolt.roles``.
    :param extra_plugins: more plugins (modules or objects with a ``protomolt_role_module``
        hookimpl), e.g. test roles.
    :returns: the wired :class:`Node`; call ``start()`` then ``close()``.
    :raises ComposerError: unknown or duplicate roles, cycles, a role that failed to wire
        (its message unchanged when it raised ``ComposerError``), duplicate action names.
    """
    pm = _plugin_manager(plugin_manager, extra_plugins, config.roles)
    modules = _role_modules(pm)
    order = order_roles(config.roles, modules)
    node_id = uuid.uuid4().hex[:8]
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ComposerError(f"node.data_dir {config.data_dir} cannot be created: {exc}") from exc
    contributions = Contributions()
    type_pool = TypePool()
    contributions.contribute(TypePool, type_pool)
    _contribute_grant_sources(contributions, config, pm)
    # a plugin's artifact store (S3, a shared volume); without one the jobs role keeps files
    store = pm.hook.protomolt_artifact_store(data_dir=config.data_dir)
    if store is not None:
        if not isinstance(store, ArtifactStore):
            raise ComposerError(
                f"protomolt_artifact_store returned {type(store).__name__}, not an ArtifactStore"
            )
        contributions.contribute(ArtifactStore, store)
    channels = Channels(config.data_dir, node_id=node_id)
    mounts: list[tuple[str, Mount]] = []

    def unwind() -> None:
        for role, mount in reversed(mounts):
            try:
                mount.close()
            except Exception:  # one role's failing close must not keep the others open
                log.exception(
                    "role %s failed to close",
                    role,
                    extra={"action": "role_close_failed", "role": role},
                )
        channels.close()

    try:
        for role in order:
            log.info("wiring role %s", role, extra={"action": "role_wire", "role": role})
            ctx = WireContext(
                node_id=node_id,
                data_dir=config.data_dir,
                settings=config.section(role),
                contributions=contributions,
                channels=channels,
            )
            try:
                mount = modules[role].wire(ctx)
            except ComposerError:
                raise
            except Exception as exc:  # a role's failure names the role
                raise ComposerError(f"node boot failed: role {role} failed to wire: {exc}") from exc
            if (
                mount is None
                or not callable(getattr(mount, "start", None))
                or not callable(getattr(mount, "close", None))
            ):
                raise ComposerError(f"role {role} wired to a null mount")
            mounts.append((role, mount))
        contributions.freeze()
        catalog = Catalog(refusal_recorders=contributions.all(RefusalRecorder))
        for action in contributions.all(Action):
            try:
                catalog.register(action)
            except ValueError as exc:
                raise ComposerError(f"node boot failed: {exc}") from exc
        try:
            channels.register(contributions.all(InProcessService))
        except ValueError as exc:
            raise ComposerError(f"node boot failed: {exc}") from exc
    except BaseException:  # unwind what was wired, re-raised
        unwind()
        raise
    return Node(
        config=config,
        node_id=node_id,
        roles=order,
        mounts=mounts,
        contributions=contributions,
        catalog=catalog,
        type_pool=type_pool,
        channels=channels,
        authority=Authority.from_config(config, pm),
    )
