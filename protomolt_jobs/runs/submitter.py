"""The submitter: turn a submission into a QUEUED job row, or an ``ok: false`` answer.

Checks run in the reference's order (upstream ``WorkflowRunSubmitter``):

1. resolve the definition: an inline ``workflow`` wins; else a non-blank ``workflow_name``
   through the :class:`~protomolt_jobs.hooks.contract.WorkflowRepository`;
2. the definition and the input must be JSON objects, and the definition may hold no key its
   objects do not know (the engine's ``keys``: an unknown key is ``invalid-input`` naming
   ``field`` ``workflow``, or ``workflowName`` for a stored one, and ``path``, the key's path
   in the definition; a typo never silently drops a setting);
3. parse the definition (the engine's ``parse_workflow``);
4. verify it (the engine's ``verify``), then hold it against the node's policy floors (a
   step weaker than a floor that selects it is ``invalid-input``, ``weakens_policy`` naming
   the rule: ``workflow/floors.py``);
5. check the input against the workflow's ``inputType`` (the engine's ``parse_input``);
6. resolve the scheduling fields and the budget (:mod:`~protomolt_jobs.runs.scheduling`): a
   submitted value that is malformed is ``invalid-input``, a workflow's own ``scheduling`` or
   ``budget`` that is malformed is ``invalid-definition``, both naming the field; then the
   workflow's ``retention`` (:mod:`~protomolt_jobs.runs.retention`): malformed or outside the
   node's bounds is ``invalid-input`` (``field`` ``workflow``/``workflowName``, ``path`` the
   key, the message naming the bound);
7. take the job id (a uuid) or mint a uuid4;
8. insert the row with the definition and the input snapshotted (``ON CONFLICT DO NOTHING``:
   a resubmission returns the stored row untouched; a live run holding the same ``dedupKey``
   is answered instead, with ``deduplicated``).

Failures in 1-6 are answers (:class:`SubmitOutcome` with ``ok`` false, a ``reason`` the
request consumer routes on, ``failed_step`` and ``error``), never exceptions. Store failures
propagate as :class:`~protomolt_jobs.errors.StoreError`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from protomolt_jobs.hooks.contract import WorkflowRepository
from protomolt_jobs.input_rules import proto_json_path
from protomolt_jobs.store.records import NewJob
from protomolt_jobs.telemetry import tracing

__all__ = ["REASONS", "SubmitOutcome", "Submitter", "parse_job_id"]

log = logging.getLogger("protomolt_jobs.submitter")

#: Every ``reason`` an ``ok: false`` outcome carries.
REASONS = frozenset(
    {
        "unknown-workflow",
        "no-repository",
        "corrupt-workflow",
        "invalid-definition",
        "invalid-input",
        "invalid-job-id",
    }
)

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def parse_job_id(raw: str) -> uuid.UUID | None:
    """The uuid in ``raw`` (surrounding blanks ignored; the 8-4-4-4-12 hex form, any
    version), or None when it is not one."""
    text = raw.strip()
    if not _UUID.match(text):
        return None
    return uuid.UUID(text)


@dataclasses.dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """The answer to one submission.

    :ivar ok: True when a row exists for ``job_id`` (created now or before).
    :ivar job_id: the stored row's id (None when not ok).
    :ivar status: the stored row's status (QUEUED when created; the existing status on an
        idempotent resubmit; None when not ok).
    :ivar created: True when this call inserted the row.
    :ivar failed_step: the step a definition problem belongs to ("" when none).
    :ivar error: why it was refused ("" when ok).
    :ivar reason: one of :data:`REASONS` when not ok, else None.
    :ivar deduplicated: True when ``job_id`` is an existing live run holding the submitted
        ``dedupKey`` (nothing was inserted).
    :ivar field: the field a refusal names ("" when none).
    :ivar path: the field inside ``field`` a refusal names (``txt`` for ``{"txt": ...}`` in
        ``input``; "" when none).
    """

    ok: bool
    job_id: str | None
    status: str | None
    created: bool = False
    failed_step: str = ""
    error: str = ""
    reason: str | None = None
    deduplicated: bool = False
    field: str = ""
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        """The ``submit-workflow`` envelope: ``{ok, jobId, status, deduplicated?}`` or
        ``{ok: false, failedStep?, error}``."""
        if self.ok:
            body_ok: dict[str, Any] = {"ok": True, "jobId": self.job_id, "status": self.status}
            if self.deduplicated:
                body_ok["deduplicated"] = True
            return body_ok
        body: dict[str, Any] = {"ok": False}
        if self.failed_step:
            body["failedStep"] = self.failed_step
        body["error"] = self.error
        return body


def _refuse(
    reason: str, error: str, failed_step: str = "", field: str = "", path: str = ""
) -> SubmitOutcome:
    return SubmitOutcome(
        ok=False,
        job_id=None,
        status=None,
        failed_step=failed_step or "",
        error=error,
        reason=reason,
        field=field,
        path=path,
    )


class Submitter:
    """Validates and inserts submissions (the ``submit-workflow`` verb and the request topic).

    :param store: a :class:`~protomolt_jobs.store.store.JobStore` (anything with ``job_insert``).
    :param repository: the stored workflows, or None when no registry is mounted.
    :param runtime: the engine's ``Runtime`` (type pool, channel factory).
    :param max_attempts: attempts stamped into each new row (positive).
    :param fairness_weights: fairness key -> weight (> 0); a key not listed weighs 1.
    :param floors: the node's policy floors (``workflow/floors.py``); a definition weaker
        than one is refused ``invalid-input`` (``weakens_policy``, naming the rule).
    :param retention_bounds: the node's bounds on a workflow's ``retention``
        (:class:`~protomolt_jobs.runs.retention.Bounds`); None: the defaults of ``JobsConfig``.
    :param run_retention_s: the node's ``jobs.run_retention_seconds``, stamped for the final
        statuses a workflow's ``retention`` object leaves out.
    :raises ValueError: ``max_attempts`` is not a positive integer.
    """

    def __init__(
        self,
        store: Any,
        repository: WorkflowRepository | None,
        runtime: Any,
        max_attempts: int,
        fairness_weights: Mapping[str, float] | None = None,
        floors: Sequence[Any] = (),
        retention_bounds: Any = None,
        run_retention_s: float = 0.0,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer; got {max_attempts!r}")
        self.store = store
        self.repository = repository
        self.runtime = runtime
        self.max_attempts = max_attempts
        self.fairness_weights = dict(fairness_weights or {})
        self.floors = tuple(floors)
        self.retention_bounds = retention_bounds
        self.run_retention_s = run_retention_s

    def _bounds(self) -> Any:
        if self.retention_bounds is not None:
            return self.retention_bounds
        from protomolt_jobs.config import JobsConfig
        from protomolt_jobs.runs.retention import Bounds

        return Bounds.of(JobsConfig())

    def submit(
        self,
        *,
        workflow: Any = None,
        workflow_name: str | None = None,
        input: Any = None,
        job_id: str | None = None,
        priority: Any = None,
        queue: Any = None,
        fairness_key: Any = None,
        dedup_key: Any = None,
        actor: str = "api",
        groups: Iterable[str] = (),
    ) -> SubmitOutcome:
        """Validate a submission and insert its row.

        :param workflow: an inline definition (a JSON object); wins over ``workflow_name``.
        :param workflow_name: a stored workflow's name.
        :param input: the workflow input (a JSON object, proto3 JSON of ``inputType``).
        :param job_id: the idempotency key (a uuid string); blank or None mints a uuid4.
        :param priority: 1 (highest) .. 5; None takes the workflow's default, else 3.
        :param queue: the queue; None takes the workflow's default, else ``default``.
        :param fairness_key: the fairness key; None takes the workflow's default, else
            ``default``.
        :param dedup_key: while a run with this key is not terminal, answer it instead of
            inserting; None takes the workflow's default, else no key.
        :param actor: who submits (the transition log's actor): an API principal, or
            ``kafka:<topic>`` for the request topic.
        :param groups: the submitting caller's groups (an identity hook's and ``[node.groups]``),
            recorded with the run (``submitted_groups``): grants by group match them.
        :returns: the outcome; never raises for bad input.
        :raises StoreError: the database failed.
        """
        from protomolt_jobs.workflow import keys
        from protomolt_jobs.workflow.envelope import parse_input, parse_workflow
        from protomolt_jobs.workflow.types import WorkflowParseError
        from protomolt_jobs.workflow.verifier import verify

        name = workflow_name.strip() if isinstance(workflow_name, str) else ""
        definition = workflow
        # 1. Resolve: inline wins; the name is looked up only without an inline definition.
        if definition is None and name:
            if self.repository is None:
                return _refuse(
                    "no-repository",
                    "No workflow repository is mounted; submit with an inline 'workflow' or "
                    "start a server with a registry",
                )
            try:
                definition = self.repository.workflow(name)
            except Exception as exc:  # noqa: BLE001 - any repository failure is "corrupt", loudly
                log.warning(
                    "stored workflow %s is not readable: %s",
                    name,
                    exc,
                    extra={"action": "stored_workflow_unreadable", "workflow_name": name},
                )
                return _refuse(
                    "corrupt-workflow", f"stored workflow '{name}' is not readable: {exc}"
                )
            if definition is None:
                return _refuse("unknown-workflow", f"No stored workflow named '{name}'")
        # 2. Both must be objects.
        if not isinstance(definition, dict) or not isinstance(input, dict):
            reason = "invalid-definition" if not isinstance(definition, dict) else "invalid-input"
            return _refuse(
                reason,
                "'workflow' (or 'workflowName') and 'input' objects are required",
                field="workflow" if reason == "invalid-definition" else "input",
            )
        # 2b. No unknown keys (a door's check: the worker never makes it, so a run stored
        # before a key became unknown keeps running).
        refused = keys.refusal(definition)
        if refused is not None:
            unknown, said = refused
            stored = name if workflow is None else ""
            whose = f"stored workflow '{stored}'" if stored else "the workflow"
            return _refuse(
                "invalid-input",
                f"{whose} has {said}",
                unknown.step,
                field="workflowName" if stored else "workflow",
                path=unknown.path,
            )
        # 3. Parse.
        try:
            compiled = parse_workflow(definition, self.runtime)
        except WorkflowParseError as exc:
            return _refuse("invalid-definition", exc.message, exc.step)
        # 4. Verify.
        findings = verify(compiled)
        if findings:
            first = findings[0]
            noun = "finding" if len(findings) == 1 else "findings"
            return _refuse(
                "invalid-definition",
                f"workflow does not verify ({len(findings)} {noun}); "
                f"first: [{first.kind}] {first.error}",
                first.step,
            )
        # 4b. The node's policy floors: a definition may only tighten them.
        if self.floors:
            from protomolt_jobs.workflow.floors import findings as floor_findings

            weakened = floor_findings(compiled, self.floors)
            if weakened:
                first = weakened[0]
                noun = "finding" if len(weakened) == 1 else "findings"
                return _refuse(
                    "invalid-input",
                    f"weakens_policy: the workflow weakens the node's policy ({len(weakened)} "
                    f"{noun}); first: step '{first.step}': {first.error}",
                    first.step,
                    field="workflowName" if workflow is None and name else "workflow",
                )
        # 5. The input against inputType.
        try:
            # Strict: a misspelt field ({"txt": ...} for "text") is refused, not dropped.
            parse_input(compiled, input, ignore_unknown_fields=False)
        except WorkflowParseError as exc:
            message = exc.message
            if not message.startswith("'input'"):
                message = (
                    f"'input' is not valid proto3 JSON for {compiled.input_type.full_name}: "
                    f"{message}"
                )
            # The parser's own words follow "...proto3 JSON for <type>: ".
            said = message.split(": ", 1)[1] if ": " in message else message
            return _refuse(
                "invalid-input", message, field="input", path=proto_json_path(said) or ""
            )
        # 6. Scheduling and budget.
        from protomolt_jobs.runs import scheduling

        submitted = {
            "priority": priority,
            "queue": queue,
            "fairnessKey": fairness_key,
            "dedupKey": dedup_key,
        }
        try:
            sched = scheduling.resolve(definition, submitted)
            budget = scheduling.parse_budget(definition, pause_supported=scheduling.PAUSE_SUPPORTED)
            scheduling.check_step_costs(definition)
        except scheduling.FieldError as exc:
            own = exc.field.startswith(("scheduling", "budget", "steps["))
            return _refuse(
                "invalid-definition" if own else "invalid-input", exc.message, field=exc.field
            )
        # 6b. The workflow's own retention, within the node's bounds (a definition without
        # the key costs one dict lookup and stores NULL: the node-wide setting applies).
        kept = None
        if definition.get("retention") is not None:
            from protomolt_jobs.runs import retention

            try:
                kept = retention.stamp(definition, self._bounds(), self.run_retention_s)
            except scheduling.FieldError as exc:
                stored = name if workflow is None else ""
                return _refuse(
                    "invalid-input",
                    f"stored workflow '{stored}': {exc.message}" if stored else exc.message,
                    field="workflowName" if stored else "workflow",
                    path=exc.field,
                )
        # 7. The job id, after the workflow checks (as the reference orders them).
        if job_id is None or (isinstance(job_id, str) and not job_id.strip()):
            key = uuid.uuid4()
        else:
            parsed = parse_job_id(job_id) if isinstance(job_id, str) else None
            if parsed is None:
                return _refuse(
                    "invalid-job-id", f"'jobId' must be a uuid; got '{job_id}'", field="jobId"
                )
            key = parsed
        # 8. Insert (idempotent on job_id; a live dedup key answers its run).
        declared = definition.get("name")
        stored_name: str = name or (
            declared if isinstance(declared, str) and declared.strip() else "inline"
        )
        outcome = self.store.job_insert(
            NewJob(
                job_id=key,
                workflow_name=stored_name,
                workflow_definition=definition,
                input=input,
                max_attempts=self.max_attempts,
                trace_context=tracing.submit_trace_context(key, stored_name),
                priority=sched.priority,
                queue=sched.queue,
                fairness_key=sched.fairness_key,
                fairness_weight=self.fairness_weights.get(sched.fairness_key, 1.0),
                dedup_key=sched.dedup_key,
                deadline_s=budget.deadline_s if budget is not None else None,
                actor=actor,
                groups=tuple(groups),
                retention=kept,
            )
        )
        job = outcome.job
        if outcome.created:
            log.info(
                "job %s accepted (%s)",
                job.job_id,
                job.workflow_name,
                extra={
                    "action": "job_submitted",
                    "job_id": str(job.job_id),
                    "workflow_name": job.workflow_name,
                },
            )
        return SubmitOutcome(
            ok=True,
            job_id=str(job.job_id),
            status=job.status,
            created=outcome.created,
            deduplicated=getattr(outcome, "deduplicated", False),
        )
