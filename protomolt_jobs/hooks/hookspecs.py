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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pluggy

from protomolt_jobs.hooks.contract import ArtifactStore, Identity, RoleModule, StepDecision

__all__ = [
    "PROJECT",
    "hookimpl",
    "hookspec",
    "protomolt_artifact_store",
    "protomolt_authorize_step",
    "protomolt_resolve_identity",
    "protomolt_role_module",
]

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


# -------------------------------------------------------------------------
# Request hooks: called by the host's surfaces while the node serves
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def protomolt_resolve_identity(token: str) -> Identity | None:
    """Return who presents ``token``, or None when this plugin does not know it.

    This is the identity-provider hook: a plugin that checks tokens against an external
    provider (an OIDC introspection endpoint, a directory) answers with the principal and its
    groups. The host asks it for every token a caller presents on HTTP, gRPC, the CLI (which
    calls HTTP) and the dashboard, except the node's single ``api_token``, which is always
    principal ``api`` with every scope and is never handed to a plugin. When no plugin answers,
    the node's own tables are the default implementation: ``[node.tokens]`` names the
    principal and ``[node.groups]`` its groups. Groups the hook returns are joined with the
    ``[node.groups]`` entries naming the principal; ``[node.scopes]`` then grants scopes to
    groups and principals alike (docs/configuration.md).

    A node that has an implementation of this hook is never open: a caller without a token is
    refused (``unauthenticated``).

    Calling convention: ``firstresult``; implementations run in pluggy's order (last
    registered first) and the first non-None answer wins.

    :param token: the token exactly as presented (``api_token`` header or metadata, or
        ``Authorization: Bearer``), surrounding blanks removed; never empty.
    :returns: an :class:`~protomolt_jobs.hooks.contract.Identity`, or None (not known here).
        A principal that is not a valid name (lower-case letters, digits, ``.``, ``_``, ``-``,
        at most 64) or is reserved (``api``, ``anonymous``, ``operator``, ``sweeper``) is
        refused as if no plugin knew the token, and logged.

    .. note::
        It is called on the request path, in a server thread, for every call: answer within
        a few milliseconds (cache the provider's answers). An exception is logged and the
        caller is refused (``unauthenticated``), never answered with an internal error.

    When it is called
    ~~~~~~~~~~~~~~~~~
    By the host's resolver (``protomolt_jobs.host.authority.Authority``) for each request that
    presents a token other than the ``api_token``, before any verb runs. Any installed
    distribution may implement it by declaring an entry point in the ``protomolt.roles`` group
    (a plugin need not provide a role module); tests pass the plugin as ``extra_plugins``.
    """


@hookspec(firstresult=True)
def protomolt_authorize_step(
    job: Mapping[str, Any], step: str, capabilities: tuple[str, ...]
) -> StepDecision | None:
    """Decide whether a job's step may use the capabilities it declares, or None (no opinion).

    This is the policy-engine hook (OPA or another engine decides): the node's
    ``[[jobs.grants]]`` are the default implementation, asked when no plugin answers.

    Calling convention: ``firstresult``; the first non-None answer wins.

    :param job: ``{"jobId": str, "workflowName": str, "submittedBy": str | None,
        "submittedGroups": [str], "attempt": int}`` (``submittedGroups``: the groups recorded
        with the run at submit, sorted; empty when none were).
    :param step: the step's name.
    :param capabilities: the step's declared capability names, sorted, never empty.
    :returns: a :class:`~protomolt_jobs.hooks.contract.StepDecision` (``allow`` | ``deny`` |
        ``needs-approval``, a reason and the engine's decision id), or None.

    .. note::
        It is called in a worker thread, after the claim and before the step's call (before
        the intent of an ``effect: external`` step), once per run of the step: answer within
        a few milliseconds. An exception or an answer that is not a ``StepDecision`` fails the
        attempt as a retryable ``WORKFLOW`` error (the grant is unknown), never as a grant.

    When it is called
    ~~~~~~~~~~~~~~~~~
    By the jobs worker, for each step that declares ``capabilities``; steps without
    capabilities never call it. The host wraps the implementations into a
    :class:`~protomolt_jobs.hooks.contract.StepAuthorizer` contribution at boot.
    """


@hookspec(firstresult=True)
def protomolt_artifact_store(data_dir: Path) -> ArtifactStore | None:
    """The store artifact bytes live in (an S3-compatible bucket, a shared volume), or None.

    Calling convention: ``firstresult``; the first non-None answer wins. With none, the jobs
    role keeps a file store under ``<data_dir>/jobs/artifacts``
    (``protomolt_jobs.runs.artifact_store.FileArtifactStore``).

    :param data_dir: the node's data directory.
    :returns: an :class:`~protomolt_jobs.hooks.contract.ArtifactStore`, or None.

    When it is called
    ~~~~~~~~~~~~~~~~~
    Once per boot, by the host's composer, before the wire phase; the answer is contributed as
    the ``ArtifactStore`` contribution the jobs role's worker (publication checks) and pruner
    (byte deletion) use.
    """
