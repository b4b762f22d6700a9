"""A minimal test ``registry`` role: an in-memory WorkflowRepository, nothing served.

Use it with the composer's ``extra_plugins`` on a fresh plugin manager, so the installed
entry points (the real registry and parse roles) stay out of the test::

    repo = MemoryRepository({"seed-review": seed_workflow(target)})
    node = compose(config, plugin_manager=fresh_plugin_manager(),
                   extra_plugins=[registry_plugin(repo), jobs_module])
"""

from __future__ import annotations

import copy
import threading
import types
from typing import Any

import pluggy

from protomolt_jobs.hooks import InertMount, WireContext, WorkflowRepository, hookimpl, hookspecs


class CorruptWorkflow(Exception):
    """Raised by :class:`MemoryRepository` for a name marked corrupt."""


class MemoryRepository:
    """Named workflow definitions in a dict (deep-copied in and out).

    :param workflows: initial name -> definition.
    :param corrupt: names whose read raises :class:`CorruptWorkflow` (a damaged stored file).
    """

    def __init__(
        self, workflows: dict[str, dict[str, Any]] | None = None, corrupt: set[str] | None = None
    ) -> None:
        self._workflows = {k: copy.deepcopy(v) for k, v in (workflows or {}).items()}
        self._corrupt = set(corrupt or ())
        self._lock = threading.Lock()

    def workflow(self, name: str) -> dict[str, Any] | None:
        if name in self._corrupt:
            raise CorruptWorkflow(f"stored workflow {name} is not valid JSON")
        with self._lock:
            found = self._workflows.get(name)
        return copy.deepcopy(found) if found is not None else None

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._workflows)

    def put(self, name: str, definition: dict[str, Any]) -> None:
        with self._lock:
            self._workflows[name] = copy.deepcopy(definition)


class TestRegistryModule:
    """Role ``registry``: contributes its repository at wire; start and close do nothing."""

    __test__ = False
    role = "registry"
    requires = frozenset()

    def __init__(self, repository: MemoryRepository | None = None) -> None:
        self.repository = repository if repository is not None else MemoryRepository()

    def wire(self, ctx: WireContext) -> InertMount:
        ctx.contributions.contribute(WorkflowRepository, self.repository)
        return InertMount()


def registry_plugin(repository: MemoryRepository | None = None) -> Any:
    """A plugin object whose hookimpl returns a :class:`TestRegistryModule`."""
    module = TestRegistryModule(repository)
    return types.SimpleNamespace(protomolt_role_module=hookimpl(lambda: module), module=module)


def fresh_plugin_manager() -> pluggy.PluginManager:
    """A ``PluginManager("protomolt")`` with the hookspecs and no plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm
