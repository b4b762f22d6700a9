"""Read-only views of one job for operator surfaces (the dashboard): its steps, its events, and
the type a parked step's answer must have.

The jobs role contributes one :class:`JobInspector` (contribution kind ``JobInspector``); every
*change* still goes through the catalog verbs. Nothing here writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from protomolt_jobs.errors import StoreError
from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent
from protomolt_jobs.runs.grant_gates import GATE_DECISIONS, step_gate
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun, decode_definition
from protomolt_jobs.workflow.floors import Floor, requirement, selecting
from protomolt_jobs.workflow.types import ON_SUCCESS

__all__ = ["JobEvent", "JobInspector"]

log = logging.getLogger("protomolt_jobs.job_inspector")


@dataclass(frozen=True)
class JobEvent:
    """One outbox row of a job, decoded for display.

    :ivar seq: the outbox order.
    :ivar event_type: ``ACCEPTED``, ``STEP_CHECKPOINT``, ``WAITING``, ``COMPLETED``, ...
    :ivar status: the outbox row's status (``PENDING``, ``PUBLISHED``, ``FAILED``).
    :ivar created_at: when the row was written (ISO-8601).
    :ivar detail: the decoded event as proto3 JSON (empty when it cannot be decoded).
    """

    seq: int
    event_type: str
    status: str
    created_at: str
    detail: dict[str, Any]


class JobInspector:
    """Reads a job's definition and events through the role's store.

    :param store: returns the open store, or None while the role is not started.
    :param runtime: the engine's runtime (type pool) for parsing snapshotted definitions.
    :param floors: the node's policy floors (the quorum and vetoes in force).
    :param grant_policy: ``() -> worker.grants.GrantPolicy``: the grant gates' approvers.
    """

    def __init__(
        self,
        store: Any,
        runtime: Any,
        floors: Sequence[Floor] = (),
        grant_policy: Callable[[], Any] | None = None,
    ) -> None:
        self._store = store
        self._runtime = runtime
        self._floors = tuple(floors)
        self._grant_policy = grant_policy

    def _open(self) -> Any:
        store = self._store()
        if store is None:
            raise StoreError("the jobs store is not open")
        return store

    def _stored(self, job_id: str) -> StoredRun | None:
        """The job's stored run; None when the job does not exist or its definition cannot be
        used (these views only add to what the verbs answer, so they never fail for it)."""
        job = self._open().job_get(job_id)
        if job is None:
            return None
        try:
            return StoredRun.load(job, self._runtime)
        except SnapshotError:
            return None

    def step_names(self, job_id: str) -> list[str]:
        """The names of the steps of the job's snapshotted definition, in definition order.

        A definition that no longer parses still names its steps (the raw ``steps[].name``
        strings), so the page of a job whose workflow broke still shows the step it waits on;
        empty when the job does not exist or its definition is not a JSON object.

        :raises StoreError: the store is unavailable.
        """
        job = self._open().job_get(job_id)
        if job is None:
            return []
        try:
            return StoredRun.load(job, self._runtime).step_names()
        except SnapshotError:
            pass
        try:
            steps = decode_definition(job.workflow_definition).get("steps")
        except SnapshotError:
            return []
        if not isinstance(steps, list):
            return []
        return [s["name"] for s in steps if isinstance(s, dict) and isinstance(s.get("name"), str)]

    def step_graph(self, job_id: str) -> list[dict[str, Any]]:
        """The steps of a *graph* workflow with what each waits for:
        ``[{"name", "after": ["a", "b (failure)"]}]`` in definition order; empty for a
        sequential workflow (each step simply follows the one before) or one that does not parse.

        :raises StoreError: the store is unavailable.
        """
        stored = self._stored(job_id)
        if stored is None or not stored.workflow.graph:
            return []
        return [
            {
                "name": step.name,
                "after": [
                    d.step if d.on == ON_SUCCESS else f"{d.step} ({d.on})"
                    for d in getattr(step, "depends", ())
                ],
            }
            for step in stored.workflow.steps
        ]

    def answer_type(self, job_id: str, step_name: str) -> _d.Descriptor | None:
        """The message type ``complete-step`` must send for ``step_name`` (the step method's
        output type), or None when the job, its definition or the step cannot be resolved.

        :raises StoreError: the store is unavailable.
        """
        stored = self._stored(job_id)
        if stored is None:
            return None
        for step in stored.workflow.steps:
            if step.name == step_name and step.method is not None:
                return step.method.output_type
        return None

    def approval(self, job_id: str, step_name: str) -> dict[str, Any] | None:
        """The approval step ``step_name`` of the job (or the step's grant gate) and the votes
        cast on its current opening: ``{step, roles, principals, quorum, decisions, veto,
        votes: [{principal, decision, comment?}], tally: {decision: n}, submittedBy, grantGate?}``
        (``submittedBy``: the run's submitter, who may not vote; None when unrecorded); None
        when the job, its definition or an approval step (or grant gate) of that name cannot
        be resolved. ``quorum`` and ``veto`` are those the node's policy floors leave in force
        (as ``approve-step`` counts); a grant gate's (``grantGate``: the deciding rules) are
        its grants' (``runs/grant_gates.py``).

        :raises StoreError: the store is unavailable.
        """
        job = self._open().job_get(job_id)
        stored = self._stored(job_id)
        step = stored.workflow.step(step_name) if stored is not None else None
        if job is None or stored is None or step is None:
            return None
        if step.approval is None:
            return self._grant_gate(job, step)
        spec = step.approval
        floor = requirement(selecting(self._floors, stored.workflow, step))
        roles, principals = list(spec.roles), list(spec.principals)
        for timer in job.wait_timers or []:  # escalations that fired widen the approvers
            if isinstance(timer, dict) and timer.get("kind") == "escalate" and timer.get("fired"):
                roles += list(timer.get("addRoles", []))
                principals += list(timer.get("addPrincipals", []))
        votes = self._open().approval_votes_open(job_id, step_name)
        tally: dict[str, int] = {}
        for v in votes:
            tally[v.decision] = tally.get(v.decision, 0) + 1
        return {
            "step": step_name,
            "roles": roles,
            "principals": principals,
            "quorum": max(spec.quorum, floor.quorum) if floor else spec.quorum,
            "decisions": list(spec.decisions),
            "veto": [v for v in spec.veto if floor is None or v in floor.veto],
            "votes": [
                {"principal": v.principal, "decision": v.decision}
                | ({"comment": v.comment} if v.comment else {})
                for v in votes
            ],
            "tally": tally,
            "submittedBy": job.submitted_by,
        }

    def _grant_gate(self, job: Any, step: Any) -> dict[str, Any] | None:
        """:meth:`approval`'s view of a step waiting on its grant gate (None: it has none)."""
        if job.wait_kind != "approval" or job.outstanding_step != step.name:
            return None
        gate = step_gate(self._grant_policy, job, step)
        if gate is None:
            return None
        roles, principals = gate.approvers(job.wait_timers)
        votes = self._open().approval_votes_open(str(job.job_id), step.name)
        tally: dict[str, int] = {}
        for v in votes:
            tally[v.decision] = tally.get(v.decision, 0) + 1
        return {
            "step": step.name,
            "roles": roles,
            "principals": principals,
            "quorum": gate.quorum,
            "decisions": list(GATE_DECISIONS),
            "veto": [],
            "votes": [
                {"principal": v.principal, "decision": v.decision}
                | ({"comment": v.comment} if v.comment else {})
                for v in votes
            ],
            "tally": tally,
            "submittedBy": job.submitted_by,
            "grantGate": list(gate.rules),
        }

    def statuses(self, job_ids: list[str]) -> list[dict[str, Any]]:
        """Job summaries (``jobId, workflowName, status, attempt, outstandingStep?, error?,
        createdAt, updatedAt, completedAt?``) of ``job_ids``, read cheaply (no payloads).

        :raises StoreError: the store is unavailable.
        """
        out = []
        for row in self._open().job_statuses(job_ids):
            doc: dict[str, Any] = {
                "jobId": str(row["job_id"]),
                "workflowName": row["workflow_name"],
                "status": row["status"],
                "attempt": row["attempt"],
                "createdAt": row["created_at"].isoformat(),
                "updatedAt": row["updated_at"].isoformat(),
            }
            if row["outstanding_step"]:
                doc["outstandingStep"] = row["outstanding_step"]
            if row["error"]:
                doc["error"] = row["error"]
            if row["completed_at"] is not None:
                doc["completedAt"] = row["completed_at"].isoformat()
            out.append(doc)
        return out

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's events (its outbox rows) in order, decoded.

        :raises StoreError: the store is unavailable.
        """
        out = []
        for row in self._open().outbox_for_job(job_id):
            try:
                detail = json_format.MessageToDict(WorkflowRunEvent.FromString(row.payload))
            except (DecodeError, ValueError):
                detail = {}
            out.append(
                JobEvent(
                    seq=row.seq,
                    event_type=row.event_type,
                    status=row.status,
                    created_at=row.created_at.isoformat(),
                    detail=detail,
                )
            )
        return out
