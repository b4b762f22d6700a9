"""The jobs role's catalog actions (verbs), on one shared base.

===================== ======================================================================
module                verbs
===================== ======================================================================
:mod:`.submit`        ``submit-workflow``
:mod:`.read`          ``get-job``, ``list-jobs``, ``job-history``
:mod:`.complete`      ``complete-step``
:mod:`.control`       ``cancel-job``, ``pause-job``, ``resume-job``, ``retry-step``,
                      ``requeue-job``
:mod:`.recovery`      ``reconcile-step``, ``migrate-checkpoint``
:mod:`.loops`         ``extend-loop``
:mod:`.progress`      ``report-progress``
:mod:`.explain`       ``explain-job``
:mod:`.inputs`        ``supply-input``
:mod:`.artifacts`     ``list-artifacts``, ``get-artifact``, ``lineage``, ``retract-artifact``,
                      ``promote-artifact``
:mod:`.workflow`      ``run-workflow``, ``check-workflow`` (the engine's; no store)
:mod:`.replay`        ``replay-check`` (a candidate version against the stored runs)
:mod:`.workflow_tests` ``test-workflow`` (a definition's tests, mocked; no store, no network)
:mod:`.stored_workflow` ``get-workflow`` (a stored workflow's version, retention, last test)
===================== ======================================================================

:mod:`.base` holds what every verb shares (the backend, the verb classes, field readers,
answers); :mod:`.responses` turns a supplied response into a checkpoint entry. No verb module
imports another (import-linter contract ``verbs-on-one-base``). :func:`jobs_actions` gives the
job verbs in manifest order; the role adds ``run-workflow``, ``check-workflow``,
``replay-check``, ``get-workflow`` and ``test-workflow`` after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protomolt_jobs.verbs.approve import ApproveStepAction
from protomolt_jobs.verbs.artifacts import (
    GetArtifactAction,
    LineageAction,
    ListArtifactsAction,
    PromoteArtifactAction,
    RetractArtifactAction,
)
from protomolt_jobs.verbs.base import NOT_CONFIGURED, NOT_RUNNING, JobsBackend, Verb
from protomolt_jobs.verbs.complete import CompleteStepAction
from protomolt_jobs.verbs.control import (
    CancelJobAction,
    PauseJobAction,
    RequeueJobAction,
    ResumeJobAction,
    RetryStepAction,
)
from protomolt_jobs.verbs.explain import ExplainJobAction
from protomolt_jobs.verbs.inputs import SupplyInputAction
from protomolt_jobs.verbs.loops import ExtendLoopAction
from protomolt_jobs.verbs.progress import ReportProgressAction
from protomolt_jobs.verbs.read import GetJobAction, JobHistoryAction, ListJobsAction
from protomolt_jobs.verbs.recovery import MigrateCheckpointAction, ReconcileStepAction
from protomolt_jobs.verbs.replay import ReplayCheckAction
from protomolt_jobs.verbs.stored_workflow import GetWorkflowAction
from protomolt_jobs.verbs.submit import SOURCE_RULE, SubmitWorkflowAction
from protomolt_jobs.verbs.workflow import CheckWorkflowAction, RunWorkflowAction
from protomolt_jobs.verbs.workflow_tests import TestWorkflowAction
from protomolt_jobs.workflow.floors import Floor

__all__ = [
    "NOT_CONFIGURED",
    "NOT_RUNNING",
    "SOURCE_RULE",
    "ApproveStepAction",
    "CancelJobAction",
    "CheckWorkflowAction",
    "CompleteStepAction",
    "ExplainJobAction",
    "ExtendLoopAction",
    "GetArtifactAction",
    "GetJobAction",
    "GetWorkflowAction",
    "JobHistoryAction",
    "JobsBackend",
    "LineageAction",
    "ListArtifactsAction",
    "ListJobsAction",
    "MigrateCheckpointAction",
    "PauseJobAction",
    "PromoteArtifactAction",
    "ReconcileStepAction",
    "ReplayCheckAction",
    "ReportProgressAction",
    "RequeueJobAction",
    "ResumeJobAction",
    "RetractArtifactAction",
    "RetryStepAction",
    "RunWorkflowAction",
    "SubmitWorkflowAction",
    "SupplyInputAction",
    "TestWorkflowAction",
    "Verb",
    "jobs_actions",
]


def jobs_actions(backend: JobsBackend, runtime: Any, floors: Sequence[Floor] = ()) -> list[Verb]:
    """The job verbs over one backend, in manifest order: the four of the reference
    (submit-workflow, get-job, list-jobs, complete-step), then the operator verbs (cancel-job,
    pause-job, resume-job, retry-step, the recovery verbs of step effects, requeue-job),
    job-history, approve-step, extend-loop, report-progress, explain-job, supply-input and the
    artifact verbs (list-artifacts, get-artifact, lineage, retract-artifact, promote-artifact).

    :param backend: the role's late-bound store and submitter.
    :param runtime: the engine's runtime (type pool) for reading stored definitions.
    :param floors: the node's policy floors (approve-step applies them again at decision time).
    """
    return [
        SubmitWorkflowAction(backend),
        GetJobAction(backend, runtime),
        ListJobsAction(backend),
        CompleteStepAction(backend, runtime),
        CancelJobAction(backend),
        PauseJobAction(backend),
        ResumeJobAction(backend),
        RetryStepAction(backend, runtime),
        ReconcileStepAction(backend, runtime),
        MigrateCheckpointAction(backend, runtime),
        RequeueJobAction(backend),
        JobHistoryAction(backend),
        ApproveStepAction(backend, runtime, floors),
        ExtendLoopAction(backend, runtime),
        ReportProgressAction(backend),
        ExplainJobAction(backend, runtime, floors),
        SupplyInputAction(backend, runtime),
        ListArtifactsAction(backend, runtime),
        GetArtifactAction(backend, runtime),
        LineageAction(backend, runtime),
        RetractArtifactAction(backend, runtime),
        PromoteArtifactAction(backend, runtime),
    ]
