"""Breaker tests for the restructured core (issue 25: segment, settlement, settler, policies,
checkpoints, claimed_run, compensation, StoredRun, the verbs package).

Each test asserts what the docs promise (docs/worker.md, docs/verbs.md, claimed_run.py's table,
and the pre-restructure reference, commit 4754549). A passing test documents a hole that could
not be found; a failing one is a bug report. Real PostgreSQL, real gRPC servers on loopback,
real worker processes; every wait is on a condition and bounded.

Found by these tests and fixed since (each test asserts the fixed behaviour):

- test_a_budgeted_run_whose_checkpoints_are_not_objects_fails_instead_of_crashing_the_loop:
  BudgetPolicy.resume -> CostMeter.add raised AttributeError on a non-object checkpoint and
  SegmentExecutor._classify (phase BUDGET) let it through to the claim loop (also in 4754549).
- test_the_dashboard_step_list_of_an_unparsable_definition_is_unchanged_by_the_restructure:
  runs/inspector.py step_names parsed (StoredRun.load) and answered [] where the old
  job_inspector.py read the raw ``steps`` names (a regression of issue 25).
- test_a_graph_run_failed_by_its_budget_compensates_its_succeeded_steps: a budget overrun
  FAILED a graph run without its compensations (also in 4754549).
- test_retry_step_on_a_row_with_odd_step_generations_is_not_an_internal_error: queries.sql's
  ``(step_generations->>step)::int`` cast made retry-step an internal-error (also in 4754549).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import psycopg
import pytest

from protomolt_jobs.errors import ActionError, InternalError, JobCorrupt
from protomolt_jobs.workflow import Runtime, parse_workflow
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import (
    CRASH_EXIT_CODE,
    WorkerProcess,
    enqueue,
    event_types,
    in_process_worker,
    wait_for,
)

_FAST = {
    "lease_seconds": 1.5,
    "poll_interval_ms": 200,
    "sweep_interval_ms": 200,
    "backoff_base_seconds": 0.2,
    "worker_count": 1,
    "pool_max_size": 4,
}


def q(dsn: str, sql: str, params: Any = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def corrupt(dsn: str, job_id: Any, column: str, value: Any) -> None:
    """Write ``value`` (JSON-encoded here) into a jsonb column of the row, behind the store."""
    q(
        dsn,
        f"UPDATE workflow_run SET {column} = %(v)s::jsonb WHERE job_id = %(id)s",
        {"v": json.dumps(value), "id": job_id},
    )


def parse_message(definition: dict[str, Any]) -> tuple[str, str]:
    """(step, message) of the WorkflowParseError ``definition`` raises (the reference text)."""
    from protomolt_jobs.workflow.types import WorkflowParseError

    try:
        parse_workflow(definition, Runtime())
    except WorkflowParseError as exc:
        return exc.step or "", exc.message
    raise AssertionError("the definition parses")


def seed(target: str, **kw: Any) -> dict[str, Any]:
    return seed_workflow(target, review="invoke", **kw)


def unparsable(target: str) -> dict[str, Any]:
    wf = seed(target)
    wf["steps"][1]["method"] = "jobs.test.Nope/Nope"
    return wf


@pytest.fixture
def verbs(store):
    from protomolt_jobs.host.catalog import Caller, Catalog
    from protomolt_jobs.runs.submitter import Submitter
    from protomolt_jobs.verbs import JobsBackend, jobs_actions

    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)

    def call(verb: str, body: dict[str, Any], *, principal: str = "alice") -> dict[str, Any]:
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


# == 1. broken rows through the worker ===========================================================


def _unparsable_def(t: str) -> tuple[dict, str, str]:
    wf = unparsable(t)
    step, msg = parse_message(wf)
    return wf, step, f"WORKFLOW: stored workflow does not parse (step '{step}'): {msg}"


def _steps_not_list(t: str) -> tuple[dict, str, str]:
    wf = seed(t)
    wf["steps"] = {"a": 1}
    _step, msg = parse_message(wf)
    return wf, "", f"WORKFLOW: stored workflow does not parse: {msg}"


def _unverified(t: str) -> tuple[dict, str, str]:
    wf = seed(t)
    wf["steps"][1]["rules"] = ["ids = nosuch.ids"]
    detail = (
        "WORKFLOW: stored workflow does not verify (1 finding); [rule] embed: source: unknown "
        "source 'nosuch'; the scope has [input, tokenize] (ids = nosuch.ids)"
    )
    return wf, "embed", detail


@pytest.mark.parametrize("make", [_unparsable_def, _steps_not_list, _unverified])
def test_a_stored_definition_that_no_longer_parses_or_verifies_fails_with_the_reference_text(
    make, store, fresh_dsn, services
):
    job = enqueue(store, seed(services.target), {"text": "hello brave world"})
    wf, step, detail = make(services.target)
    corrupt(fresh_dsn, job.job_id, "workflow_definition", wf)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert (row.status, row.error, row.attempt) == ("FAILED", detail, 1)
    assert row.lease_owner is None and row.checkpoints == []
    assert services.calls("Tokenize") == 0
    kinds = event_types(store, job.job_id)
    assert kinds == [("ACCEPTED", ""), ("FAILED", step)]


@pytest.mark.parametrize(
    ("column", "value", "detail"),
    [
        (
            "input",
            {"text": 5},
            (
                "MAPPING: stored input is not valid proto3 JSON for jobs.test.Text: Failed to parse "
                "text field: expected string or bytes-like object, got 'int'."
            ),
        ),
        (
            "input",
            [1, 2],
            "WORKFLOW: stored row is not readable JSON: input: not a JSON object (found list)",
        ),
        (
            "workflow_definition",
            "a string, not an object",
            (
                "WORKFLOW: stored row is not readable JSON: workflow_definition: not a JSON object "
                "(found str)"
            ),
        ),
        (
            "checkpoints",
            {"not": "an array"},
            "WORKFLOW: stored row is not readable JSON: checkpoints: not a JSON array (found dict)",
        ),
        (
            "checkpoints",
            [1, 2],
            (
                "WORKFLOW: checkpoint 0 is not a {name, skipped, response} object; the workflow "
                "definition changed under the job"
            ),
        ),
        (
            "checkpoints",
            [{"name": "embed", "skipped": False, "response": {}}],
            (
                "WORKFLOW: checkpoint 0 belongs to step 'embed' but the workflow's step 0 is "
                "'tokenize'; the workflow definition changed under the job"
            ),
        ),
        (
            "checkpoints",
            [{"name": "x", "skipped": False, "response": {}}] * 5,
            "WORKFLOW: stored checkpoints (5) outnumber the workflow's steps (3)",
        ),
        (
            "checkpoints",
            [{"name": "tokenize", "skipped": False, "response": [1]}],
            (
                "WORKFLOW: checkpoint 'tokenize' response is not valid proto3 JSON for "
                "jobs.test.Tokens: expected a JSON object"
            ),
        ),
    ],
)
def test_a_broken_input_or_checkpoints_fail_the_job_once_without_a_call(
    column, value, detail, store, fresh_dsn, services
):
    job = enqueue(store, seed(services.target), {"text": "hello brave world"})
    corrupt(fresh_dsn, job.job_id, column, value)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert (row.status, row.error) == ("FAILED", detail)
    assert row.lease_owner is None and row.attempt == 1
    assert services.calls("Tokenize") + services.calls("Embed") + services.calls("Review") == 0
    assert [k for k, _ in event_types(store, job.job_id)] == ["ACCEPTED", "FAILED"]


def _budgeted(target: str) -> dict[str, Any]:
    wf = seed(target)
    wf["budget"] = {"maxCost": 100}
    for s in wf["steps"]:
        s["cost"] = "1"
    return wf


@pytest.mark.parametrize("checkpoints", [[1], ["tokenize"], [None]])
def test_a_budgeted_run_whose_checkpoints_are_not_objects_fails_instead_of_crashing_the_loop(
    checkpoints, store, fresh_dsn, services
):
    """claimed_run.py/segment.py: "nothing in a row can crash the executor"; docs/worker.md:
    "any other surprise while reading the row FAIL it with a WORKFLOW: text". The same row
    without a budget FAILS with the engine's "checkpoint 0 is not a {name, skipped, response}
    object" (test above)."""
    job = enqueue(store, _budgeted(services.target), {"text": "hello brave world"})
    corrupt(fresh_dsn, job.job_id, "checkpoints", checkpoints)
    worker = in_process_worker(store, fresh_dsn)
    try:
        settled = worker.run_once()
    except Exception as exc:  # noqa: BLE001 - the claim loop would catch it: a crash
        pytest.fail(f"the claimed row crashed the executor: {type(exc).__name__}: {exc}")
    assert settled is True
    row = store.job_get(job.job_id)
    assert row.status == "FAILED", (row.status, row.error)
    assert row.error.startswith("WORKFLOW: ")
    assert row.lease_owner is None


# == 2. broken definitions through the verbs =====================================================


def _parked(store, target: str) -> Any:
    from protomolt_jobs.store import ParkedStepCompleted  # noqa: F401

    wf = seed_workflow(target)  # review external: the job parks
    return enqueue(store, wf, {"text": "hello brave world"})


def _no_internal(call, verb: str, body: dict[str, Any]) -> Any:
    try:
        return call(verb, body)
    except InternalError as exc:  # a 500 with a traceback in the log
        pytest.fail(f"{verb} answered internal-error: {exc}")


def test_complete_step_on_a_definition_that_no_longer_parses_is_job_corrupt_and_writes_nothing(
    store, fresh_dsn, services, verbs
):
    job = _parked(store, services.target)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "WAITING"
    wf = seed_workflow(services.target)
    wf["steps"][1]["method"] = "jobs.test.Nope/Nope"
    _, msg = parse_message(wf)
    corrupt(fresh_dsn, job.job_id, "workflow_definition", wf)
    before = store.job_get(job.job_id)
    with pytest.raises(JobCorrupt) as err:
        _no_internal(
            verbs,
            "complete-step",
            {"jobId": str(job.job_id), "stepName": "review", "response": {"approved": True}},
        )
    assert str(err.value.message if hasattr(err.value, "message") else err.value) == (
        f"the job's stored workflow definition does not parse: {msg}"
    )
    after = store.job_get(job.job_id)
    assert (after.status, after.checkpoints, after.history_seq) == (
        "WAITING",
        before.checkpoints,
        before.history_seq,
    )


def test_retry_step_reconcile_and_migrate_on_unparsable_definitions_are_job_corrupt(
    store, fresh_dsn, services, verbs
):
    # a FAILED job (retry-step) and a RECOVERY_REQUIRED one (reconcile, migrate)
    failed = enqueue(store, seed(services.target), {"text": "hello brave world"})
    services.fail_next("Embed", 1, __import__("grpc").StatusCode.INVALID_ARGUMENT, "no")
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(failed.job_id).status == "FAILED"
    bad = unparsable(services.target)
    _, msg = parse_message(bad)
    corrupt(fresh_dsn, failed.job_id, "workflow_definition", bad)
    expected = f"the job's stored workflow definition does not parse: {msg}"
    with pytest.raises(JobCorrupt, match="^" + __import__("re").escape(expected) + "$"):
        _no_internal(verbs, "retry-step", {"jobId": str(failed.job_id), "stepName": "embed"})
    assert store.job_get(failed.job_id).status == "FAILED"

    rec = enqueue(store, seed(services.target), {"text": "x y z"})
    claimed = store.job_claim("w-rec", 60)
    assert claimed.job_id == rec.job_id
    store.job_recovery_required(claimed.lease, "embed", "unproven")
    corrupt(fresh_dsn, rec.job_id, "workflow_definition", bad)
    seq = store.job_get(rec.job_id).history_seq
    for verb, body in (
        ("reconcile-step", {"outcome": "done", "response": {"values": [1.0], "model": "m"}}),
        ("migrate-checkpoint", {"action": "replace", "response": {"values": [1.0]}}),
    ):
        with pytest.raises(JobCorrupt, match="^" + __import__("re").escape(expected) + "$"):
            _no_internal(verbs, verb, {"jobId": str(rec.job_id), "stepName": "embed", **body})
    row = store.job_get(rec.job_id)
    assert (row.status, row.history_seq) == ("RECOVERY_REQUIRED", seq)


def test_reads_of_rows_with_unparsable_definitions_answer_without_internal_errors(
    store, fresh_dsn, services, verbs
):
    job = enqueue(store, seed(services.target), {"text": "hello brave world"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "COMPLETED"
    corrupt(fresh_dsn, job.job_id, "workflow_definition", unparsable(services.target))
    got = _no_internal(verbs, "get-job", {"jobId": str(job.job_id)})
    assert got["ok"] is True
    steps = [s["name"] for s in got["job"]["report"]["steps"]]
    assert steps == ["tokenize", "embed", "review"]  # the checkpointed ones
    listed = _no_internal(verbs, "list-jobs", {})
    assert [j["jobId"] for j in listed["jobs"]] == [str(job.job_id)]
    hist = _no_internal(verbs, "job-history", {"jobId": str(job.job_id)})
    assert hist["ok"] is True and hist["integrity"] == "ok"
    # retry-step refuses (the steps to drop come from the definition), nothing written
    seq = store.job_get(job.job_id).history_seq
    with pytest.raises(JobCorrupt):
        _no_internal(verbs, "retry-step", {"jobId": str(job.job_id), "stepName": "embed"})
    assert store.job_get(job.job_id).history_seq == seq


def test_a_definition_nested_past_the_parser_is_job_corrupt_for_retry_step_not_internal(
    store, fresh_dsn, services, verbs
):
    """A snapshot that nests deep enough to raise RecursionError in the parser (but that
    PostgreSQL and Python's JSON decoder accept): the verbs answer job-corrupt, the worker
    FAILS the job with "stored row could not be read: RecursionError"."""
    job = enqueue(store, seed(services.target), {"text": "hello brave world"})
    wf = seed(services.target)
    deep: Any = "x"
    for _ in range(600):
        deep = {"and": [deep]}
    wf["steps"][0]["when"] = deep
    corrupt(fresh_dsn, job.job_id, "workflow_definition", wf)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert row.error.startswith("WORKFLOW: "), row.error


# == 3. SIGKILL at every named crash point of the worker path ====================================

# point -> (expected calls (Tokenize, Embed, Review), expected attempt at the end,
#           whether the second worker is needed at all)
_CRASHES = {
    # the claim committed, nothing else: the sweeper requeues, attempt 2 runs everything
    "after_claim": ((1, 1, 1), 2),
    # tokenize is stored: never called again
    "after_checkpoint:tokenize": ((1, 1, 1), 2),
    # embed answered, its checkpoint not written: embed is called again (idempotent steps)
    "before_checkpoint:embed": ((1, 2, 1), 2),
    # the last step's entry is held for job_complete: review answered, not stored, called again
    "before_checkpoint:review": ((1, 1, 2), 2),
    # the segment is done, its completion (carrying review's entry) not written: the price
    # docs/worker.md names, review is called again
    "before_settle": ((1, 1, 2), 2),
    # job_complete committed (it carries review's entry): nothing is left to run
    "after_checkpoint:review": ((1, 1, 1), 1),
}


@pytest.mark.parametrize("point", sorted(_CRASHES))
def test_sigkill_at_each_crash_point_ends_completed_with_the_documented_calls(
    point, store, fresh_dsn, services
):
    calls, attempt = _CRASHES[point]
    job = enqueue(store, seed(services.target), {"text": "crash point"})
    a = WorkerProcess(fresh_dsn, worker_id="crash-a", crash_at=point, **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="crash-b", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE, a.logs()
        b.start()
        wait_for(
            lambda: store.job_get(job.job_id).status == "COMPLETED",
            timeout_s=60,
            what=lambda: f"{store.job_get(job.job_id)}\n{b.logs()[-3000:]}",
        )
        row = store.job_get(job.job_id)
        got = (services.calls("Tokenize"), services.calls("Embed"), services.calls("Review"))
        assert got == calls, f"{point}: calls {got}"
        assert row.attempt == attempt
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
        assert row.lease_owner is None and row.error is None
        kinds = [k for k, _ in event_types(store, job.job_id)]
        assert kinds == [
            "ACCEPTED",
            "STEP_CHECKPOINT",
            "STEP_CHECKPOINT",
            "STEP_CHECKPOINT",
            "COMPLETED",
        ]
    finally:
        a.close()
        b.close()


def test_a_job_that_crashes_its_worker_before_every_checkpoint_goes_dead_after_max_attempts(
    store, fresh_dsn, services
):
    job = enqueue(store, seed(services.target), {"text": "poison"}, max_attempts=2)
    procs: list[WorkerProcess] = []
    try:
        for i in range(2):
            p = WorkerProcess(
                fresh_dsn, worker_id=f"poison-{i}", crash_at="before_checkpoint:embed", **_FAST
            )
            procs.append(p)
            p.start(wait_ready=False)
            assert p.wait_exit(60) == CRASH_EXIT_CODE, p.logs()
            assert store.job_get(job.job_id).attempt == i + 1
        last = WorkerProcess(
            fresh_dsn, worker_id="poison-last", crash_at="before_checkpoint:embed", **_FAST
        )
        procs.append(last)
        last.start()
        wait_for(lambda: store.job_get(job.job_id).status == "DEAD", timeout_s=30)
        row = store.job_get(job.job_id)
        assert row.attempt == 2 and row.error
        assert last.alive(), "the DEAD job was claimed again"
        assert services.calls("Tokenize") == 1
        assert services.calls("Embed") == 2
        assert [c["name"] for c in row.checkpoints] == ["tokenize"]
        assert [k for k, _ in event_types(store, job.job_id)] == [
            "ACCEPTED",
            "STEP_CHECKPOINT",
            "DEAD",
        ]
    finally:
        for p in procs:
            p.close()


# == 4. effects: a crash between an external step's intent and its call =========================


@pytest.mark.parametrize(("verify", "found"), [(True, False), (True, True), (False, False)])
def test_crash_after_the_intent_before_the_call(verify, found, store, fresh_dsn, services):
    from tests.integration.test_effects_crash import charge_workflow, probe_answers

    probe_answers(services, found, "r-1")
    wf = charge_workflow(services.target, effect="external", verify=verify)
    job = enqueue(store, wf, {"text": "pay"})
    a = WorkerProcess(fresh_dsn, worker_id="intent-a", crash_at="after_intent:charge", **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="intent-b", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE, a.logs()
        row = store.job_get(job.job_id)
        assert row.effect_intents and "charge" in row.effect_intents
        assert services.calls("Run") == 0
        b.start()
        final = "RECOVERY_REQUIRED" if not verify else "COMPLETED"
        wait_for(lambda: store.job_get(job.job_id).status == final, timeout_s=60)
        row = store.job_get(job.job_id)
        if not verify:
            # never re-called blindly
            assert services.calls("Run") == 0
            assert row.outstanding_step == "charge"
            assert row.lease_owner is None
        elif found:
            # the probe says it happened: not called, the probe's receipt stored
            assert services.calls("Run") == 0
            assert row.checkpoints[1]["receipt"] == {"note": "r-1"}
        else:
            assert services.calls("Run") == 1
        assert services.calls("Review") == (1 if verify else 0)
    finally:
        a.close()
        b.close()


# == 5. lease loss: the old owner, frozen mid-step, must write nothing ===========================


def _row_state(store, job_id) -> tuple:
    row = store.job_get(job_id)
    return (
        row.status,
        row.attempt,
        row.lease_owner,
        json.dumps(row.checkpoints, sort_keys=True),
        row.history_seq,
        len(event_types(store, job_id)),
    )


@pytest.mark.parametrize(
    ("frozen_in", "a_fails"),
    [
        ("Tokenize", None),
        ("Review", None),
        ("Tokenize", "UNAVAILABLE"),
        ("Embed", "INVALID_ARGUMENT"),
    ],
)
def test_a_frozen_owner_whose_lease_was_taken_writes_nothing_when_it_wakes(
    frozen_in, a_fails, store, fresh_dsn, services
):
    """Worker A is SIGSTOPped inside a step's call (its heartbeat frozen too); its lease
    expires, B takes the job and is itself inside a later call when A wakes and A's call
    answers. A's checkpoint (Tokenize) or completion (Review: the held entry rides
    job_complete) must be refused by the fence: the row does not change until B writes."""
    a_release = threading.Event()
    b_release = threading.Event()
    b_inside = threading.Event()
    counts = {"n": 0}
    lock = threading.Lock()
    # B blocks in the step after the frozen one (or in Review again for a Review freeze)
    b_method = {"Tokenize": "Embed", "Embed": "Review", "Review": "Review"}[frozen_in]

    def gate(name, inner):
        def handler(request, context):
            with lock:
                counts[name] = counts.get(name, 0) + 1
                n = counts[name]
            if name == frozen_in and n == 1:
                a_release.wait(60)
                if a_fails:
                    # A's call fails: its retry (UNAVAILABLE) or verdict (INVALID_ARGUMENT)
                    # write must be refused by the fence
                    import grpc

                    context.abort(getattr(grpc.StatusCode, a_fails), "late answer")
            elif name == b_method and n == (2 if b_method == frozen_in else 1):
                b_inside.set()
                b_release.wait(60)
            return inner(request, context)

        return handler

    services.set_handler("Tokenize", gate("Tokenize", services._do_tokenize))
    services.set_handler("Embed", gate("Embed", services._do_embed))
    services.set_handler("Review", gate("Review", services._do_review))
    job = enqueue(store, seed(services.target), {"text": "frozen owner"})
    a = WorkerProcess(fresh_dsn, worker_id="frozen-a", sweeper=False, **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="taker-b", **_FAST)
    try:
        a.start()
        wait_for(lambda: counts.get(frozen_in, 0) == 1, timeout_s=30)
        os.kill(a.pid, signal.SIGSTOP)
        b.start()
        wait_for(b_inside.is_set, timeout_s=60, what=lambda: f"{store.job_get(job.job_id)}")
        row = store.job_get(job.job_id)
        assert row.lease_owner == "taker-b" and row.attempt == 2
        before = _row_state(store, job.job_id)
        os.kill(a.pid, signal.SIGCONT)
        a_release.set()
        # A's call answers; wait until A has logged that its lease is gone
        wait_for(
            lambda: "lease_lost" in a.logs() or "lease lost" in a.logs(), timeout_s=30, what=a.logs
        )
        assert _row_state(store, job.job_id) == before, "the old owner wrote"
        b_release.set()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        kinds = [k for k, _ in event_types(store, job.job_id)]
        assert kinds.count("COMPLETED") == 1
        assert kinds.count("STEP_CHECKPOINT") == 3
        assert store.job_get(job.job_id).attempt == 2
    finally:
        a_release.set()
        b_release.set()
        if a.alive():
            os.kill(a.pid, signal.SIGCONT)
        a.close()
        b.close()


# == 6. operator control racing the settle =======================================================


def _blocking(services, method: str, inner_name: str) -> tuple[threading.Event, threading.Event]:
    inside, release = threading.Event(), threading.Event()
    inner = getattr(services, inner_name)

    def handler(request, context):
        inside.set()
        release.wait(30)
        return inner(request, context)

    services.set_handler(method, handler)
    return inside, release


def _run_once_in_thread(worker) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(worker.run_once()), daemon=True)
    t.start()
    return t, out


def test_cancel_while_the_last_step_is_in_flight_ends_cancelled_with_its_checkpoint_no_result(
    store, fresh_dsn, services, verbs
):
    """docs/verbs.md: a completion meeting a pending cancel becomes CANCELLED (the last
    checkpoint kept, no result). The last step's entry is held for job_complete in the new
    CheckpointWriter: it must still be kept."""
    inside, release = _blocking(services, "Review", "_do_review")
    job = enqueue(store, seed(services.target), {"text": "cancel at the end"})
    worker = in_process_worker(store, fresh_dsn)
    t, out = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        answer = verbs("cancel-job", {"jobId": str(job.job_id), "reason": "late"})
        assert answer["ok"] is True and answer.get("requested") == "cancel", answer
        release.set()
        t.join(30)
        assert not t.is_alive() and out == [True]
        row = store.job_get(job.job_id)
        assert row.status == "CANCELLED"
        assert row.result is None and row.verdict is None
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
        assert row.error == "CANCELLED by alice: late"
        kinds = [k for k, _ in event_types(store, job.job_id)]
        assert "COMPLETED" not in kinds and kinds.count("CANCELLED") == 1
        assert services.calls("Review") == 1
    finally:
        release.set()
        worker.stop(5)


def test_pause_while_the_last_step_is_in_flight_then_resume_completes_without_a_call(
    store, fresh_dsn, services, verbs
):
    inside, release = _blocking(services, "Review", "_do_review")
    job = enqueue(store, seed(services.target), {"text": "pause at the end"})
    worker = in_process_worker(store, fresh_dsn)
    t, _out = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        answer = verbs("pause-job", {"jobId": str(job.job_id)})
        assert answer["ok"] is True and answer.get("requested") == "pause", answer
        release.set()
        t.join(30)
        row = store.job_get(job.job_id)
        assert row.status == "PAUSED"
        assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
        resumed = verbs("resume-job", {"jobId": str(job.job_id)})
        assert resumed["ok"] is True and resumed["status"] == "QUEUED"
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "COMPLETED" and row.result
        assert services.calls("Review") == 1, "resume called the last step again"
        assert services.calls("Tokenize") == 1 and services.calls("Embed") == 1
    finally:
        release.set()
        worker.stop(5)


@pytest.mark.parametrize("verb", ["retry-step", "requeue-job"])
def test_retry_step_and_requeue_against_a_running_job_are_refused_and_change_nothing(
    verb, store, fresh_dsn, services, verbs
):
    inside, release = _blocking(services, "Embed", "_do_embed")
    job = enqueue(store, seed(services.target), {"text": "running"})
    worker = in_process_worker(store, fresh_dsn)
    t, _out = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        before = store.job_get(job.job_id)
        body = {"jobId": str(job.job_id)}
        if verb == "retry-step":
            body["stepName"] = "tokenize"
        answer = verbs(verb, body)
        assert answer["ok"] is False and answer["status"] == "RUNNING", answer
        after = store.job_get(job.job_id)
        assert (after.history_seq, after.lease_token, after.checkpoints) == (
            before.history_seq,
            before.lease_token,
            before.checkpoints,
        )
        release.set()
        t.join(30)
        assert store.job_get(job.job_id).status == "COMPLETED"
        assert services.calls("Tokenize") == 1
    finally:
        release.set()
        worker.stop(5)


def test_cancel_racing_a_failure_verdict_has_one_end_state_and_the_answer_says_which(
    store, fresh_dsn, services, verbs
):
    """A cancel recorded on a RUNNING row is binding: whatever the worker writes next (here a
    non-retryable failure of the step in flight), the job ends CANCELLED."""
    import grpc

    inside, release = threading.Event(), threading.Event()

    def failing(request, context):
        inside.set()
        release.wait(30)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad")

    services.set_handler("Embed", failing)
    job = enqueue(store, seed(services.target), {"text": "fail vs cancel"})
    worker = in_process_worker(store, fresh_dsn)
    t, _out = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        answer = verbs("cancel-job", {"jobId": str(job.job_id)})
        release.set()
        t.join(30)
        row = store.job_get(job.job_id)
        if answer["ok"]:
            assert row.status == "CANCELLED", (answer, row.status, row.error)
        else:
            assert row.status == answer["status"] == "FAILED"
        kinds = [k for k, _ in event_types(store, job.job_id)]
        assert sum(kinds.count(k) for k in ("CANCELLED", "FAILED")) == 1, kinds
    finally:
        release.set()
        worker.stop(5)


# == 7. budgets ===================================================================================


def _costly(target: str, on_exceeded: str | None) -> dict[str, Any]:
    wf = seed(target)
    wf["budget"] = {"maxCost": 10}
    if on_exceeded:
        wf["budget"]["onExceeded"] = on_exceeded
    for s in wf["steps"]:
        s["cost"] = "4"
    return wf


_OVER = (
    "BUDGET: budget.maxCost 10 exceeded: 8 spent after step 'embed', and the next step may "
    "cost up to 4"
)


def test_budget_fail_stops_before_the_step_that_would_overrun(store, fresh_dsn, services):
    job = enqueue(store, _costly(services.target, None), {"text": "spend"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert (row.status, row.error) == ("FAILED", _OVER)
    assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed"]
    assert services.calls("Review") == 0
    assert event_types(store, job.job_id)[-1] == ("FAILED", "embed")


def test_budget_pause_then_resume_grants_one_more_max_cost_and_completes(
    store, fresh_dsn, services, verbs
):
    job = enqueue(store, _costly(services.target, "pause"), {"text": "spend"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert (row.status, row.error) == ("PAUSED", _OVER)
    assert row.lease_owner is None
    assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed"]
    resumed = verbs("resume-job", {"jobId": str(job.job_id)})
    assert resumed["ok"] is True and resumed["status"] == "QUEUED", resumed
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED", (row.status, row.error)
    assert (services.calls("Tokenize"), services.calls("Embed"), services.calls("Review")) == (
        1,
        1,
        1,
    )


def test_budget_checked_on_resume_after_a_crash_between_steps(store, fresh_dsn, services):
    """The spend is recomputed from the checkpoints at each claim: a segment that resumes over
    the ceiling stops before its next step (BudgetPolicy.resume), naming the last stored step."""
    wf = _costly(services.target, None)
    job = enqueue(store, wf, {"text": "spend"})
    entries = []
    for name in ("tokenize", "embed"):
        entries.append({"name": name, "skipped": False, "response": {}})
    corrupt(fresh_dsn, job.job_id, "checkpoints", entries)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert (row.status, row.error) == ("FAILED", _OVER)
    assert services.calls("Review") == 0


def test_a_cost_that_is_not_a_number_pauses_a_pausing_budget_naming_the_step(
    store, fresh_dsn, services
):
    wf = _costly(services.target, "pause")
    wf["steps"][0]["cost"] = "response.text"  # a string
    job = enqueue(store, wf, {"text": "spend"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "PAUSED", (row.status, row.error)
    assert row.error.startswith(
        "BUDGET: budget.maxCost cannot be metered: step 'tokenize' cost (response.text)"
    ), row.error
    assert [c["name"] for c in row.checkpoints] == ["tokenize"]


# == 8. effects on the exhausted path =============================================================


def _flaky_charge(services, code_name: str):
    import grpc

    code = getattr(grpc.StatusCode, code_name)

    def failing(request, context):
        context.abort(code, "flaky")

    services.set_handler("Run", failing)


@pytest.mark.parametrize(
    ("effect", "code", "status"),
    [
        ("external", "UNAVAILABLE", "RECOVERY_REQUIRED"),
        (None, "UNAVAILABLE", "DEAD"),
        ("external", "INVALID_ARGUMENT", "FAILED"),
    ],
)
def test_an_exhausted_external_step_with_an_intent_waits_for_an_operator(
    effect, code, status, store, fresh_dsn, services
):
    from tests.integration.test_effects_crash import charge_workflow

    _flaky_charge(services, code)
    wf = charge_workflow(services.target, effect=effect, verify=False)
    job = enqueue(store, wf, {"text": "pay"}, max_attempts=1)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == status, (row.status, row.error)
    detail = f"GRPC: gRPC {code} from {services.target}: flaky"
    if status == "RECOVERY_REQUIRED":
        assert row.outstanding_step == "charge"
        assert row.error == (
            f"step 'charge' has effect 'external', an intent and no checkpoint, and its call "
            f"failed on the last attempt ({detail}): reconcile-step must say whether it happened"
        )
    else:
        assert row.error == detail
    assert row.lease_owner is None
    assert services.calls("Run") == 1


# == 9. the dashboard's reads of a definition that no longer parses ==============================


def test_the_dashboard_step_list_of_an_unparsable_definition_is_unchanged_by_the_restructure(
    store, fresh_dsn, services
):
    """The dashboard's job page lists the steps from ``JobInspector.step_names``. Before the
    restructure (4754549, job_inspector.py) the names were read from the stored definition's
    ``steps`` without parsing it, so a parked job whose method vanished still showed
    tokenize, embed and review (review waiting). runs/inspector.py now parses through
    StoredRun.load and answers [] for any SnapshotError: the page falls back to the
    checkpointed steps only, and the step the job waits on disappears from its timeline."""
    from protomolt_jobs.runs.inspector import JobInspector

    job = _parked(store, services.target)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "WAITING"
    wf = seed_workflow(services.target)
    wf["steps"][1]["method"] = "jobs.test.Nope/Nope"
    corrupt(fresh_dsn, job.job_id, "workflow_definition", wf)
    inspector = JobInspector(lambda: store, Runtime())
    assert inspector.step_names(str(job.job_id)) == ["tokenize", "embed", "review"]
    # the other inspector reads answer without raising
    assert inspector.step_graph(str(job.job_id)) == []
    assert inspector.answer_type(str(job.job_id), "review") is None


# == 10. graphs: compensation when the worker (not the engine) ends the run =====================


def test_a_graph_run_failed_by_its_budget_compensates_its_succeeded_steps(
    store, fresh_dsn, services
):
    """docs/workflows.md: "When a run fails ... every step that declared compensate and
    succeeded has its compensation step run". A budget.maxCost overrun FAILS the run after
    reserve's checkpoint; reserve declared compensate: release."""
    from tests.support.graphs import graph, step

    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release", cost="6"),
            step("charge", t, after=["reserve"], cost="6"),
            step("release", t, reads=["reserve"]),
        ],
        budget={"maxCost": 10},
    )
    job = enqueue(store, wf, {"text": "x"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "FAILED", (row.status, row.error)
    assert row.error.startswith("BUDGET: budget.maxCost 10 exceeded"), row.error
    assert services.step_calls("charge") == 0
    assert services.step_calls("release") == 1, "the succeeded step was not compensated"
    assert [c["name"] for c in row.checkpoints] == ["reserve", "release"]


def test_a_cancelled_graph_run_whose_last_main_step_was_in_flight_keeps_it_and_compensates(
    store, fresh_dsn, services, verbs
):
    """The last main step's entry is held for job_complete (CheckpointWriter); a cancel pending
    when it answers turns the completion CANCELLED (the entry kept), and then the compensations
    run (compensation.py)."""
    from tests.support.graphs import graph, step

    t = services.target
    inside, release = threading.Event(), threading.Event()

    def run(request, context):
        if request.step == "ship":
            inside.set()
            release.wait(30)
        return services._do_run(request, context)

    services.set_handler("Run", run)
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("ship", t, after=["reserve"]),
            step("release", t, reads=["reserve"]),
        ]
    )
    job = enqueue(store, wf, {"text": "x"})
    worker = in_process_worker(store, fresh_dsn)
    th, out = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        answer = verbs("cancel-job", {"jobId": str(job.job_id)})
        assert answer["ok"] is True and answer.get("requested") == "cancel", answer
        release.set()
        th.join(30)
        assert out == [True]
        wait_for(
            lambda: services.step_calls("release") == 1,
            timeout_s=10,
            what=lambda: str(store.job_get(job.job_id)),
        )
        row = store.job_get(job.job_id)
        assert row.status == "CANCELLED"
        assert [c["name"] for c in row.checkpoints] == ["reserve", "ship", "release"]
        assert row.result is None
    finally:
        release.set()
        worker.stop(5)


# == 11. parked steps ============================================================================


def _waiting(store, fresh_dsn, services) -> Any:
    job = _parked(store, services.target)
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "WAITING"
    return job, worker


def test_concurrent_complete_step_answers_are_applied_once(store, fresh_dsn, services, verbs):
    job, worker = _waiting(store, fresh_dsn, services)
    body = {
        "jobId": str(job.job_id),
        "stepName": "review",
        "response": {"approved": True, "note": "ok"},
    }
    answers: list = []
    barrier = threading.Barrier(4)

    def answer():
        barrier.wait(10)
        answers.append(verbs("complete-step", body))

    threads = [threading.Thread(target=answer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 4 and all(a["ok"] is True for a in answers), answers
    # a redelivered answer is "ok: true with the job's current status" (QUEUED too): count
    # what was written instead
    row = store.job_get(job.job_id)
    assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
    assert worker.run_once() is True
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED" and row.result["note"] == "ok"
    kinds = [k for k, _ in event_types(store, job.job_id)]
    assert kinds.count("STEP_CHECKPOINT") == 3 and kinds.count("COMPLETED") == 1


def test_cancel_racing_complete_step_on_a_parked_job_has_one_end_state(
    store, fresh_dsn, services, verbs
):
    job, worker = _waiting(store, fresh_dsn, services)
    body = {"jobId": str(job.job_id), "stepName": "review", "response": {"approved": True}}
    out: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def run(name, verb, b):
        barrier.wait(10)
        out[name] = verbs(verb, b)

    ts = [
        threading.Thread(target=run, args=("complete", "complete-step", body)),
        threading.Thread(target=run, args=("cancel", "cancel-job", {"jobId": str(job.job_id)})),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    row = store.job_get(job.job_id)
    if out["cancel"]["ok"] and out["cancel"]["status"] == "CANCELLED":
        # the cancel ran first: the answer was refused or came after it
        assert row.status == "CANCELLED"
        assert out["complete"]["ok"] is False or out["complete"]["status"] == "CANCELLED", out
    else:
        assert out["complete"] == {"ok": True, "status": "QUEUED"}, out
    while worker.run_once():
        pass
    final = store.job_get(job.job_id)
    assert final.status in ("CANCELLED", "COMPLETED")
    kinds = [k for k, _ in event_types(store, job.job_id)]
    assert kinds.count("CANCELLED") + kinds.count("COMPLETED") == 1, kinds


def test_a_parked_answer_with_a_misspelt_field_is_refused_and_writes_nothing(
    store, fresh_dsn, services, verbs
):
    job, _worker = _waiting(store, fresh_dsn, services)
    from protomolt_jobs.errors import InvalidInput

    with pytest.raises(InvalidInput):
        verbs(
            "complete-step",
            {"jobId": str(job.job_id), "stepName": "review", "response": {"approvedd": True}},
        )
    row = store.job_get(job.job_id)
    assert row.status == "WAITING" and [c["name"] for c in row.checkpoints] == ["tokenize", "embed"]


def test_retry_step_on_a_row_with_odd_step_generations_is_not_an_internal_error(
    store, fresh_dsn, services, verbs
):
    """``step_generations`` holding a non-number ({"embed": "x"}): retry-step's store write
    casts it to an integer and PostgreSQL refuses, so the verb answers internal-error (a 500,
    "the node's log has the details") instead of job-corrupt or a refusal. Same before the
    restructure (4754549); found by reading every broken column through every verb."""
    job = enqueue(store, seed(services.target), {"text": "hello brave world"})
    worker = in_process_worker(store, fresh_dsn)
    assert worker.run_once() is True
    assert store.job_get(job.job_id).status == "COMPLETED"
    corrupt(fresh_dsn, job.job_id, "step_generations", {"embed": "x"})
    seq = store.job_get(job.job_id).history_seq
    try:
        verbs("retry-step", {"jobId": str(job.job_id), "stepName": "embed"})
    except InternalError as exc:
        pytest.fail(f"retry-step answered internal-error: {exc}")
    except ActionError:
        pass  # job-corrupt or another named refusal is fine
    row = store.job_get(job.job_id)
    assert row.status in ("COMPLETED", "QUEUED")
    if row.status == "COMPLETED":
        assert row.history_seq == seq


# == 12. a request reaching a job that waits for its permit (the Stopped outcome) =================


@pytest.mark.parametrize("request_", ["cancel", "pause", "pause-then-resume"])
def test_a_request_reaching_a_job_waiting_for_its_permit(
    request_, store, fresh_dsn, services, verbs
):
    """Two claim loops, one permit per target: job 1 holds the permit inside Tokenize, job 2
    is claimed and waits for the permit. A cancel/pause of job 2 is learnt from the heartbeat
    and applied with job_stop before its first step (Tokenize is never called for it); a
    pause withdrawn by resume-job before that gives the job back (job_release) and it runs."""
    inside, release = threading.Event(), threading.Event()
    first: dict[str, Any] = {}

    def tokenize(request, context):
        if not first:
            first["text"] = request.text
            inside.set()
            release.wait(30)
        return services._do_tokenize(request, context)

    services.set_handler("Tokenize", tokenize)
    one = enqueue(store, seed(services.target), {"text": "holder of the permit"})
    worker = in_process_worker(
        store, fresh_dsn, worker_count=2, max_concurrent_per_target=1, lease_seconds=1.0
    )
    worker.start()
    try:
        assert inside.wait(30)
        two = enqueue(store, seed(services.target), {"text": "waiter"})
        wait_for(lambda: store.job_get(two.job_id).status == "RUNNING", timeout_s=20)
        if request_ == "cancel":
            answer = verbs("cancel-job", {"jobId": str(two.job_id)})
            assert answer["ok"] and answer.get("requested") == "cancel", answer
            wait_for(lambda: store.job_get(two.job_id).status == "CANCELLED", timeout_s=20)
        elif request_ == "pause":
            answer = verbs("pause-job", {"jobId": str(two.job_id)})
            assert answer["ok"] and answer.get("requested") == "pause", answer
            wait_for(lambda: store.job_get(two.job_id).status == "PAUSED", timeout_s=20)
        else:
            assert verbs("pause-job", {"jobId": str(two.job_id)})["ok"]
            resumed = verbs("resume-job", {"jobId": str(two.job_id)})
            assert resumed["ok"] is True, resumed
        row = store.job_get(two.job_id)
        assert row.checkpoints == []
        assert row.lease_owner is None or request_ == "pause-then-resume"
        release.set()
        wait_for(lambda: store.job_get(one.job_id).status == "COMPLETED", timeout_s=30)
        if request_ == "pause-then-resume":
            wait_for(lambda: store.job_get(two.job_id).status == "COMPLETED", timeout_s=30)
            assert services.calls("Tokenize") == 2
            kinds = [k for k, _ in event_types(store, two.job_id)]
            assert "PAUSED" not in kinds and kinds.count("COMPLETED") == 1
        else:
            assert services.calls("Tokenize") == 1, "the stopped job's step was called"
            assert store.job_get(two.job_id).status in ("CANCELLED", "PAUSED")
    finally:
        release.set()
        worker.stop(10)


# == 13. graceful stop mid-step: the release gives the attempt back =============================


def test_a_graceful_stop_mid_step_releases_the_job_and_the_late_answer_writes_nothing(
    store, fresh_dsn, services
):
    inside, release = _blocking(services, "Embed", "_do_embed")
    job = enqueue(store, seed(services.target), {"text": "deploy now"})
    keys = {**_FAST, "shutdown_grace_seconds": 0.5}
    a = WorkerProcess(fresh_dsn, worker_id="stopping-a", **keys)
    b = WorkerProcess(fresh_dsn, worker_id="after-b", **keys)
    try:
        a.start()
        assert inside.wait(30)
        assert a.terminate(30) == 0
        row = store.job_get(job.job_id)
        assert row.status == "QUEUED", (row.status, row.error)
        assert row.attempt == 0, "the attempt was not given back"
        assert row.lease_owner is None
        assert [c["name"] for c in row.checkpoints] == ["tokenize"]
        before = _row_state(store, job.job_id)
        release.set()  # the dead process's call answers into nothing
        services.set_handler("Embed", services._do_embed)
        assert _row_state(store, job.job_id) == before
        b.start()
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED", timeout_s=60)
        row = store.job_get(job.job_id)
        assert row.attempt == 1
        assert services.calls("Tokenize") == 1 and services.calls("Embed") == 2
    finally:
        release.set()
        a.close()
        b.close()


# == 14. an external LAST step: its entry is held for job_complete ================================


@pytest.mark.parametrize(("verify", "found"), [(True, True), (True, False), (False, False)])
def test_a_crash_before_the_completion_of_an_external_last_step(
    verify, found, store, fresh_dsn, services
):
    """The last step's entry rides job_complete (CheckpointWriter holds it). A crash after the
    external last step answered and before the completion (before_settle) leaves an intent and
    no checkpoint: the next claim must not call the step blindly (its probe decides, or the run
    waits as RECOVERY_REQUIRED)."""
    from tests.integration.test_effects_crash import charge_workflow, probe_answers

    probe_answers(services, found, "r-9")
    wf = charge_workflow(services.target, effect="external", verify=verify)
    wf["steps"] = wf["steps"][:2]  # prepare -> charge (last)
    job = enqueue(store, wf, {"text": "pay"})
    a = WorkerProcess(fresh_dsn, worker_id="last-a", crash_at="before_settle", **_FAST)
    b = WorkerProcess(fresh_dsn, worker_id="last-b", **_FAST)
    try:
        a.start(wait_ready=False)
        assert a.wait_exit(60) == CRASH_EXIT_CODE, a.logs()
        row = store.job_get(job.job_id)
        assert [c["name"] for c in row.checkpoints] == ["prepare"]
        assert "charge" in (row.effect_intents or {})
        assert services.calls("Run") == 1
        b.start()
        final = "COMPLETED" if verify else "RECOVERY_REQUIRED"
        wait_for(lambda: store.job_get(job.job_id).status == final, timeout_s=60)
        expected_runs = 2 if (verify and not found) else 1
        assert services.calls("Run") == expected_runs
        if verify and found:
            assert store.job_get(job.job_id).checkpoints[1]["receipt"] == {"note": "r-9"}
    finally:
        a.close()
        b.close()


# == 15. a pending pause meeting each settlement ================================================


@pytest.mark.parametrize(
    ("code", "max_attempts", "status"),
    [
        ("INVALID_ARGUMENT", 3, "FAILED"),  # a verdict: the pause is dropped
        ("UNAVAILABLE", 1, "DEAD"),  # a verdict: the pause is dropped
        ("UNAVAILABLE", 3, "PAUSED"),  # a retry: the pause wins
        (None, 3, "PAUSED"),  # a checkpoint: the pause wins
    ],
)
def test_a_pending_pause_meeting_the_settlement(
    code, max_attempts, status, store, fresh_dsn, services, verbs
):
    import grpc

    inside, release = threading.Event(), threading.Event()

    def embed(request, context):
        inside.set()
        release.wait(30)
        if code:
            context.abort(getattr(grpc.StatusCode, code), "late")
        return services._do_embed(request, context)

    services.set_handler("Embed", embed)
    job = enqueue(store, seed(services.target), {"text": "pause me"}, max_attempts=max_attempts)
    worker = in_process_worker(store, fresh_dsn)
    th, _ = _run_once_in_thread(worker)
    try:
        assert inside.wait(30)
        answer = verbs("pause-job", {"jobId": str(job.job_id)})
        assert answer["ok"] and answer.get("requested") == "pause", answer
        release.set()
        th.join(30)
        row = store.job_get(job.job_id)
        assert row.status == status, (row.status, row.error)
        assert row.lease_owner is None
        assert row.control is None, f"a request is left on the {status} row: {row.control}"
        kinds = [k for k, _ in event_types(store, job.job_id)]
        assert sum(kinds.count(k) for k in ("FAILED", "DEAD", "PAUSED", "QUEUED")) <= 1, kinds
        if status == "PAUSED":
            resumed = verbs("resume-job", {"jobId": str(job.job_id)})
            assert resumed["ok"] is True, resumed
            services.set_handler("Embed", services._do_embed)
            wait_for(worker.run_once, timeout_s=10)
            assert store.job_get(job.job_id).status == "COMPLETED"
            assert services.calls("Tokenize") == 1
    finally:
        release.set()
        worker.stop(5)
