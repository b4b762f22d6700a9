"""workflow/replay_check.py: which stored checkpoints would not replay under a candidate, for
sequential and graph workflows, with real fingerprints (nothing is called)."""

from __future__ import annotations

import copy

import pytest

from protomolt_jobs.workflow import Runtime, parse_workflow
from protomolt_jobs.workflow import effects as fx
from protomolt_jobs.workflow.replay_check import drift
from tests.support.graphs import diamond, step
from tests.support.grpc_servers import seed_workflow

T = "127.0.0.1:9"  # never called


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def _entries(definition, runtime, names, responses=None):
    """Checkpoint entries of ``names`` as a run of ``definition`` stores them (fingerprinted)."""
    compiled = parse_workflow(definition, runtime)
    out = []
    for name in names:
        entry = {"name": name, "skipped": False, "response": (responses or {}).get(name, {})}
        out.append(fx.stamp(entry, compiled, compiled.step(name), attempt=1))
    return out


def test_sequential_additive_change_replays_and_a_rename_does_not(runtime):
    stored = seed_workflow(T, review="external")
    entries = _entries(stored, runtime, ["tokenize", "embed"])
    appended = copy.deepcopy(stored)
    appended["steps"].append(
        {"name": "archive", "target": T, "method": "jobs.test.Tokenizer/Tokenize", "rules": []}
    )
    assert drift(parse_workflow(appended, runtime), entries) is None
    # the same definition replays too (definitionSha256 is not what is compared)
    assert drift(parse_workflow(stored, runtime), entries) is None
    reordered = copy.deepcopy(stored)
    reordered["steps"][0]["name"] = "tokenise"
    for s in reordered["steps"][1:]:
        s["rules"] = [r.replace("tokenize.", "tokenise.") for r in s["rules"]]
    reordered["output"]["rules"] = [
        r.replace("tokenize.", "tokenise.") for r in reordered["output"]["rules"]
    ]
    reordered["output"].pop("celRules")
    found = drift(parse_workflow(reordered, runtime), entries)
    assert found is not None
    assert (found.checkpoint, found.step, found.rule) == (0, "tokenize", "placement")
    assert "the candidate's step 0 is 'tokenise'" in found.reason


def test_sequential_entries_past_the_candidates_steps_and_malformed_ones_drift(runtime):
    stored = seed_workflow(T, review="invoke")
    entries = _entries(stored, runtime, ["tokenize", "embed", "review"])
    shorter = copy.deepcopy(stored)
    shorter["steps"] = shorter["steps"][:2]
    shorter.pop("output")
    found = drift(parse_workflow(shorter, runtime), entries)
    assert found is not None and (found.checkpoint, found.rule) == (2, "placement")
    assert "the candidate has only 2 steps" in found.reason
    found = drift(parse_workflow(stored, runtime), ["not an entry"])
    assert found is not None and (found.checkpoint, found.step, found.rule) == (0, "", "placement")


def test_an_adapter_version_or_a_response_that_no_longer_parses_drifts(runtime):
    stored = seed_workflow(T, review="invoke")
    entries = _entries(stored, runtime, ["tokenize"], {"tokenize": {"ids": [1, 2]}})
    versioned = copy.deepcopy(stored)
    versioned["steps"][0]["adapterVersion"] = "v2"
    found = drift(parse_workflow(versioned, runtime), entries)
    assert found is not None and found.rule == "fingerprint"
    assert found.reason == "checkpoint-mismatch: step 'tokenize' adapterVersion changed"
    # an entry without a fingerprint (stored before them): its response must still parse
    bare = [{"name": "tokenize", "response": {"noSuchField": 1}}]
    found = drift(parse_workflow(stored, runtime), bare)
    assert found is not None and found.rule == "response"
    assert "noSuchField" in found.reason


def test_graph_entries_are_matched_by_name(runtime):
    stored = diamond(T)
    entries = _entries(stored, runtime, ["a", "c", "b"])
    grown = copy.deepcopy(stored)
    grown["steps"].append(step("e", T, after=["d"]))
    assert drift(parse_workflow(grown, runtime), entries) is None
    renamed = copy.deepcopy(stored)
    renamed["steps"][1] = step("b2", T, reads=["a"], after=["a"])
    renamed["steps"][3] = step("d", T, reads=["b2", "c"], after=["b2", "c"])
    found = drift(parse_workflow(renamed, runtime), entries)
    assert found is not None and (found.checkpoint, found.step, found.rule) == (
        2,
        "b",
        "placement",
    )
    assert found.reason == "the candidate has no step 'b' (checkpoint 2)"
    found = drift(parse_workflow(stored, runtime), [*entries, entries[0]])
    assert found is not None and "repeats step 'a'" in found.reason
