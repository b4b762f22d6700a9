"""Breaking operator control (issue 15): races between operators, against the sweeper and
against complete-step, resume ``at`` edges, bad input at the verbs' door, the history after
all of it. Real PostgreSQL."""

from __future__ import annotations

import threading

import psycopg
import pytest

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.job_verbs import JobsBackend, jobs_actions
from protomolt_jobs.store import JobStore
from protomolt_jobs.submitter import Submitter
from protomolt_jobs.workflow import Runtime
from tests.support.factories import claimed_job, dead_job, failed_job, parked_job, queued_job
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import event_types


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
        try:
            return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))
        except InvalidInput as exc:  # what a surface answers as invalid-input
            return {"ok": False, "code": "invalid-input", "error": str(exc)}

    return call


def _sql(dsn, query, *params):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else cur.rowcount


def _race(*calls):
    barrier = threading.Barrier(len(calls))
    answers = [None] * len(calls)

    def run(i, fn):
        barrier.wait()
        try:
            answers[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the race's loser must not raise
            answers[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return answers


def _chain_ok(store, job_id):
    history = store.job_history(job_id)
    assert history.first_bad_seq is None
    assert [t.seq for t in history.transitions] == list(range(1, len(history.transitions) + 1))
    return history


def test_resume_at_beyond_year_9999_in_utc_is_invalid_input(verbs, store):
    job = queued_job(store)
    assert verbs("pause-job", {"jobId": str(job.job_id)})["status"] == "PAUSED"
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "9999-12-31T23:59:59-14:00"})
    assert answer["ok"] is False and answer.get("code") == "invalid-input", answer
    assert "at" in answer["error"]
    assert verbs("get-job", {"jobId": str(job.job_id)})["job"]["status"] == "PAUSED"


@pytest.mark.parametrize(
    "at", ["tomorrow", "2026-13-01T00:00:00Z", "2026-01-01T22:00:00", "2026-01-01", "", "\x00"]
)
def test_resume_at_bad_values(verbs, store, at):
    job = queued_job(store)
    verbs("pause-job", {"jobId": str(job.job_id)})
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": at})
    if at == "":
        assert answer["ok"] is True
        return
    assert answer["ok"] is False and answer.get("code") == "invalid-input", answer
    assert "at" in answer["error"]
    assert verbs("get-job", {"jobId": str(job.job_id)})["job"]["status"] == "PAUSED"
    _chain_ok(store, job.job_id)


def test_resume_at_in_the_past_and_far_future(verbs, store):
    job = queued_job(store)
    verbs("pause-job", {"jobId": str(job.job_id)})
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "0001-01-01T00:00:00+14:00"})
    assert answer["ok"] is True and answer["status"] == "QUEUED", answer
    verbs("pause-job", {"jobId": str(job.job_id)})
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "9999-12-31T00:00:00Z"})
    assert answer["ok"] is True and answer["runAfter"].startswith("9999-12-31"), answer
    assert verbs("get-job", {"jobId": str(job.job_id)})["ok"]
    assert verbs("list-jobs", {})["ok"]


@pytest.mark.parametrize(
    "verb,body",
    [
        ("cancel-job", {"jobId": 5}),
        ("cancel-job", {"jobId": "not-a-uuid"}),
        ("cancel-job", {"jobId": "00000000-0000-0000-0000-00000000000\x00"}),
        ("cancel-job", {"jobId": None}),
        ("cancel-job", {}),
        ("pause-job", {"jobId": ["x"]}),
        ("resume-job", {"jobId": "7", "at": 5}),
        ("retry-step", {"jobId": "7", "stepName": 5}),
        ("job-history", {"jobId": {}}),
        ("requeue-job", {"jobId": "x", "extra": 1}),
    ],
)
def test_malformed_input_is_invalid_input(verbs, verb, body):
    answer = verbs(verb, body)
    assert answer["ok"] is False and answer.get("code") == "invalid-input", answer


def test_reason_nul_and_over_long(verbs, store):
    job = queued_job(store)
    answer = verbs("pause-job", {"jobId": str(job.job_id), "reason": "x" * 2001})
    assert answer.get("code") == "invalid-input" and "reason" in answer["error"], answer
    answer = verbs("pause-job", {"jobId": str(job.job_id), "reason": 7})
    assert answer.get("code") == "invalid-input" and "reason" in answer["error"], answer
    answer = verbs("pause-job", {"jobId": str(job.job_id), "reason": "a\x00b"})
    assert answer.get("code") == "invalid-input" and "reason" in answer["error"], answer
    assert verbs("get-job", {"jobId": str(job.job_id)})["job"]["status"] == "QUEUED"
    answer = verbs("cancel-job", {"jobId": str(job.job_id), "reason": "\ud800"})
    assert answer["ok"] is True or answer.get("code") == "invalid-input", answer
    _chain_ok(store, job.job_id)


PAIRS = [
    ("cancel-job", "pause-job"),
    ("pause-job", "resume-job"),
    ("resume-job", "cancel-job"),
    ("cancel-job", "cancel-job"),
    ("pause-job", "pause-job"),
]


@pytest.mark.parametrize("start", ["QUEUED", "RUNNING", "PAUSED", "WAITING"])
@pytest.mark.parametrize("first,second", PAIRS)
def test_two_operators_at_once(verbs, store, fresh_dsn, start, first, second):
    for _ in range(5):
        if start == "RUNNING":
            job = claimed_job(store)
        elif start == "WAITING":
            job = parked_job(store)
        else:
            job = queued_job(store)
            if start == "PAUSED":
                store.job_pause(job.job_id, actor="setup")
        jid = str(job.job_id)
        a, b = _race(
            lambda j=jid: verbs(first, {"jobId": j, "reason": "a"}, principal="alice"),
            lambda j=jid: verbs(second, {"jobId": j, "reason": "b"}, principal="bob"),
        )
        assert isinstance(a, dict) and isinstance(b, dict), (a, b)
        final = verbs("get-job", {"jobId": jid})["job"]
        # every answer names a status; a success's status is one the job went through
        for answer in (a, b):
            assert "status" in answer or answer.get("code") == "not-found", answer
        winners = [x for x in (a, b) if x["ok"]]
        if final["status"] in ("CANCELLED", "PAUSED", "QUEUED", "WAITING"):
            assert (
                any(w["status"] == final["status"] for w in winners) or final["status"] == start
            ), (a, b, final)
        history = _chain_ok(store, job.job_id)
        terminal = [t for t in history.transitions if t.new_status == "CANCELLED"]
        assert len(terminal) <= 1
        cancelled = [e for e, _ in event_types(store, job.job_id) if e == "CANCELLED"]
        assert len(cancelled) == (1 if final["status"] == "CANCELLED" else 0), (a, b, final)


def test_retry_step_vs_requeue_and_two_retries(verbs, store):
    definition = seed_workflow("127.0.0.1:9", review="invoke")
    first = definition["steps"][0]["name"]
    for make in (dead_job, failed_job):
        for _ in range(5):
            job = make(store, workflow_definition=definition)
            jid = str(job.job_id)
            a, b = _race(
                lambda j=jid: verbs("retry-step", {"jobId": j, "stepName": first}),
                lambda j=jid: verbs("requeue-job", {"jobId": j}),
            )
            assert isinstance(a, dict) and isinstance(b, dict), (a, b)
            assert [a["ok"], b["ok"]].count(True) == 1, (a, b)
            _chain_ok(store, job.job_id)
            store.job_cancel(job.job_id, actor="cleanup")
            job = make(store, workflow_definition=definition)
            jid = str(job.job_id)
            a, b = _race(
                lambda j=jid: verbs("retry-step", {"jobId": j, "stepName": first}),
                lambda j=jid: verbs("retry-step", {"jobId": j, "stepName": first}),
            )
            assert [a["ok"], b["ok"]].count(True) == 1, (a, b)
            loser = a if not a["ok"] else b
            assert loser["status"] == "QUEUED", loser
            _chain_ok(store, job.job_id)
            store.job_cancel(job.job_id, actor="cleanup")
