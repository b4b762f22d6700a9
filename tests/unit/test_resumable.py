"""workflow/resumable.py and the ``resumable`` key: parse errors and findings naming the field,
the chunk loop's state passing, saved-state resume and report failures (a fake ``call_unary``
and a fake ``on_progress``; the real service and store are in
tests/integration/test_long_steps.py)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from protomolt_jobs import workflow as engine
from protomolt_jobs.errors import LeaseLost
from protomolt_jobs.store.progress import ProgressReport, report_params
from protomolt_jobs.workflow import resumable
from protomolt_jobs.workflow.effects import EffectContext
from tests.support.render_service import message_class, render_workflow

RUNTIME = engine.Runtime()


def _workflow(**resumable_spec):
    wf = render_workflow("127.0.0.1:1")
    if resumable_spec:
        wf["steps"][0]["resumable"] = resumable_spec
    return wf


def _findings(wf):
    return [
        f.error for f in engine.verify(engine.parse_workflow(wf, RUNTIME)) if f.kind == "resumable"
    ]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("yes", "'resumable' must be an object"),
        ({"done": "response.done"}, "'resumable.state' must name a field"),
        ({"state": "a.b", "done": "response.done"}, "'resumable.state' must name a field"),
        ({"state": "state"}, "'resumable.done' must be a CEL expression"),
        ({"state": "state", "done": " "}, "'resumable.done' must be a CEL expression"),
        ({"state": "state", "done": "response.done", "progress": 5}, "'resumable.progress'"),
    ],
)
def test_a_malformed_declaration_is_refused_naming_the_field(spec, named):
    wf = render_workflow("127.0.0.1:1")
    wf["steps"][0]["resumable"] = spec
    with pytest.raises(engine.WorkflowParseError) as info:
        engine.parse_workflow(wf, RUNTIME)
    assert named in str(info.value)


def test_a_sound_declaration_has_no_findings():
    assert _findings(render_workflow("127.0.0.1:1")) == []


def test_findings_name_the_state_field_the_expressions_and_an_external_effect():
    assert _findings(_workflow(state="nope", done="response.done")) == [
        "resumable.state: 'nope' is not a field of the method's request"
    ]
    # in the request (scene) but not in the response
    assert _findings(_workflow(state="scene", done="response.done")) == [
        "resumable.state: 'scene' is not a field of the method's response"
    ]
    errors = _findings(_workflow(state="state", done="response.done ==", progress="1 +"))
    assert [e.split(":")[0] for e in errors] == ["resumable.done", "resumable.progress"]
    wf = render_workflow("127.0.0.1:1")
    wf["steps"][0]["effect"] = "external"
    assert _findings(wf) == [
        (
            "resumable: a step with effect 'external' cannot be resumable (a chunk in flight "
            "at a crash is called again)"
        )
    ]


def _chunk(frame, total=4):
    out = message_class("render.v1.RenderChunk")()
    out.state.next_frame = frame + 1
    out.frames_done, out.frames_total = frame, total
    out.done = frame >= total
    out.details = f"frame {frame} of {total}"
    return out


class _FakeService:
    def __init__(self):
        self.requests = []

    def __call__(self, channel, step, request, timeout_s, metadata, watch):
        self.requests.append(copy.deepcopy(request))
        return _chunk(request.state.next_frame or 1)


def _run(monkeypatch, effects):
    wf = engine.parse_workflow(render_workflow("127.0.0.1:1"), RUNTIME)
    step = wf.steps[0]
    fake = _FakeService()
    monkeypatch.setattr(resumable, "call_unary", fake)
    request = message_class("render.v1.RenderRequest")(scene="s", frames=4)
    response = resumable.call(None, step, request, 1000, lambda: 1000, None, effects)
    return response, fake


def test_each_chunk_carries_the_last_state_and_is_reported(monkeypatch):
    reports = []
    effects = EffectContext(job_id="j", on_progress=lambda *a: reports.append(a))
    response, fake = _run(monkeypatch, effects)
    assert [r.state.next_frame for r in fake.requests] == [0, 2, 3, 4]
    assert response.done and response.frames_done == 4
    assert [(s, i, r["percent"], r["done"]) for s, i, r in reports] == [
        ("render", 0, 25.0, False),
        ("render", 0, 50.0, False),
        ("render", 0, 75.0, False),
        ("render", 0, 100.0, True),
    ]
    assert reports[0][2]["state"] == {"nextFrame": 2}
    assert reports[0][2]["details"] == "frame 1 of 4"
    assert reports[0][2]["adapterVersion"] == "render-1.0"
    assert len(reports[0][2]["inputSha256"]) == 64


def test_a_saved_state_is_continued_from_and_a_done_one_is_not(monkeypatch):
    saved = SimpleNamespace(state={"nextFrame": 3}, done=False)
    effects = EffectContext(job_id="j", progress_saved=lambda step, it: saved)
    _, fake = _run(monkeypatch, effects)
    assert [r.state.next_frame for r in fake.requests] == [3, 4]
    saved = SimpleNamespace(state={"nextFrame": 5}, done=True)
    effects = EffectContext(job_id="j", progress_saved=lambda step, it: saved)
    _, fake = _run(monkeypatch, effects)
    assert [r.state.next_frame for r in fake.requests] == [0, 2, 3, 4]


def test_a_report_that_fails_fails_the_step_as_a_store_failure(monkeypatch):
    def lost(*_):
        raise LeaseLost("j", "w", 1, "progress")

    with pytest.raises(engine.WorkflowExecutionError) as info:
        _run(monkeypatch, EffectContext(job_id="j", on_progress=lost))
    assert info.value.store_failure and isinstance(info.value.__cause__, LeaseLost)


def test_a_step_without_resumable_is_one_call(monkeypatch):
    wf = copy.deepcopy(render_workflow("127.0.0.1:1"))
    del wf["steps"][0]["resumable"]
    step = engine.parse_workflow(wf, RUNTIME).steps[0]
    fake = _FakeService()
    monkeypatch.setattr(resumable, "call_unary", fake)
    request = message_class("render.v1.RenderRequest")(scene="s", frames=4)
    response = resumable.call(None, step, request, 1000, lambda: 1000, None, None)
    assert len(fake.requests) == 1 and not response.done


@pytest.mark.parametrize(
    ("report", "named"),
    [
        (ProgressReport(step=""), "step"),
        (ProgressReport(step="s", iteration=-1), "iteration"),
        (ProgressReport(step="s", percent=101), "percent"),
        (ProgressReport(step="s", percent=float("nan")), "percent"),
        (ProgressReport(step="s", percent="50"), "percent"),
        (ProgressReport(step="s", state={1j}), "state"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(report, named):
    with pytest.raises((ValueError, TypeError)) as info:
        report_params(report)
    assert named in str(info.value)


def test_the_guides_render_step_is_the_one_the_tests_run():
    """docs/long-steps.md's step, as written, parses and verifies against the render proto,
    and declares what the integration tests' render step declares."""
    import json
    import re
    from pathlib import Path

    guide = Path(__file__).resolve().parents[2] / "docs" / "long-steps.md"
    block = re.search(r"```json\n(.*?)```", guide.read_text(), re.DOTALL)
    assert block is not None
    step = json.loads(block.group(1))
    wf = render_workflow(step["target"])
    assert step == wf["steps"][0] | {"target": step["target"]}
    assert engine.verify(engine.parse_workflow(wf, RUNTIME)) == []


def _saved(**kw):
    base = {
        "adapter_version": "render-1.0",
        "input_sha256": "a" * 64,
        "descriptor_sha256": "b" * 64,
        "definition_sha256": "c" * 64,
    }
    return SimpleNamespace(**{**base, **kw})


CURRENT = {
    "adapterVersion": "render-1.0",
    "inputSha256": "a" * 64,
    "descriptorSha256": "b" * 64,
    "definitionSha256": "c" * 64,
}


def test_progress_mismatch_names_the_first_fingerprint_that_changed():
    assert resumable.progress_mismatch("render", _saved(), CURRENT) is None
    assert resumable.progress_mismatch(
        "render", _saved(), {**CURRENT, "adapterVersion": "render-2.0"}
    ) == (
        "progress-mismatch: step 'render' adapterVersion changed (was 'render-1.0', now "
        "'render-2.0')"
    )
    # the adapter is named before the hashes it changes too
    assert "adapterVersion" in resumable.progress_mismatch(
        "render", _saved(), {**CURRENT, "adapterVersion": "", "definitionSha256": "d" * 64}
    )
    assert resumable.progress_mismatch(
        "render", _saved(), {**CURRENT, "inputSha256": "e" * 64}
    ) == (
        "progress-mismatch: step 'render' inputSha256 changed (was aaaaaaaaaaaa..., now "
        "eeeeeeeeeeee...)"
    )
    assert "descriptorSha256" in resumable.progress_mismatch(
        "render", _saved(), {**CURRENT, "descriptorSha256": "f" * 64}
    )
    assert "definitionSha256" in resumable.progress_mismatch(
        "render", _saved(), {**CURRENT, "definitionSha256": "f" * 64}
    )


def test_progress_without_fingerprints_or_fingerprints_unknown_now_is_not_compared():
    # written before migration 0025, only by ReportProgress, or accepted by keep
    assert resumable.progress_mismatch("render", _saved(definition_sha256=""), {}) is None
    # without a workflow the caller has no definition or descriptor hash: not compared
    only = {"adapterVersion": "render-1.0", "inputSha256": "a" * 64}
    assert resumable.progress_mismatch("render", _saved(), only) is None
