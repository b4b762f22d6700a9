"""runs/stored_run.py without a database: decode_definition's kinds, and the step order and
dependants a loaded run gives the verbs (retry-step, migrate-checkpoint discard)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun, decode_definition
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import diamond
from tests.support.grpc_servers import seed_workflow


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def deep_object_text(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def test_decode_definition_passes_an_object_through_and_decodes_json_text():
    definition = {"name": "wf", "steps": []}
    assert decode_definition(definition) is definition
    assert decode_definition('{"name": "wf", "steps": []}') == definition
    assert decode_definition(b'{"name": "wf"}') == {"name": "wf"}


@pytest.mark.parametrize(
    ("raw", "kind", "found"),
    [
        ("{not json", "unreadable", ""),
        (deep_object_text(3000), "unreadable", ""),  # past the decoder's recursion limit
        ("[1, 2]", "not-object", "list"),
        ([1, 2], "not-object", "list"),
        (None, "not-object", "NoneType"),
        (7, "not-object", "int"),
        ('"text"', "not-object", "str"),
    ],
)
def test_decode_definition_names_what_is_wrong(raw, kind, found):
    with pytest.raises(SnapshotError) as raised:
        decode_definition(raw)
    assert (raised.value.kind, raised.value.found, raised.value.step) == (kind, found, "")
    assert raised.value.detail


def test_load_of_a_sequential_run_orders_its_steps_and_every_later_step_depends(runtime):
    stored = StoredRun.load(SimpleNamespace(workflow_definition=seed_workflow("x:1")), runtime)
    assert not stored.workflow.graph
    assert stored.step_names() == ["tokenize", "embed", "review"]
    assert stored.dependants() == {
        "tokenize": {"embed", "review"},
        "embed": {"review"},
        "review": set(),
    }


def test_load_of_a_graph_run_gives_each_step_its_transitive_dependants(runtime):
    stored = StoredRun.load(SimpleNamespace(workflow_definition=diamond("x:1")), runtime)
    assert stored.workflow.graph
    assert stored.step_names() == ["a", "b", "c", "d"]
    assert stored.dependants() == {"a": {"b", "c", "d"}, "b": {"d"}, "c": {"d"}, "d": set()}


def test_load_parse_and_verify_failures_name_the_step(runtime):
    with pytest.raises(SnapshotError) as raised:
        StoredRun.load(SimpleNamespace(workflow_definition={"name": "x", "steps": 1}), runtime)
    assert raised.value.kind == "parse"

    bad = copy.deepcopy(seed_workflow("x:1"))
    bad["steps"][1]["rules"] = ["ids = tokenize.nope"]
    job = SimpleNamespace(workflow_definition=bad)
    assert StoredRun.load(job, runtime).step_names() == ["tokenize", "embed", "review"]
    with pytest.raises(SnapshotError) as raised:
        StoredRun.load(job, runtime, verified=True)
    assert (raised.value.kind, raised.value.step) == ("verify", "embed")
    assert raised.value.detail.startswith("(1 finding); [rule] embed: ")
