"""Operator control (issue 15 acceptance): cancel, pause, resume at a time, retry one step,
requeue, the history and the final report, against real PostgreSQL, a real Worker and real
gRPC step servers on loopback that count their calls. Verbs run through the host catalog as a
named principal, so the actors in the history are the ones a surface would give."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import event_types, jobs_config, wait_for

INPUT = {"text": "hello brave world"}


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

    def start(**overrides):
        config = jobs_config(fresh_dsn, **{"lease_seconds": 3.0, **overrides})
        w = Worker(store, runtime=Runtime(), config=config, dsn=fresh_dsn)
        w.start()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop(timeout_s=5)


def _submit(verbs, services, **kw):
    answer = verbs(
        "submit-workflow",
        {"workflow": seed_workflow(services.target, review="invoke", **kw), "input": INPUT},
    )
    assert answer["ok"], answer
    return answer["jobId"]


def _status(verbs, job_id):
    return verbs("get-job", {"jobId": job_id})["job"]["status"]


def _db_now(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def test_cancel_a_running_job_keeps_the_step_in_flight_and_calls_nothing_after(
    verbs, services, worker, store
):
    services.set_delay("Tokenize", 2.0)
    job_id = _submit(verbs, services)
    worker()
    wait_for(lambda: services.calls("Tokenize") == 1 or None, timeout_s=10)
    started = time.monotonic()
    answer = verbs("cancel-job", {"jobId": job_id, "reason": "wrong input"})
    assert time.monotonic() - started < 1.0, "the cancel waited for the step"
    assert answer["ok"] and answer["status"] == "RUNNING" and answer["requested"] == "cancel"
    wait_for(lambda: _status(verbs, job_id) == "CANCELLED" or None, timeout_s=15)
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert [c["name"] for c in job["checkpoints"]] == ["tokenize"]
    assert job["error"] == "CANCELLED by alice: wrong input"
    assert services.calls("Tokenize") == 1
    assert services.calls("Embed") == 0 and services.calls("Review") == 0
    types = [t for t, _ in event_types(store, job_id)]
    assert types.count("CANCELLED") == 1 and "COMPLETED" not in types
    report = job["report"]
    assert [(s["name"], s["status"]) for s in report["steps"]] == [
        ("tokenize", "succeeded"),
        ("embed", "not run"),
        ("review", "not run"),
    ]
    assert report["steps"][1]["reason"] == "cancelled"
    assert report["durationsMs"]["tokenize"] >= 1900
    assert report["attempts"] == {"tokenize": 1} and report["claims"] == 1
    assert {"kind": "cancel-request", "actor": "alice"}.items() <= report["operatorActions"][
        0
    ].items()


def test_pause_during_step_one_and_resume_at_a_time(verbs, services, worker, fresh_dsn):
    services.set_delay("Tokenize", 1.0)
    job_id = _submit(verbs, services)
    worker()
    wait_for(lambda: services.calls("Tokenize") == 1 or None, timeout_s=10)
    answer = verbs("pause-job", {"jobId": job_id, "reason": "night shift"})
    assert answer["ok"] and answer["requested"] == "pause"
    wait_for(lambda: _status(verbs, job_id) == "PAUSED" or None, timeout_s=15)
    assert services.calls("Embed") == 0
    at = _db_now(fresh_dsn) + timedelta(seconds=3)
    resumed = verbs("resume-job", {"jobId": job_id, "at": at.isoformat()})
    assert resumed["ok"] and resumed["status"] == "QUEUED", resumed
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=20)
    assert services.calls("Tokenize") == 1
    assert services.calls("Embed") == 1
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        claimed_at = conn.execute(
            "SELECT at FROM workflow_run_transition WHERE job_id = %s AND kind = 'claim'"
            " ORDER BY seq DESC LIMIT 1",
            (uuid.UUID(job_id),),
        ).fetchone()[0]
    assert claimed_at >= at, "step 2 started before 'at'"


def test_resume_at_a_time_of_a_job_paused_while_waiting_says_the_time_planned_nothing(
    verbs, services, worker
):
    """A job paused while WAITING goes back to its parked step on resume; an 'at' given with
    the resume plans nothing, and the answer says so instead of letting the caller believe a
    start was deferred (breaker finding, issue 28)."""
    job_id = verbs(
        "submit-workflow",
        {"workflow": seed_workflow(services.target, review="external"), "input": INPUT},
    )["jobId"]
    worker()
    wait_for(lambda: _status(verbs, job_id) == "WAITING" or None, timeout_s=15)
    assert verbs("pause-job", {"jobId": job_id})["status"] == "PAUSED"
    answer = verbs(
        "resume-job", {"jobId": job_id, "at": "23:59", "day": "tomorrow", "zone": "Europe/Warsaw"}
    )
    assert answer["ok"] is True and answer["status"] == "WAITING", answer
    assert answer["outstandingStep"] == "review"
    assert "runAfter" not in answer
    assert "no start to defer" in answer["ignored"]["at"]
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["status"] == "WAITING"
    # nothing was planned for 23:59 in Warsaw (22:59 UTC in winter)
    assert not str(job.get("runAfter") or "").endswith("T22:59:00Z")


def test_pause_a_waiting_job_then_resume_it_waits_on_the_same_step(verbs, services, worker):
    job_id = verbs(
        "submit-workflow",
        {"workflow": seed_workflow(services.target, review="external"), "input": INPUT},
    )["jobId"]
    worker()
    wait_for(lambda: _status(verbs, job_id) == "WAITING" or None, timeout_s=15)
    paused = verbs("pause-job", {"jobId": job_id})
    assert paused == {"ok": True, "status": "PAUSED", "outstandingStep": "review"}
    refused = verbs(
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True}},
    )
    assert refused["ok"] is False and refused["status"] == "PAUSED"
    assert verbs("resume-job", {"jobId": job_id}) == {
        "ok": True,
        "status": "WAITING",
        "outstandingStep": "review",
    }
    done = verbs(
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True, "note": "ok"}},
    )
    assert done == {"ok": True, "status": "QUEUED"}
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=15)


def test_retry_step_two_of_a_completed_job(verbs, services, worker):
    job_id = _submit(verbs, services)
    worker()
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=15)
    assert [services.calls(m) for m in ("Tokenize", "Embed", "Review")] == [1, 1, 1]
    answer = verbs(
        "retry-step",
        {"jobId": job_id, "stepName": "embed", "reason": "model updated"},
        principal="bob",
    )
    assert answer == {"ok": True, "status": "QUEUED", "dropped": ["embed", "review"]}
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=15)
    assert [services.calls(m) for m in ("Tokenize", "Embed", "Review")] == [1, 2, 2]
    history = verbs("job-history", {"jobId": job_id})
    assert history["integrity"] == "ok"
    retry = [t for t in history["transitions"] if t["kind"] == "retry-step"]
    assert len(retry) == 1
    assert (retry[0]["actor"], retry[0]["reason"], retry[0]["step"]) == (
        "bob",
        "model updated",
        "embed",
    )
    assert (retry[0]["prevStatus"], retry[0]["newStatus"]) == ("COMPLETED", "QUEUED")


def test_retry_step_names_an_unknown_step_as_invalid_input(verbs, services, worker):
    from protomolt_jobs.errors import InvalidInput

    job_id = _submit(verbs, services)
    worker()
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=15)
    with pytest.raises(InvalidInput) as raised:
        verbs("retry-step", {"jobId": job_id, "stepName": "nope"})
    assert raised.value.details == {"field": "stepName"}


def test_requeue_a_dead_job_resumes_at_its_first_missing_checkpoint(verbs, services, worker):
    import grpc

    services.fail_next("Embed", 10, grpc.StatusCode.UNAVAILABLE, "model loading")
    job_id = _submit(verbs, services)
    worker(max_attempts=2, backoff_base_seconds=0.05)
    wait_for(lambda: _status(verbs, job_id) == "DEAD" or None, timeout_s=20)
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert [c["name"] for c in job["checkpoints"]] == ["tokenize"]
    assert [(s["name"], s["status"]) for s in job["report"]["steps"]] == [
        ("tokenize", "succeeded"),
        ("embed", "failed"),
        ("review", "not run"),
    ]
    assert job["report"]["attempts"] == {"tokenize": 1, "embed": 3}  # max_attempts 3
    assert job["report"]["steps"][1]["reason"].startswith("GRPC: ")
    services.reset()
    assert verbs("requeue-job", {"jobId": job_id, "reason": "model is back"}) == {
        "ok": True,
        "status": "QUEUED",
    }
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=15)
    assert services.calls("Tokenize") == 0 and services.calls("Embed") == 1
    again = verbs("requeue-job", {"jobId": job_id})
    assert again["ok"] is False and again["status"] == "COMPLETED"


def test_cancel_racing_completion_ends_in_exactly_one_state(verbs, services, worker, store):
    """50 races: the cancel is sent as the last step returns; each job ends CANCELLED or
    COMPLETED with one terminal event, and the cancel's answer says which."""
    import random

    review_class = services.message_class("jobs.test.Review")
    called = threading.Semaphore(0)

    def review(request, context):
        called.release()
        time.sleep(random.uniform(0, 0.004))  # vary which side of the race wins
        return review_class(approved=True, note="auto-approved")

    services.set_handler("Review", review)
    worker(worker_count=1)
    answers: dict[str, dict] = {}
    job_ids = []
    for _ in range(50):
        job_id = _submit(verbs, services)
        job_ids.append(job_id)
        assert called.acquire(timeout=15), "the review step was never called"
        answers[job_id] = verbs("cancel-job", {"jobId": job_id, "reason": "race"})
        wait_for(
            lambda j=job_id: store.job_get(j).status in ("COMPLETED", "CANCELLED") or None,
            timeout_s=15,
        )
    outcomes = {"CANCELLED": 0, "COMPLETED": 0}
    for job_id in job_ids:
        job = store.job_get(job_id)
        outcomes[job.status] += 1
        types = [t for t, _ in event_types(store, job_id)]
        assert types.count("CANCELLED") + types.count("COMPLETED") == 1, (job_id, types)
        answer = answers[job_id]
        if job.status == "COMPLETED":
            assert answer["ok"] is False and answer["status"] == "COMPLETED", answer
            assert job.result is not None
        else:
            assert answer["ok"] is True and answer["status"] in ("CANCELLED", "RUNNING"), answer
            assert job.result is None
            assert [c["name"] for c in job.checkpoints] == ["tokenize", "embed", "review"]
    assert sum(outcomes.values()) == 50
    print("race outcomes:", outcomes)


def test_history_of_a_retried_and_swept_job(verbs, services, store, fresh_dsn):
    import grpc

    services.fail_next("Tokenize", 1, grpc.StatusCode.UNAVAILABLE, "warming up")
    job_id = _submit(verbs, services)
    config = jobs_config(fresh_dsn, lease_seconds=30.0, backoff_base_seconds=0.01)
    w = Worker(store, runtime=Runtime(), config=config, dsn=fresh_dsn)
    assert w.run_once() is True  # claim, tokenize UNAVAILABLE -> retry
    # the next claim crashes in spirit: claim by hand, then let its lease expire
    wait_for(lambda: store.job_claim("crashed-worker", 30), timeout_s=10)
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 s' WHERE job_id = %s",
            (uuid.UUID(job_id),),
        )
    Sweeper(store, config=config).run_once()
    assert w.run_once() is True
    assert _status(verbs, job_id) == "COMPLETED"
    history = verbs("job-history", {"jobId": job_id})
    kinds = [(t["kind"], t["actor"]) for t in history["transitions"]]
    worker_actor = f"worker:{config.worker_id}"
    assert kinds[:6] == [
        ("submit", "alice"),
        ("claim", worker_actor),
        ("retry", worker_actor),
        ("claim", "worker:crashed-worker"),
        ("sweep", "sweeper"),
        ("claim", worker_actor),
    ]
    assert history["integrity"] == "ok"
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE workflow_run_transition SET reason = 'edited' WHERE job_id = %s AND seq = 4",
            (uuid.UUID(job_id),),
        )
        conn.execute(
            "UPDATE workflow_run SET status = 'QUEUED' WHERE job_id = %s", (uuid.UUID(job_id),)
        )
    history = verbs("job-history", {"jobId": job_id})
    assert history["integrity"] == "broken at seq 4" and history["firstBadSeq"] == 4
    last = history["transitions"][-1]
    assert (last["kind"], last["actor"], last["newStatus"]) == ("sql", "sql:postgres", "QUEUED")


def test_get_job_shows_run_after_max_attempts_and_a_pending_control(verbs, services, store):
    job_id = _submit(verbs, services)
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["maxAttempts"] == 3 and job["runAfter"].endswith("Z")
    assert "control" not in job and "report" not in job
    claimed = store.job_claim("w", 60)
    assert str(claimed.job_id) == job_id
    verbs("pause-job", {"jobId": job_id, "reason": "later"})
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["control"]["kind"] == "pause" and job["control"]["actor"] == "alice"
    again = verbs("cancel-job", {"jobId": job_id})
    assert again["requested"] == "cancel"  # a cancel overrides a pending pause
    assert verbs("pause-job", {"jobId": job_id})["ok"] is False


def test_bad_input_is_invalid_input_naming_the_field(verbs, services):
    from protomolt_jobs.errors import InvalidInput

    job_id = _submit(verbs, services)
    for verb, body, field in [
        ("cancel-job", {"jobId": "nope"}, "jobId"),
        ("cancel-job", {"jobId": job_id, "reason": 5}, "reason"),
        ("pause-job", {"jobId": job_id, "why": "x"}, "why"),
        ("resume-job", {"jobId": job_id, "at": "tomorrow"}, "at"),
        ("resume-job", {"jobId": job_id, "at": "2026-01-01T22:00:00"}, "at"),
        ("retry-step", {"jobId": job_id}, "stepName"),
        ("job-history", {"jobId": 7}, "jobId"),
    ]:
        with pytest.raises(InvalidInput) as raised:
            verbs(verb, body)
        assert raised.value.details == {"field": field}, (verb, body)
    unknown = str(uuid.uuid4())
    for verb in ("cancel-job", "pause-job", "resume-job", "requeue-job", "job-history"):
        assert verbs(verb, {"jobId": unknown}) == {
            "ok": False,
            "error": f"no workflow run {unknown}",
        }
    assert verbs("resume-job", {"jobId": job_id})["ok"] is False  # QUEUED is not PAUSED


def test_an_uncontrolled_three_step_job_runs_no_more_statements(services, store, fresh_dsn):
    """The budget rule: the history rows ride inside the statements the worker already runs.
    A never-controlled three-step job costs the claim, two checkpoints and the completion (with
    the last checkpoint): 4 statements, each write carrying its own events (one-statement
    fenced writes, issue 14; 8 before it)."""
    import collections

    from protomolt_jobs.store import db as store_module
    from tests.support.worker_proc import enqueue

    workflow = seed_workflow(services.target, review="invoke")
    config = jobs_config(fresh_dsn, lease_seconds=300.0)  # no heartbeat falls due
    worker = Worker(store, runtime=Runtime(), config=config, dsn=fresh_dsn)
    enqueue(store, workflow, INPUT)
    assert worker.run_once() is True  # warm-up: the worker's own first-call reads
    job = enqueue(store, workflow, INPUT)
    counts: collections.Counter[str] = collections.Counter()
    originals = {name: getattr(store_module, name) for name in ("execute", "one", "rows")}

    def counting(original):
        def run(conn, name, params):
            counts[name] += 1
            return original(conn, name, params)

        return run

    try:
        for name, original in originals.items():
            setattr(store_module, name, counting(original))
        assert worker.run_once() is True
    finally:
        for name, original in originals.items():
            setattr(store_module, name, original)
    assert store.job_get(job.job_id).status == "COMPLETED"
    assert dict(counts) == {
        "job_claim_one_queue": 1,  # job_claim for a worker of one queue (a plan kept)
        "job_checkpoint": 2,
        "job_complete_with_checkpoint": 1,
    }
    kinds = [t.kind for t in store.job_history(job.job_id).transitions]
    assert kinds == ["submit", "claim", "checkpoint", "checkpoint", "complete"]


def test_a_job_waiting_for_its_permit_stops_within_a_heartbeat(verbs, services, worker, store):
    """A cancel reaches a job that has not started its step (waiting for a per-target permit)
    through the heartbeat's answer; it stops at once (job_stop), calling nothing."""
    services.set_delay("Tokenize", 4.0)
    first = _submit(verbs, services)
    worker(worker_count=2, max_concurrent_per_target=1)
    wait_for(lambda: services.calls("Tokenize") == 1 or None, timeout_s=10)
    second = _submit(verbs, services)
    wait_for(lambda: store.job_get(second).status == "RUNNING" or None, timeout_s=10)
    answer = verbs("cancel-job", {"jobId": second, "reason": "not needed"})
    assert answer["requested"] == "cancel"
    # lease 3 s: a heartbeat each second; the first job's step still holds the permit.
    wait_for(lambda: store.job_get(second).status == "CANCELLED" or None, timeout_s=3)
    assert services.calls("Tokenize") == 1
    job = store.job_get(second)
    assert job.checkpoints == [] and job.lease_owner is None
    last = store.job_history(second).transitions[-1]
    assert (last.kind, last.actor, last.prev_status) == ("cancel", "alice", "RUNNING")
    wait_for(lambda: _status(verbs, first) == "COMPLETED" or None, timeout_s=20)


def test_retry_step_in_a_graph_reruns_the_step_and_its_dependants_only(verbs, services, worker):
    """Diamond a -> (b || c) -> d: retrying b re-runs b and d; a and c are not called again."""
    from tests.support.graphs import diamond

    answer = verbs(
        "submit-workflow",
        {"workflow": diamond(services.target, sleep_ms=10), "input": {"text": "x"}},
    )
    job_id = answer["jobId"]
    worker()
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=20)
    calls = {s: services.step_calls(s) for s in "abcd"}
    assert calls == {"a": 1, "b": 1, "c": 1, "d": 1}
    retried = verbs("retry-step", {"jobId": job_id, "stepName": "b"})
    assert retried == {"ok": True, "status": "QUEUED", "dropped": ["b", "d"]}
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=20)
    assert {s: services.step_calls(s) for s in "abcd"} == {"a": 1, "b": 2, "c": 1, "d": 2}
    report = verbs("get-job", {"jobId": job_id})["job"]["report"]
    assert "criterion" in report and report["operatorActions"][0]["kind"] == "retry-step"
