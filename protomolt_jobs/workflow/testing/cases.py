"""The ``tests`` key of a workflow definition: its cases, read and checked against the workflow.

Shape (docs/workflows.md *Tests in the definition*)::

    "tests": [{
      "name": "retried once",
      "input": {...},                               # proto3 JSON of the input type
      "mocks": {"charge": [                          # per step: one item, or a sequence
          {"status": {"code": "UNAVAILABLE", "message": "down"}},
          {"response": {...}, "delayMs": 20}],       # proto3 JSON of the step's output type
        "review": [{"votes": [{"principal": "alice", "decision": "accept"}]}]},
      "events": [{"after": "charge", "crash": "after_checkpoint"},
                 {"advanceMs": 60000}, {"after": "ship", "action": "pause"},
                 {"action": "resume"}],
      "expect": {"status": "COMPLETED", "path": ["reserve", "charge"],
                 "calls": {"charge": 2}, "skipped": {"refund": ""}, "errorKind": "GRPC"}}]

:func:`parse_cases` reads the JSON into :class:`Case` values, raising :class:`CaseError` with the
path of the first thing wrong (``tests[1].mocks.charge[0].response.amount``: a mock that is not
proto3 JSON of the step's output type, parsed strictly). :func:`findings` is the verifier's view
of the same check: one finding of kind ``tests`` per error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.types import CompiledWorkflow, Finding, Step

__all__ = [
    "ACTIONS",
    "CASE_KEYS",
    "CRASH_POINTS",
    "EVENT_KEYS",
    "EXPECT_KEYS",
    "FINDING_KIND",
    "MOCK_KEYS",
    "STATUSES",
    "Case",
    "CaseError",
    "Event",
    "Mock",
    "findings",
    "parse_cases",
]

#: The ``kind`` of the verifier's findings about ``tests``.
FINDING_KIND = "tests"
CASE_KEYS = ("name", "input", "mocks", "events", "expect")
MOCK_KEYS = ("response", "status", "delayMs", "votes")
EVENT_KEYS = ("after", "advanceMs", "crash", "action")
EXPECT_KEYS = ("status", "path", "calls", "skipped", "errorKind", "failedStep")
#: Where a case can crash the run (``crashpoints.POINTS`` a segment passes per step).
CRASH_POINTS = ("before_checkpoint", "after_checkpoint")
ACTIONS = ("pause", "resume", "cancel")
#: The final statuses a case can expect (a job's statuses).
STATUSES = (
    "COMPLETED",
    "FAILED",
    "DEAD",
    "CANCELLED",
    "PAUSED",
    "WAITING",
    "RECOVERY_REQUIRED",
)
#: Most cases one definition holds, and most items one step's mock sequence holds.
MAX_CASES = 100
MAX_MOCKS = 100
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,100}$")


class CaseError(ProtomoltJobsError, ValueError):
    """A ``tests`` value that is not what the key takes.

    :ivar path: where (``tests[0].mocks.charge[1].status.code``).
    :ivar message: what is wrong, the path first.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = f"{path}: {message}"


@dataclass(frozen=True)
class Mock:
    """One answer of a mocked step: a ``response`` (parsed), a gRPC ``code`` (with
    ``message``), or an approval's ``votes``; ``delay_ms`` on the virtual clock first."""

    response: Message | None = None
    response_json: dict[str, Any] | None = None
    code: grpc.StatusCode | None = None
    message: str = ""
    votes: tuple[dict[str, str], ...] | None = None
    delay_ms: int = 0


@dataclass(frozen=True)
class Event:
    """One event: once ``after`` (a step name; None: at the start) has checkpointed, advance
    the clock by ``advance_ms``, crash at ``crash``, or apply the operator ``action``."""

    after: str | None = None
    advance_ms: int = 0
    crash: str | None = None
    action: str | None = None


@dataclass(frozen=True)
class Case:
    """One named case: ``input``, mocks per step, events in order, and ``expect``."""

    name: str
    input: dict[str, Any]
    mocks: Mapping[str, tuple[Mock, ...]]
    events: tuple[Event, ...] = ()
    expect: Mapping[str, Any] = field(default_factory=dict)


def findings(workflow: CompiledWorkflow, tests: Any) -> list[Finding]:
    """The verifier's findings about ``tests`` (kind ``tests``; the first error only)."""
    try:
        parse_cases(workflow, tests)
    except CaseError as exc:
        return [Finding(_step_of(exc.path), FINDING_KIND, exc.message)]
    return []


def _step_of(path: str) -> str:
    m = re.search(r"\.mocks\.([^.\[]+)", path)
    return m.group(1) if m else ""


def parse_cases(workflow: CompiledWorkflow, tests: Any, where: str = "tests") -> list[Case]:
    """Read ``tests`` (a list of case objects) against ``workflow``.

    :raises CaseError: naming the path of the first error: a key a case, mock, event or
        ``expect`` does not know, a wrong JSON type, a mock of a step the workflow lacks, a
        ``response`` that is not proto3 JSON of the step's output type (unknown fields
        included), an unknown gRPC code, votes on a step that is not an approval, a crash
        point or action outside :data:`CRASH_POINTS` / :data:`ACTIONS`, an expected status
        outside :data:`STATUSES`, or two cases with one name.
    """
    if not isinstance(tests, list):
        raise CaseError(where, "must be a list of test cases")
    if len(tests) > MAX_CASES:
        raise CaseError(where, f"at most {MAX_CASES} cases; got {len(tests)}")
    cases: list[Case] = []
    seen: set[str] = set()
    for i, raw in enumerate(tests):
        path = f"{where}[{i}]"
        case = _case(workflow, raw, path)
        if case.name in seen:
            raise CaseError(f"{path}.name", f"two cases are named '{case.name}'")
        seen.add(case.name)
        cases.append(case)
    return cases


def _whole(value: Any) -> int | None:
    """``value`` as a whole number, or None: JSON ``3`` or ``3.0`` (a ``google.protobuf.Struct``
    over gRPC carries every number as a double)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _object(value: Any, path: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseError(path, "must be an object")
    for key in value:
        if key not in known:
            raise CaseError(f"{path}.{key}", f"unknown key; known keys: {', '.join(known)}")
    return value


def _case(workflow: CompiledWorkflow, raw: Any, path: str) -> Case:
    obj = _object(raw, path, CASE_KEYS)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip() or not _NAME.match(name):
        raise CaseError(f"{path}.name", "must be a non-blank string of at most 100 characters")
    given = obj.get("input", {})
    if not isinstance(given, dict):
        raise CaseError(f"{path}.input", "must be an object (proto3 JSON of the input type)")
    try:
        json_format.ParseDict(given, message_class(workflow.input_type)())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise CaseError(f"{path}.input", f"not {workflow.input_type.full_name}: {exc}") from None
    mocks_raw = obj.get("mocks", {})
    if not isinstance(mocks_raw, dict):
        raise CaseError(f"{path}.mocks", "must be an object: step name -> mock or list of mocks")
    mocks: dict[str, tuple[Mock, ...]] = {}
    for step_name, seq in mocks_raw.items():
        step = workflow.step(step_name) if isinstance(step_name, str) else None
        if step is None:
            raise CaseError(f"{path}.mocks.{step_name}", "the workflow has no step of this name")
        items = seq if isinstance(seq, list) else [seq]
        if not items or len(items) > MAX_MOCKS:
            raise CaseError(f"{path}.mocks.{step_name}", f"1 to {MAX_MOCKS} mocks")
        mocks[step_name] = tuple(
            _mock(step, item, f"{path}.mocks.{step_name}[{j}]") for j, item in enumerate(items)
        )
    events_raw = obj.get("events", [])
    if not isinstance(events_raw, list):
        raise CaseError(f"{path}.events", "must be a list of events")
    events = tuple(_event(workflow, e, f"{path}.events[{j}]") for j, e in enumerate(events_raw))
    expect = _expect(workflow, obj.get("expect", {}), f"{path}.expect")
    return Case(name, given, mocks, events, expect)


def _mock(step: Step, raw: Any, path: str) -> Mock:
    obj = _object(raw, path, MOCK_KEYS)
    delay = _whole(obj.get("delayMs", 0))
    if delay is None or not 0 <= delay <= 86_400_000:
        raise CaseError(f"{path}.delayMs", "must be an integer from 0 to 86400000")
    answers = [k for k in ("response", "status", "votes") if k in obj]
    if len(answers) != 1:
        raise CaseError(path, "needs exactly one of 'response', 'status', 'votes'")
    if "votes" in obj:
        if step.approval is None:
            raise CaseError(f"{path}.votes", f"step '{step.name}' is not an approval step")
        votes = obj["votes"]
        if not isinstance(votes, list) or not votes:
            raise CaseError(f"{path}.votes", "must be a non-empty list of {principal, decision}")
        out = []
        for k, v in enumerate(votes):
            vp = f"{path}.votes[{k}]"
            vote = _object(v, vp, ("principal", "decision"))
            for key in ("principal", "decision"):
                if not isinstance(vote.get(key), str) or not vote[key]:
                    raise CaseError(f"{vp}.{key}", "must be a non-empty string")
            if vote["decision"] not in step.approval.decisions:
                raise CaseError(
                    f"{vp}.decision",
                    f"'{vote['decision']}' is not one of {list(step.approval.decisions)}",
                )
            out.append({"principal": vote["principal"], "decision": vote["decision"]})
        return Mock(votes=tuple(out), delay_ms=delay)
    if step.approval is not None:
        raise CaseError(path, f"step '{step.name}' is an approval step: mock it with 'votes'")
    if "status" in obj:
        status = _object(obj["status"], f"{path}.status", ("code", "message"))
        code_name = status.get("code")
        code = grpc.StatusCode.__members__.get(code_name) if isinstance(code_name, str) else None
        if code is None or code is grpc.StatusCode.OK:
            raise CaseError(f"{path}.status.code", f"not a failing gRPC status code: {code_name!r}")
        message = status.get("message", "")
        if not isinstance(message, str):
            raise CaseError(f"{path}.status.message", "must be a string")
        return Mock(code=code, message=message, delay_ms=delay)
    response = obj["response"]
    if not isinstance(response, dict):
        raise CaseError(f"{path}.response", "must be an object (proto3 JSON)")
    out_type = step.method.output_type if step.method is not None else step.output_type
    if out_type is None:
        raise CaseError(f"{path}.response", f"step '{step.name}' has no output type to mock")
    try:
        msg = json_format.ParseDict(response, message_class(out_type)())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise CaseError(f"{path}.response", f"not {out_type.full_name}: {exc}") from None
    return Mock(response=msg, response_json=response, delay_ms=delay)


def _event(workflow: CompiledWorkflow, raw: Any, path: str) -> Event:
    obj = _object(raw, path, EVENT_KEYS)
    after = obj.get("after")
    if after is not None and (not isinstance(after, str) or workflow.step(after) is None):
        raise CaseError(f"{path}.after", f"the workflow has no step {after!r}")
    kinds = [k for k in ("advanceMs", "crash", "action") if k in obj]
    if len(kinds) != 1:
        raise CaseError(path, "needs exactly one of 'advanceMs', 'crash', 'action'")
    if "advanceMs" in obj:
        ms = _whole(obj["advanceMs"])
        if ms is None or not 0 < ms <= 366 * 86_400_000:
            raise CaseError(f"{path}.advanceMs", "must be a positive integer (at most a year)")
        return Event(after=after, advance_ms=ms)
    if "crash" in obj:
        if obj["crash"] not in CRASH_POINTS:
            raise CaseError(f"{path}.crash", f"must be one of {list(CRASH_POINTS)}")
        if after is None:
            raise CaseError(f"{path}.after", "a crash needs the step it follows")
        return Event(after=after, crash=obj["crash"])
    if obj["action"] not in ACTIONS:
        raise CaseError(f"{path}.action", f"must be one of {list(ACTIONS)}")
    return Event(after=after, action=obj["action"])


def _expect(workflow: CompiledWorkflow, raw: Any, path: str) -> dict[str, Any]:
    obj = _object(raw, path, EXPECT_KEYS)
    if "status" in obj and obj["status"] not in STATUSES:
        raise CaseError(f"{path}.status", f"must be one of {list(STATUSES)}")
    if "path" in obj and (
        not isinstance(obj["path"], list) or not all(isinstance(p, str) for p in obj["path"])
    ):
        raise CaseError(f"{path}.path", "must be a list of step names (name#k for iterations)")
    for key in ("calls", "skipped"):
        if key not in obj:
            continue
        value = obj[key]
        if not isinstance(value, dict):
            raise CaseError(f"{path}.{key}", "must be an object keyed by step name")
        for name, v in value.items():
            if workflow.step(name) is None:
                raise CaseError(f"{path}.{key}.{name}", "the workflow has no step of this name")
            count = _whole(v)
            ok = count is not None and count >= 0 if key == "calls" else isinstance(v, str)
            if not ok:
                said = "a count >= 0" if key == "calls" else "a reason (text it contains)"
                raise CaseError(f"{path}.{key}.{name}", f"must be {said}")
    for key in ("errorKind", "failedStep"):
        if key in obj and not isinstance(obj[key], str):
            raise CaseError(f"{path}.{key}", "must be a string")
    out = dict(obj)
    if "calls" in out:
        out["calls"] = {name: _whole(n) for name, n in out["calls"].items()}
    return out
