"""The engine's two verbs: ``run-workflow`` (synchronous run) and ``check-workflow`` (verify).

Both follow the host's ``Action`` shape (``hooks/contract.py``): ``name``, ``description``,
``scope``, ``input_schema``, ``execute(input) -> dict``. Malformed input (wrong JSON types)
raises :class:`~protomolt_jobs.errors.InvalidInput` naming the field; a workflow that is not
found, does not parse, does not verify or fails while running is an answer with ``ok: false``
(reference 2.5 and 3.10).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from protomolt_jobs.errors import InternalError, InvalidInput
from protomolt_jobs.input_rules import check_json, invalid, proto_json_path
from protomolt_jobs.runs import retention
from protomolt_jobs.runs.scheduling import FieldError
from protomolt_jobs.verbs.base import Verb, only_known
from protomolt_jobs.workflow import (
    Runtime,
    WorkflowExecutionError,
    WorkflowParseError,
    check,
    keys,
    loops,
    parse_input,
    parse_workflow,
    run,
    verify,
)
from protomolt_jobs.workflow.envelope import MAX_GRAPH_STEPS
from protomolt_jobs.workflow.floors import Floor
from protomolt_jobs.workflow.floors import findings as floor_findings
from protomolt_jobs.workflow.graph import simulate
from protomolt_jobs.workflow.loop_exits import loop_exits

__all__ = ["NO_REPOSITORY", "CheckWorkflowAction", "RunWorkflowAction"]

log = logging.getLogger("protomolt_jobs.workflow")

NO_REPOSITORY = (
    "No workflow repository is mounted; run with an inline 'workflow' or start a server with "
    "a registry"
)


class _Repository(Protocol):
    def workflow(self, name: str) -> dict[str, Any] | None: ...


def _require_object(input: Any, verb: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(input, dict):
        raise InvalidInput("the input must be a JSON object", {"field": ""})
    only_known(verb, input, known)
    return input


def _resolve(
    input: dict[str, Any], repository: _Repository | None
) -> tuple[Any, dict[str, Any] | None]:
    """``(definition, None)`` or ``(None, ok:false answer)``; inline ``workflow`` wins."""
    if "workflow" in input and input["workflow"] is not None:
        return input["workflow"], None
    name = input.get("workflowName")
    if name is None:
        raise InvalidInput(
            "one of 'workflow' (an object) or 'workflowName' (a string) is required",
            {"field": "workflow"},
        )
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("'workflowName' must be a non-empty string", {"field": "workflowName"})
    if repository is None:
        return None, {"ok": False, "error": NO_REPOSITORY}
    try:
        definition = repository.workflow(name)
    except Exception as exc:  # a stored definition that cannot be read is an answer, not a crash
        log.warning(
            "stored workflow unreadable",
            exc_info=True,
            extra={"action": "stored_workflow_unreadable", "workflow_name": name},
        )
        return None, {"ok": False, "error": f"stored workflow '{name}' cannot be read: {exc}"}
    if definition is None:
        return None, {"ok": False, "error": f"No stored workflow named '{name}'"}
    return definition, None


class RunWorkflowAction(Verb):
    """``run-workflow``: run a workflow synchronously and answer with its output.

    Input ``{"workflow": {...} | "workflowName": "...", "input": {...}}``; answer
    ``{"ok": true, "outputType", "output", "steps": [{"name", "skipped"}]}`` or
    ``{"ok": false, "failedStep"?, "error"}``. A workflow with an unknown key is
    ``invalid-input``, as at submit.
    """

    name = "run-workflow"
    description = (
        "Run a descriptor-first workflow synchronously over gRPC and return its output; give an "
        "inline 'workflow' or a stored 'workflowName', and the 'input' object."
    )
    scope = "workflow-run"
    fields = ("workflow", "workflowName", "input")

    def __init__(
        self,
        runtime: Runtime,
        repository: _Repository | None = None,
        floors: tuple[Floor, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.repository = repository
        self.floors = tuple(floors)
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflow": {"type": "object", "description": "the workflow envelope"},
                "workflowName": {"type": "string", "description": "a stored workflow's name"},
                "input": {"type": "object", "description": "proto3 JSON of the input type"},
            },
            "required": ["input"],
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Run the workflow.

        :raises InvalidInput: the input is not an object, ``workflow`` is not an object,
            ``workflowName`` is not a string, ``input`` is not an object or not proto3 JSON of
            the input type (an unknown field included: ``details.path`` names it); a step
            weaker than a node policy floor that selects it (``weakens_policy``); a field
            other than ``workflow``, ``workflowName``, ``input``; the workflow holds a key its
            objects do not know (``details.field`` is ``workflow``, or ``workflowName`` for a
            stored one; ``details.path`` the first key's path, e.g. ``steps[1].maxAtempts``).
        :raises InternalError: the engine failed unexpectedly.
        """
        input = _require_object(input, self.name, self.fields)
        if "input" not in input or not isinstance(input.get("input"), dict):
            raise InvalidInput("'input' must be a JSON object", {"field": "input"})
        # The rule submit-workflow applies (input_rules): no NaN or infinite numbers, no
        # integers beyond 2**53, no NUL or lone surrogates, no nesting past the limit.
        check_json("input", input["input"])
        definition, refusal = _resolve(input, self.repository)
        if refusal is not None:
            return refusal
        if not isinstance(definition, dict):
            raise InvalidInput("'workflow' must be a JSON object", {"field": "workflow"})
        refused = keys.refusal(definition)
        if refused is not None:
            # As submit-workflow: a misspelt key is refused naming it, never silently dropped.
            unknown, said = refused
            if "workflow" in input and input["workflow"] is not None:
                raise invalid("workflow", f"the workflow has {said}", unknown.path)
            raise invalid(
                "workflowName",
                f"stored workflow '{input.get('workflowName')}' has {said}",
                unknown.path,
            )
        try:
            workflow = parse_workflow(definition, self.runtime)
        except WorkflowParseError as exc:
            return {"ok": False, "failedStep": exc.step, "error": exc.message}
        findings = verify(workflow)
        if findings:
            first = findings[0]
            plural = "finding" if len(findings) == 1 else "findings"
            return {
                "ok": False,
                "failedStep": first.step,
                "error": f"workflow does not verify ({len(findings)} {plural}); first: "
                f"[{first.kind}] {first.error}",
            }
        weakened = floor_findings(workflow, self.floors) if self.floors else []
        if weakened:
            # As submit-workflow: a step a node policy floor selects runs only behind a gate
            # at least as strict (this verb cannot park, so such a workflow never runs here).
            first = weakened[0]
            source = "workflow" if input.get("workflow") is not None else "workflowName"
            raise invalid(
                source,
                f"weakens_policy: the workflow weakens the node's policy ({len(weakened)} "
                f"finding{'s' if len(weakened) > 1 else ''}); first: step '{first.step}': "
                f"{first.error}",
            )
        try:
            # Strict, as submit-workflow: a misspelt field is refused naming it, not dropped.
            message = parse_input(workflow, input["input"], ignore_unknown_fields=False)
        except WorkflowParseError as exc:
            said = exc.message.split(": ", 1)[1] if ": " in exc.message else exc.message
            raise invalid("input", exc.message, proto_json_path(said)) from None
        try:
            result = run(workflow, message, runtime=self.runtime)
        except WorkflowExecutionError as exc:
            failed: dict[str, Any] = {"ok": False, "failedStep": exc.step, "error": exc.message}
            if exc.report is not None:
                failed["report"] = exc.report
            return failed
        except Exception as exc:  # the verb answers with an error, never a 500
            log.exception(
                "run-workflow failed",
                extra={"action": "run_workflow_crashed", "workflow_name": workflow.name},
            )
            raise InternalError(f"run-workflow failed: {type(exc).__name__}") from exc
        answer: dict[str, Any] = {
            "ok": True,
            "outputType": result.output_type,
            "output": result.output_json,
            "steps": result.steps,
        }
        if result.report is not None:
            answer["report"] = result.report  # graph workflows: the final report
        return answer


class CheckWorkflowAction(Verb):
    """``check-workflow``: parse and verify a workflow without running it.

    Input ``{"workflow": {...}}`` (or ``{"workflowName": "..."}``); answer
    ``{"ok": <no findings>, "findings": [{"step", "kind", "error"}]}``. Any JSON value given as
    ``workflow`` gets findings, never an error; each key the definition's objects do not know
    is a finding of kind ``unknown-key`` naming its path and the closest known key; a step
    weaker than a node policy floor that selects it is a finding of kind ``weakens_policy``
    naming the rule (``workflow/floors.py``); a ``retention`` that is malformed or outside the
    node's bounds is a finding of kind ``retention`` naming the field and the bound
    (``runs/retention.py``). The registry's PUT runs this verb, so such a definition is
    refused there (422) with the same findings. A definition with a ``retention`` key also
    gets ``retention`` in the answer: the effective retention of its runs per final status (``{"completed":
    {"seconds", "source": "workflow" | "node"}, ...}``, ``seconds`` None when kept).

    :param floors: the node's policy floors (none: nothing to weaken).
    :param retention_bounds: the node's bounds on ``retention`` (None: any positive duration).
    :param run_retention_s: the node's ``jobs.run_retention_seconds`` (the statuses a
        workflow leaves out).
    """

    name = "check-workflow"
    description = (
        "Statically check a workflow envelope (schema, methods, mapping rules, CEL, gates) and "
        "list its findings without calling anything."
    )
    scope = "schema-read"
    fields = ("workflow", "workflowName", "simulate")

    def __init__(
        self,
        runtime: Runtime,
        repository: _Repository | None = None,
        floors: tuple[Floor, ...] = (),
        retention_bounds: retention.Bounds | None = None,
        run_retention_s: float = 0.0,
    ) -> None:
        self.runtime = runtime
        self.repository = repository
        self.floors = tuple(floors)
        self.retention_bounds = retention_bounds
        self.run_retention_s = run_retention_s
        self.input_schema = {
            "type": "object",
            "properties": {
                "workflow": {"type": "object", "description": "the workflow envelope"},
                "workflowName": {"type": "string", "description": "a stored workflow's name"},
                "simulate": {
                    "type": "boolean",
                    "description": "also say, for every step, what runs, what is skipped and "
                    "how the run ends if that step fails",
                },
            },
            "additionalProperties": False,
        }

    def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        """Check the workflow; with ``"simulate": true`` a workflow without findings also gets
        ``"simulation": {"allSucceed": {...}, "ifFails": [{"step", "runs", "skipped",
        "notRun", "compensates", "status", "criterion"}], "truncated"?: {"played", "of",
        "reason"}}`` (see ``graph.simulate``: at most 1024 failure paths and 2 s of this
        thread's CPU). A workflow that declares a ``loop`` also gets ``"worstCase":
        {"executions", "calls", "cost", "loops"}`` (``loops.worst_case``; in ``simulation``
        too) and, simulated, ``simulation.loopExits`` (``loop_exits.loop_exits``: each loop
        left at each iteration, and exhausted; ``loopExitsTruncated`` when the caps cut it).

        :raises InvalidInput: the input is not an object, ``workflowName`` is not a string, a
            field other than ``workflow``, ``workflowName``, ``simulate``.
        """
        input = _require_object(input, self.name, self.fields)
        simulated = input.get("simulate", False)
        if not isinstance(simulated, bool):
            raise InvalidInput("'simulate' must be a boolean", {"field": "simulate"})
        if "workflow" not in input and "workflowName" in input:
            definition, refusal = _resolve(input, self.repository)
            if refusal is not None:
                return {
                    "ok": False,
                    "findings": [{"step": "", "kind": "workflow", "error": refusal["error"]}],
                }
        else:
            definition = input.get("workflow")
        if definition is None:
            findings = [{"step": "", "kind": "workflow", "error": "'workflow' object is required"}]
        else:
            found = check(definition, self.runtime)
            if not found and self.floors:
                found = floor_findings(parse_workflow(definition, self.runtime), self.floors)
            findings = [f.to_json() for f in found]
            findings += self._retention_findings(definition)
        answer: dict[str, Any] = {"ok": not findings, "findings": findings}
        worst = _worst_case(definition, self.runtime)
        if worst is not None:
            answer["worstCase"] = worst
        if isinstance(definition, dict) and definition.get(retention.KEY) is not None:
            answer["retention"] = retention.effective(definition, self.run_retention_s)
        if simulated and not findings:
            compiled = parse_workflow(definition, self.runtime)
            if len(compiled.steps) > MAX_GRAPH_STEPS:
                raise InvalidInput(
                    f"'simulate' plays workflows of at most {MAX_GRAPH_STEPS} steps; this one "
                    f"has {len(compiled.steps)}",
                    {"field": "simulate"},
                )
            started_s = time.thread_time()
            answer["simulation"] = simulate(compiled)
            if worst is not None:
                answer["simulation"]["worstCase"] = worst
                # the loop exits share simulate's caps (paths and CPU)
                played = len(answer["simulation"]["ifFails"])
                answer["simulation"].update(
                    loop_exits(compiled, played=played, started_s=started_s)
                )
        return answer

    def _retention_findings(self, definition: Any) -> list[dict[str, Any]]:
        """The definition's ``retention``, malformed or outside the node's bounds, as one
        finding of kind ``retention`` naming the field and the bound."""
        if not isinstance(definition, dict) or definition.get(retention.KEY) is None:
            return []
        bounds = self.retention_bounds or retention.Bounds(0.0, float("inf"))
        try:
            retention.parse(definition, bounds)
        except FieldError as exc:
            return [{"step": "", "kind": retention.FINDING_KIND, "error": exc.message}]
        return []


def _worst_case(definition: Any, runtime: Any) -> dict[str, Any] | None:
    """``loops.worst_case`` of a definition that parses and declares a loop, else None."""
    if definition is None:
        return None
    try:
        compiled = parse_workflow(definition, runtime)
        return loops.worst_case(compiled) if compiled.loops else None
    except Exception:  # noqa: BLE001 - the findings already say why it does not parse
        return None
