"""Authority: the one resolver that turns a presented token into a :class:`Caller`.

Every door asks it, once per request: the actions route (and so the CLI, which calls it), the
registry's routes, ``ProtoMoltService`` and the dashboard. No surface builds a caller of its
own.

Who a token is, in order:

1. the node's single ``api_token``: principal ``api``, every scope, always (documented as full
   rights; ``[node.scopes]`` cannot name it);
2. an identity hook (``protomolt_resolve_identity``, :mod:`~protomolt_jobs.hooks.hookspecs`),
   when a plugin implements it: the principal and groups it answers;
3. the node's own tables (the default implementation): a ``[node.tokens]`` entry names the
   principal, ``[node.groups]`` its groups;
4. otherwise nobody: the caller is refused (``unauthenticated``).

A node with neither ``api_token`` nor ``[node.tokens]`` nor an identity hook is *open*: every
caller is ``anonymous`` (a presented token is ignored), as before authority existed; such a
node binds loopback unless told otherwise, and says so in its log when it does not.

What a caller may run: with ``[node.scopes]`` absent, every resolved caller holds every scope
(the node warns at start when named tokens or an identity hook exist, since they then carry
no limit). With ``[node.scopes]`` present, a caller holds exactly the union of the scopes
granted to its principal and to each of its groups, and everything else is refused
(``permission-denied`` naming the scope; :meth:`Catalog.authorize`). ``anonymous`` gets what
``[node.scopes] anonymous`` grants.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Any

from protomolt_jobs.hooks.contract import Identity
from protomolt_jobs.host.catalog import Caller
from protomolt_jobs.host.nodeconfig import is_principal_name

__all__ = ["Authority", "IdentityHook"]

log = logging.getLogger("protomolt_jobs.authority")

#: ``hook(token) -> Identity | None``: the plugins' ``protomolt_resolve_identity``.
IdentityHook = Callable[[str], Identity | None]


class Authority:
    """Resolves tokens to callers with their groups and scopes (see the module docstring).

    Thread-safe and immutable once built.

    :param api_token: the node's single operator token (principal ``api``, every scope), or
        None.
    :param tokens: ``[node.tokens]``: principal -> token.
    :param groups: ``[node.groups]``: group -> principals.
    :param scopes: ``[node.scopes]``: group or principal -> scopes; None when the table is
        absent (every resolved caller holds every scope).
    :param identity_hook: the identity provider's hook, or None when no plugin implements it.
    """

    def __init__(
        self,
        *,
        api_token: str | None = None,
        tokens: Mapping[str, str] | None = None,
        groups: Mapping[str, frozenset[str]] | None = None,
        scopes: Mapping[str, frozenset[str]] | None = None,
        identity_hook: IdentityHook | None = None,
    ) -> None:
        self.api_token = api_token or None
        self.tokens = dict(tokens or {})
        self.groups = {name: frozenset(members) for name, members in (groups or {}).items()}
        self.scopes = (
            None
            if scopes is None
            else {name: frozenset(granted) for name, granted in scopes.items()}
        )
        self.identity_hook = identity_hook

    @classmethod
    def from_config(cls, config: Any, plugin_manager: Any = None) -> Authority:
        """The authority of a node: its ``[node]`` token tables and, when a plugin of
        ``plugin_manager`` implements ``protomolt_resolve_identity``, that hook.

        :param config: a :class:`~protomolt_jobs.host.nodeconfig.NodeConfig`.
        :param plugin_manager: the node's ``pluggy.PluginManager`` (None: no hook).
        """
        hook: IdentityHook | None = None
        caller = getattr(getattr(plugin_manager, "hook", None), "protomolt_resolve_identity", None)
        if caller is not None and caller.get_hookimpls():

            def hook(token: str) -> Identity | None:
                answer: Identity | None = caller(token=token)
                return answer

        return cls(
            api_token=config.api_token,
            tokens=config.tokens,
            groups=getattr(config, "groups", None),
            scopes=getattr(config, "scopes", None),
            identity_hook=hook,
        )

    # -- what the node is ------------------------------------------------------------------

    @property
    def open(self) -> bool:
        """True for a node without any token or identity hook: every caller is anonymous."""
        return not self.api_token and not self.tokens and self.identity_hook is None

    @property
    def scoped(self) -> bool:
        """True when ``[node.scopes]`` is configured (what is not granted is refused)."""
        return self.scopes is not None

    def warnings(self) -> list[tuple[str, str]]:
        """``(action, message)`` pairs the node logs at start about its authority: tokens
        that carry no limit because ``[node.scopes]`` is absent; group members that no token
        names while no identity hook could supply them."""
        notes: list[tuple[str, str]] = []
        if self.scopes is None and (self.tokens or self.identity_hook is not None):
            names = ", ".join(sorted(self.tokens)) or "the identity hook's principals"
            notes.append(
                (
                    "scopes_not_configured",
                    (
                        f"[node.scopes] is not configured: every named token ({names}) holds every "
                        "scope; add [node.scopes] to grant each group or principal only what it "
                        "needs (docs/configuration.md)"
                    ),
                )
            )
        if self.identity_hook is None:
            for group, members in sorted(self.groups.items()):
                strangers = sorted(m for m in members if m not in self.tokens and m != "anonymous")
                if strangers:
                    notes.append(
                        (
                            "group_member_without_token",
                            (
                                f"[node.groups] {group} names {', '.join(strangers)}, which no "
                                "[node.tokens] entry names and no identity hook can supply"
                            ),
                        )
                    )
        return notes

    # -- resolving -------------------------------------------------------------------------

    def resolve(self, presented: str | None) -> Caller | None:
        """The caller presenting ``presented`` (a token, or None when none was sent).

        :returns: the :class:`Caller` with its groups and scopes, or None when the node
            refuses it (``unauthenticated``): no token, an unknown token, or an identity hook
            that failed or answered with an invalid principal.
        """
        if self.open:
            return self.caller("anonymous")
        if presented is None:
            return None
        token = presented.strip()
        if not token:
            return None
        # surrogatepass: a token that is not text (a lone surrogate) matches nothing, never
        # raises.
        candidate = token.encode("utf-8", "surrogatepass")
        # Compare against every configured token (constant work whichever matches).
        is_api = bool(self.api_token) and hmac.compare_digest(
            str(self.api_token).encode(), candidate
        )
        named: str | None = None
        for name, secret in self.tokens.items():
            if hmac.compare_digest(secret.encode(), candidate) and named is None:
                named = name
        if is_api:
            return Caller("api", unrestricted=True)
        if self.identity_hook is not None:
            identity = self._from_hook(token)
            if identity is not None:
                return self.caller(identity.principal, identity.groups)
        if named is not None:
            return self.caller(named)
        return None

    def principal(self, presented: str | None) -> str | None:
        """The principal name :meth:`resolve` gives, or None when refused."""
        caller = self.resolve(presented)
        return None if caller is None else caller.name

    def caller(self, principal: str, groups: frozenset[str] = frozenset()) -> Caller:
        """The caller ``principal`` is, with ``groups`` joined by the ``[node.groups]`` entries
        naming it, and the scopes ``[node.scopes]`` grants to it and its groups (every scope
        when the table is absent)."""
        member_of = frozenset(groups) | {
            name for name, members in self.groups.items() if principal in members
        }
        if self.scopes is None:
            return Caller(principal, unrestricted=True, groups=member_of)
        granted: set[str] = set(self.scopes.get(principal, ()))
        for group in member_of:
            granted |= self.scopes.get(group, frozenset())
        return Caller(principal, frozenset(granted), groups=member_of)

    def _from_hook(self, token: str) -> Identity | None:
        assert self.identity_hook is not None
        try:
            identity = self.identity_hook(token)
        except Exception:  # an identity provider's failure refuses the caller, never a 500
            log.exception(
                "the identity hook failed; the caller is refused",
                extra={"action": "identity_hook_failed"},
            )
            return None
        if identity is None:
            return None
        principal = getattr(identity, "principal", None)
        groups = getattr(identity, "groups", None)
        if (
            not is_principal_name(principal)
            or not isinstance(groups, (frozenset, set, tuple, list))
            or not all(isinstance(g, str) for g in groups)
        ):
            log.error(
                "the identity hook answered %r, which is not an Identity with a valid principal "
                "(lower-case letters, digits, '.', '_', '-'; not api, anonymous, operator or "
                "sweeper) and string groups; the caller is refused",
                identity,
                extra={"action": "identity_hook_invalid"},
            )
            return None
        return Identity(str(principal), frozenset(groups))
