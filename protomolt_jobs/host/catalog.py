"""The action catalog: every verb a node serves, by name, behind one execute path.

``execute`` runs, in order: resolve the action (``unknown-action`` with the available names),
check the caller's scope (``permission-denied``), require a JSON object input
(``invalid-input``), then the action. An :class:`~protomolt_jobs.errors.ActionError` passes
through unchanged; anything else the action raises is a defect: it is logged here with its
traceback and the caller gets ``internal-error`` with no traceback.

A refusal for want of a scope (:meth:`Catalog.authorize`, which ``execute`` and the HTTP
route's scoped routes both use) is reported to every contributed
:class:`~protomolt_jobs.hooks.contract.RefusalRecorder` before it is raised, so each door
(HTTP, gRPC, the CLI through HTTP, the dashboard) records it the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from protomolt_jobs.errors import (
    ActionError,
    InternalError,
    InvalidInput,
    PermissionDenied,
    UnknownAction,
)
from protomolt_jobs.hooks.contract import Action, Refusal, RefusalRecorder, principal_scope

__all__ = ["Caller", "Catalog"]

log = logging.getLogger("protomolt_jobs.catalog")

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """Who calls a verb. The surfaces never build one themselves: the node's resolver
    (:class:`~protomolt_jobs.host.authority.Authority`) does, from the token presented.

    :param name: principal name (the transition log's actor; logs; ``permission-denied``
        details).
    :param scopes: scopes the caller holds.
    :param unrestricted: every scope: the node's single ``api_token`` (principal ``api``), any
        token of a node without ``[node.scopes]``, the ``anonymous`` caller of a node without
        tokens, and in-process calls (:meth:`operator`).
    :param groups: the principal's groups (``[node.groups]`` or an identity hook).
    """

    name: str
    scopes: frozenset[str] = frozenset()
    unrestricted: bool = False
    groups: frozenset[str] = frozenset()

    @classmethod
    def operator(cls) -> Caller:
        """The in-process caller (no surface: a role calling a verb itself), every scope."""
        return cls(name="operator", unrestricted=True)

    def holds(self, scope: str) -> bool:
        """True when the caller may run an action of ``scope``."""
        return self.unrestricted or (bool(scope) and scope in self.scopes)


class Catalog:
    """Named actions in registration order. Thread-safe; execution runs outside the lock.

    :param refusal_recorders: where refusals are reported (the node's contributed
        :class:`~protomolt_jobs.hooks.contract.RefusalRecorder` values); none: each refusal
        is logged here instead.
    """

    def __init__(self, refusal_recorders: Iterable[RefusalRecorder] = ()) -> None:
        self._actions: dict[str, Action] = {}
        self._lock = threading.Lock()
        self._recorders: tuple[RefusalRecorder, ...] = tuple(refusal_recorders)

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

    def authorize(self, caller: Caller, name: str, scope: str, input: Any = None) -> None:
        """Refuse ``caller`` unless it holds ``scope``: the refusal is reported (every
        recorder, or a log line when there is none), then raised.

        :param caller: who calls.
        :param name: the verb or route (``cancel-job``, ``PUT /protomolt/workflows/x``).
        :param scope: the scope it needs ("" : only an unrestricted caller may run it).
        :param input: the call's input; its ``jobId`` (a string) names the job in the report.
        :raises PermissionDenied: naming the caller and the scope, with ``details``
            ``{"action", "caller", "requiredScope"}``.
        """
        if caller.holds(scope):
            return
        details: dict[str, Any] = {"action": name, "caller": caller.name}
        if scope:
            details["requiredScope"] = scope
        job_id = input.get("jobId") if isinstance(input, dict) else None
        self._report(Refusal(caller.name, name, scope, job_id if isinstance(job_id, str) else None))
        raise PermissionDenied(
            f"caller '{caller.name}' may not run '{name}'"
            + (f": it needs scope '{scope}'" if scope else ""),
            details,
        )

    def _report(self, refusal: Refusal) -> None:
        if not self._recorders:
            log.info(
                "refused %s to %s: it needs scope %s",
                refusal.verb,
                refusal.principal,
                refusal.scope or "(none)",
                extra={
                    "action": "permission_denied",
                    "principal": refusal.principal,
                    "verb": refusal.verb,
                    "scope": refusal.scope,
                    "job_id": refusal.job_id,
                },
            )
            return
        for recorder in self._recorders:
            try:
                recorder.record_refusal(refusal)
            except Exception:  # a recorder's failure must never turn the refusal into an error
                log.exception(
                    "a refusal recorder failed; the refusal of %s to %s stands",
                    refusal.verb,
                    refusal.principal,
                    extra={"action": "refusal_record_failed", "verb": refusal.verb},
                )

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
        self.authorize(caller, name, action.scope, input)
        if not isinstance(input, dict):
            raise InvalidInput("Input must be a JSON object (at '')")
        try:
            with principal_scope(caller.name, caller.groups, caller.holds):
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
