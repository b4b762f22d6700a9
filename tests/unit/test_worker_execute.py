"""The executor's settlement rules with a fake store and a stubbed engine (no services)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
import pytest

import protomolt_jobs.workflow as wf
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import LeaseLost, StoreError
from protomolt_jobs.runs import stored_run
from protomolt_jobs.worker.heartbeat import Heartbeat
from protomolt_jobs.worker.permits import TargetPermits
from protomolt_jobs.worker.segment import SegmentExecutor
from protomolt_jobs.worker.settlement import Settlement
from protomolt_jobs.workflow.types import (
    Completed,
    FailureKind,
    Finding,
    Parked,
    WorkflowExecutionError,
    WorkflowParseError,
)


@dataclass(frozen=True)
class _Lease:
    """The fence as the executor and heartbeat use it (attributes only)."""

    job_id: uuid.UUID
    owner: str
    attempt: int
    token: uuid.UUID


@dataclass
class _Job:
    attempt: int = 1
    max_attempts: int = 3
    checkpoints: Any = field(default_factory=list)
    workflow_definition: Any = field(default_factory=lambda: {"name": "wf"})
    input: Any = field(default_factory=lambda: {"text": "x"})
    workflow_name: str = "wf"
    job_id: uuid.UUID = field(default_factory=uuid.uuid4)
    unreadable: str | None = None

    @property
    def lease(self) -> _Lease:
        return _Lease(self.job_id, "w", self.attempt, uuid.UUID(int=self.attempt))


class _Store:
    def __init__(self) -> None:
        self.writes: list[tuple] = []
        self.lose_on: set[str] = set()
        self.fail_on: set[str] = set()

    def _do(self, op: str, lease: _Lease, *args: Any) -> None:
        if op in self.lose_on:
            raise LeaseLost(lease.job_id, lease.owner, lease.attempt, op)
        if op in self.fail_on:
            raise StoreError(f"{op} failed")
        self.writes.append((op, *args))

    def job_checkpoint(self, lease, entry):
        self._do("checkpoint", lease, entry["name"])

    def job_complete(self, lease, result, verdict, *, final_entry=None):
        if final_entry is None:
            self._do("complete", lease, result, verdict)
        else:
            self._do("complete", lease, result, verdict, final_entry["name"])

    def job_park(self, lease, step):
        self._do("park", lease, step)

    def job_fail(self, lease, error, step=""):
        self._do("fail", lease, error, step)

    def job_retry(self, lease, backoff_s, error):
        self._do("retry", lease, backoff_s, error)

    def job_dead(self, lease, error, step=""):
        self._do("dead", lease, error)

    def job_release(self, lease):
        self._do("release", lease)

    def job_heartbeat(self, lease, lease_s):
        pass

    def job_heartbeat_control(self, lease, lease_s):
        return None, None


class _Input:
    full_name = "t.In"


class _Workflow:
    input_type = _Input()
    steps = ("a", "b")
    graph = False
    checkpoints_to_complete = 2
    compensations: frozenset[str] = frozenset()
    loops: tuple[object, ...] = ()


@pytest.fixture
def engine(monkeypatch):
    """Stub the engine entry points the executor imports; ``engine.segment`` decides the run."""

    class Engine:
        segment = None  # (prior, on_checkpoint) -> outcome, or raises
        findings: ClassVar[list] = []
        parse_error: Exception | None = None
        input_error: Exception | None = None
        targets: ClassVar[list] = []

    def parse_workflow(obj, runtime):
        if Engine.parse_error:
            raise Engine.parse_error
        return _Workflow()

    def parse_input(workflow, obj):
        if Engine.input_error:
            raise Engine.input_error
        return obj

    def next_target(workflow, n):
        Engine.targets.append(n)
        return "t:1"

    def run_segment(
        workflow,
        message,
        prior,
        on_checkpoint,
        *,
        runtime,
        call_permit=None,
        effects=None,
        authorize=None,
    ):
        return Engine.segment(prior, on_checkpoint)

    for name, value in {
        "parse_workflow": parse_workflow,
        "verify": lambda w: list(Engine.findings),
        "parse_input": parse_input,
        "next_target": next_target,
        "run_segment": run_segment,
        "Completed": Completed,
        "Parked": Parked,
        "WorkflowExecutionError": WorkflowExecutionError,
        "WorkflowParseError": WorkflowParseError,
    }.items():
        monkeypatch.setattr(wf, name, value, raising=False)
    # the worker reads the stored definition through StoredRun.load, which calls these two
    monkeypatch.setattr(stored_run, "parse_workflow", parse_workflow)
    monkeypatch.setattr(stored_run, "verify", lambda w: list(Engine.findings))
    return Engine


def _executor(store, *, draining=None, limit=8):
    config = JobsConfig(worker_id="w", backoff_base_seconds=0.5, lease_seconds=60)
    return SegmentExecutor(
        store,
        runtime=None,
        config=config,
        permits=TargetPermits(limit),
        heartbeat=Heartbeat(store, lease_s=60, worker_id="w"),
        draining=draining or threading.Event(),
    )


def _completed(n_steps=2):
    return Completed(
        output=None,
        output_json={"ok": True},
        output_type="t.Out",
        steps=[{"name": str(i), "skipped": False} for i in range(n_steps)],
    )


def test_completed_writes_checkpoints_then_complete_with_the_verdict(engine):
    store = _Store()

    def segment(prior, on_checkpoint):
        on_checkpoint({"name": "a", "skipped": False, "response": {}})
        on_checkpoint({"name": "b", "skipped": False, "response": {}})
        return _completed(2)

    engine.segment = segment
    assert _executor(store).execute(_Job()) is Settlement.COMPLETED
    # The last step's checkpoint goes with the completion (one transaction).
    assert store.writes == [
        ("checkpoint", "a"),
        ("complete", {"ok": True}, "2 steps, output t.Out", "b"),
    ]


def test_a_resumed_segment_defers_only_the_last_steps_checkpoint(engine):
    store = _Store()

    def segment(prior, on_checkpoint):
        assert [p["name"] for p in prior] == ["a"]
        on_checkpoint({"name": "b", "skipped": True})
        return _completed(2)

    engine.segment = segment
    job = _Job(checkpoints=[{"name": "a", "skipped": False, "response": {}}])
    assert _executor(store).execute(job) is Settlement.COMPLETED
    assert store.writes == [("complete", {"ok": True}, "2 steps, output t.Out", "b")]


def test_a_segment_with_nothing_left_completes_without_a_final_entry(engine):
    store = _Store()
    engine.segment = lambda prior, cb: _completed(2)
    done = [{"name": n, "skipped": True} for n in ("a", "b")]
    assert _executor(store).execute(_Job(checkpoints=done)) is Settlement.COMPLETED
    assert store.writes == [("complete", {"ok": True}, "2 steps, output t.Out")]


def _fails_after_the_last_step(error):
    def segment(prior, on_checkpoint):
        on_checkpoint({"name": "a", "skipped": False, "response": {}})
        on_checkpoint({"name": "b", "skipped": False, "response": {}})
        raise error

    return segment


def test_a_failure_after_the_last_step_stores_its_checkpoint_first(engine):
    store = _Store()
    engine.segment = _fails_after_the_last_step(
        WorkflowExecutionError(FailureKind.MAPPING, "output", "mapping failed: no")
    )
    assert _executor(store).execute(_Job()) is Settlement.FAILED
    assert store.writes == [
        ("checkpoint", "a"),
        ("checkpoint", "b"),
        ("fail", "MAPPING: mapping failed: no", "output"),
    ]


def test_compensations_and_failures_are_stored_as_they_end_never_held(engine, monkeypatch):
    # A graph run a, b, c (+ undo_a): b fails for good, c never runs, undo_a compensates. The
    # compensation would be the third new entry, the "last step's" count, but only a main
    # step's entry that can end a completed run is held: each is stored before the engine
    # goes on (a crash later never calls a finished compensation again).
    monkeypatch.setattr(_Workflow, "compensations", frozenset({"undo_a"}), raising=False)
    monkeypatch.setattr(_Workflow, "checkpoints_to_complete", 3)
    monkeypatch.setattr(_Workflow, "graph", True)
    store = _Store()
    failed = {"name": "b", "skipped": False, "failed": {"kind": "GRPC", "message": "no"}}

    def segment(prior, on_checkpoint):
        on_checkpoint({"name": "a", "skipped": False, "response": {}})
        on_checkpoint(failed)
        assert store.writes[-1] == ("checkpoint", "b"), "the failure was held back"
        on_checkpoint({"name": "undo_a", "skipped": False, "response": {}})
        assert store.writes[-1] == ("checkpoint", "undo_a"), "the compensation was held back"
        raise WorkflowExecutionError(FailureKind.GRPC, "b", "no")

    engine.segment = segment
    assert _executor(store).execute(_Job()) is Settlement.FAILED
    assert [w[:2] for w in store.writes] == [
        ("checkpoint", "a"),
        ("checkpoint", "b"),
        ("checkpoint", "undo_a"),
        ("fail", "GRPC: no"),
    ]


def test_a_resumed_compensation_counts_only_main_entries(engine, monkeypatch):
    # A stored compensation entry is not counted among the main steps' entries, so the last
    # main step's entry is still recognised (and held for the completion).
    monkeypatch.setattr(_Workflow, "compensations", frozenset({"undo_a"}), raising=False)
    monkeypatch.setattr(_Workflow, "checkpoints_to_complete", 3)
    store = _Store()

    def segment(prior, on_checkpoint):
        on_checkpoint({"name": "c", "skipped": False, "response": {}})
        return _completed(3)

    engine.segment = segment
    prior = [
        {"name": "a", "skipped": False, "response": {}},
        {"name": "undo_a", "skipped": False, "response": {}},
        {"name": "b", "skipped": False, "response": {}},
    ]
    assert _executor(store).execute(_Job(checkpoints=prior)) is Settlement.COMPLETED
    assert store.writes == [("complete", {"ok": True}, "3 steps, output t.Out", "c")]


def test_a_defect_after_the_last_step_stores_its_checkpoint_then_retries(engine):
    store = _Store()
    engine.segment = _fails_after_the_last_step(RuntimeError("boom"))
    assert _executor(store).execute(_Job()) is Settlement.RETRIED
    assert [w[0] for w in store.writes] == ["checkpoint", "checkpoint", "retry"]


def test_a_held_checkpoint_that_cannot_be_stored_retries_the_job(engine):
    class _FailsSecond(_Store):
        def job_checkpoint(self, lease, entry):
            if entry["name"] == "b":
                raise StoreError("connection lost")
            super().job_checkpoint(lease, entry)

    store = _FailsSecond()
    engine.segment = _fails_after_the_last_step(
        WorkflowExecutionError(FailureKind.MAPPING, "output", "mapping failed: no")
    )
    assert _executor(store).execute(_Job()) is Settlement.RETRIED
    assert store.writes[0] == ("checkpoint", "a")
    op, _backoff, detail = store.writes[1]
    assert op == "retry"
    assert detail == (
        "WORKFLOW: checkpoint observer failed; the step's response may not have persisted: "
        "connection lost"
    )
    assert len(store.writes) == 2


def test_a_held_checkpoint_whose_lease_is_lost_abandons_the_run(engine):
    engine.segment = _fails_after_the_last_step(
        WorkflowExecutionError(FailureKind.MAPPING, "output", "mapping failed: no")
    )

    class _LosesSecond(_Store):
        def job_checkpoint(self, lease, entry):
            if entry["name"] == "b":
                raise LeaseLost(lease.job_id, lease.owner, lease.attempt, "checkpoint")
            super().job_checkpoint(lease, entry)

    store = _LosesSecond()
    assert _executor(store).execute(_Job()) is Settlement.ABANDONED
    assert store.writes == [("checkpoint", "a")]


def test_a_completion_with_its_final_entry_losing_the_lease_writes_nothing(engine):
    store = _Store()
    store.lose_on.add("complete")

    def segment(prior, on_checkpoint):
        on_checkpoint({"name": "a", "skipped": False, "response": {}})
        on_checkpoint({"name": "b", "skipped": False, "response": {}})
        return _completed(2)

    engine.segment = segment
    assert _executor(store).execute(_Job()) is Settlement.ABANDONED
    assert store.writes == [("checkpoint", "a")]


def test_parked_parks_on_the_step(engine):
    store = _Store()
    engine.segment = lambda prior, cb: Parked("review")
    assert _executor(store).execute(_Job()) is Settlement.PARKED
    assert store.writes == [("park", "review")]


@pytest.mark.parametrize(
    ("kind", "code", "store_failure"),
    [
        (FailureKind.GRPC, grpc.StatusCode.UNAVAILABLE, False),
        (FailureKind.GRPC, grpc.StatusCode.DEADLINE_EXCEEDED, False),
        (FailureKind.GRPC, grpc.StatusCode.RESOURCE_EXHAUSTED, False),
        (FailureKind.DEADLINE, None, False),
        (FailureKind.WORKFLOW, None, True),
    ],
)
def test_retryable_failures_retry_with_backoff_then_go_dead(engine, kind, code, store_failure):
    def segment(prior, cb):
        raise WorkflowExecutionError(kind, "a", "boom", code, store_failure)

    engine.segment = segment
    store = _Store()
    assert _executor(store).execute(_Job(attempt=2, max_attempts=3)) is Settlement.RETRIED
    assert store.writes == [("retry", 1.0, f"{kind.value}: boom")]  # 0.5 * 2^(2-1)
    store = _Store()
    assert _executor(store).execute(_Job(attempt=3, max_attempts=3)) is Settlement.DEAD
    assert store.writes == [("dead", f"{kind.value}: boom")]


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (FailureKind.VALIDATION, None),
        (FailureKind.GATE, None),
        (FailureKind.MAPPING, None),
        (FailureKind.WORKFLOW, None),
        (FailureKind.EXTERNAL, None),
        (FailureKind.GRPC, grpc.StatusCode.INTERNAL),
        (FailureKind.GRPC, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_non_retryable_failures_fail_with_kind_and_step(engine, kind, code):
    def segment(prior, cb):
        raise WorkflowExecutionError(kind, "b", "nope", code)

    engine.segment = segment
    store = _Store()
    assert _executor(store).execute(_Job(attempt=1)) is Settlement.FAILED
    assert store.writes == [("fail", f"{kind.value}: nope", "b")]


def test_lease_lost_on_a_checkpoint_abandons_without_writing(engine):
    store = _Store()
    store.lose_on.add("checkpoint")

    def segment(prior, on_checkpoint):
        try:
            on_checkpoint({"name": "a", "skipped": False})
        except Exception as exc:  # the engine wraps observer failures
            raise WorkflowExecutionError(
                FailureKind.WORKFLOW, "a", "checkpoint observer failed", None, True
            ) from exc
        return _completed()

    engine.segment = segment
    assert _executor(store).execute(_Job()) is Settlement.ABANDONED
    assert store.writes == []


def test_lease_lost_on_settle_abandons_and_store_error_leaves_it_unsettled(engine):
    engine.segment = lambda prior, cb: _completed()
    store = _Store()
    store.lose_on.add("complete")
    assert _executor(store).execute(_Job()) is Settlement.ABANDONED
    store = _Store()
    store.fail_on.add("complete")
    assert _executor(store).execute(_Job()) is Settlement.UNSETTLED
    assert store.writes == []


def test_a_store_write_refusing_its_arguments_surfaces_instead_of_settle_failed(engine):
    # ValueError/TypeError from a store write is a defect in the worker, not a settle failure
    engine.segment = lambda prior, cb: _completed()
    store = _Store()

    def refuse(*args, **kwargs):
        raise TypeError("result: not JSON serialisable")

    store.job_complete = refuse
    with pytest.raises(TypeError, match="serialisable"):
        _executor(store).execute(_Job())


def test_snapshot_and_input_failures_use_the_reference_texts(engine):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    assert _executor(store).execute(_Job(workflow_definition=[1])) is Settlement.FAILED
    assert store.writes[-1] == (
        "fail",
        "WORKFLOW: stored workflow definition is not a JSON object",
        "",
    )

    assert _executor(store).execute(_Job(workflow_definition="{nope")) is Settlement.FAILED
    assert store.writes[-1][1].startswith(
        "WORKFLOW: stored workflow definition is not readable JSON: "
    )

    engine.parse_error = WorkflowParseError("tok", "a step needs 'target' and 'method'")
    _executor(store).execute(_Job())
    assert store.writes[-1] == (
        "fail",
        "WORKFLOW: stored workflow does not parse (step 'tok'): a step needs 'target' and 'method'",
        "tok",
    )
    engine.parse_error = None

    engine.findings = [Finding("a", "method", "bad"), Finding("b", "rule", "worse")]
    _executor(store).execute(_Job())
    assert store.writes[-1] == (
        "fail",
        "WORKFLOW: stored workflow does not verify (2 findings); [method] a: bad; [rule] b: worse",
        "a",
    )
    engine.findings = []

    engine.input_error = WorkflowParseError("", "Failed to parse text field: bad")
    _executor(store).execute(_Job())
    assert store.writes[-1] == (
        "fail",
        "MAPPING: stored input is not valid proto3 JSON for t.In: Failed to parse text field: bad",
        "",
    )


def test_no_permit_when_every_step_is_checkpointed(engine):
    store = _Store()
    engine.segment = lambda prior, cb: _completed()
    done = [{"name": "a", "skipped": False}, {"name": "b", "skipped": False}]
    assert _executor(store, limit=1).execute(_Job(checkpoints=done)) is Settlement.COMPLETED
    assert engine.targets == []
    _executor(store).execute(_Job(checkpoints=done[:1]))
    assert engine.targets == [1]


def test_a_job_claimed_while_draining_is_released_not_run(engine):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    draining = threading.Event()
    draining.set()
    assert _executor(store, draining=draining).execute(_Job()) is Settlement.ABANDONED
    assert store.writes == [("release",)]


def test_an_unexpected_engine_error_is_a_bounded_retry(engine):
    def segment(prior, cb):
        raise KeyError("defect")

    engine.segment = segment
    store = _Store()
    assert _executor(store).execute(_Job(attempt=3, max_attempts=3)) is Settlement.DEAD
    assert store.writes[0][0] == "dead"
    assert store.writes[0][1].startswith("WORKFLOW: unexpected error in the worker: KeyError")


# -- nothing in a claimed row crashes the executor ---------------------------------------------


@pytest.mark.parametrize("checkpoints", [5, "tokenize", {"name": "a"}, 2.5, True])
def test_checkpoints_that_are_not_an_array_fail_the_job(engine, checkpoints):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    assert _executor(store).execute(_Job(checkpoints=checkpoints)) is Settlement.FAILED
    assert store.writes == [("fail", "WORKFLOW: stored checkpoints are not an array", "")]


def test_a_row_the_store_could_not_decode_fails_with_what_was_unreadable(engine):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    job = _Job(
        input=None,
        checkpoints=None,
        unreadable="input: nested too deeply; checkpoints: not a JSON array",
    )
    assert _executor(store).execute(job) is Settlement.FAILED
    assert store.writes == [
        (
            "fail",
            (
                "WORKFLOW: stored row is not readable JSON: "
                "input: nested too deeply; checkpoints: not a JSON array"
            ),
            "",
        )
    ]


def test_a_record_without_the_unreadable_field_still_runs(engine):
    @dataclass
    class OldJob:  # a JobRecord from before the store grew `unreadable`
        attempt: int = 1
        max_attempts: int = 3
        checkpoints: Any = field(default_factory=list)
        workflow_definition: Any = field(default_factory=lambda: {"name": "wf"})
        input: Any = field(default_factory=lambda: {"text": "x"})
        workflow_name: str = "wf"
        job_id: uuid.UUID = field(default_factory=uuid.uuid4)

        @property
        def lease(self) -> _Lease:
            return _Lease(self.job_id, "w", self.attempt, uuid.UUID(int=0))

    store = _Store()
    engine.segment = lambda prior, cb: Parked("b")
    assert _executor(store).execute(OldJob()) is Settlement.PARKED


def test_a_surprise_while_reading_the_row_fails_the_job_under_the_lease(engine):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    engine.parse_error = RecursionError("maximum recursion depth exceeded")
    assert _executor(store).execute(_Job()) is Settlement.FAILED
    assert store.writes == [
        (
            "fail",
            (
                "WORKFLOW: stored row could not be read: RecursionError: "
                "maximum recursion depth exceeded"
            ),
            "",
        )
    ]


def test_the_input_error_names_the_input_once(engine):
    store = _Store()
    engine.segment = lambda prior, cb: pytest.fail("must not run")
    engine.input_error = WorkflowParseError(
        "", "'input' is not valid proto3 JSON for t.In: expected a JSON object"
    )
    assert _executor(store).execute(_Job(input=[1])) is Settlement.FAILED
    assert store.writes == [
        (
            "fail",
            "MAPPING: stored input is not valid proto3 JSON for t.In: expected a JSON object",
            "",
        )
    ]
