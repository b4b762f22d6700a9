"""retry-step's scopes without services (workflow/retry_scope.py): what a retry stores, how a
stored array resolves for a segment and for a reader, and the engine replaying held entries
instead of calling (a stub channel counts the calls)."""

from __future__ import annotations

import pytest

from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow import retry_scope as rs
from tests.support.graphs import graph, step

T = "127.0.0.1:9"


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def _entry(name, seen=None, **extra):
    return {
        "name": name,
        "skipped": False,
        "response": {"step": name, "seen": seen or [name]},
        **extra,
    }


def _sequential(runtime, *, effect_on="charge"):
    steps = [step(n, T) for n in ("a", "b", "charge", "d")]
    for s in steps:
        if s["name"] == effect_on:
            s["effect"] = "external"
    return parse_workflow(graph(steps), runtime)


def _chain(runtime):
    return parse_workflow(
        graph(
            [
                step("a", T, after=[]),
                step("b", T, after=["a"]),
                step("c", T, after=["b"]),
                step("d", T, after=["c"]),
            ]
        ),
        runtime,
    )


def test_output_hash_reads_the_response_not_the_fingerprints():
    one = _entry("b", attempt=1, at="2026-01-01T00:00:00Z", requestSha256="x")
    two = _entry("b", attempt=7)
    assert rs.output_sha256(one) == rs.output_sha256(two)
    assert rs.output_sha256(one) != rs.output_sha256(_entry("b", seen=["other"]))
    skipped = {"name": "b", "skipped": True, "reason": "condition false: x"}
    failed = {"name": "b", "skipped": False, "failed": {"kind": "GRPC", "message": "no"}}
    assert len({rs.output_sha256(e) for e in (one, skipped, failed)}) == 3


def test_plan_only_marks_the_dependants_and_dependants_drops_them(runtime):
    wf = _chain(runtime)
    stored = [_entry(n) for n in "abcd"]
    only = rs.plan_retry(wf, stored, "b", scope="only", downstream={"c", "d"})
    sha = rs.output_sha256(stored[1])
    assert only.checkpoints == [
        stored[0],
        {**stored[2], "retryOf": {"step": "b", "outputSha256": sha}},
        {**stored[3], "retryOf": {"step": "b", "outputSha256": sha}},
    ]
    assert (only.dropped, only.provisional, only.kept_effects) == (["b"], ["c", "d"], [])
    deps = rs.plan_retry(wf, stored, "b", scope="dependants", downstream={"c", "d"})
    assert deps.checkpoints == [stored[0]]
    assert (deps.dropped, deps.provisional) == (["b", "c", "d"], [])
    with pytest.raises(ValueError, match="scope"):
        rs.plan_retry(wf, stored, "b", scope="all", downstream=())


def test_a_recorded_external_effect_is_kept_whatever_the_scope(runtime):
    wf = _sequential(runtime)
    stored = [_entry(n) for n in ("a", "b", "charge", "d")]
    for scope in rs.SCOPES:
        plan = rs.plan_retry(wf, stored, "a", scope=scope, downstream={"b", "charge", "d"})
        kept = [e for e in plan.checkpoints if e["name"] == "charge"]
        assert kept == [{**stored[2], "retryOf": {"step": "a", "kept": "effect"}}], scope
        assert plan.kept_effects == ["charge"]
    # a failed or skipped effect recorded nothing: it runs again
    skipped = {"name": "charge", "skipped": True, "reason": "condition false: x"}
    plan = rs.plan_retry(
        wf, [*stored[:2], skipped, stored[3]], "a", scope="dependants", downstream={"charge"}
    )
    assert plan.kept_effects == [] and "charge" in plan.dropped


def test_an_unmarked_array_resolves_to_none(runtime):
    assert rs.resolve(_chain(runtime), [_entry(n) for n in "abcd"]) is None
    assert rs.settled(_chain(runtime), [_entry("a")]) == [_entry("a")]


def test_a_graph_run_holds_the_marked_entries_until_the_retried_step_ran_again(runtime):
    wf = _chain(runtime)
    stored = [_entry(n) for n in "abcd"]
    plan = rs.plan_retry(wf, stored, "b", scope="only", downstream={"c", "d"})
    resolved = rs.resolve(wf, plan.checkpoints)
    assert resolved is not None and resolved.prior == [stored[0]]
    held = resolved.held
    assert held.take("c") is None  # b has not run again: c would run
    seen = []
    observed = held.wrap(seen.append)
    observed(_entry("b"))  # the same output
    assert seen == [_entry("b")]
    assert held.take("c") == stored[2] and held.take("d") == stored[3]
    # once b's new entry is stored, the next segment replays everything up front
    again = rs.resolve(wf, [*plan.checkpoints, _entry("b")])
    assert [e["name"] for e in again.prior] == ["a", "b", "c", "d"]
    assert "retryOf" not in again.prior[2]


def test_a_changed_output_drops_the_marked_entries_and_later_entries_win(runtime):
    wf = _chain(runtime)
    stored = [_entry(n) for n in "abcd"]
    plan = rs.plan_retry(wf, stored, "b", scope="only", downstream={"c", "d"})
    held = rs.resolve(wf, plan.checkpoints).held
    held.observe(_entry("b", seen=["changed"]))
    assert held.take("c") is None and held.take("d") is None
    # b stored with another output, c ran again: c's new entry wins, d runs
    after = [*plan.checkpoints, _entry("b", seen=["changed"]), _entry("c", seen=["new"])]
    resolved = rs.resolve(wf, after)
    assert [e["name"] for e in resolved.prior] == ["a", "b", "c"]
    assert resolved.prior[2]["response"]["seen"] == ["new"]
    assert resolved.held.take("d") is None
    assert [e["name"] for e in rs.settled(wf, after)] == ["a", "b", "c"]


def test_a_sequential_run_replays_a_positional_prefix_and_holds_the_rest(runtime):
    wf = _sequential(runtime)
    stored = [_entry(n) for n in ("a", "b", "charge", "d")]
    plan = rs.plan_retry(wf, stored, "b", scope="only", downstream={"charge", "d"})
    resolved = rs.resolve(wf, plan.checkpoints)
    assert [e["name"] for e in resolved.prior] == ["a"]
    assert resolved.held.take("charge") == stored[2]  # a kept effect: always
    assert resolved.held.take("d") is None  # waits for b
    # b ran again with the same output: the whole array is a prefix again
    resolved = rs.resolve(wf, [*plan.checkpoints, _entry("b")])
    assert [e["name"] for e in resolved.prior] == ["a", "b", "charge", "d"]


def test_a_second_retry_settles_the_first_one(runtime):
    wf = _chain(runtime)
    stored = [_entry(n) for n in "abcd"]
    first = rs.plan_retry(wf, stored, "b", scope="only", downstream={"c", "d"})
    ran = [*first.checkpoints, _entry("b")]  # b ran again, same output: c, d accepted
    second = rs.plan_retry(wf, ran, "c", scope="only", downstream={"d"})
    names = [(e["name"], e.get("retryOf", {}).get("step")) for e in second.checkpoints]
    assert names == [("a", None), ("b", None), ("d", "c")]


def test_the_engine_replays_held_entries_instead_of_calling(runtime):
    # run_segment on a graph whose dependants are marked: only b is called (a stub channel)
    from protomolt_jobs.workflow import run_segment
    from tests.support.grpc_servers import message_class

    calls: list[str] = []

    class _Channel:
        def unary_unary(self, path, request_serializer, response_deserializer):
            def call(request, timeout=None, metadata=None):
                calls.append(request.step)
                reply = message_class("jobs.test.StepReply")()
                reply.step = request.step
                reply.seen.append(request.step)
                return reply

            return call

        def close(self):
            pass

    rt = Runtime(channel_factory=lambda target, tls: _Channel())
    wf = parse_workflow(
        graph(
            [
                step(n, T, after=([] if n == "a" else [p]))
                for n, p in zip("abcd", " abc", strict=True)
            ]
        ),
        rt,
    )
    stored: list[dict] = []
    run_segment(wf, {"text": "x"}, [], stored.append, runtime=rt)
    assert calls == ["a", "b", "c", "d"]
    calls.clear()
    plan = rs.plan_retry(wf, stored, "b", scope="only", downstream={"c", "d"})
    written: list[dict] = []
    done = run_segment(wf, {"text": "x"}, plan.checkpoints, written.append, runtime=rt)
    assert calls == ["b"]
    assert [e["name"] for e in written] == ["b"]
    assert [s["name"] for s in done.steps] == ["a", "b", "c", "d"]


def test_an_intent_is_proven_only_by_a_checkpoint_of_its_own_iteration():
    job = "6f1c2b9e-0000-4000-8000-000000000001"
    checkpoints = [
        {"name": "build", "response": {}},
        {"name": "send", "response": {}},
        {"name": "build", "iteration": 1, "response": {}},
    ]
    intents = {
        # iteration 1's send: its intent is recorded, its call's outcome is not
        "send": {"key": f"{job}:send:0:1"},
        "notify": {"key": f"{job}:notify:0"},
        "build": {"key": f"{job}:build:0:1"},
    }
    kept = rs.unproven_intents(intents, checkpoints, retried="build")
    # send#0's checkpoint does not prove send#1's intent; notify has no checkpoint at all; the
    # retried step's own intent is the operator's word
    assert kept == {"send": intents["send"], "notify": intents["notify"]}
    # once iteration 1 of send is checkpointed, its intent is proven
    proven = [*checkpoints, {"name": "send", "iteration": 1, "response": {}}]
    assert rs.unproven_intents(intents, proven, retried="build") == {"notify": intents["notify"]}
    # iteration 0 keys and keys not in the engine's form: any checkpoint of the step proves them
    plain = {"send": {"key": f"{job}:send:2"}, "other": {"key": "custom"}}
    done = [{"name": "send"}, {"name": "other"}]
    assert rs.unproven_intents(plain, done, retried="x") == {}
    assert rs.unproven_intents(plain, [], retried="x") == plain
