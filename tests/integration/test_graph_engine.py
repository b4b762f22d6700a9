"""The graph executor without the jobs worker: ``run_segment`` against the test gRPC servers
on loopback (upstream's edge and fan-out steps, structured steps, gates, handled failures)."""

from __future__ import annotations

import grpc
import pytest

from protomolt_jobs.workflow import (
    FailureKind,
    Parked,
    Runtime,
    WorkflowExecutionError,
    check,
    parse_workflow,
    run,
    run_segment,
)
from tests.support.graphs import batch, fan_out, graph, step


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def _run(wf, input, runtime, prior=None):
    assert check(wf, runtime) == []
    entries: list[dict] = []
    result = run_segment(
        parse_workflow(wf, runtime), input, prior or [], entries.append, runtime=runtime
    )
    return result, entries


# -- fan-out ------------------------------------------------------------------------------------


def test_fail_fast_over_twenty_items_stops_starting_branches_after_item_7(services, runtime):
    wf = fan_out(services.target, policy="FAIL_FAST", max_concurrency=4)
    with pytest.raises(WorkflowExecutionError) as info:
        # items 4..7 start together once 0..3 end; 7 fails 100 ms into its call, while
        # 4, 5 and 6 still hold the other three slots: nothing may start after that
        _run(wf, batch(20, failing=(7,), sleep_ms=300, fail_after_ms=100), runtime)
    err = info.value
    assert err.kind is FailureKind.GRPC
    assert err.code is grpc.StatusCode.FAILED_PRECONDITION
    assert err.step == "fan"
    assert err.message.startswith("branch 'fan#7' failed: gRPC FAILED_PRECONDITION from ")
    assert err.message.endswith("step item7 asked to fail")
    spans = services.spans()
    (failed,) = [s for s in spans if s[0] == "item7"]
    late = [s[0] for s in spans if s[1] > failed[2]]
    assert late == [], f"branches started after item 7 failed: {late}"
    started = {s[0] for s in spans}
    assert not started & {f"item{i}" for i in range(8, 20)}


def test_fail_fast_reports_the_lowest_index_failure(services, runtime):
    wf = fan_out(services.target, policy="FAIL_FAST", max_concurrency=8)
    with pytest.raises(WorkflowExecutionError) as info:
        _run(wf, batch(8, failing=(5, 2)), runtime)
    assert info.value.message.startswith("branch 'fan#2' failed: ")


def test_continue_collects_the_nineteen_others_in_index_order(services, runtime):
    wf = fan_out(services.target, policy="CONTINUE", max_concurrency=4)
    result, entries = _run(wf, batch(20, failing=(7,), sleep_ms=20), runtime)
    replies = result.output_json["replies"]
    assert [r["index"] for r in replies] == [i for i in range(20) if i != 7]
    assert [r["step"] for r in replies][:3] == ["item0", "item1", "item2"]
    assert services.calls("Run") == 20
    assert [e["name"] for e in entries] == ["fan"]
    assert services.max_in_flight("Run") <= 4


def test_zero_items_collect_nothing_and_succeed(services, runtime):
    result, _ = _run(fan_out(services.target), {"items": []}, runtime)
    assert result.output_json == {"replies": []}
    assert services.calls("Run") == 0


def test_more_items_than_max_items_is_an_edge_failure(services, runtime):
    with pytest.raises(WorkflowExecutionError) as info:
        _run(fan_out(services.target, max_items=3), batch(5), runtime)
    assert info.value.kind is FailureKind.EDGE
    assert info.value.message == "fan-out produced 5 items, over the max_items cap of 3"
    assert services.calls("Run") == 0


def test_a_fan_out_replays_its_collected_checkpoint(services, runtime):
    wf = fan_out(services.target, policy="CONTINUE")
    _, entries = _run(wf, batch(3), runtime)
    services.reset()
    result, more = _run(wf, batch(3), runtime, prior=entries)
    assert more == []
    assert services.calls("Run") == 0
    assert [r["index"] for r in result.output_json["replies"]] == [0, 1, 2]


# -- edges ----------------------------------------------------------------------------------------


def test_an_edge_builds_the_request_from_its_sources_only(services, runtime):
    t = services.target
    wf = graph(
        [
            step("a", t),
            {
                "name": "e",
                "target": t,
                "method": "jobs.test.Steps/Run",
                "edge": {
                    "sources": ["input", "a"],
                    "produceType": "jobs.test.StepRequest",
                    "rules": ["step = input.text", "seen = a.seen"],
                },
            },
        ]
    )
    result, entries = _run(wf, {"text": "edge"}, runtime)
    assert result.output_json == {"step": "edge", "seen": ["a", "edge"], "index": 0}
    assert [e["name"] for e in entries] == ["a", "e"]


def test_edge_validate_refuses_the_value_before_the_call(services, runtime):
    t = services.target
    wf = graph(
        [
            {
                "name": "e",
                "target": t,
                "method": "jobs.test.Steps/Run",
                "edge": {
                    "sources": ["input"],
                    "produceType": "jobs.test.StepRequest",
                    "rules": ["step = input.text"],
                    "validate": True,
                },
            }
        ]
    )
    # StepRequest declares no rules: a validated edge value passes and the call is made.
    result, _ = _run(wf, {"text": "ok"}, runtime)
    assert result.output_json["step"] == "ok"


# -- structured steps -------------------------------------------------------------------------------


def test_a_structured_step_without_a_generator_fails_with_upstreams_text(services, runtime):
    wf = graph([{"name": "gen", "structured": {"targetType": "jobs.test.StepReply", "model": "m"}}])
    with pytest.raises(WorkflowExecutionError) as info:
        _run(wf, {"text": "x"}, runtime)
    assert info.value.kind is FailureKind.STRUCTURED
    assert info.value.message == (
        "structured step 'gen' needs a StructuredGenerator; this runner was built without one"
    )


# -- gates, handled failures, run-workflow ------------------------------------------------------------


def test_a_false_gate_skips_with_its_reason_and_skips_propagate(services, runtime):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, after=["a"], when="input.text == 'never'"),
            step("c", t, after=["b"]),
            step("d", t, after=[{"step": "b", "on": "done"}]),
        ],
        completion={"require": ["d"]},
    )
    result, entries = _run(wf, {"text": "x"}, runtime)
    by = {e["name"]: e for e in entries}
    assert by["b"] == {
        "name": "b",
        "skipped": True,
        "reason": "condition false: input.text == 'never'",
    }
    assert by["c"] == {"name": "c", "skipped": True, "reason": "upstream b skipped"}
    assert by["d"]["skipped"] is False
    assert result.report["status"] == "COMPLETED"
    assert result.report["criterion"].startswith("completion.require [d]")


def test_max_parallel_bounds_the_steps_in_flight(services, runtime):
    t = services.target
    wf = graph(
        [step("root", t)] + [step(f"s{i}", t, sleep_ms=150, after=["root"]) for i in range(6)],
        maxParallel=2,
    )
    _run(wf, {"text": "x"}, runtime)
    assert services.max_in_flight("Run") == 2


def test_run_workflow_runs_a_graph_synchronously(services, runtime):
    t = services.target
    wf = graph([step("a", t), step("b", t, reads=["a"], after=["a"])])
    assert parse_workflow(wf, runtime).graph
    result = run(parse_workflow(wf, runtime), {"text": "x"}, runtime=runtime)
    assert result.output_json["seen"] == ["a", "b"]


def test_replay_resumes_only_steps_without_a_checkpoint(services, runtime):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, after=["a"]),
            step("c", t, after=["a"]),
            step("d", t, after=["b", "c"]),
        ]
    )
    _, entries = _run(wf, {"text": "x"}, runtime)
    services.reset()
    prior = [e for e in entries if e["name"] in ("a", "c")]
    _, more = _run(wf, {"text": "x"}, runtime, prior=prior)
    assert [e["name"] for e in more] == ["b", "d"]
    assert services.step_calls("a") == 0 and services.step_calls("c") == 0


def test_a_checkpoint_naming_no_step_is_drift(services, runtime):
    t = services.target
    wf = graph([step("a", t), step("b", t, after=["a"])])
    with pytest.raises(WorkflowExecutionError) as info:
        _run(wf, {"text": "x"}, runtime, prior=[{"name": "zz", "skipped": True}])
    assert info.value.kind is FailureKind.WORKFLOW
    assert "names step 'zz', which the workflow does not have" in info.value.message


# -- structured steps through a StructuredGenerator ------------------------------------------------


@pytest.fixture
def generator():
    from tests.support.grpc_servers import GeneratorServer

    with GeneratorServer() as gen:
        yield gen


def _structured(**extra) -> dict:
    spec = {"targetType": "jobs.test.StepReply", "model": "m1", "maxAttempts": 2}
    return {"name": "gen", "structured": spec, **extra}


def test_a_structured_step_asks_the_configured_generator(generator):
    runtime = Runtime(structured_generator=generator.target)
    result, entries = _run(graph([_structured()]), {"text": "x"}, runtime)
    assert result.output_json == {"step": "gen:m1", "seen": [], "index": 0}
    assert entries == [
        {
            "name": "gen",
            "skipped": False,
            "response": {"step": "gen:m1", "seen": [], "index": 0},
        }
    ]
    (request,) = generator.requests
    assert (request.target_type, request.model, request.max_attempts) == (
        "jobs.test.StepReply",
        "m1",
        2,
    )
    assert not request.HasField("grounding")


def test_a_structured_edge_step_is_grounded_on_the_edge_value(generator):
    runtime = Runtime(structured_generator=generator.target)
    wf = graph(
        [
            _structured(
                edge={
                    "sources": ["input"],
                    "produceType": "jobs.test.StepRequest",
                    "rules": ["step = input.text", "index = 4"],
                }
            )
        ]
    )
    result, _ = _run(wf, {"text": "ground"}, runtime)
    assert result.output_json == {"step": "gen:m1", "seen": ["ground"], "index": 4}
    assert generator.requests[0].grounding.type_url.endswith("/jobs.test.StepRequest")


def test_a_structured_fan_out_reports_the_failed_branch(generator):
    runtime = Runtime(structured_generator=generator.target)
    wf = fan_out("unused:1", policy="FAIL_FAST")
    step_ = wf["steps"][0]
    del step_["target"], step_["method"]
    step_["structured"] = {"targetType": "jobs.test.StepReply", "model": "m1"}
    with pytest.raises(WorkflowExecutionError) as info:
        _run(wf, batch(5, failing=(3,)), runtime)
    assert info.value.kind is FailureKind.STRUCTURED
    assert info.value.message == (
        "branch 'fan#3' failed: structured generation failed at branch 'fan#3'"
    )
    step_["fanOut"]["failurePolicy"] = "CONTINUE"
    result, _ = _run(wf, batch(5, failing=(3,)), runtime)
    assert [r["index"] for r in result.output_json["replies"]] == [0, 1, 2, 4]


def test_a_generator_answer_that_does_not_parse_is_a_workflow_failure(generator):
    generator.garbage = True
    runtime = Runtime(structured_generator=generator.target)
    with pytest.raises(WorkflowExecutionError) as info:
        _run(graph([_structured()]), {"text": "x"}, runtime)
    assert info.value.kind is FailureKind.WORKFLOW
    assert info.value.message == (
        "the coordinator's packed output does not parse as the step's target type"
    )


def test_a_generator_that_cannot_be_reached_is_a_structured_failure():
    runtime = Runtime(structured_generator="127.0.0.1:9")
    wf = graph([_structured()], deadlineMs=2000)
    with pytest.raises(WorkflowExecutionError) as info:
        _run(wf, {"text": "x"}, runtime)
    assert info.value.kind is FailureKind.STRUCTURED
    assert info.value.message.startswith("structured generation failed: gRPC ")


def test_edge_and_structured_steps_record_their_lineage_as_a_plain_step_does(services, generator):
    """Inside a job (an ``EffectContext``) every entry carries ``inputs``, hashed when the
    request is built (docs/artifacts.md): an edge step's are its declared sources, a structured
    step's what its gate reads (none here), a structured edge's its sources, a fan-out's its
    sources; a plain step's are what its rules read, as before."""
    import hashlib
    import uuid

    from google.protobuf import json_format

    from protomolt_jobs.store.artifact_rows import has_artifact_rows
    from protomolt_jobs.workflow.effects import EffectContext
    from tests.support.grpc_servers import message_class

    t = services.target
    runtime = Runtime(structured_generator=generator.target)
    edge = {"sources": ["input", "a"], "produceType": "jobs.test.StepRequest"}
    wf = graph(
        [
            step("a", t),
            step("b", t, reads=["a"]),
            {
                "name": "e",
                "target": t,
                "method": "jobs.test.Steps/Run",
                "edge": {**edge, "rules": ["step = input.text", "seen = a.seen"]},
            },
            _structured(
                name="ge",
                edge={"sources": ["b"], "produceType": "jobs.test.StepRequest", "rules": []},
            ),
            _structured(name="gp", after=["a"]),
        ]
    )
    assert check(wf, runtime) == []
    entries: list[dict] = []
    effects = EffectContext(job_id=str(uuid.uuid4()))
    run_segment(
        parse_workflow(wf, runtime),
        {"text": "x"},
        [],
        entries.append,
        runtime=runtime,
        effects=effects,
    )
    by = {e["name"]: e for e in entries}
    data = message_class("jobs.test.Text")(text="x").SerializeToString(deterministic=True)
    given = {"step": "input", "iteration": 0, "sha256": hashlib.sha256(data).hexdigest()}

    def of(name: str) -> dict:
        return {"step": name, "iteration": 0, "sha256": by[name]["sha256"]}

    assert by["a"]["inputs"] == []
    assert by["b"]["inputs"] == [of("a")]
    assert by["e"]["inputs"] == [of("a"), given]
    assert by["ge"]["inputs"] == [of("b")]
    assert by["gp"]["inputs"] == []
    assert all("sha256" in e and "sizeBytes" in e for e in entries)
    # no artifact key: each entry is stored by the plain checkpoint statement, as before
    assert not any(has_artifact_rows(e) for e in entries)
    # a fan-out edge: its sources
    fan: list[dict] = []
    run_segment(
        parse_workflow(fan_out(t), runtime),
        batch(3),
        [],
        fan.append,
        runtime=runtime,
        effects=EffectContext(job_id=str(uuid.uuid4())),
    )
    (entry,) = fan
    batch_msg = json_format.ParseDict(batch(3), message_class("jobs.test.StepBatch")())
    data = batch_msg.SerializeToString(deterministic=True)
    assert entry["inputs"] == [
        {"step": "input", "iteration": 0, "sha256": hashlib.sha256(data).hexdigest()}
    ]


def test_run_workflow_answers_a_graphs_report(services, runtime):
    from protomolt_jobs.verbs.workflow import RunWorkflowAction

    t = services.target
    wf = graph(
        [
            step("a", t),
            step("b", t, fail="FAILED_PRECONDITION", after=["a"]),
            step("c", t, after=["b"]),
        ]
    )
    answer = RunWorkflowAction(runtime).execute({"workflow": wf, "input": {"text": "x"}})
    assert answer["ok"] is False
    assert answer["failedStep"] == "b"
    assert answer["report"]["status"] == "FAILED"
    assert [s["status"] for s in answer["report"]["steps"]] == ["succeeded", "failed", "not run"]
    wf["steps"][1]["rules"] = ['step = "b"']
    answer = RunWorkflowAction(runtime).execute({"workflow": wf, "input": {"text": "x"}})
    assert answer["ok"] is True
    assert answer["report"]["criterion"].startswith("every sink [c]")


def test_an_external_step_whose_gate_is_false_is_skipped_not_parked(services, runtime):
    t = services.target
    wf = graph(
        [
            step("a", t),
            step("approve", t, after=["a"], completion="external", when="input.text == 'ask'"),
            step("b", t, after=[{"step": "approve", "on": "done"}]),
        ]
    )
    _, entries = _run(wf, {"text": "x"}, runtime)
    assert [e["name"] for e in entries] == ["a", "approve", "b"]
    assert entries[1]["reason"] == "condition false: input.text == 'ask'"
    parked = run_segment(
        parse_workflow(wf, runtime), {"text": "ask"}, [], lambda e: None, runtime=runtime
    )
    assert parked == Parked("approve")


def test_run_compensation_undoes_succeeded_steps_once(services, runtime):
    from protomolt_jobs.workflow.graph_run import run_compensation

    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("charge", t, after=["reserve"], compensate="refund"),
            step("ship", t, after=["charge"], sleep_ms=50),
            step("release", t, reads=["reserve"]),
            step("refund", t, reads=["charge"]),
        ]
    )
    compiled = parse_workflow(wf, runtime)
    # a cancel arrived after reserve and charge were checkpointed
    prior = [
        {"name": "reserve", "skipped": False, "response": {"step": "reserve"}},
        {"name": "charge", "skipped": False, "response": {"step": "charge"}},
    ]
    entries: list[dict] = []
    ran = run_compensation(compiled, {"text": "x"}, prior, entries.append, runtime=runtime)
    assert ran == ["refund", "release"]
    assert [e["name"] for e in entries] == ["refund", "release"]
    assert services.step_calls("ship") == 0
    again = run_compensation(
        compiled, {"text": "x"}, prior + entries, entries.append, runtime=runtime
    )
    assert again == []
    assert services.step_calls("refund") == 1 and services.step_calls("release") == 1
