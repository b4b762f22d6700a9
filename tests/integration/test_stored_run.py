"""StoredRun.load over rows read back from PostgreSQL, the broken ones test_store_unreadable
builds included: each problem is one SnapshotError whose kind says what was wrong."""

from __future__ import annotations

import copy

import pytest

from protomolt_jobs.runs.inspector import JobInspector
from protomolt_jobs.runs.stored_run import SnapshotError, StoredRun
from protomolt_jobs.store import JobStore
from protomolt_jobs.workflow import Runtime
from tests.integration.test_store_unreadable import corrupt, deep_object_text
from tests.support.factories import queued_job
from tests.support.grpc_servers import seed_workflow


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def reload(store, job):
    return store.job_get(job.job_id)


def test_a_sound_row_loads_as_stored(store, runtime):
    definition = seed_workflow("inprocess:test")
    job = reload(store, queued_job(store, workflow_definition=definition))
    stored = StoredRun.load(job, runtime, verified=True)
    assert stored.definition == definition
    assert stored.workflow.name == definition["name"]
    assert stored.step_names() == ["tokenize", "embed", "review"]


@pytest.mark.parametrize(
    ("json_text", "unreadable"),
    [
        ("[1, 2]", "workflow_definition: not a JSON object (found list)"),
        (deep_object_text(3000), "workflow_definition: RecursionError"),
    ],
    ids=["not-an-object", "nested-too-deeply"],
)
def test_a_definition_the_store_cannot_read_is_not_an_object(
    store, fresh_dsn, runtime, json_text, unreadable
):
    job = queued_job(store)
    corrupt(fresh_dsn, job.job_id, "workflow_definition", json_text)
    row = reload(store, job)
    assert row.workflow_definition is None and row.unreadable.startswith(unreadable)
    with pytest.raises(SnapshotError) as raised:
        StoredRun.load(row, runtime)
    assert (raised.value.kind, raised.value.found) == ("not-object", "NoneType")


def test_a_definition_that_does_not_parse(store, runtime):
    job = reload(store, queued_job(store, workflow_definition={"name": "damaged", "steps": "x"}))
    assert job.unreadable is None
    with pytest.raises(SnapshotError) as raised:
        StoredRun.load(job, runtime)
    assert raised.value.kind == "parse"
    assert raised.value.detail == str(raised.value.__cause__)


def test_a_definition_that_does_not_verify_loads_unless_verified(store, runtime):
    definition = copy.deepcopy(seed_workflow("inprocess:test"))
    definition["steps"][1]["rules"] = ["ids = tokenize.nope"]
    job = reload(store, queued_job(store, workflow_definition=definition))
    assert StoredRun.load(job, runtime).workflow.step("embed") is not None
    with pytest.raises(SnapshotError) as raised:
        StoredRun.load(job, runtime, verified=True)
    assert (raised.value.kind, raised.value.step) == ("verify", "embed")
    assert "no field 'nope'" in raised.value.detail


def test_the_inspector_leaves_out_what_a_broken_definition_cannot_give(store, runtime):
    """A read that only adds extras maps SnapshotError to its empty value."""
    inspector = JobInspector(lambda: store, runtime)
    sound = queued_job(store, workflow_definition=seed_workflow("inprocess:test"))
    assert inspector.step_names(str(sound.job_id)) == ["tokenize", "embed", "review"]
    assert inspector.answer_type(str(sound.job_id), "review") is not None
    broken = queued_job(store, workflow_definition={"name": "damaged", "steps": "x"})
    job_id = str(broken.job_id)
    assert inspector.step_names(job_id) == []
    assert inspector.step_graph(job_id) == []
    assert inspector.answer_type(job_id, "review") is None
