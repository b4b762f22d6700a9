"""Upstream's structured, edge and fanOut steps: valid forms verify, invalid ones give
upstream's parse and verifier messages (reference/upstream-workflow.md 1.5, 1.6, 2.1, 2.3)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protomolt_jobs.workflow import Runtime, check
from tests.support.graphs import fan_out, graph, step

T = "127.0.0.1:9"  # never called


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


def edge_workflow() -> dict[str, Any]:
    return graph(
        [
            step("a", T),
            {
                "name": "e",
                "target": T,
                "method": "jobs.test.Steps/Run",
                "edge": {
                    "sources": ["input", "a"],
                    "produceType": "jobs.test.StepRequest",
                    "rules": ["step = input.text", "seen = a.seen"],
                },
            },
        ]
    )


def structured_workflow() -> dict[str, Any]:
    return graph(
        [{"name": "gen", "structured": {"targetType": "jobs.test.StepReply", "model": "m1"}}]
    )


@pytest.mark.parametrize("build", [edge_workflow, structured_workflow, lambda: fan_out(T)])
def test_valid_forms_verify(runtime, build):
    assert check(build(), runtime) == []


def _fan(mutate) -> dict[str, Any]:
    wf = copy.deepcopy(fan_out(T))
    mutate(wf["steps"][0])
    return wf


def _edge(mutate) -> dict[str, Any]:
    wf = copy.deepcopy(edge_workflow())
    mutate(wf["steps"][1])
    return wf


def _gen(mutate) -> dict[str, Any]:
    wf = copy.deepcopy(structured_workflow())
    mutate(wf["steps"][0])
    return wf


def _set(key, value):
    def mutate(step):
        node = step
        for k in key[:-1]:
            node = node[k]
        node[key[-1]] = value

    return mutate


def _del(*key):
    def mutate(step):
        node = step
        for k in key[:-1]:
            node = node[k]
        del node[key[-1]]

    return mutate


# (id, workflow, step, kind, message): kind "workflow" is a parse error
# fmt: off
CASES = [
    # structured (1.5, 2.3)
    ("structured-not-object", _gen(_set(["structured"], "m")), "gen", "workflow",
     "'structured' must be an object"),
    ("structured-with-target", _gen(_set(["target"], T)), "gen", "workflow",
     "a structured step must not declare target, method, or tls"),
    ("structured-with-tls", _gen(_set(["tls"], False)), "gen", "workflow",
     "a structured step must not declare target, method, or tls"),
    ("structured-no-model", _gen(_del("structured", "model")), "gen", "workflow",
     "a structured step needs 'targetType' and 'model'"),
    ("structured-attempts-not-int", _gen(_set(["structured", "maxAttempts"], 2**40)), "gen",
     "workflow", "structured.maxAttempts must be a 32-bit integer"),
    ("structured-attempts-range", _gen(_set(["structured", "maxAttempts"], 5)), "gen",
     "structured", "structured step maxAttempts must be between 0 and 3; got 5"),
    ("structured-when", _gen(_set(["when"], "true")), "gen", "structured",
     "structured steps do not support when gates"),
    ("structured-rules", _gen(_set(["rules"], ["step = input.text"])), "gen", "structured",
     "structured steps declare no mapping rules; the coordinator fills the target type directly"),
    ("structured-validate", _gen(_set(["validate"], True)), "gen", "structured",
     "validate is meaningless on a structured step; the coordinator always validates its output"),
    ("structured-deadline", _gen(_set(["deadlineMs"], 100)), "gen", "structured",
     "structured steps do not support per-step deadlines"),
    ("structured-completion", _gen(_set(["completion"], "external")), "gen", "structured",
     "structured steps do not support completion modes"),
    ("structured-unknown-type", _gen(_set(["structured", "targetType"], "jobs.test.Nope")), "gen",
     "workflow", "Unknown type 'jobs.test.Nope'"),
    # edge (1.6, 2.3)
    ("edge-not-object", _edge(_set(["edge"], [])), "e", "workflow", "'edge' must be an object"),
    ("edge-no-sources", _edge(_set(["edge", "sources"], [])), "e", "workflow",
     "an edge needs 'sources' and 'produceType'"),
    ("edge-no-produce", _edge(_del("edge", "produceType")), "e", "workflow",
     "an edge needs 'sources' and 'produceType'"),
    ("edge-unknown-source", _edge(_set(["edge", "sources"], ["input", "zz"])), "e", "edge",
     "edge source 'zz' is not 'input' or a prior step"),
    ("edge-source-not-identifier", _edge(_set(["edge", "sources"], ["input", "a-b"])), "e",
     "edge", "edge source 'a-b' is not an identifier"),
    ("edge-top-level-rules", _edge(_set(["rules"], ["step = input.text"])), "e", "edge",
     ("top-level rules and celRules must be empty when an edge is set; the edge owns request "
     "mapping")),
    ("edge-external", _edge(_set(["completion"], "external")), "e", "edge",
     "external-completion steps do not carry edges; the completion lane owns their request"),
    ("edge-wrong-produce", _edge(_set(["edge", "produceType"], "jobs.test.Text")), "e", "edge",
     ("a gRPC step's edge must produce the method's request type jobs.test.StepRequest; got "
     "jobs.test.Text")),
    ("edge-projection-on-grpc", _edge(_set(["edge", "projectTo"], "jobs.test.StepRequest")), "e",
     "edge", ("a gRPC step without fan-out takes no projection; the edge value must be the "
     "method request")),
    ("edge-rule-outside-sources", _edge(_set(["edge", "sources"], ["input"])), "e", "edge",
     "source: unknown source 'a'; the scope has [input] (seen = a.seen)"),
    # fanOut (1.6, 2.3)
    ("fan-not-object", _fan(_set(["fanOut"], 3)), "fan", "workflow",
     "'fanOut' must be an object"),
    ("fan-missing-items", _fan(_del("fanOut", "items")), "fan", "workflow",
     "a fanOut needs 'items', 'collectType', 'collectInto', and 'failurePolicy'"),
    ("fan-policy", _fan(_set(["fanOut", "failurePolicy"], "SOMETIMES")), "fan", "workflow",
     "fanOut.failurePolicy must be FAIL_FAST or CONTINUE; got 'SOMETIMES'"),
    ("fan-max-items-not-int", _fan(_set(["fanOut", "maxItems"], "many")), "fan", "workflow",
     "fanOut.maxItems must be a 32-bit integer"),
    ("fan-max-concurrency-not-int", _fan(_set(["fanOut", "maxConcurrency"], 1.5)), "fan",
     "workflow", "fanOut.maxConcurrency must be a 32-bit integer"),
    ("fan-without-edge", _fan(_del("edge")), "fan", "workflow",
     "fan-out requires an edge; the items resolve against the edge's produced message"),
    ("fan-max-items-zero", _fan(_del("fanOut", "maxItems")), "fan", "fanOut",
     "fan-out maxItems must be between 1 and 1024; got 0"),
    ("fan-max-items-over", _fan(_set(["fanOut", "maxItems"], 1025)), "fan", "fanOut",
     "fan-out maxItems must be between 1 and 1024; got 1025"),
    ("fan-concurrency-over", _fan(_set(["fanOut", "maxConcurrency"], 65)), "fan", "fanOut",
     "fan-out maxConcurrency must be between 1 and 64; got 65"),
    ("fan-items-unknown", _fan(_set(["fanOut", "items"], "nope")), "fan", "fanOut",
     "items path 'nope' does not resolve: jobs.test.StepBatch has no field 'nope'"),
    ("fan-items-singular", _fan(_set(["fanOut", "items"], "label")), "fan", "fanOut",
     "items path 'label' ends at a non-repeated field"),
    ("fan-items-through-scalar", _fan(_set(["fanOut", "items"], "label.x")), "fan", "fanOut",
     "items path 'label.x' walks through 'label', which is not a singular message field"),
    ("fan-collect-no-field", _fan(_set(["fanOut", "collectInto"], "nope")), "fan", "fanOut",
     "collect type jobs.test.StepReplies has no field 'nope'"),
]
# fmt: on
CASES += [
    (
        "fan-collect-scalar-field",
        _fan(lambda s: s["fanOut"].update(collectType="jobs.test.Summary", collectInto="ids")),
        "fan",
        "fanOut",
        "collect field 'ids' of jobs.test.Summary must be a repeated message field",
    ),
    (
        "fan-collect-wrong-element",
        _fan(lambda s: s["fanOut"].update(collectType="jobs.test.StepBatch", collectInto="items")),
        "fan",
        "fanOut",
        (
            "collect field 'items' takes jobs.test.StepRequest but the branch output type is "
            "jobs.test.StepReply"
        ),
    ),
    (
        "fan-item-type-not-request",
        _fan(lambda s: s.update(method="jobs.test.Tokenizer/Tokenize")),
        "fan",
        "fanOut",
        (
            "a fanned-out gRPC step's item type must be the method's request type jobs.test.Text; "
            "got jobs.test.StepRequest"
        ),
    ),
]


@pytest.mark.parametrize(
    ("wf", "step", "kind", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_forms_give_upstreams_messages(runtime, wf, step, kind, message):
    findings = [(f.step, f.kind, f.error) for f in check(wf, runtime)]
    assert (step, kind, message) in findings, findings
