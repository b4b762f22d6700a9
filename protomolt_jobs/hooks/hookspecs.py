"""Hook specifications of the ProtoMolt host contract (pluggy project ``protomolt``).

A role is a plugin: a module (or object) registered with the host's
``pluggy.PluginManager("protomolt")``, usually found through the entry-point group
``protomolt.roles``. Its one hook hands the host a :class:`~protomolt_jobs.hooks.contract.RoleModule`;
the lifecycle (wire, start, close) lives on that object, and the host orders it by
``requires``, never by pluggy's registration order.

Hosts call hooks with keyword arguments only and run ``check_pending()`` after loading roles,
so a misspelt hook implementation fails the boot instead of never running.
"""

from __future__ import annotations

import pluggy

from protomolt_jobs.hooks.contract import RoleModule

__all__ = ["PROJECT", "hookimpl", "hookspec", "protomolt_role_module"]

#: The pluggy project name; hosts create ``pluggy.PluginManager(PROJECT)``.
PROJECT = "protomolt"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -------------------------------------------------------------------------
# Discovery hooks: called once per boot, before the wire phase
# -------------------------------------------------------------------------


@hookspec
def protomolt_role_module() -> RoleModule:
    """Return the role module this plugin provides.

    The host calls every implementation once per boot, before anything is wired, collects the
    modules and refuses two modules claiming one ``role``
    (``two modules claim role <r>: <A> and <B>``). Only the roles the node's configuration
    names are then wired, in ``requires`` order, and started; the others are dropped
    unwired, so building the module object must be cheap and side-effect free (no
    connection, no thread, no file written).

    Calling convention: not ``firstresult``; the host collects one module per plugin.

    :returns: an object with ``role: str``, ``requires: frozenset[str]`` and
        ``wire(ctx: WireContext) -> Mount``.

    .. note::
        The module receives its configuration at wire (``ctx.settings``), not here: a role
        that is installed but not mounted must not demand configuration.

    When it is called
    ~~~~~~~~~~~~~~~~~
    By the host's composer while it builds a node, after loading the ``protomolt.roles``
    entry points and any plugins the host registers itself (tests pass ``extra_plugins``).
    Any installed distribution may implement it by declaring an entry point in that group.
    """
