"""Text PostgreSQL refuses (NUL, lone surrogates) is stored as U+FFFD, so every write settles."""

from __future__ import annotations

import pytest

from protomolt_jobs.kafka.wire import WorkflowRunEvent
from protomolt_jobs.store import JobStore, ParkedStepCompleted
from tests.support.factories import claimed_job, new_job, parked_job

R = "\ufffd"


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def last_event(store: JobStore, job_id) -> WorkflowRunEvent:
    msg = WorkflowRunEvent()
    msg.ParseFromString(store.outbox_for_job(job_id)[-1].payload)
    return msg


def test_fail_with_a_nul_in_the_error_and_step_settles_and_reads_back_scrubbed(store):
    job = claimed_job(store)
    store.job_fail(job.lease, "bad byte \x00 here", step="fir\x00st")
    row = store.job_get(job.job_id)
    assert row.status == "FAILED"
    assert row.error == f"bad byte {R} here"
    event = last_event(store, job.job_id)
    assert (event.error, event.step) == (f"bad byte {R} here", f"fir{R}st")


def test_complete_with_nul_in_result_strings_keys_and_verdict(store):
    job = claimed_job(store)
    result = {"text": "a\u0000b", "k\u0000ey": ["\u0000", {"deep": "x\x00"}], "n": 1}
    store.job_complete(job.lease, result, "ok \x00 verdict")
    row = store.job_get(job.job_id)
    assert row.status == "COMPLETED" and row.unreadable is None
    assert row.result == {"text": f"a{R}b", f"k{R}ey": [R, {"deep": f"x{R}"}], "n": 1}
    assert row.verdict == f"ok {R} verdict"
    assert last_event(store, job.job_id).verdict == f"ok {R} verdict"


def test_checkpoint_with_a_nul_in_its_response_and_name(store):
    job = claimed_job(store)
    store.job_checkpoint(
        job.lease, {"name": "fi\x00rst", "skipped": False, "response": {"body": "\x00\x00"}}
    )
    row = store.job_get(job.job_id)
    assert row.checkpoints == [{"name": f"fi{R}rst", "skipped": False, "response": {"body": R + R}}]
    assert last_event(store, job.job_id).step == f"fi{R}rst"


def test_insert_with_nul_in_input_definition_name_and_error(store):
    created = store.job_insert(
        new_job(
            workflow_name="wf\x00x",
            input={"text": "hello \u0000 world", "n\x00": None},
            workflow_definition={"name": "wf\x00x"},
        )
    ).job
    assert created.workflow_name == f"wf{R}x"
    assert created.input == {"text": f"hello {R} world", f"n{R}": None}
    assert created.workflow_definition == {"name": f"wf{R}x"}
    assert store.job_get(created.job_id).input == created.input
    failed = store.job_insert(new_job(status="FAILED", error="born \x00 bad")).job
    assert failed.error == f"born {R} bad"


def test_lone_surrogates_are_replaced_too(store):
    job = claimed_job(store)
    store.job_checkpoint(
        job.lease, {"name": "first", "skipped": False, "response": {"s": "\ud800"}}
    )
    store.job_retry(job.lease, 0, "GRPC: \udcff broken")
    row = store.job_get(job.job_id)
    assert row.checkpoints[0]["response"] == {"s": R}
    assert row.error == f"GRPC: {R} broken"


def test_park_and_complete_a_step_named_with_a_nul(store):
    job = parked_job(store, step="appr\x00ove")
    assert job.outstanding_step == f"appr{R}ove"
    outcome = store.job_complete_parked(
        job.job_id, "appr\x00ove", {"name": "appr\x00ove", "skipped": False, "response": {}}
    )
    assert isinstance(outcome, ParkedStepCompleted)
    assert store.job_get(job.job_id).checkpoints[-1]["name"] == f"appr{R}ove"


def test_dead_release_parked_fail_outbox_error_and_rejects_accept_nul(store):
    dead = claimed_job(store)
    store.job_dead(dead.lease, "gave up \x00")
    assert store.job_get(dead.job_id).error == f"gave up {R}"
    parked = parked_job(store)
    assert isinstance(
        store.job_fail_parked(parked.job_id, "approve", "no \x00"), ParkedStepCompleted
    )
    assert store.job_get(parked.job_id).error == f"no {R}"
    event_id = store.outbox_for_job(parked.job_id)[-1].event_id
    assert store.outbox_mark_failed(event_id, "broker \x00 down").last_error == f"broker {R} down"
    assert store.reject_insert(b"\x00", "topic\x00", 0, 1, "why \x00") > 0


def test_a_backslash_u0000_literal_is_kept_as_written(store):
    job = claimed_job(store)
    store.job_complete(job.lease, {"t": "\\u0000 and \\ud800"}, "v")
    assert store.job_get(job.job_id).result == {"t": "\\u0000 and \\ud800"}


def test_input_nested_too_deeply_to_serialise_is_a_value_error_naming_the_field(store):
    deep: dict = {}
    for _ in range(3000):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="input: not representable as JSON"):
        store.job_insert(new_job(input=deep))
