"""The scheduling fields through the verbs (real PostgreSQL, the host catalog): submit's
priority / queue / fairnessKey / dedupKey, their defaults from a stored workflow, get-job and
list-jobs showing and filtering them, invalid-input naming the field, and the dedup answer."""

from __future__ import annotations

import threading
import uuid

import pytest

from protomolt_jobs.errors import InvalidInput
from tests.integration.test_verbs import make_verbs


@pytest.fixture(scope="module")
def services():
    from tests.support.grpc_servers import TestServices

    svc = TestServices().start()
    yield svc
    svc.stop()


@pytest.fixture
def verbs(fresh_dsn, services):
    v = make_verbs(fresh_dsn, services.target)
    try:
        yield v
    finally:
        v.close()


def submit(verbs, **fields):
    return verbs(
        "submit-workflow", {"workflowName": "seed-review", "input": {"text": "hi"}, **fields}
    )


def test_submit_stores_the_fields_and_get_and_list_show_them(verbs):
    out = submit(verbs, priority=1, queue="gpu", fairnessKey="team-a", dedupKey="d1")
    assert out["ok"] and "deduplicated" not in out
    job = verbs("get-job", {"jobId": out["jobId"]})["job"]
    assert (job["priority"], job["queue"], job["fairnessKey"], job["dedupKey"]) == (
        1,
        "gpu",
        "team-a",
        "d1",
    )
    plain = submit(verbs)
    job = verbs("get-job", {"jobId": plain["jobId"]})["job"]
    assert (job["priority"], job["queue"], job["fairnessKey"]) == (3, "default", "default")
    assert "dedupKey" not in job and "deadlineAt" not in job
    listed = verbs("list-jobs", {"queue": "gpu"})["jobs"]
    assert [j["jobId"] for j in listed] == [out["jobId"]]
    assert [j["jobId"] for j in verbs("list-jobs", {"fairnessKey": "default"})["jobs"]] == [
        plain["jobId"]
    ]


def test_a_stored_workflows_defaults_apply_and_the_submit_wins(verbs):
    verbs.repository.put(
        "sched-defaults",
        {
            **verbs.workflow,
            "scheduling": {"priority": 2, "queue": "gpu", "fairnessKey": "wf-team"},
        },
    )
    by_default = verbs(
        "submit-workflow", {"workflowName": "sched-defaults", "input": {"text": "x"}}
    )
    job = verbs("get-job", {"jobId": by_default["jobId"]})["job"]
    assert (job["priority"], job["queue"], job["fairnessKey"]) == (2, "gpu", "wf-team")
    overridden = verbs(
        "submit-workflow",
        {"workflowName": "sched-defaults", "input": {"text": "x"}, "priority": 5, "queue": "cpu"},
    )
    job = verbs("get-job", {"jobId": overridden["jobId"]})["job"]
    assert (job["priority"], job["queue"], job["fairnessKey"]) == (5, "cpu", "wf-team")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"priority": 0}, "priority"),
        ({"priority": 6}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"queue": ""}, "queue"),
        ({"queue": 7}, "queue"),
        ({"queue": "x" * 201}, "queue"),
        ({"fairnessKey": "a\nb"}, "fairnessKey"),
        ({"dedupKey": "   "}, "dedupKey"),
        ({"priority": float("nan")}, "priority"),
        ({"priority": 2**70}, "priority"),
        ({"priority": [1]}, "priority"),
        ({"queue": "gpu\x7f"}, "queue"),
        ({"fairnessKey": "a\u0085b"}, "fairnessKey"),
        ({"dedupKey": {"k": 1}}, "dedupKey"),
        ({"dedupKey": "a\x00b"}, "dedupKey"),
    ],
)
def test_bad_scheduling_fields_are_invalid_input_naming_the_field(verbs, fields, field):
    before = verbs.counts()
    with pytest.raises(InvalidInput) as err:
        submit(verbs, **fields)
    assert err.value.details == {"field": field}
    assert field in str(err.value)
    assert verbs.counts() == before


def test_a_bad_workflow_default_is_an_answer_naming_it(verbs):
    verbs.repository.put("bad-defaults", {**verbs.workflow, "scheduling": {"priority": 9}})
    out = verbs("submit-workflow", {"workflowName": "bad-defaults", "input": {"text": "x"}})
    assert out["ok"] is False and "scheduling.priority" in out["error"]


def test_fifty_concurrent_submits_with_one_dedup_key_answer_one_run(verbs):
    barrier = threading.Barrier(50)
    answers: list[dict] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(timeout=30)
            answers.append(submit(verbs, jobId=str(uuid.uuid4()), dedupKey="nightly"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(answers) == 50 and all(a["ok"] for a in answers)
    (run_id,) = {a["jobId"] for a in answers}
    assert sum(1 for a in answers if a.get("deduplicated")) == 49
    assert verbs.counts()[0] == 1
    # The run ends: the key is free again.
    job = verbs.store.job_claim("w", 60)
    assert str(job.job_id) == run_id
    verbs.store.job_complete(job.lease, {}, "done")
    again = submit(verbs, dedupKey="nightly")
    assert again["ok"] and again["jobId"] != run_id and "deduplicated" not in again


def test_a_dedup_key_is_free_once_its_run_is_cancelled(verbs):
    first = submit(verbs, dedupKey="weekly")
    assert verbs("cancel-job", {"jobId": first["jobId"]})["status"] == "CANCELLED"
    second = submit(verbs, dedupKey="weekly")
    assert second["ok"] and "deduplicated" not in second
    assert second["jobId"] != first["jobId"]
    # A submit while the second is live answers the second.
    third = submit(verbs, dedupKey="weekly")
    assert third["deduplicated"] is True and third["jobId"] == second["jobId"]


def test_requeue_or_retry_of_an_ended_run_whose_dedup_key_is_taken_is_refused_naming_it(verbs):
    first = submit(verbs, dedupKey="daily")
    job = verbs.store.job_claim("w", 60)
    assert str(job.job_id) == first["jobId"]
    verbs.store.job_fail(job.lease, "boom", "s")
    second = submit(verbs, dedupKey="daily")
    assert second["ok"] and second["jobId"] != first["jobId"]
    before = verbs.counts()
    out = verbs("requeue-job", {"jobId": first["jobId"]})
    assert out["ok"] is False and out["status"] == "FAILED"
    assert "dedupKey 'daily'" in out["error"] and second["jobId"] in out["error"]
    step = verbs.workflow["steps"][0]["name"]
    out = verbs("retry-step", {"jobId": first["jobId"], "stepName": step})
    assert out["ok"] is False and "dedupKey 'daily'" in out["error"]
    assert verbs.counts() == before
    assert verbs("get-job", {"jobId": first["jobId"]})["job"]["status"] == "FAILED"
    # Once the holder ends, the requeue goes through.
    verbs("cancel-job", {"jobId": second["jobId"]})
    assert verbs("requeue-job", {"jobId": first["jobId"]}) == {"ok": True, "status": "QUEUED"}


def test_a_running_runs_dedup_key_is_held_until_its_cancel_is_applied(verbs):
    first = submit(verbs, dedupKey="hourly")
    job = verbs.store.job_claim("w", 60)
    assert verbs("cancel-job", {"jobId": first["jobId"]})["status"] == "RUNNING"
    # The cancel is only requested: the run is live, so the key still answers it.
    held = submit(verbs, dedupKey="hourly")
    assert held["deduplicated"] is True and held["jobId"] == first["jobId"]
    # The worker's next boundary write applies it (CANCELLED): the key is free.
    assert verbs.store.job_stop(job.lease) == "CANCELLED"
    fresh = submit(verbs, dedupKey="hourly")
    assert fresh["ok"] and "deduplicated" not in fresh and fresh["jobId"] != first["jobId"]
