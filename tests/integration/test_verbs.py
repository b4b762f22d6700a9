"""The four job verbs against a real PostgreSQL database (no worker running).

Parked jobs are reached through the real store (claim, checkpoint, park), never by writing
rows. Verbs run through the host catalog, so an unexpected exception would surface as
``internal-error``, which every test here treats as a failure.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from protomolt_jobs.errors import InvalidInput, JobCorrupt
from protomolt_jobs.host.catalog import Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store.records import NewJob
from protomolt_jobs.store.store import JobStore
from protomolt_jobs.verbs import SOURCE_RULE, JobsBackend, jobs_actions
from protomolt_jobs.workflow.types import Runtime
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.roles import MemoryRepository

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6})?Z$")


@dataclass
class Verbs:
    catalog: Catalog
    store: JobStore
    repository: MemoryRepository
    workflow: dict[str, Any]
    dsn: str
    _counter: psycopg.Connection | None = None

    def __call__(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.catalog.execute(verb, body)

    def counts(self) -> tuple[int, int]:
        """(job rows, outbox rows), read on one kept autocommit connection."""
        if self._counter is None or self._counter.closed:
            self._counter = psycopg.connect(self.dsn, autocommit=True)
        row = self._counter.execute(
            "SELECT (SELECT count(*) FROM workflow_run),"
            " (SELECT count(*) FROM workflow_run_events_outbox)"
        ).fetchone()
        return row[0], row[1]

    def close(self) -> None:
        self.store.close()
        if self._counter is not None:
            self._counter.close()

    def parked(self, *, on: str = "review", definition: dict[str, Any] | None = None) -> uuid.UUID:
        """A job parked WAITING on ``on`` with tokenize and embed checkpointed."""
        job_id = uuid.uuid4()
        self.store.job_insert(
            NewJob(
                job_id=job_id,
                workflow_name="seed-review",
                workflow_definition=definition or self.workflow,
                input={"text": "hello brave new world"},
            )
        )
        claimed = self.store.job_claim("test-worker", 60)
        assert claimed is not None and claimed.job_id == job_id
        lease = claimed.lease
        self.store.job_checkpoint(
            lease, {"name": "tokenize", "skipped": False, "response": {"ids": ["1"], "count": 1}}
        )
        self.store.job_checkpoint(
            lease, {"name": "embed", "skipped": False, "response": {"values": [0.5]}}
        )
        self.store.job_park(lease, on)
        return job_id


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


def make_verbs(dsn: str, target: str) -> Verbs:
    """The four verbs in a catalog over a real store on ``dsn`` (``close()`` after)."""
    store = JobStore.open(dsn, max_size=4)
    runtime = Runtime()
    workflow = seed_workflow(target)
    repository = MemoryRepository({"seed-review": workflow}, corrupt={"broken"})
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, repository, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    return Verbs(catalog, store, repository, workflow, dsn)


@pytest.fixture
def verbs(fresh_dsn, services):
    v = make_verbs(fresh_dsn, services.target)
    try:
        yield v
    finally:
        v.close()


@pytest.fixture(scope="module")
def shared_verbs(session_dsn, services):
    """Verbs on the session database, for tests that only read or are refused."""
    v = make_verbs(session_dsn, services.target)
    try:
        yield v
    finally:
        v.close()


# ---------------------------------------------------------------------------- submit-workflow


def test_submit_inline_then_get(verbs):
    answer = verbs("submit-workflow", {"workflow": verbs.workflow, "input": {"text": "a b c"}})
    assert answer["ok"] is True and answer["status"] == "QUEUED"
    uuid.UUID(answer["jobId"])
    got = verbs("get-job", {"jobId": answer["jobId"]})
    assert got["ok"] is True
    job = got["job"]
    assert list(job)[:4] == ["jobId", "workflowName", "status", "attempt"]
    assert job["jobId"] == answer["jobId"]
    assert job["workflowName"] == "seed-review"  # the inline definition's name
    assert job["status"] == "QUEUED" and job["attempt"] == 0
    assert job["input"] == {"text": "a b c"}
    assert job["checkpoints"] == []
    assert "result" not in job and "verdict" not in job and "completedAt" not in job
    assert ISO_Z.match(job["createdAt"]) and ISO_Z.match(job["updatedAt"])
    assert job["maxAttempts"] == 3 and ISO_Z.match(job["runAfter"])
    for hidden in ("leaseOwner", "leaseUntil", "workflowDefinition", "control", "report"):
        assert hidden not in job


def test_submit_by_name_and_inline_name_fallback(verbs):
    answer = verbs("submit-workflow", {"workflowName": "seed-review", "input": {"text": "x"}})
    assert answer["ok"] is True
    assert verbs.store.job_get(answer["jobId"]).workflow_name == "seed-review"
    nameless = {k: v for k, v in verbs.workflow.items() if k != "name"}
    answer = verbs("submit-workflow", {"workflow": nameless, "input": {"text": "x"}})
    assert verbs.store.job_get(answer["jobId"]).workflow_name == "inline"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"input": {"text": "x"}}, id="neither"),
        pytest.param({"workflowName": "  ", "input": {"text": "x"}}, id="blank-name"),
        pytest.param({"workflow": {}, "workflowName": "seed-review", "input": {}}, id="both"),
    ],
)
def test_exactly_one_source_rule(verbs, body):
    if "workflow" in body:
        body = {**body, "workflow": verbs.workflow}
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs("submit-workflow", body)
    assert SOURCE_RULE in info.value.message
    assert "exactly-one-source" in info.value.message
    assert info.value.details["rule"] == SOURCE_RULE
    assert verbs.counts() == before


def test_resubmit_returns_the_existing_job(verbs):
    job_id = str(uuid.uuid4())
    body = {"workflowName": "seed-review", "input": {"text": "one"}, "jobId": job_id}
    first = verbs("submit-workflow", body)
    assert first == {"ok": True, "jobId": job_id, "status": "QUEUED"}
    claimed = verbs.store.job_claim("someone", 60)
    assert str(claimed.job_id) == job_id
    before = verbs.counts()
    again = verbs("submit-workflow", {**body, "input": {"text": "different"}})
    assert again == {"ok": True, "jobId": job_id, "status": "RUNNING"}
    assert verbs.counts() == before
    assert verbs.store.job_get(job_id).input == {"text": "one"}


def test_job_id_is_trimmed_and_case_insensitive(verbs):
    job_id = uuid.uuid4()
    answer = verbs(
        "submit-workflow",
        {"workflowName": "seed-review", "input": {}, "jobId": f"  {str(job_id).upper()} "},
    )
    assert answer["jobId"] == str(job_id)


@pytest.mark.parametrize(
    ("body", "error", "failed_step"),
    [
        (
            {"workflowName": "nope", "input": {}},
            "No stored workflow named 'nope'",
            None,
        ),
        (
            {"workflowName": "broken", "input": {}},
            "stored workflow 'broken' is not readable",
            None,
        ),
    ],
)
def test_submit_refusals_are_answers(verbs, body, error, failed_step):
    before = verbs.counts()
    answer = verbs("submit-workflow", body)
    assert answer["ok"] is False
    assert answer["error"].startswith(error)
    assert answer.get("failedStep") == failed_step
    assert "jobId" not in answer
    assert verbs.counts() == before


def test_a_misspelt_input_field_is_invalid_input_at_submit_naming_it(verbs):
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs("submit-workflow", {"workflowName": "seed-review", "input": {"txt": "x"}})
    assert info.value.message.startswith("'input' is not valid proto3 JSON for jobs.test.Text")
    assert '"txt"' in info.value.message
    assert info.value.details == {"field": "input", "path": "txt"}
    assert verbs.counts() == before


def test_input_of_the_wrong_type_is_invalid_input_at_submit_naming_the_field(verbs):
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs("submit-workflow", {"workflowName": "seed-review", "input": {"text": {"no": 1}}})
    assert info.value.message.startswith("'input' is not valid proto3 JSON for jobs.test.Text")
    assert info.value.details == {"field": "input", "path": "text"}
    assert verbs.counts() == before


def test_definition_that_does_not_verify_names_the_step(verbs):
    bad = seed_workflow(verbs.workflow["steps"][0]["target"])
    bad["steps"][1]["rules"] = ["ids = nowhere.ids"]
    answer = verbs("submit-workflow", {"workflow": bad, "input": {"text": "x"}})
    assert answer["ok"] is False
    assert answer["failedStep"] == "embed"
    assert re.match(
        r"^workflow does not verify \(\d+ findings?\); first: \[\w+\] ", answer["error"]
    )


def test_definition_that_does_not_parse(verbs):
    answer = verbs("submit-workflow", {"workflow": {"name": "x"}, "input": {}})
    assert answer["ok"] is False and answer["error"]


# ---------------------------------------------------------------------------- get / list


def test_get_unknown_job_is_an_answer(verbs):
    job_id = uuid.uuid4()
    assert verbs("get-job", {"jobId": str(job_id)}) == {
        "ok": False,
        "error": f"no workflow run {job_id}",
    }


def test_list_jobs_filters_order_and_paging(verbs):
    ids = [
        verbs("submit-workflow", {"workflowName": "seed-review", "input": {"text": str(i)}})[
            "jobId"
        ]
        for i in range(3)
    ]
    other = verbs("submit-workflow", {"workflow": {**verbs.workflow, "name": "other"}, "input": {}})
    everything = verbs("list-jobs", {})["jobs"]
    assert [j["jobId"] for j in everything] == [other["jobId"], *reversed(ids)]
    summary = everything[0]
    assert "input" not in summary and "checkpoints" not in summary and "result" not in summary
    named = verbs("list-jobs", {"workflowName": "seed-review"})["jobs"]
    assert [j["jobId"] for j in named] == list(reversed(ids))
    page = verbs("list-jobs", {"workflowName": "seed-review", "limit": 2, "offset": 1})["jobs"]
    assert [j["jobId"] for j in page] == [ids[1], ids[0]]
    assert len(verbs("list-jobs", {"limit": 0})["jobs"]) == 4
    assert len(verbs("list-jobs", {"limit": 10_000})["jobs"]) == 4
    assert len(verbs("list-jobs", {"limit": 2.0})["jobs"]) == 2
    assert verbs("list-jobs", {"status": "RUNNING"})["jobs"] == []
    assert len(verbs("list-jobs", {"status": "QUEUED"})["jobs"]) == 4
    assert verbs("list-jobs", {"offset": 2**63 - 1})["jobs"] == []


def test_list_jobs_by_id_prefix(verbs):
    """Issue 31: ``idPrefix`` (4 to 32 hex digits, any case, no dashes) lists the jobs whose id
    starts with it; anything else is invalid-input naming the field."""
    ids = [
        "abcd1234-0000-4000-8000-000000000001",
        "abcd1234-0000-4000-8000-000000000002",
        "abcd9999-0000-4000-8000-000000000003",
        "ffffffff-ffff-4fff-bfff-ffffffffffff",
    ]
    for job_id in ids:
        verbs("submit-workflow", {"workflowName": "seed-review", "input": {}, "jobId": job_id})

    def listed(prefix):
        return sorted(j["jobId"] for j in verbs("list-jobs", {"idPrefix": prefix})["jobs"])

    assert listed("abcd") == sorted(ids[:3])
    assert listed("abcd1234") == sorted(ids[:2])
    assert listed("ABCD9999") == [ids[2]]
    assert listed(ids[0].replace("-", "")) == [ids[0]]
    assert listed("ffffffff") == [ids[3]]
    assert listed("0123abcd") == []
    assert verbs("list-jobs", {"idPrefix": "abcd", "status": "RUNNING"})["jobs"] == []
    for bad in ("abc", "abcd-1234", "xyz12345", "a" * 33, " abcd", 1234, ["abcd"]):
        with pytest.raises(InvalidInput) as info:
            verbs("list-jobs", {"idPrefix": bad})
        assert info.value.details["field"] == "idPrefix", (bad, info.value.message)


# ---------------------------------------------------------------------------- complete-step


def review_checkpoints(verbs, job_id) -> list[dict]:
    return [c for c in verbs.store.job_get(job_id).checkpoints if c["name"] == "review"]


def test_complete_step_requeues_then_is_idempotent(verbs):
    job_id = verbs.parked()
    body = {"jobId": str(job_id), "stepName": "review", "response": {"approved": True}}
    assert verbs("complete-step", body) == {"ok": True, "status": "QUEUED"}
    job = verbs.store.job_get(job_id)
    assert job.status == "QUEUED" and job.outstanding_step is None
    # Default-valued fields printed, as upstream's transcoder stores them (the entry also
    # carries its time and the definition's and descriptors' digests: effects, #17).
    assert [
        {k: c[k] for k in ("name", "skipped", "response")}
        for c in review_checkpoints(verbs, job_id)
    ] == [{"name": "review", "skipped": False, "response": {"approved": True, "note": ""}}]
    before = verbs.counts()
    assert verbs("complete-step", body) == {"ok": True, "status": "QUEUED"}
    assert len(review_checkpoints(verbs, job_id)) == 1
    assert verbs.counts() == before


def test_complete_step_response_breaking_rules_fails_the_job(verbs):
    job_id = verbs.parked()
    answer = verbs(
        "complete-step",
        {"jobId": str(job_id), "stepName": "review", "response": {"approved": False}},
    )
    assert answer["ok"] is False and answer["status"] == "FAILED"
    assert "a rejection needs a note" in answer["error"]
    job = verbs.store.job_get(job_id)
    assert job.status == "FAILED"
    assert job.error.startswith("VALIDATION: complete-step response failed validation: ")
    assert review_checkpoints(verbs, job_id) == []
    events = [row.event_type for row in verbs.store.outbox_for_job(job_id)]
    assert events[-1] == "FAILED"


def test_complete_step_wrong_state_and_wrong_step(verbs):
    job_id = verbs.parked()
    answer = verbs("complete-step", {"jobId": str(job_id), "stepName": "embed2", "response": {}})
    assert answer == {
        "ok": False,
        "status": "WAITING",
        "outstandingStep": "review",
        "error": f"job {job_id} is WAITING, parked on step 'review'; "
        "it is not waiting on step 'embed2'",
    }
    queued = verbs("submit-workflow", {"workflowName": "seed-review", "input": {}})["jobId"]
    answer = verbs("complete-step", {"jobId": queued, "stepName": "review", "response": {}})
    assert answer == {
        "ok": False,
        "status": "QUEUED",
        "error": f"job {queued} is QUEUED; it is not waiting on step 'review'",
    }
    # a step that is not external is never completed from outside, checkpointed or not
    before = verbs.counts()
    answer = verbs("complete-step", {"jobId": str(job_id), "stepName": "embed", "response": {}})
    assert answer == {
        "ok": False,
        "status": "WAITING",
        "error": "step 'embed' is a gRPC call (completion: \"invoke\") step, not an external "
        'one (completion: "external"); only an external step can be completed',
    }
    assert verbs.counts() == before


def test_complete_step_twice_on_the_external_step_completes_then_is_already_done(verbs):
    job_id = verbs.parked()
    body = {"jobId": str(job_id), "stepName": "review", "response": {"approved": True}}
    assert verbs("complete-step", body) == {"ok": True, "status": "QUEUED"}
    # The store's own gate, too: the second answer is AlreadyDone, whatever the pre-gate saw.
    from protomolt_jobs.store.records import AlreadyDone

    entry = {"name": "review", "skipped": False, "response": {"approved": True}}
    assert isinstance(verbs.store.job_complete_parked(job_id, "review", entry), AlreadyDone)
    assert verbs("complete-step", body) == {"ok": True, "status": "QUEUED"}
    assert len(review_checkpoints(verbs, job_id)) == 1


def test_complete_step_unknown_job(verbs):
    job_id = uuid.uuid4()
    answer = verbs("complete-step", {"jobId": str(job_id), "stepName": "s", "response": {}})
    assert answer == {"ok": False, "error": f"no workflow run {job_id}"}


def test_complete_step_response_of_the_wrong_shape(verbs):
    job_id = verbs.parked()
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs(
            "complete-step",
            {"jobId": str(job_id), "stepName": "review", "response": {"approved": "maybe"}},
        )
    assert info.value.message.startswith("'response' is not valid proto3 JSON for jobs.test.Review")
    assert info.value.details == {"field": "response", "path": "approved"}
    assert verbs.counts() == before
    assert verbs.store.job_get(job_id).status == "WAITING"


def test_complete_step_response_with_a_misspelt_field_is_refused_naming_it(verbs):
    # A human's answer {"aproved": true} must not become approved = false.
    job_id = verbs.parked()
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs(
            "complete-step",
            {"jobId": str(job_id), "stepName": "review", "response": {"aproved": True}},
        )
    assert '"aproved"' in info.value.message
    assert info.value.details == {"field": "response", "path": "aproved"}
    assert verbs.counts() == before
    assert verbs.store.job_get(job_id).status == "WAITING"


def test_complete_step_on_a_step_the_definition_lacks(verbs):
    job_id = verbs.parked(on="ghost")
    with pytest.raises(InvalidInput, match="the workflow has no step named 'ghost'"):
        verbs("complete-step", {"jobId": str(job_id), "stepName": "ghost", "response": {}})


def test_complete_step_on_an_unreadable_definition_is_job_corrupt(verbs):
    job_id = verbs.parked(definition={"name": "damaged", "steps": "not a list"})
    with pytest.raises(JobCorrupt, match="the job's stored workflow definition does not parse"):
        verbs("complete-step", {"jobId": str(job_id), "stepName": "review", "response": {}})


def test_get_job_on_a_row_whose_json_cannot_be_read_is_job_corrupt(verbs):
    """A row another writer damaged (input nested deeper than the decoder goes) is a loud
    job-corrupt naming the column, not an internal error and not "not found"."""
    job_id = verbs.parked(on="review")
    deep = "[" * 3000 + "]" * 3000
    with psycopg.connect(verbs.dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE workflow_run SET input = jsonb_build_object('x', %s::jsonb) WHERE job_id = %s",
            (deep, job_id),
        )
    with pytest.raises(JobCorrupt, match="cannot be read: input") as raised:
        verbs("get-job", {"jobId": str(job_id)})
    assert raised.value.details == {"jobId": str(job_id), "status": "WAITING"}
    # Summaries do not read the damaged column: the list still answers.
    listed = verbs("list-jobs", {})
    assert str(job_id) in [j["jobId"] for j in listed["jobs"]]


# ---------------------------------------------------------------------------- malformed input

JOB = "1b4e28ba-2fa1-41d2-883f-0016d3cca427"

MALFORMED = [
    # submit-workflow
    (
        "submit-workflow",
        {"workflowName": "seed-review"},
        "input",
        "Missing required object field 'input'",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": []},
        "input",
        "must be a JSON object",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": "x"},
        "input",
        "must be a JSON object",
    ),
    ("submit-workflow", {"workflow": "x", "input": {}}, "workflow", "must be a JSON object"),
    ("submit-workflow", {"workflowName": 7, "input": {}}, "workflowName", "must be a string"),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {}, "jobId": 5},
        "jobId",
        "must be a string",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {}, "jobId": "nope"},
        "jobId",
        "'jobId' must be a uuid; got 'nope'",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {}, "extra": 1},
        "extra",
        "Unknown field 'extra'",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {"text": "a\x00b"}},
        "input",
        "NUL",
    ),
    (
        "submit-workflow",
        {"workflowName": "seed-review", "input": {"n": float("nan")}},
        "input",
        "finite",
    ),
    ("submit-workflow", {"workflowName": "a\x00", "input": {}}, "workflowName", "NUL"),
    # get-job
    ("get-job", {}, "jobId", "Missing required string field 'jobId'"),
    ("get-job", {"jobId": None}, "jobId", "Missing required string field 'jobId'"),
    ("get-job", {"jobId": 12}, "jobId", "Field 'jobId' must be a string"),
    ("get-job", {"jobId": "12"}, "jobId", "'jobId' must be a uuid; got '12'"),
    ("get-job", {"jobId": JOB + "0"}, "jobId", "must be a uuid"),
    ("get-job", {"jobId": JOB, "verbose": True}, "verbose", "Unknown field 'verbose'"),
    # list-jobs
    (
        "list-jobs",
        {"status": "DONE"},
        "status",
        "'status' must be one of CANCELLED, COMPLETED, DEAD, FAILED, PAUSED, QUEUED, RECOVERY_REQUIRED, RUNNING, WAITING; got 'DONE'",
    ),
    ("list-jobs", {"status": "queued"}, "status", "must be one of"),
    ("list-jobs", {"status": 1}, "status", "Field 'status' must be a string"),
    ("list-jobs", {"workflowName": []}, "workflowName", "must be a string"),
    ("list-jobs", {"limit": "10"}, "limit", "Field 'limit' must be an integer"),
    ("list-jobs", {"limit": 1.5}, "limit", "Field 'limit' must be an integer"),
    ("list-jobs", {"limit": True}, "limit", "Field 'limit' must be an integer"),
    ("list-jobs", {"limit": -1}, "limit", "Field 'limit' must be >= 0"),
    ("list-jobs", {"offset": -1}, "offset", "Field 'offset' must be a non-negative integer"),
    ("list-jobs", {"offset": "0"}, "offset", "Field 'offset' must be a non-negative integer"),
    ("list-jobs", {"offset": 2**64}, "offset", "at most"),
    ("list-jobs", {"page": 1}, "page", "Unknown field 'page'"),
    # complete-step
    (
        "complete-step",
        {"stepName": "review", "response": {}},
        "jobId",
        "Missing required string field 'jobId'",
    ),
    (
        "complete-step",
        {"jobId": JOB, "response": {}},
        "stepName",
        "Missing required string field 'stepName'",
    ),
    (
        "complete-step",
        {"jobId": JOB, "stepName": "review"},
        "response",
        "Missing required object field 'response'",
    ),
    (
        "complete-step",
        {"jobId": JOB, "stepName": 3, "response": {}},
        "stepName",
        "must be a string",
    ),
    (
        "complete-step",
        {"jobId": JOB, "stepName": "review", "response": [1]},
        "response",
        "must be a JSON object",
    ),
    (
        "complete-step",
        {"jobId": "x", "stepName": "review", "response": {}},
        "jobId",
        "'jobId' must be a uuid; got 'x'",
    ),
    (
        "complete-step",
        {"jobId": JOB, "stepName": "r", "response": {}, "note": ""},
        "note",
        "Unknown field 'note'",
    ),
]


@pytest.mark.parametrize(
    ("verb", "body", "field", "message"),
    MALFORMED,
    ids=[f"{v}-{i}" for i, (v, *_rest) in enumerate(MALFORMED)],
)
def test_malformed_input_is_invalid_input_naming_the_field(
    shared_verbs, verb, body, field, message
):
    verbs = shared_verbs
    before = verbs.counts()
    with pytest.raises(InvalidInput) as info:
        verbs(verb, body)
    assert message in info.value.message
    assert f"'{field}'" in info.value.message or field in info.value.message
    assert info.value.details["field"] == field
    assert info.value.code == "invalid-input"
    assert verbs.counts() == before
