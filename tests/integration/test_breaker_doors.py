"""Breaker: odd inputs at the doors answer 2xx or invalid-input naming the field, never 500."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node

ODD_INPUTS = [
    '{"text": 5}',
    '{"text": null}',
    '{"text": "\\ud800"}',
    '{"text": "a\\u0000b"}',
    '{"text": "\\ud83d\\ude00 ok"}',
    '{"fail": "true"}',
    '{"fail": 1}',
    '{"fail": null}',
    '{"text": ["a"]}',
    '{"text": {"a": 1}}',
    '{"meta": 5}',
    '{"meta": null}',
    '{"meta": {"a": 1e400}}',
    '{"meta": {"a": NaN}}',
    '{"meta": {"a": -Infinity}}',
    '{"meta": {"\\ud800": 1}}',
    '{"meta": {"a": 123456789012345678901234567890}}',
    '{"meta": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"meta": {"a": ' + "1" * 400 + "}}",
    '{"text": "x", "Text": "y"}',
    '{"text": "x", "unknown": 1}',
    '{"lang": "\\u65e5\\u672c"}',
    '{"text": 1.5}',
    '{"fail": 0.0}',
    '{"text": "x", "fail": true, "meta": {"k": [1, "2", null, {"z": false}]}}',
    "[]",
    '"text"',
    "null",
    "12",
]


@pytest.fixture
def services():
    with TestServices(max_workers=4) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


@pytest.mark.parametrize("verb", ["submit-workflow", "run-workflow"])
def test_odd_inputs_at_the_doors(node, services, verb):
    wf = json.dumps(seed_workflow(services.target, review="invoke"))
    bad = []
    for raw_input in ODD_INPUTS:
        job_id = str(uuid.uuid4())
        ident = f'"jobId": "{job_id}", ' if verb == "submit-workflow" else ""
        raw = f'{{"workflow": {wf}, {ident}"input": {raw_input}}}'.encode()
        status, body, _ = http("POST", f"{node.actions_url}/{verb}", raw=raw, timeout=30)
        short = raw_input[:40]
        print(verb, short, status, str(body)[:300])
        if status >= 500 or (status == 400 and body.get("error") != "invalid-input"):
            bad.append((short, status, str(body)[:300]))
        elif status == 400 and (body.get("details") or {}).get("field") != "input":
            bad.append((short, status, "field not named", str(body)[:300]))
        if status == 400 and verb == "submit-workflow":
            _, b2, _ = http("POST", f"{node.actions_url}/get-job", {"jobId": job_id})
            if b2.get("ok") is not False and b2.get("status"):
                bad.append((short, "row written", str(b2)[:200]))
    assert bad == []


@pytest.mark.parametrize(
    "raw_input",
    [
        '{"meta": {"a": NaN}}',
        '{"meta": {"a": -Infinity}}',
        '{"meta": {"a": 123456789012345678901234567890}}',
        '{"meta": {"a": ' + "1" * 400 + "}}",
        '{"text": "a\\u0000b"}',
    ],
)
def test_run_workflow_refuses_what_submit_workflow_refuses(node, services, raw_input):
    # One input rule for every door (input_rules.py): run-workflow used to run a Struct
    # holding NaN or an integer beyond 2**53 that submit-workflow refuses.
    wf = json.dumps(seed_workflow(services.target, review="invoke"))
    answers = {}
    for verb in ("submit-workflow", "run-workflow"):
        raw = f'{{"workflow": {wf}, "input": {raw_input}}}'.encode()
        status, body, _ = http("POST", f"{node.actions_url}/{verb}", raw=raw, timeout=30)
        answers[verb] = (status, body.get("error"), (body.get("details") or {}).get("field"))
    assert answers == {
        "submit-workflow": (400, "invalid-input", "input"),
        "run-workflow": (400, "invalid-input", "input"),
    }, answers
