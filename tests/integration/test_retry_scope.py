"""retry-step's scopes (issue 27 item 3): real PostgreSQL, a real Worker, the test
``Steps/Run`` service on loopback counting calls per step. Verbs run through the host catalog
as a named principal, as a surface would call them.

``scope: "only"`` re-runs the named step alone; its dependants run again only when its new
output differs from the checkpointed one (by hash). A dependant with an external effect whose
result is recorded never runs again as a side effect of a retry, whatever the scope; naming it
keeps its idempotency key unless the operator asks for a new one.
"""

from __future__ import annotations

from typing import Any

import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
from tests.support.worker_proc import event_types, jobs_config, wait_for

KEY = "x-protomolt-idempotency-key"


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=8)
    yield s
    s.close()


@pytest.fixture
def verbs(store):
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)

    def call(verb, body, *, principal="alice"):
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


@pytest.fixture
def worker(store, fresh_dsn):
    workers = []

    def start():
        config = jobs_config(fresh_dsn, lease_seconds=3.0)
        w = Worker(store, runtime=Runtime(), config=config, dsn=fresh_dsn)
        w.start()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop(timeout_s=5)


def _status(verbs, job_id) -> str:
    return verbs("get-job", {"jobId": job_id})["job"]["status"]


def _completed(verbs, job_id) -> dict[str, Any]:
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=20)
    return verbs("get-job", {"jobId": job_id})["job"]


def _run(verbs, worker, workflow) -> str:
    answer = verbs("submit-workflow", {"workflow": workflow, "input": {"text": "x"}})
    assert answer["ok"], answer
    worker()
    _completed(verbs, answer["jobId"])
    return answer["jobId"]


def _calls(services, names) -> dict[str, int]:
    return {n: services.step_calls(n) for n in names}


def chain_graph(t: str) -> dict[str, Any]:
    """A graph a -> b -> c -> d, each reading its parent."""
    return graph(
        [
            step("a", t, after=[]),
            step("b", t, after=["a"], reads=["a"]),
            step("c", t, after=["b"], reads=["b"]),
            step("d", t, after=["c"], reads=["c"]),
        ],
        name="chain",
    )


def with_charge(t: str) -> dict[str, Any]:
    """A sequential a -> b -> charge (effect: external) -> d, each reading the one before."""
    return graph(
        [
            step("a", t),
            step("b", t, reads=["a"]),
            step("charge", t, reads=["b"], effect="external"),
            step("d", t, reads=["charge"]),
        ],
        name="with-charge",
    )


def b_answers_differently_the_second_time(services) -> None:
    def run(request, context):
        reply = services._do_run(request, context)
        if request.step == "b" and services.step_calls("b") > 1:
            reply.seen.append("changed")
        return reply

    services.set_handler("Run", run)


def test_retry_only_a_middle_step_of_a_completed_run_calls_that_step_alone(
    verbs, services, worker, store
):
    # issue 27 acceptance: retry-step --only on a COMPLETED run naming a middle step: that
    # step is called once more, no dependant and no effect step is called, and the history
    # records the retry with its scope.
    job_id = _run(verbs, worker, chain_graph(services.target))
    before = verbs("get-job", {"jobId": job_id})["job"]
    assert _calls(services, "abcd") == {"a": 1, "b": 1, "c": 1, "d": 1}
    answer = verbs(
        "retry-step",
        {"jobId": job_id, "stepName": "b", "scope": "only", "reason": "flaky validator"},
        principal="bob",
    )
    assert answer == {
        "ok": True,
        "status": "QUEUED",
        "dropped": ["b"],
        "scope": "only",
        "rerunIfChanged": ["c", "d"],
    }
    job = _completed(verbs, job_id)
    assert _calls(services, "abcd") == {"a": 1, "b": 2, "c": 1, "d": 1}
    assert job["result"] == before["result"]
    # c and d stay as they were stored, after them b's new entry
    assert [c["name"] for c in job["checkpoints"]] == ["a", "c", "d", "b"]
    history = verbs("job-history", {"jobId": job_id})
    assert history["integrity"] == "ok"
    (retry,) = [t for t in history["transitions"] if t["kind"] == "retry-step"]
    assert (retry["actor"], retry["step"], retry["reason"]) == (
        "bob",
        "b",
        "scope only; flaky validator",
    )
    assert (retry["prevStatus"], retry["newStatus"]) == ("COMPLETED", "QUEUED")
    report = job["report"]
    assert [(s["name"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "succeeded"),
        ("d", "succeeded"),
    ]
    kinds = [k for k, _ in event_types(store, job_id)]
    assert kinds.count("REQUEUED") == 1 and kinds.count("COMPLETED") == 2


def test_retry_only_whose_output_changed_reruns_the_dependants(verbs, services, worker):
    b_answers_differently_the_second_time(services)
    job_id = _run(verbs, worker, chain_graph(services.target))
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "b", "scope": "only"})
    assert answer["rerunIfChanged"] == ["c", "d"]
    job = _completed(verbs, job_id)
    assert _calls(services, "abcd") == {"a": 1, "b": 2, "c": 2, "d": 2}
    assert job["result"]["seen"] == ["a", "b", "changed", "c", "d"]
    report = job["report"]
    assert [s["status"] for s in report["steps"]] == ["succeeded"] * 4
    assert report["completionOrder"][-3:] == ["b", "c", "d"]


def test_retry_only_of_a_sequential_run_never_calls_the_effect_step(verbs, services, worker):
    job_id = _run(verbs, worker, with_charge(services.target))
    names = ("a", "b", "charge", "d")
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "b", "scope": "only"})
    assert answer == {
        "ok": True,
        "status": "QUEUED",
        "dropped": ["b"],
        "scope": "only",
        "rerunIfChanged": ["d"],
        "keptEffects": ["charge"],
    }
    job = _completed(verbs, job_id)
    assert _calls(services, names) == {"a": 1, "b": 2, "charge": 1, "d": 1}
    assert job["verdict"].startswith("4 steps")


def test_a_changed_output_reruns_the_dependants_but_never_a_recorded_effect(
    verbs, services, worker
):
    b_answers_differently_the_second_time(services)
    job_id = _run(verbs, worker, with_charge(services.target))
    names = ("a", "b", "charge", "d")
    verbs("retry-step", {"jobId": job_id, "stepName": "b", "scope": "only"})
    job = _completed(verbs, job_id)
    assert _calls(services, names) == {"a": 1, "b": 2, "charge": 1, "d": 2}
    # d read the kept charge's stored answer
    assert job["result"]["seen"] == ["a", "b", "charge", "d"]


def test_the_default_scope_reruns_dependants_but_keeps_a_recorded_effect(verbs, services, worker):
    job_id = _run(verbs, worker, with_charge(services.target))
    names = ("a", "b", "charge", "d")
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "b"})
    assert answer == {
        "ok": True,
        "status": "QUEUED",
        "dropped": ["b", "d"],
        "keptEffects": ["charge"],
    }
    _completed(verbs, job_id)
    assert _calls(services, names) == {"a": 1, "b": 2, "charge": 1, "d": 2}
    history = verbs("job-history", {"jobId": job_id})
    (retry,) = [t for t in history["transitions"] if t["kind"] == "retry-step"]
    assert "reason" not in retry or retry["reason"] is None  # no scope given: as before


def test_naming_an_external_step_keeps_its_idempotency_key_unless_asked(
    verbs, services, worker, store
):
    job_id = _run(verbs, worker, with_charge(services.target))
    verbs("retry-step", {"jobId": job_id, "stepName": "charge"})
    _completed(verbs, job_id)
    verbs(
        "retry-step",
        {"jobId": job_id, "stepName": "charge", "newIdempotencyKey": True, "reason": "refund"},
    )
    _completed(verbs, job_id)
    keys = [
        m[KEY]
        for m, r in zip(services.metadata("Run"), services.requests("Run"), strict=True)
        if r.step == "charge"
    ]
    assert keys == [f"{job_id}:charge:0", f"{job_id}:charge:0", f"{job_id}:charge:1"]
    assert store.job_get(job_id).step_generations == {"charge": 1}
    history = verbs("job-history", {"jobId": job_id})
    reasons = [t.get("reason") for t in history["transitions"] if t["kind"] == "retry-step"]
    assert reasons == [None, "new idempotency key; refund"]


def test_retry_step_fields_are_validated_naming_the_field(verbs, services, worker):
    from protomolt_jobs.errors import InvalidInput

    job_id = _run(verbs, worker, chain_graph(services.target))
    for body, field in [
        ({"scope": "everything"}, "scope"),
        ({"scope": 3}, "scope"),
        ({"newIdempotencyKey": "yes"}, "newIdempotencyKey"),
        ({"scop": "only"}, "scop"),
    ]:
        with pytest.raises(InvalidInput) as raised:
            verbs("retry-step", {"jobId": job_id, "stepName": "b", **body})
        assert raised.value.details == {"field": field}, body
    assert _status(verbs, job_id) == "COMPLETED"
