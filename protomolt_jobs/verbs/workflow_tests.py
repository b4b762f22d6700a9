"""``test-workflow``: run a definition's ``tests`` cases on the real engine, mocked, offline.

Input ``{"workflow": {...} | "workflowName": "...", "tests"?: [...]}``; ``tests`` given here
replaces the definition's own. Answer (``workflow/testing/suite.py``)::

    {"ok": <every case passed, and there is one>, "passed": n, "failed": n,
     "cases": [{"name", "passed", "difference"?, "step"?, "actual": {"status", "path",
                "calls", "skipped", "attempts", "clockMs", "error"?, "errorKind"?,
                "failedStep"?}}],
     "coverage": {"decisions", "failureEdges", "loopExits", "escalations"}}

A definition that does not parse or verify is an answer ``{"ok": false, "error"}`` (as
``run-workflow``); a definition without cases is ``{"ok": false, "error": "... no tests"}``.
No job is made and no network connection is opened: the engine's channels are the mock
transport's (``workflow/testing/transport.py``). A stored workflow tested by name with its own
tests (no ``tests`` in the request), on a repository that numbers versions
(``WorkflowVersions``), has the answer recorded as that version's last test result, by the
caller (``via: "test-workflow"``) when the caller also holds ``workflow-write`` (a caller with
``schema-read`` alone gets the answer, and nothing is recorded); the registry's PUT runs this
verb too and records its own. The scope is ``check-workflow``'s,
``schema-read``: it runs the definition against mocks only.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from protomolt_jobs.errors import InternalError, InvalidInput
from protomolt_jobs.hooks.contract import WorkflowVersions, current_holds
from protomolt_jobs.input_rules import check_json, invalid
from protomolt_jobs.verbs.base import Verb, actor, only_known
from protomolt_jobs.workflow import Runtime, WorkflowParseError, keys, parse_workflow, verify
from protomolt_jobs.workflow.testing.cases import CaseError, parse_cases
from protomolt_jobs.workflow.testing.suite import run_tests

__all__ = ["NO_TESTS", "TestWorkflowAction"]

log = logging.getLogger("protomolt_jobs.workflow")

NO_TESTS = "the workflow has no tests: give 'tests' in the definition or in the request"


class _Repository(Protocol):
    def workflow(self, name: str) -> dict[str, Any] | None: ...


class TestWorkflowAction(Verb):
    """``test-workflow`` (module docstring).

    :param runtime: the role's runtime: only its type ``pool`` is used (the channels are the
        mock transport's).
    :param repository: the node's stored workflows (``workflowName``), or None.
    :param max_attempts: ``jobs.max_attempts``, the attempts a case's run gets.
    :param backoff_base_s: ``jobs.backoff_base_seconds``, the virtual clock's retry backoff.
    """

    __test__ = False  # not a pytest class
    name = "test-workflow"
    description = (
        "Run a workflow definition's tests (named cases of input, mocked step answers, events "
        "and expectations) on the real engine with mocked steps, a virtual clock and no network."
    )
    scope = "schema-read"
    fields = ("workflow", "workflowName", "tests")

    def __init__(
        self,
        runtime: Runtime,
        repository: _Repository | None = None,
        *,
        max_attempts: int = 3,
        backoff_base_s: float = 5.0,
    ) -> None:
        self.runtime = runtime
        self.repository = repository
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflow": {"type": "object", "description": "the workflow envelope"},
                "workflowName": {"type": "string", "description": "a stored workflow's name"},
                "tests": {
                    "type": "array",
                    "description": "test cases to run instead of the definition's own",
                },
            },
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Run the cases.

        :raises InvalidInput: the input is not an object; a field other than ``workflow``,
            ``workflowName``, ``tests``; neither ``workflow`` nor ``workflowName``; ``workflow``
            not an object or ``workflowName`` not a non-empty string; the definition holds an
            unknown key (``details.path`` names it); ``tests`` (given here, field ``tests``, or
            in the definition, field ``workflow``) is not a list of cases: ``details.path``
            names the first error (``tests[0].mocks.charge[1].response``: a mock that is not
            proto3 JSON of the step's output type).
        :raises InternalError: the engine failed unexpectedly.
        """
        if not isinstance(input, dict):
            raise InvalidInput("the input must be a JSON object", {"field": ""})
        only_known(self.name, input, self.fields)
        definition, source, answer, version = self._definition(input)
        if answer is not None:
            return answer
        result = self._test(input, definition, source)
        if version is not None and input.get("tests") is None and current_holds("workflow-write"):
            # recording changes what get-workflow shows: only a caller who may store the
            # workflow may record its result (a schema-read caller gets the answer only)
            self._record(input["workflowName"], version, result)
        return result

    def _record(self, name: str, version: int, result: dict[str, Any]) -> None:
        """A stored workflow tested by name with its own tests: the result becomes its
        version's ``lastTest`` (by the caller, via ``test-workflow``)."""
        if isinstance(self.repository, WorkflowVersions):
            try:
                self.repository.record_test(name, version, result, by=actor(), via=self.name)
            except Exception:  # the answer stands; the record is a convenience
                log.warning(
                    "could not record the test result",
                    exc_info=True,
                    extra={"action": "test_result_unrecorded", "workflow_name": name},
                )

    def _test(self, input: dict[str, Any], definition: Any, source: str) -> dict[str, Any]:
        refused = keys.refusal(definition)
        if refused is not None:
            unknown, said = refused
            raise invalid(source, f"the workflow has {said}", unknown.path)
        try:
            workflow = parse_workflow(definition, self.runtime)
        except WorkflowParseError as exc:
            return {"ok": False, "failedStep": exc.step, "error": exc.message}
        findings = verify(workflow)
        if findings:
            first = findings[0]
            return {
                "ok": False,
                "failedStep": first.step,
                "error": f"workflow does not verify; first: [{first.kind}] {first.error}",
            }
        if input.get("tests") is not None:
            check_json("tests", input["tests"])
            raw, field = input["tests"], "tests"
        else:
            raw, field = definition.get("tests"), source
        if raw is None or raw == []:
            return {"ok": False, "error": NO_TESTS}
        try:
            cases = parse_cases(workflow, raw)
        except CaseError as exc:
            raise invalid(field, exc.message, exc.path) from None
        try:
            return run_tests(
                workflow,
                cases,
                pool=self.runtime.pool,
                max_attempts=self.max_attempts,
                backoff_base_s=self.backoff_base_s,
            )
        except Exception as exc:  # the verb answers with an error, never a 500
            log.exception(
                "test-workflow failed",
                extra={"action": "test_workflow_crashed", "workflow_name": workflow.name},
            )
            raise InternalError(f"test-workflow failed: {type(exc).__name__}") from exc

    def _definition(
        self, input: dict[str, Any]
    ) -> tuple[Any, str, dict[str, Any] | None, int | None]:
        """``(definition, field, None, version)`` (``version``: the stored version read by
        name, when the repository numbers them), or ``(None, "", answer, None)`` when there
        is nothing to test (no repository, no such stored workflow, an unreadable one)."""
        version = None
        if input.get("workflow") is not None:
            definition = input["workflow"]
            if not isinstance(definition, dict):
                raise InvalidInput("'workflow' must be a JSON object", {"field": "workflow"})
            check_json("workflow", definition)
            return definition, "workflow", None, None
        name = input.get("workflowName")
        if name is None:
            raise InvalidInput(
                "one of 'workflow' (an object) or 'workflowName' (a string) is required",
                {"field": "workflow"},
            )
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(
                "'workflowName' must be a non-empty string", {"field": "workflowName"}
            )
        if self.repository is None:
            return None, "", {"ok": False, "error": "No workflow repository is mounted"}, None
        try:
            if isinstance(self.repository, WorkflowVersions):
                stored = self.repository.stored(name)
                definition = stored["definition"] if stored is not None else None
                version = stored["version"] if stored is not None else None
            else:
                definition = self.repository.workflow(name)
        except Exception as exc:  # a stored definition that cannot be read is an answer
            log.warning(
                "stored workflow unreadable",
                exc_info=True,
                extra={"action": "stored_workflow_unreadable", "workflow_name": name},
            )
            error = f"stored workflow '{name}' cannot be read: {exc}"
            return None, "", {"ok": False, "error": error}, None
        if definition is None:
            return None, "", {"ok": False, "error": f"No stored workflow named '{name}'"}, None
        return definition, "workflowName", None, version
