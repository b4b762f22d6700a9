"""The action catalog: every verb a node serves, by name, behind one execute path.

``execute`` runs, in order: resolve the action (``unknown-action`` with the available names),
check the caller's scope (``permission-denied``), require a JSON object input
(``invalid-input``), then the action. An :class:`~protomolt_jobs.errors.ActionError` passes
through unchanged; anything else the action raises is a defect: it is logged here with its
traceback and the caller gets ``internal-error`` with no traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from typing import Any

from protomolt_jobs.errors import (
    ActionError,
    InternalError,
    InvalidInput,
    PermissionDenied,
    UnknownAction,
)
from protomolt_jobs.hooks.contract import Action, principal_scope

__all__ = ["Caller", "Catalog"]

log = logging.getLogger("protomolt_jobs.catalog")

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """Who calls a verb.

    :param name: principal name (for logs and ``permission-denied`` details).
    :param scopes: scopes the caller holds.
    :param unrestricted: the operator: every scope.
    """

    name: str
    scopes: frozenset[str] = frozenset()
    unrestricted: bool = False

    @classmethod
    def operator(cls) -> Caller:
        """The unrestricted caller (local CLI, an authenticated operator token)."""
        return cls(name="operator", unrestricted=True)

    def holds(self, scope: str) -> bool:
        """True when the caller may run an action of ``scope``."""
        return self.unrestricted or (bool(scope) and scope in self.scopes)


class Catalog:
    """Named actions in registration order. Thread-safe; execution runs outside the lock."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}
        self._lock = threading.Lock()

    def register(self, action: Action) -> None:
        """Add ``action``.

        :raises ValueError: the name is taken (``Action '<name>' is already registered
            (<type>)``), not kebab-case, or the object lacks the Action members.
        """
        for member in ("name", "description", "scope", "input_schema", "execute"):
            if not hasattr(action, member):
                raise ValueError(f"{type(action).__name__} is not an Action: it has no {member!r}")
        name = action.name
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"action name must be kebab-case (like 'submit-workflow'); got {name!r}"
            )
        with self._lock:
            existing = self._actions.get(name)
            if existing is not None:
                raise ValueError(
                    f"Action '{name}' is already registered ({type(existing).__module__}."
                    f"{type(existing).__qualname__})"
                )
            self._actions[name] = action

    def names(self) -> list[str]:
        """Action names in registration order."""
        with self._lock:
            return list(self._actions)

    def get(self, name: str) -> Action:
        """The action called ``name``.

        :raises UnknownAction: with ``details = {"action": name, "available": [...]}``.
        """
        with self._lock:
            action = self._actions.get(name) if isinstance(name, str) else None
            available = list(self._actions)
        if action is None:
            raise UnknownAction(
                f"Unknown action '{name}'. Available actions: {', '.join(available)}",
                {"action": name, "available": available},
            )
        return action

    def manifest(self, caller: Caller | None = None) -> list[dict[str, Any]]:
        """``[{name, description, scope, inputSchema}]`` in registration order, limited to
        the actions ``caller`` may run (all of them for None, the operator)."""
        caller = caller or Caller.operator()
        with self._lock:
            actions = list(self._actions.values())
        return [
            {
                "name": a.name,
                "description": a.description,
                "scope": a.scope,
                "inputSchema": a.input_schema,
            }
            for a in actions
            if caller.holds(a.scope)
        ]

    def execute(self, name: str, input: Any, *, caller: Caller | None = None) -> dict[str, Any]:
        """Run the action ``name`` on ``input``.

        :param name: action name.
        :param input: the decoded JSON input; must be an object (dict).
        :param caller: None runs as the operator.
        :returns: the action's JSON object answer (``ok: false`` answers included).
        :raises UnknownAction: no such action.
        :raises PermissionDenied: the caller lacks the action's scope.
        :raises InvalidInput: ``input`` is not a JSON object, or the action refused a field.
        :raises ActionError: any other code the action raised.
        :raises InternalError: the action failed unexpectedly (logged with its traceback).
        """
        caller = caller or Caller.operator()
        action = self.get(name)
        if not caller.holds(action.scope):
            details: dict[str, Any] = {"action": name, "caller": caller.name}
            if action.scope:
                details["requiredScope"] = action.scope
            raise PermissionDenied(
                f"caller '{caller.name}' may not run '{name}'"
                + (f": it needs scope '{action.scope}'" if action.scope else ""),
                details,
            )
        if not isinstance(input, dict):
            raise InvalidInput("Input must be a JSON object (at '')")
        try:
            with principal_scope(caller.name):
                result = action.execute(input)
        except ActionError:
            raise
        except Exception as exc:  # internal-error with a log, never a 500
            log.exception(
                "action %s failed unexpectedly",
                name,
                extra={"action": "action_internal_error", "verb": name},
            )
            raise InternalError(
                f"internal error in action '{name}' ({type(exc).__name__}); "
                "the node's log has the details"
            ) from exc
        if not isinstance(result, dict):
            log.error(
                "action %s returned %s, not a JSON object",
                name,
                type(result).__name__,
                extra={"action": "action_internal_error", "verb": name},
            )
            raise InternalError(
                f"internal error in action '{name}': it answered with no JSON object"
            )
        return result
