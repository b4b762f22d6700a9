"""Step effects in the engine (issue #17): the envelope keys, idempotency keys, fingerprints
(cached per compiled workflow) and the replay comparison. Nothing here calls a service."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protomolt_jobs.workflow import Runtime, WorkflowParseError, parse_workflow, verify
from protomolt_jobs.workflow.effects import fingerprint, idempotency_key, mismatch, stamp
from tests.support.grpc_servers import message_class, seed_workflow

TARGET = "127.0.0.1:9"


def workflow(**charge: Any) -> dict[str, Any]:
    wf = seed_workflow(TARGET, review="invoke")
    wf["steps"][1].update(charge)
    return wf


def test_effect_defaults_to_idempotent_and_keeps_what_is_declared():
    wf = parse_workflow(workflow(), Runtime())
    assert [s.effect for s in wf.steps] == ["idempotent"] * 3
    wf = parse_workflow(workflow(effect="external", adapterVersion="embed-2"), Runtime())
    assert wf.steps[1].effect == "external" and wf.steps[1].adapter_version == "embed-2"
    assert verify(wf) == []


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"effect": "sometimes"}, "'effect' must be one of none, idempotent, external"),
        ({"adapterVersion": " "}, "'adapterVersion' must be a non-blank string"),
        ({"verify": {"method": "jobs.test.ReviewDesk/Review", "found": "true"}}, "only for"),
        ({"effect": "external", "verify": {"found": "true"}}, "needs 'method' and 'found'"),
        ({"effect": "external", "verify": []}, "'verify' must be an object"),
        (
            {"effect": "external", "verify": {"method": "no.Such/Thing", "found": "true"}},
            "not found in the workflow's schema",
        ),
    ],
)
def test_bad_effect_keys_are_parse_errors_naming_the_step(keys, message):
    with pytest.raises(WorkflowParseError, match=message) as info:
        parse_workflow(workflow(**keys), Runtime())
    assert info.value.step == "embed"


def test_external_effect_in_a_graph_workflow_verifies():
    # issue 27 item 2: a graph records intents and probes like a sequential run
    wf = workflow(effect="external")
    wf["maxParallel"] = 2
    assert verify(parse_workflow(wf, Runtime())) == []


def test_idempotency_key_shape():
    assert idempotency_key("j", "charge", 0) == "j:charge:0"
    assert idempotency_key("j", "charge", 3) == "j:charge:3"
    assert idempotency_key("j", "charge", "x") == "j:charge:0"
    assert idempotency_key("j", "charge", True) == "j:charge:0"


def test_fingerprints_are_computed_once_per_compiled_workflow_and_stamp_keeps_the_entry():
    wf = parse_workflow(workflow(adapterVersion="embed-2"), Runtime())
    assert fingerprint(wf) is fingerprint(wf)
    step = wf.steps[1]
    response = message_class("jobs.test.Embedding")(values=[0.5], model="m")
    entry = {"name": "embed", "skipped": False, "response": {"values": [0.5], "model": "m"}}
    before = copy.deepcopy(entry)
    request = message_class("jobs.test.Tokens")(ids=[1])
    stamp(entry, wf, step, request=request, attempt=2)
    assert {k: entry[k] for k in before} == before
    assert entry["adapterVersion"] == "embed-2" and entry["attempt"] == 2
    assert len(entry["descriptorSha256"]) == 64 and len(entry["requestSha256"]) == 64
    assert "receipt" not in entry  # not an external step
    assert mismatch(wf, step, entry) is None
    assert response.model == "m"


def test_replay_comparison_names_the_changed_field_and_ignores_old_entries():
    wf = parse_workflow(workflow(adapterVersion="embed-2"), Runtime())
    step = wf.steps[1]
    entry = stamp({"name": "embed", "skipped": True}, wf, step)
    newer = parse_workflow(workflow(adapterVersion="embed-3"), Runtime())
    # the definition changed too (adapterVersion is part of it): the first field named wins
    assert mismatch(newer, newer.steps[1], entry) == "definitionSha256"
    same_def = dict(entry, adapterVersion="embed-1")
    assert mismatch(wf, step, same_def) == "adapterVersion"
    other = dict(entry, descriptorSha256="0" * 64)
    assert mismatch(wf, step, other) == "descriptorSha256"
    assert mismatch(wf, step, {"name": "embed", "skipped": True}) is None
