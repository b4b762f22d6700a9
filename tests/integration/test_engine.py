"""The workflow engine against real gRPC servers on loopback (issue 3 acceptance)."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import grpc
import pytest

from protomolt_jobs.workflow import (
    CANNOT_PARK,
    Completed,
    FailureKind,
    Parked,
    Runtime,
    WorkflowExecutionError,
    next_target,
    parse_workflow,
    run,
    run_segment,
    verify,
)
from tests.support.grpc_servers import BoxServer, TestServices, expected_tokens, seed_workflow

TEXT = "hello big world"


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def svc(services):
    services.reset()
    return services


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


def compiled(runtime: Runtime, wf: dict[str, Any]):
    workflow = parse_workflow(wf, runtime)
    assert verify(workflow) == []
    return workflow


def failure(callable_, *args, **kwargs) -> WorkflowExecutionError:
    with pytest.raises(WorkflowExecutionError) as info:
        callable_(*args, **kwargs)
    return info.value


# -- the seed, both schema forms ----------------------------------------------------------------


def test_descriptor_set_and_sources_give_the_same_output(svc, runtime):
    outputs = []
    for form in ("descriptorSetBase64", "sources"):
        wf = compiled(runtime, seed_workflow(svc.target, schema=form, review="invoke"))
        result = run(wf, {"text": TEXT, "meta": {"origin": "test"}}, runtime=runtime)
        assert isinstance(result, Completed)
        assert result.output_type == "jobs.test.Summary"
        assert result.steps == [
            {"name": "tokenize", "skipped": False},
            {"name": "embed", "skipped": False},
            {"name": "review", "skipped": False},
        ]
        outputs.append(result.output_json)
    assert outputs[0] == outputs[1]
    out = outputs[0]
    assert out["ids"] == [str(i) for i in expected_tokens(TEXT)]
    assert out["count"] == 3
    assert out["tier"] == "long"  # CEL rule (filter + selector) in the output mapping
    assert out["approved"] is True and out["note"] == "auto-approved"
    assert out["model"] == "test-embed-v1"
    assert out["meta"] == {"origin": "test", "tokenizer": "whitespace"}  # Struct through 2 steps
    assert svc.calls("Tokenize") == 2 and svc.calls("Embed") == 2 and svc.calls("Review") == 2


def test_short_text_takes_the_other_cel_branch(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target, review="invoke"))
    result = run(wf, {"text": "two words"}, runtime=runtime)
    assert result.output_json["tier"] == "short"


def test_text_rules_cel_rules_and_struct_keys_build_the_request(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][0]["rules"] = [
        "text = input.text",
        "meta = input.meta",
        'meta.source = "tika"',  # a key written inside a Struct
        "meta.nested.level = 2",
        "lang = input.meta.lang",  # a Struct key read into a string field
        "-meta.drop",
    ]
    wf["steps"][0]["celRules"] = [
        {"selector": "input.text.upperAscii() + '!'", "target": "text"},
        {"filter": "has(target.meta)", "selector": "size(input.text)", "target": "meta.length"},
        {"filter": "false", "selector": "'never'", "target": "lang"},
        {"target": "lang", "fallback": ["lang = text"]},  # no selector: the fallback runs
    ]
    workflow = compiled(runtime, wf)
    run(workflow, {"text": "abc def", "meta": {"lang": "en", "drop": True}}, runtime=runtime)
    (request,) = svc.requests("Tokenize")
    assert request.text == "ABC DEF!"
    assert request.lang == "ABC DEF!"
    meta = dict(request.meta)
    assert meta["source"] == "tika"
    assert meta["lang"] == "en"
    assert meta["length"] == 7
    assert "drop" not in meta
    assert dict(meta["nested"]) == {"level": 2}


def test_literals_append_and_clear(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["rules"] = [
        "ids = tokenize.ids",
        "ids += 7",
        "ids += tokenize.ids",
        'text = "quoted = literal"',
        "count = 3",
        "-meta",
    ]
    workflow = compiled(runtime, wf)
    run(workflow, {"text": "a b"}, runtime=runtime)
    (request,) = svc.requests("Embed")
    assert list(request.ids) == [97, 98, 7, 97, 98]
    assert request.text == "quoted = literal"
    assert request.count == 3
    assert not request.HasField("meta")


def test_absent_source_skips_the_rule(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][0]["rules"] = ['text = "kept"', "text = input.text", "lang = input.lang"]
    workflow = compiled(runtime, wf)
    run(workflow, {"text": ""}, runtime=runtime)
    (request,) = svc.requests("Tokenize")
    assert request.text == "kept"  # input.text is empty: absent, the literal stays
    assert request.lang == ""


def test_gate_true_runs_the_step_and_gate_false_skips_it(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["when"] = "size(tokenize.ids) > 1 && input.lang != 'none'"
    del wf["steps"][1]["validate"]
    workflow = compiled(runtime, wf)

    entries: list[dict] = []
    result = run_segment(workflow, {"text": "one two"}, [], entries.append, runtime=runtime)
    assert isinstance(result, Completed)
    assert [e["skipped"] for e in entries] == [False, False, False]
    assert svc.calls("Embed") == 1

    entries.clear()
    result = run_segment(workflow, {"text": "one"}, [], entries.append, runtime=runtime)
    assert result.steps[1] == {"name": "embed", "skipped": True}
    assert entries[1] == {"name": "embed", "skipped": True}
    assert svc.calls("Embed") == 1  # not called again
    # the skipped step is bound to an empty Embedding, so review saw no values
    assert list(svc.requests("Review")[-1].values) == []
    assert result.output_json["values"] == []
    assert result.output_json["approved"] is False


def test_without_output_mapping_the_last_executed_response_is_the_result(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    del wf["output"]
    wf["steps"][2]["when"] = "false"
    result = run(compiled(runtime, wf), {"text": "a b"}, runtime=runtime)
    assert result.output_type == "jobs.test.Embedding"
    assert result.output_json["model"] == "test-embed-v1"


def test_inprocess_targets_use_the_runtime_channel_factory(svc):
    made: list[tuple[str, bool]] = []
    channel = grpc.insecure_channel(svc.target)

    def factory(target: str, tls: bool) -> grpc.Channel:
        made.append((target, tls))
        return channel

    try:
        runtime = Runtime(channel_factory=factory)
        wf = compiled(runtime, seed_workflow("inprocess:jobs-test", review="invoke"))
        result = run(wf, {"text": TEXT}, runtime=runtime)
        assert result.output_json["count"] == 3
        assert made == [("inprocess:jobs-test", False)]  # one channel for the segment
        # the factory owns its channel: the engine did not close it
        assert run(wf, {"text": TEXT}, runtime=runtime).output_json["count"] == 3
    finally:
        channel.close()


def test_a_channel_factory_that_refuses_the_target_is_a_workflow_failure(svc):
    def factory(target: str, tls: bool) -> grpc.Channel:
        raise ValueError(f"no in-process service named {target[10:]!r} on this node")

    runtime = Runtime(channel_factory=factory)
    wf = compiled(runtime, seed_workflow("inprocess:nobody", review="invoke"))
    for call in (
        lambda: run(wf, {"text": TEXT}, runtime=runtime),
        lambda: run_segment(wf, {"text": TEXT}, [], lambda e: None, runtime=runtime),
    ):
        err = failure(call)
        assert err.kind is FailureKind.WORKFLOW
        assert err.step == "tokenize"
        assert err.code is None and not err.store_failure
        assert err.message == (
            "outbound channel policy rejected step: target 'inprocess:nobody': "
            "no in-process service named 'nobody' on this node"
        )
        assert isinstance(err.__cause__, ValueError)


def test_a_closed_factory_channel_is_unavailable(svc):
    channel = grpc.insecure_channel(svc.target)
    channel.close()  # the host is shutting down its in-process channels
    runtime = Runtime(channel_factory=lambda target, tls: channel)
    wf = compiled(runtime, seed_workflow("inprocess:jobs-test", review="invoke"))
    err = failure(run, wf, {"text": TEXT}, runtime=runtime)
    assert (err.kind, err.code, err.step) == (
        FailureKind.GRPC,
        grpc.StatusCode.UNAVAILABLE,
        "tokenize",
    )
    assert err.message.startswith("gRPC UNAVAILABLE from inprocess:jobs-test: ")


def test_a_bound_value_cel_cannot_hold_fails_the_gate_or_the_mapping(svc, runtime, monkeypatch):
    import protomolt_jobs.workflow.cel as cel_module

    def unrepresentable(msg):
        raise OverflowError("timestamp out of range for datetime")

    gated = seed_workflow(svc.target, review="invoke")
    gated["steps"][1]["when"] = "size(tokenize.ids) > 0"
    gated = compiled(runtime, gated)
    mapped = seed_workflow(svc.target, review="invoke")
    mapped["steps"][1]["celRules"] = [{"selector": "tokenize.text", "target": "text"}]
    mapped = compiled(runtime, mapped)
    # Binding a message into the scope is where its conversion fails: bind_message converts a
    # type that can fail (one reaching a Timestamp or Duration) at once (test_cel_deferred).
    monkeypatch.setattr(cel_module, "bind_message", unrepresentable)
    err = failure(run, gated, {"text": TEXT}, runtime=runtime)
    assert (err.kind, err.step) == (FailureKind.GATE, "embed")
    assert err.message == "gate failed: timestamp out of range for datetime"

    err = failure(run, mapped, {"text": TEXT}, runtime=runtime)
    assert (err.kind, err.step) == (FailureKind.MAPPING, "embed")
    assert err.message == "mapping failed: timestamp out of range for datetime"


def test_inprocess_target_without_a_factory_is_a_workflow_failure(svc, runtime):
    wf = compiled(runtime, seed_workflow("inprocess:jobs-test", review="invoke"))
    err = failure(run, wf, {"text": TEXT}, runtime=runtime)
    assert err.kind is FailureKind.WORKFLOW
    assert err.step == "tokenize"
    assert "inprocess:jobs-test" in err.message


# -- every failure kind -----------------------------------------------------------------------


def test_unavailable_is_grpc_with_that_code(svc, runtime):
    svc.fail_next("Embed", 1, grpc.StatusCode.UNAVAILABLE, "backend down")
    err = failure(
        run,
        compiled(runtime, seed_workflow(svc.target, review="invoke")),
        {"text": TEXT},
        runtime=runtime,
    )
    assert err.kind is FailureKind.GRPC
    assert err.code is grpc.StatusCode.UNAVAILABLE
    assert err.step == "embed"
    assert err.message == f"gRPC UNAVAILABLE from {svc.target}: backend down"
    assert err.detail == f"GRPC: gRPC UNAVAILABLE from {svc.target}: backend down"


def test_server_status_passes_through(svc, runtime):
    err = failure(
        run,
        compiled(runtime, seed_workflow(svc.target, review="invoke")),
        {"text": TEXT, "fail": True},
        runtime=runtime,
    )
    assert (err.kind, err.code, err.step) == (
        FailureKind.GRPC,
        grpc.StatusCode.FAILED_PRECONDITION,
        "tokenize",
    )
    assert err.message == f"gRPC FAILED_PRECONDITION from {svc.target}: asked to fail"


def test_slow_server_past_the_step_deadline_is_deadline_exceeded(svc, runtime):
    svc.set_delay("Embed", 2.0)
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["deadlineMs"] = 150
    started = time.monotonic()
    err = failure(run, compiled(runtime, wf), {"text": TEXT}, runtime=runtime)
    assert err.kind is FailureKind.GRPC
    assert err.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.step == "embed"
    assert err.message.startswith(f"gRPC DEADLINE_EXCEEDED from {svc.target}:")
    assert time.monotonic() - started < 1.8  # the step deadline cut the 2 s call short


def test_workflow_budget_caps_the_step_deadline(svc, runtime):
    svc.set_delay("Tokenize", 2.0)
    wf = seed_workflow(svc.target, review="invoke", deadline_ms=200, step_deadline_ms=10_000)
    started = time.monotonic()
    err = failure(run, compiled(runtime, wf), {"text": TEXT}, runtime=runtime)
    assert (err.kind, err.code, err.step) == (
        FailureKind.GRPC,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "tokenize",
    )
    assert time.monotonic() - started < 1.8


def test_exhausted_budget_is_deadline_before_the_call(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target, review="invoke", deadline_ms=300))

    def slow_checkpoint(entry: dict) -> None:
        time.sleep(0.4)  # spend the whole segment budget between two steps

    err = failure(run_segment, wf, {"text": TEXT}, [], slow_checkpoint, runtime=runtime)
    assert err.kind is FailureKind.DEADLINE
    assert err.step == "embed"
    assert err.message == "workflow deadline exhausted before the step ran"
    assert err.code is None
    assert svc.calls("Tokenize") == 1 and svc.calls("Embed") == 0


def test_validation_failure_names_the_violations(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target, review="invoke"))
    err = failure(run, wf, {"text": ""}, runtime=runtime)  # no tokens -> no values
    assert err.kind is FailureKind.VALIDATION
    assert err.step == "embed"
    assert err.message.startswith("response failed validation: values: ")
    assert svc.calls("Review") == 0


def test_message_level_rule_fails_validation(svc, runtime):
    review_cls = svc.message_class("jobs.test.Review")
    svc.set_handler("Review", lambda request, context: review_cls(approved=False))
    err = failure(
        run,
        compiled(runtime, seed_workflow(svc.target, review="invoke")),
        {"text": TEXT},
        runtime=runtime,
    )
    assert err.kind is FailureKind.VALIDATION
    assert err.step == "review"
    assert "a rejection needs a note" in err.message


def test_mapping_failure(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["rules"] = ["count = tokenize.text"]
    err = failure(run, compiled(runtime, wf), {"text": "not a number"}, runtime=runtime)
    assert err.kind is FailureKind.MAPPING
    assert err.step == "embed"
    assert err.message.startswith("mapping failed: ")
    assert "int32" in err.message and "(Rule: 'count = tokenize.text')" in err.message
    assert svc.calls("Embed") == 0


def test_output_mapping_failure_belongs_to_output(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["output"]["celRules"] = [{"selector": "tokenize.text", "target": "count"}]
    err = failure(run, compiled(runtime, wf), {"text": "words here"}, runtime=runtime)
    assert (err.kind, err.step) == (FailureKind.MAPPING, "output")


def test_gate_failure(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["when"] = "input.meta.flag"  # reading a field of an unset message
    err = failure(run, parse_workflow(wf, runtime), {"text": TEXT}, runtime=runtime)
    assert err.kind is FailureKind.GATE
    assert err.step == "embed"
    assert err.message.startswith("gate failed: ")


def test_non_boolean_gate_is_a_gate_failure(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["when"] = "input.text"
    err = failure(run, parse_workflow(wf, runtime), {"text": TEXT}, runtime=runtime)
    assert err.kind is FailureKind.GATE
    assert err.message == "gate failed: CEL expression did not return a boolean: input.text"


def test_synchronous_run_refuses_an_external_step(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    err = failure(run, wf, {"text": TEXT}, runtime=runtime)
    assert err.kind is FailureKind.EXTERNAL
    assert err.step == "review"
    assert err.message == CANNOT_PARK
    assert (
        "synchronous run-workflow cannot park - submit the workflow as a job (submit-workflow) so complete-step can supply the response"
        in err.message
    )
    assert svc.calls("Tokenize") == 0  # refused before anything ran


def test_checkpoint_observer_failure_is_a_store_failure(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    cause = RuntimeError("database went away")

    def broken(entry: dict) -> None:
        raise cause

    err = failure(run_segment, wf, {"text": TEXT}, [], broken, runtime=runtime)
    assert err.kind is FailureKind.WORKFLOW
    assert err.store_failure is True
    assert err.step == "tokenize"
    assert err.message == (
        "checkpoint observer failed; the step's response may not have persisted: database went away"
    )
    assert err.__cause__ is cause


# -- segments, parking and replay ---------------------------------------------------------------


def test_segment_parks_at_the_external_step_and_resumes_after_completion(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    entries: list[dict] = []
    parked = run_segment(wf, {"text": TEXT}, [], entries.append, runtime=runtime)
    assert parked == Parked("review")
    assert [e["name"] for e in entries] == ["tokenize", "embed"]
    assert next_target(wf, 0) == svc.target
    assert next_target(wf, 2) is None  # external: parks without a call
    assert next_target(wf, 3) is None

    entries.append(
        {"name": "review", "skipped": False, "response": {"approved": True, "note": "ok by me"}}
    )
    new: list[dict] = []
    done = run_segment(wf, {"text": TEXT}, copy.deepcopy(entries), new.append, runtime=runtime)
    assert isinstance(done, Completed)
    assert new == []  # replayed steps are not reported again
    assert done.output_json["note"] == "ok by me"
    assert done.output_json["ids"] == [str(i) for i in expected_tokens(TEXT)]
    assert svc.calls("Tokenize") == 1 and svc.calls("Embed") == 1 and svc.calls("Review") == 0


def test_replayed_prefix_does_not_call_those_servers(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target, review="invoke"))
    entries: list[dict] = []
    first = run_segment(wf, {"text": TEXT}, [], entries.append, runtime=runtime)
    assert isinstance(first, Completed)
    svc.reset()
    new: list[dict] = []
    again = run_segment(wf, {"text": TEXT}, entries[:2], new.append, runtime=runtime)
    assert isinstance(again, Completed)
    assert svc.calls("Tokenize") == 0 and svc.calls("Embed") == 0
    assert svc.calls("Review") == 1
    assert [e["name"] for e in new] == ["review"]
    assert again.output_json == first.output_json
    assert again.steps == first.steps


def test_replay_keeps_a_skipped_checkpoint_skipped(svc, runtime):
    wf = seed_workflow(svc.target, review="invoke")
    wf["steps"][1]["when"] = "false"
    workflow = compiled(runtime, wf)
    prior = [
        {"name": "tokenize", "skipped": False, "response": {"ids": ["1"], "text": "x"}},
        {"name": "embed", "skipped": True},
    ]
    result = run_segment(workflow, {"text": "x"}, prior, lambda e: None, runtime=runtime)
    assert result.steps[:2] == [
        {"name": "tokenize", "skipped": False},
        {"name": "embed", "skipped": True},
    ]
    assert svc.calls("Tokenize") == 0 and svc.calls("Embed") == 0
    assert list(svc.requests("Review")[0].values) == []


def test_checkpoint_naming_another_step_is_drift(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    prior = [{"name": "embed", "skipped": False, "response": {}}]
    err = failure(run_segment, wf, {"text": TEXT}, prior, lambda e: None, runtime=runtime)
    assert err.kind is FailureKind.WORKFLOW
    assert err.step == "tokenize"
    assert err.message == (
        "checkpoint 0 belongs to step 'embed' but the workflow's step 0 is 'tokenize'; "
        "the workflow definition changed under the job"
    )
    assert svc.calls("Tokenize") == 0


def test_stored_response_that_no_longer_parses_is_drift(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    for response in ({"tokens": ["1"]}, {"ids": ["not a number"]}, {"count": "many"}):
        prior = [{"name": "tokenize", "skipped": False, "response": response}]
        err = failure(run_segment, wf, {"text": TEXT}, prior, lambda e: None, runtime=runtime)
        assert err.kind is FailureKind.WORKFLOW
        assert err.step == "tokenize"
        assert err.message.startswith(
            "checkpoint 'tokenize' response is not valid proto3 JSON for jobs.test.Tokens: "
        )
        assert len(err.message) > len(
            "checkpoint 'tokenize' response is not valid proto3 JSON for jobs.test.Tokens: "
        )
    prior = [{"name": "tokenize", "skipped": False, "response": "not an object"}]
    err = failure(run_segment, wf, {"text": TEXT}, prior, lambda e: None, runtime=runtime)
    assert err.message == (
        "checkpoint 'tokenize' response is not valid proto3 JSON for jobs.test.Tokens: "
        "expected a JSON object"
    )
    assert svc.calls("Tokenize") == 0


def test_more_checkpoints_than_steps_is_drift(svc, runtime):
    wf = compiled(runtime, seed_workflow(svc.target))
    prior = [{"name": n, "skipped": True} for n in ("tokenize", "embed", "review", "extra")]
    err = failure(run_segment, wf, {"text": TEXT}, prior, lambda e: None, runtime=runtime)
    assert err.kind is FailureKind.WORKFLOW
    assert err.message == "stored checkpoints (4) outnumber the workflow's steps (3)"
    assert not err.store_failure
    err = failure(run_segment, wf, {"text": TEXT}, {"not": "a list"}, print, runtime=runtime)
    assert (err.kind, err.message) == (FailureKind.WORKFLOW, "stored checkpoints are not an array")


def test_one_channel_per_target_per_segment_and_concurrent_segments(svc, runtime):
    svc.set_delay("Tokenize", 0.2)
    wf = compiled(runtime, seed_workflow(svc.target, review="invoke"))
    results: list[Any] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(run(wf, {"text": TEXT}, runtime=runtime).output_json)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(results) == 12 and all(r == results[0] for r in results)
    assert svc.max_in_flight("Tokenize") > 1  # segments really ran side by side


# -- responses carrying google.protobuf.Any -------------------------------------------------


@pytest.fixture(scope="module")
def boxes():
    with BoxServer() as server:
        yield server


def test_an_any_of_a_workflow_type_renders_in_checkpoints_and_output(boxes, runtime):
    boxes.packed_type = "jobs.anytest.Inner"
    wf = compiled(runtime, boxes.workflow())
    entries: list[dict] = []
    result = run_segment(wf, {"word": "hi"}, [], entries.append, runtime=runtime)
    assert isinstance(result, Completed)
    item = {"@type": "type.googleapis.com/jobs.anytest.Inner", "word": "hi"}
    assert entries == [
        {"name": "pack", "skipped": False, "response": {"item": item, "label": "boxed"}}
    ]
    assert result.output_json == {"item": item, "label": "boxed"}
    assert run(wf, {"word": "hi"}, runtime=runtime).output_json["item"] == item
    # the stored entry replays (the pool parses the Any back)
    again = run_segment(wf, {"word": "hi"}, entries, print, runtime=runtime)
    assert again.output_json == result.output_json


def test_an_any_nobody_knows_is_a_workflow_failure_not_a_store_failure(boxes, runtime):
    boxes.packed_type = "jobs.anytest.Missing"
    wf = compiled(runtime, boxes.workflow())
    stored: list[dict] = []
    err = failure(run_segment, wf, {"word": "hi"}, [], stored.append, runtime=runtime)
    assert err.kind is FailureKind.WORKFLOW
    assert err.step == "pack"
    assert err.store_failure is False  # the worker must not retry (and call the service again)
    assert err.message.startswith("could not render the checkpoint for 'pack' as JSON: ")
    assert "jobs.anytest.Missing" in err.message
    assert stored == []
    # synchronous run: nothing is stored; the output itself cannot be rendered
    err = failure(run, wf, {"word": "hi"}, runtime=runtime)
    assert (err.kind, err.step) == (FailureKind.WORKFLOW, "output")
    assert err.message.startswith("failed to render the workflow output: ")
