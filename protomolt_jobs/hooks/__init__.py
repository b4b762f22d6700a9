"""The host contract of ProtoMolt roles (pluggy project ``protomolt``).

``hookimpl`` marks a role plugin's implementation (eggsample pattern); the contract's types
live in :mod:`protomolt_jobs.hooks.contract`, the specifications in
:mod:`protomolt_jobs.hooks.hookspecs`, and the jobs role in :mod:`protomolt_jobs.role`.
"""

from protomolt_jobs.hooks.contract import (
    SCOPES,
    Action,
    ArtifactStore,
    ChannelFactory,
    ComponentHealth,
    ComposerError,
    Contributions,
    FileDescriptorContribution,
    Identity,
    InertMount,
    InProcessService,
    Mount,
    PrincipalGroups,
    Refusal,
    RefusalRecorder,
    RoleModule,
    StepAuthorizer,
    StepDecision,
    TypePool,
    WireContext,
    WorkflowRepository,
)
from protomolt_jobs.hooks.hookspecs import PROJECT, hookimpl, hookspec

__all__ = [
    "PROJECT",
    "SCOPES",
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
    "WorkflowRepository",
    "hookimpl",
    "hookspec",
]
