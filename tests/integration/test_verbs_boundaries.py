"""The job verbs at their input boundary: lone surrogates (not text; UTF-8, PostgreSQL and
protobuf cannot carry them) and integers a ``Struct`` double cannot hold exactly. Both are
``invalid-input`` naming the field, and nothing is written."""

from __future__ import annotations

import uuid

import pytest

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.input_rules import MAX_JSON_INT
from tests.integration.test_verbs import make_verbs
from tests.support.grpc_servers import TestServices

JOB = str(uuid.uuid4())


@pytest.fixture(scope="module")
def verbs(session_dsn):
    services = TestServices().start()
    v = make_verbs(session_dsn, services.target)
    try:
        yield v
    finally:
        v.close()
        services.stop()


REFUSED = [
    ("list-jobs", {"workflowName": "\ud800"}, "workflowName", "lone surrogates"),
    ("list-jobs", {"status": "QUEUED\udfff"}, "status", "lone surrogates"),
    ("get-job", {"jobId": "\ud800"}, "jobId", "lone surrogates"),
    ("submit-workflow", {"workflowName": "seed-review\ud800", "input": {}}, "workflowName", "lone"),
    ("submit-workflow", {"workflowName": "seed-review", "input": {"\ud800": 1}}, "input", "lone"),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {"a": ["\udc00"]}},
        "input",
        "lone",
    ),
    ("submit-workflow", {"workflow": {"name": "\ud800"}, "input": {}}, "workflow", "lone"),
    ("submit-workflow", {"workflowName": "x", "input": {}, "jobId": "\ud800"}, "jobId", "lone"),
    ("complete-step", {"jobId": JOB, "stepName": "\ud800", "response": {}}, "stepName", "lone"),
    (
        "complete-step",
        {"jobId": JOB, "stepName": "r", "response": {"k": "\ud800"}},
        "response",
        "lone",
    ),
    ("get-job", {"jobId": JOB, "\ud800": 1}, "\\ud800", "Unknown field '\\ud800'"),
    # integers past 2**53: a Struct holds doubles, gRPC could never show the job again
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {"n": MAX_JSON_INT + 1}},
        "input",
        "2**53",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {"n": [-(10**30)]}},
        "input",
        "2**53",
    ),
    (
        "submit-workflow",
        {"workflow": {"name": "w", "x": 10**5000}, "input": {}},
        "workflow",
        "2**53",
    ),
    (
        "complete-step",
        {"jobId": JOB, "stepName": "r", "response": {"n": 2**64}},
        "response",
        "2**53",
    ),
]


@pytest.mark.parametrize(
    ("verb", "body", "field", "message"),
    REFUSED,
    ids=[f"{v}-{i}" for i, (v, *_) in enumerate(REFUSED)],
)
def test_refused_as_invalid_input_naming_the_field(verbs, verb, body, field, message):
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs(verb, body)
    assert info.value.details["field"] == field
    assert message in info.value.message
    # The error itself must be sendable: its text is valid UTF-8.
    info.value.message.encode("utf-8")
    assert verbs.counts() == before


def test_integers_up_to_2_pow_53_and_surrogate_pairs_are_accepted(session_dsn):
    services = TestServices().start()
    v = make_verbs(session_dsn, services.target)
    try:
        # Free-form numbers sit in `meta` (a Struct): unknown input fields are refused.
        payload = {"text": "\U0001f600", "meta": {"n": MAX_JSON_INT, "m": -MAX_JSON_INT, "f": 1.5}}
        answer = v("submit-workflow", {"workflowName": "seed-review", "input": payload})
        assert answer["ok"] is True
        job = v("get-job", {"jobId": answer["jobId"]})["job"]
        assert job["input"] == payload
    finally:
        v.close()
        services.stop()
