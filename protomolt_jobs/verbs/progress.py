"""``report-progress`` (issue 28 item 2; docs/verbs.md "report-progress"): a step that cannot
be chunked reports its own progress from inside its call.

``{token, percent?, details?, state?}``: ``token`` is the ``protomolt-progress-token`` metadata
of the step call (a ``reportsProgress`` step's; store/progress_token.py), which names the run,
the step, its iteration and the attempt's lease, and carries the call's fingerprints, stored
with the report (so its state is checked on resume as a chunk's). Each report is ONE fenced write
(``job_progress``, never a boundary write: a pending request is told, not applied) that also
extends the lease. The answer is ``{answer}``:

- ``continue``: go on;
- ``pause_requested``: an operator's pause is pending; a step that is also ``resumable``
  returns early with ``done`` false and its state, which the engine saves as the step's
  progress checkpoint (the pause lands there). A step that is not ``resumable`` is never told
  of a pause (it is answered ``continue``; the pause lands at the step's checkpoint);
- ``cancel_requested``: a cancel is pending; the service may stop (its answer or failure ends
  the step; the cancel lands at the next write of the run);
- ``lease_lost``: the token's attempt no longer holds the run (an earlier attempt, a lease
  moved by the sweeper, a run already paused, cancelled or finished): nothing was stored.

Scope ``job-complete`` (the scope of a service answering its own step, as ``complete-step``):
the token alone fences the write to one step of one attempt of one run (its mac: a holder
that rewrites any field matches no row), and the node's caller check
applies as to every verb.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from protomolt_jobs.errors import LeaseLost
from protomolt_jobs.input_rules import check_json
from protomolt_jobs.store.progress import ProgressReport
from protomolt_jobs.store.progress_token import ProgressToken
from protomolt_jobs.verbs.base import VERBS_LOGGER, JobsBackend, JobVerb, invalid, require_string

__all__ = ["ANSWERS", "MAX_DETAILS", "MAX_STATE_BYTES", "ReportProgressAction"]

log = logging.getLogger(VERBS_LOGGER)

#: Every answer of report-progress.
ANSWERS = ("continue", "pause_requested", "cancel_requested", "lease_lost")
#: Longest ``details`` accepted (characters).
MAX_DETAILS = 1000
#: Largest ``state`` accepted (bytes of its JSON).
MAX_STATE_BYTES = 1 << 20


class ReportProgressAction(JobVerb):
    """``report-progress`` (scope ``job-complete``): one progress report of a running step."""

    name = "report-progress"
    scope = "job-complete"
    description = (
        "Report the progress of a running step from inside its call ('token': the call's "
        "protomolt-progress-token metadata, optional 'percent' 0..100, 'details', 'state'); "
        "answers continue, pause_requested, cancel_requested or lease_lost."
    )
    fields = ("token", "percent", "details", "state")

    def __init__(self, backend: JobsBackend) -> None:
        super().__init__(backend)
        self.input_schema = {
            "type": "object",
            "properties": {
                "token": {"type": "string", "description": "the step call's progress token"},
                "percent": {"type": "number", "minimum": 0, "maximum": 100},
                "details": {"type": "string", "maxLength": MAX_DETAILS},
                "state": {"description": "the state to continue from (any JSON value)"},
            },
            "required": ["token"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """:returns: ``{answer}``, one of :data:`ANSWERS`.

        :raises Unavailable: no database configured.
        :raises InvalidInput: naming the field: ``token`` missing, empty or not a token this
            node issues; ``percent`` not a number within 0..100; ``details`` not text or
            longer than :data:`MAX_DETAILS`; ``state`` larger than :data:`MAX_STATE_BYTES` or holding what JSON or ``jsonb``
            cannot (NaN, an infinity, a NUL character, nesting past the limit);
            an unknown field.
        """
        store, _ = self._accept(input)
        text = input.get("token")
        if text is not None and not isinstance(text, str):
            raise invalid("token", "Field 'token' must be a string")
        try:
            token = ProgressToken.decode(text)
        except ValueError as exc:
            raise invalid("token", str(exc)) from None
        percent = input.get("percent")
        if percent is not None and (
            isinstance(percent, bool) or not isinstance(percent, (int, float))
        ):
            raise invalid("percent", "Field 'percent' must be a number from 0 to 100")
        details = require_string(input, "details") if "details" in input else ""
        if len(details) > MAX_DETAILS:
            raise invalid("details", f"Field 'details' is longer than {MAX_DETAILS} characters")
        state = input.get("state")
        if state is not None:
            check_json("state", state)  # NaN, an infinity, NUL: jsonb cannot hold them
        if state is not None and len(json.dumps(state)) > MAX_STATE_BYTES:
            raise invalid("state", f"Field 'state' is larger than {MAX_STATE_BYTES} bytes")
        report = ProgressReport(
            step=token.step,
            iteration=token.iteration,
            percent=percent,
            details=details,
            state=state,
            # the call's fingerprints, carried by its token: a state saved only by reports is
            # checked on resume as a chunk's (docs/long-steps.md)
            adapter_version=token.adapter_version,
            input_sha256=token.input_sha256,
            definition_sha256=token.definition_sha256,
            descriptor_sha256=token.descriptor_sha256,
        )
        try:
            answer = store.job_report_live(
                token.lease, self.backend.lease_s, report, (token.bound, token.mac)
            )
        except LeaseLost:
            answer = "lease_lost"
        except (ValueError, TypeError) as exc:
            field = str(exc).split(":", 1)[0]
            raise invalid(field if field in self.fields else "token", str(exc)) from None
        if answer == "pause_requested" and not token.resumable:
            answer = "continue"  # the pause lands at the step's checkpoint
        log.debug(
            "progress reported",
            extra={
                "action": "report_progress",
                "job_id": str(token.lease.job_id),
                "step": token.step,
                "answer": answer,
            },
        )
        return {"answer": answer}
