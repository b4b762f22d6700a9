"""``submit-workflow``: queue a workflow run as a durable job.

Deliberate differences from the reference (DESIGN.md section 4, ``docs/verbs.md``):

- exactly one definition source, enforced with the CEL rule :data:`SOURCE_RULE` on
  ``{workflow?, workflow_name}``; breaking it is ``invalid-input``;
- a missing or non-object ``input`` and a malformed ``jobId`` are ``invalid-input`` too, and so
  is an input that is not proto3 JSON of the workflow's input type: never ``ok: false``.
"""

from __future__ import annotations

from typing import Any

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.hooks.contract import current_groups
from protomolt_jobs.input_rules import invalid as invalid_at
from protomolt_jobs.runs import scheduling
from protomolt_jobs.verbs.base import (
    JobsBackend,
    JobVerb,
    actor,
    as_integer,
    as_job_id,
    invalid,
    optional_object,
    optional_string,
    require_object,
)
from protomolt_jobs.workflow import celenv

__all__ = ["SOURCE_RULE", "SubmitWorkflowAction"]

#: ``submit-workflow``: exactly one definition source (CEL over ``{workflow?, workflow_name}``).
SOURCE_RULE = "has(this.workflow) != (this.workflow_name != '')"


class SubmitWorkflowAction(JobVerb):
    """``submit-workflow`` (scope ``workflow-run``): queue a workflow run as a durable job."""

    name = "submit-workflow"
    scope = "workflow-run"
    description = (
        "Queue a workflow run as a durable job: give either an inline 'workflow' or a stored "
        "'workflowName' (exactly one), its 'input', and optionally a 'jobId' (uuid) that makes "
        "the submission idempotent, a 'priority' (1 highest .. 5, default 3), a 'queue', a "
        "'fairnessKey' and a 'dedupKey' (while a run with that key is live, its id is "
        "answered with deduplicated: true); answers the job id and status."
    )
    fields = (
        "workflow",
        "workflowName",
        "input",
        "jobId",
        "priority",
        "queue",
        "fairnessKey",
        "dedupKey",
    )

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflow": {
                    "type": "object",
                    "description": "An inline workflow definition (the run-workflow envelope).",
                },
                "workflowName": {
                    "type": "string",
                    "description": "The name of a workflow stored in the registry.",
                },
                "input": {"type": "object", "description": "Proto3 JSON of the inputType."},
                "jobId": {
                    "type": "string",
                    "format": "uuid",
                    "description": "Idempotency key; a uuid4 is minted when absent.",
                },
                "priority": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 5,
                    "description": "1 (highest) .. 5; default: the workflow's, else 3.",
                },
                "queue": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "Resource class; default: the workflow's, else 'default'.",
                },
                "fairnessKey": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "Tenant or project runs are interleaved across; default: "
                    "the workflow's, else 'default'.",
                },
                "dedupKey": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "While a run with this key is not terminal, submitting "
                    "again answers that run (deduplicated: true).",
                },
            },
            "required": ["input"],
            "additionalProperties": False,
            "x-cel-rules": [{"id": "exactly-one-source", "expression": SOURCE_RULE}],
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Validate the envelope, then hand it to the submitter.

        :returns: ``{ok: true, jobId, status}`` or ``{ok: false, failedStep?, error}``.
        :raises Unavailable: no database configured (or the role is not running).
        :raises InvalidInput: a field is missing, mistyped, unknown, or the source rule fails.
        """
        _, submitter = self._accept(input)
        workflow = optional_object(input, "workflow")
        workflow_name = optional_string(input, "workflowName")
        payload = require_object(input, "input")
        raw_job_id = optional_string(input, "jobId")
        sched = _scheduling_fields(input)
        _check_source_rule(workflow, workflow_name)
        job_id = None
        if raw_job_id is not None and raw_job_id.strip():
            job_id = str(as_job_id(raw_job_id))
        outcome = submitter.submit(
            workflow=workflow,
            workflow_name=workflow_name,
            input=payload,
            job_id=job_id,
            actor=actor(),
            groups=sorted(current_groups()),
            **sched,
        )
        if outcome.reason in ("invalid-input", "invalid-job-id"):
            # Bad input is an error on every door (the request topic keeps a reject row with
            # the same reason): an input that is not proto3 JSON of the inputType, a misspelt
            # field ({"txt": ...} for "text") included, never an ok: false answer.
            raise invalid_at(outcome.field or "input", outcome.error, outcome.path)
        return outcome.to_json()


def _scheduling_fields(input: dict[str, Any]) -> dict[str, Any]:
    """``priority``, ``queue``, ``fairnessKey``, ``dedupKey`` as the submitter's keywords
    (None when absent); a malformed one is invalid-input naming it."""
    out: dict[str, Any] = {}
    try:
        raw = input.get("priority")
        if raw is not None and (isinstance(raw, str) or as_integer(raw) is None):
            raise scheduling.FieldError(
                "priority", f"'priority' must be an integer from 1 (highest) to 5; got {raw!r}"
            )
        out["priority"] = None if raw is None else scheduling.parse_priority("priority", raw)
        for field, keyword in (
            ("queue", "queue"),
            ("fairnessKey", "fairness_key"),
            ("dedupKey", "dedup_key"),
        ):
            value = input.get(field)
            out[keyword] = None if value is None else scheduling.parse_name(field, value)
    except scheduling.FieldError as exc:
        raise invalid(exc.field, exc.message) from None
    return out


def _check_source_rule(workflow: dict[str, Any] | None, workflow_name: str | None) -> None:
    # Only presence matters to the rule: an empty object stands in for the definition, so
    # no user payload is converted to CEL values.
    this: dict[str, Any] = {"workflow_name": (workflow_name or "").strip()}
    if workflow is not None:
        this["workflow"] = {}
    verdict = celenv.program(SOURCE_RULE).evaluate({"this": celenv.to_cel(this)})
    if not bool(verdict):
        given = "both" if workflow is not None else "neither"
        raise InvalidInput(
            f"rule exactly-one-source ({SOURCE_RULE}) failed: give exactly one of 'workflow' "
            f"and 'workflowName' (got {given})",
            {"rule": SOURCE_RULE, "fields": ["workflow", "workflowName"]},
        )
