"""What a segment needs from its claimed row: the stored definition (parsed and verified), the
input message, the checkpoints stored so far and the target of the next step.

Nothing in a claimed row can crash the worker. Whatever is wrong with the row's content raises
:class:`RowError`, whose text is what the job FAILS with (fenced, under its lease), with the
reference's texts where the reference has them:

========================================== ==================================================
the row                                    ``RowError`` text
========================================== ==================================================
could not be decoded by the store          ``WORKFLOW: stored row is not readable JSON: <what>``
(``JobRecord.unreadable``)
definition is JSON text that does not      ``WORKFLOW: stored workflow definition is not
decode                                     readable JSON: <reason>``
definition is not an object                ``WORKFLOW: stored workflow definition is not a
                                           JSON object``
definition does not parse                  ``WORKFLOW: stored workflow does not parse (step
                                           '<step>'): <message>`` (no step: no parenthesis)
definition does not verify                 ``WORKFLOW: stored workflow does not verify (<n>
                                           finding[s]); [<kind>] <step>: <error>; ...``
input is not proto3 JSON for the input     ``MAPPING: stored input is not valid proto3 JSON
type                                       for <type>: <reason>``
checkpoints are not an array               ``WORKFLOW: stored checkpoints are not an array``
anything else raised while reading (a      ``WORKFLOW: stored row could not be read: <type>:
definition nested too deeply, ...)         <message>`` (logged as ``row_unreadable``)
========================================== ==================================================

The definition is read by :meth:`protomolt_jobs.runs.stored_run.StoredRun.load`, the one loader
of a job's snapshot; its :class:`~protomolt_jobs.runs.stored_run.SnapshotError` is mapped here.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from protomolt_jobs import workflow as engine
from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.store.records import Lease
from protomolt_jobs.workflow.retry_scope import resolve as resolve_retry
from protomolt_jobs.workflow.types import CompiledWorkflow, Runtime

__all__ = ["ClaimedJob", "ClaimedRun", "RowError"]

log = logging.getLogger("protomolt_jobs.worker")


class RowError(ProtomoltJobsError):
    """The claimed row cannot be run: its job FAILS with ``detail`` on ``step``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step
        self.detail = detail


class ClaimedJob(Protocol):
    """A claimed row as the worker reads it (a ``JobRecord``, RUNNING under this worker's
    lease). Records from before a column existed may lack ``unreadable``,
    ``effect_intents`` or ``step_generations``: those are read with a default."""

    @property
    def job_id(self) -> uuid.UUID: ...

    @property
    def workflow_name(self) -> str: ...

    @property
    def workflow_definition(self) -> object: ...

    @property
    def input(self) -> object: ...

    @property
    def checkpoints(self) -> object: ...

    @property
    def attempt(self) -> int: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def lease(self) -> Lease: ...


@dataclass(frozen=True)
class ClaimedRun:
    """A claimed row, read.

    :ivar stored: the definition (``stored.definition``, the JSON object) and its parsed
        workflow (``stored.workflow``).
    :ivar message: the input, parsed against the workflow's input type.
    :ivar prior: checkpoint entries stored before this segment.
    :ivar target: the target of the next unexecuted step (its permit), None when every step
        is checkpointed, the step is external, or the workflow is a graph.
    """

    stored: StoredRun
    message: Any
    prior: list[dict[str, Any]]
    target: str | None

    @property
    def workflow(self) -> CompiledWorkflow:
        """The parsed, verified workflow."""
        return self.stored.workflow

    @classmethod
    def read(cls, job: ClaimedJob, runtime: Runtime) -> ClaimedRun:
        """Read ``job``'s row against ``runtime``'s type pool.

        :raises RowError: for anything wrong with the row's content (module docstring).
        """
        unreadable = getattr(job, "unreadable", None)
        if unreadable:
            raise RowError("", f"WORKFLOW: stored row is not readable JSON: {unreadable}")
        try:
            stored = StoredRun.load(job, runtime, verified=True)
            message = _parse_input(job, stored.workflow)
            prior = _prior(job)
            n_steps = len(stored.workflow.steps)
            # a retry-step's marked entries: the segment replays only the resolved prefix
            resolved = resolve_retry(stored.workflow, prior)
            n_done = len(resolved.prior) if resolved is not None else len(prior)
            target = engine.next_target(stored.workflow, n_done) if n_done < n_steps else None
        except RowError:
            raise
        except SnapshotError as exc:
            if isinstance(exc.__cause__, RecursionError):
                raise _surprise(job, exc.__cause__) from exc
            raise RowError(exc.step, _snapshot_text(exc)) from exc
        except Exception as exc:  # an odd row fails its job, not the loop
            raise _surprise(job, exc) from exc
        return cls(stored, message, prior, target)


def _snapshot_text(exc: SnapshotError) -> str:
    match exc.kind:
        case "unreadable":
            return f"WORKFLOW: stored workflow definition is not readable JSON: {exc.detail}"
        case "not-object":
            return "WORKFLOW: stored workflow definition is not a JSON object"
        case "parse":
            where = f" (step '{exc.step}')" if exc.step else ""
            return f"WORKFLOW: stored workflow does not parse{where}: {exc.detail}"
        case "verify":
            return f"WORKFLOW: stored workflow does not verify {exc.detail}"
        case _:
            return f"WORKFLOW: stored workflow cannot be used ({exc.kind}): {exc.detail}"


def _surprise(job: ClaimedJob, exc: BaseException) -> RowError:
    # Only the row's content differs between jobs here: whatever it raised fails the job.
    log.warning(
        "reading the claimed row raised",
        exc_info=exc,
        extra={"action": "row_unreadable", "job_id": str(job.job_id)},
    )
    return RowError("", f"WORKFLOW: stored row could not be read: {type(exc).__name__}: {exc}")


def _parse_input(job: ClaimedJob, workflow: CompiledWorkflow) -> Any:
    type_name = workflow.input_type.full_name
    raw = job.input
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise RowError(
                "", f"MAPPING: stored input is not valid proto3 JSON for {type_name}: {exc}"
            ) from exc
    try:
        return engine.parse_input(workflow, raw)
    except engine.WorkflowParseError as exc:
        # parse_input says "'input' is not valid proto3 JSON for <type>: <reason>"; the
        # stored form names the input once, as the reference does.
        said = f"'input' is not valid proto3 JSON for {type_name}: "
        reason = _message(exc).removeprefix(said)
        raise RowError(
            "", f"MAPPING: stored input is not valid proto3 JSON for {type_name}: {reason}"
        ) from exc


def _prior(job: ClaimedJob) -> list[dict[str, Any]]:
    prior = job.checkpoints
    if prior is None:
        return []
    if not isinstance(prior, list):
        raise RowError("", "WORKFLOW: stored checkpoints are not an array")
    return prior


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return str(message) if message is not None else str(exc)
