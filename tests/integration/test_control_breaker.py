"""Breaking operator control (issue 15): races between operators, against the sweeper and
against complete-step, resume ``at`` edges, bad input at the verbs' door, the history after
all of it. Real PostgreSQL."""

from __future__ import annotations

import threading

import psycopg
import pytest

from protomolt_jobs.errors import ControlApplied, InvalidInput
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
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
    for at in ("9999-12-31T23:59:59-14:00", "9999-12-30T00:00:00Z", "9999-12-31T00:00:00Z"):
        answer = verbs("resume-job", {"jobId": str(job.job_id), "at": at})
        assert answer["ok"] is False and answer.get("code") == "invalid-input", answer
    assert answer["ok"] is False and answer.get("code") == "invalid-input", answer
    assert "at" in answer["error"]
    assert verbs("get-job", {"jobId": str(job.job_id)})["job"]["status"] == "PAUSED"


@pytest.mark.parametrize(
    "at",
    [
        "tomorrow",
        "2026-13-01T00:00:00Z",
        "2026-01-01T22:00:00",
        "2026-01-01",
        "",
        "\x00",
        "2026-W01-1T10:00:00Z",  # ISO 8601 week date, not RFC 3339 (was 2025-12-29)
        "20260101T220000Z",  # ISO 8601 basic format
        "2026-01-01T22:00Z",  # no seconds
    ],
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
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "2001-01-01t00:00:00z"})
    assert answer["ok"] is True and answer["status"] == "QUEUED", answer  # RFC 3339 5.6 NOTE
    verbs("pause-job", {"jobId": str(job.job_id)})
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "0001-01-01T00:00:00+14:00"})
    assert answer["ok"] is True and answer["status"] == "QUEUED", answer
    verbs("pause-job", {"jobId": str(job.job_id)})
    answer = verbs("resume-job", {"jobId": str(job.job_id), "at": "9999-12-29T00:00:00Z"})
    assert answer["ok"] is True and answer["runAfter"].startswith("9999-12-29"), answer
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


def _expire(dsn, job_id):
    _sql(
        dsn,
        "UPDATE workflow_run SET lease_until = now() - interval '1 s' WHERE job_id = %s",
        job_id,
    )


@pytest.mark.parametrize("verb", ["cancel", "pause"])
@pytest.mark.parametrize("max_attempts", [3, 1])
def test_control_against_the_sweepers_requeue_of_an_expired_lease(
    store, fresh_dsn, verb, max_attempts
):
    control = store.job_cancel if verb == "cancel" else store.job_pause
    for _ in range(8):
        job = claimed_job(store, worker_id="gone", max_attempts=max_attempts)
        _expire(fresh_dsn, job.job_id)
        answer, _swept = _race(
            lambda j=job.job_id: control(j, actor="alice"), store.job_sweep_expired
        )
        assert not isinstance(answer, Exception), answer
        # The sweep skips a row the control write holds locked; its next pass takes it.
        store.job_sweep_expired()
        row = store.job_get(job.job_id)
        if answer.status != "RUNNING":  # not a request: the answer is the effective state
            assert answer.status == row.status, (answer, row.status)
        expected = {"cancel": {"CANCELLED"}, "pause": {"PAUSED"}}[verb]
        if max_attempts == 1:
            # A DEAD verdict stands against a pending pause; a sweep first makes a cancel
            # answer DEAD (ok: false naming it).
            expected = expected | {"DEAD"}
        assert row.status in expected, (answer, row.status)
        assert row.lease_owner is None and row.control is None
        types = [e for e, _ in event_types(store, job.job_id)]
        terminal = [t for t in types if t in ("CANCELLED", "DEAD", "COMPLETED", "FAILED")]
        assert len(terminal) == (0 if row.status == "PAUSED" else 1), types
        _chain_ok(store, job.job_id)
        if row.status == "PAUSED":
            store.job_cancel(job.job_id, actor="cleanup")


def test_cancel_against_complete_step_of_a_waiting_job(store):
    entry = {"name": "approve", "skipped": False, "response": {}}
    for _ in range(10):
        job = parked_job(store)
        cancel, complete = _race(
            lambda j=job.job_id: store.job_cancel(j, actor="alice"),
            lambda j=job.job_id: store.job_complete_parked(j, "approve", entry, actor="bob"),
        )
        assert not isinstance(cancel, Exception) and not isinstance(complete, Exception)
        row = store.job_get(job.job_id)
        completed = type(complete).__name__ == "ParkedStepCompleted"
        # Either order is one serial history: the cancel first (the completion is refused),
        # or the completion first (QUEUED) and then the cancel of the QUEUED job.
        assert cancel.changed or completed, (cancel, complete)
        assert row.status == "CANCELLED" if cancel.changed else row.status == "QUEUED"
        if not completed:
            assert type(complete).__name__ == "WrongState" and complete.status == "CANCELLED"
        kinds = [t.kind for t in store.job_history(job.job_id).transitions]
        if completed and cancel.changed:
            assert kinds[-2:] == ["complete-step", "cancel"], kinds
        types = [e for e, _ in event_types(store, job.job_id)]
        assert types.count("CANCELLED") == (1 if row.status == "CANCELLED" else 0)
        _chain_ok(store, job.job_id)
        if row.status == "QUEUED":
            store.job_cancel(job.job_id, actor="cleanup")


def test_pause_during_a_retry_backoff_then_resume(store, fresh_dsn):
    job = claimed_job(store)
    store.job_retry(job.lease, 3600, "GRPC: transient")
    answer = store.job_pause(job.job_id, actor="alice")
    assert (answer.changed, answer.status) == (True, "PAUSED")
    assert store.job_claim("w2", 60) is None
    resumed = store.job_resume(job.job_id, actor="alice")
    assert resumed.status == "QUEUED"
    claimed = store.job_claim("w2", 60)
    assert claimed is not None and claimed.job_id == job.job_id
    kinds = [(t.kind, t.new_status) for t in _chain_ok(store, job.job_id).transitions]
    assert kinds[-4:] == [
        ("retry", "QUEUED"),
        ("pause", "PAUSED"),
        ("resume", "QUEUED"),
        ("claim", "RUNNING"),
    ]


def test_a_pause_request_then_the_last_step_completes_then_resume(store):
    job = claimed_job(store)
    store.job_pause(job.job_id, actor="alice")
    final = {"name": "approve", "skipped": False, "response": {}}
    status = store.job_complete(job.lease, {"ok": True}, "done", final_entry=final)
    assert status == "PAUSED"
    row = store.job_get(job.job_id)
    assert [c["name"] for c in row.checkpoints] == ["approve"]
    types = [e for e, _ in event_types(store, job.job_id)]
    assert "COMPLETED" not in types and types.count("PAUSED") == 1
    assert store.job_resume(job.job_id, actor="alice").status == "QUEUED"
    _chain_ok(store, job.job_id)


FORGE = """
INSERT INTO workflow_run_transition
    (job_id, seq, prev_status, new_status, kind, actor, reason, attempt, step, at, hash)
SELECT %s, %s, 'CANCELLED', 'QUEUED', 'requeue', 'api', NULL, 0, NULL, now(),
       workflow_run_transition_hash(
           (SELECT hash FROM workflow_run_transition WHERE job_id = %s AND seq = %s - 1),
           %s, %s, 'CANCELLED', 'QUEUED', 'requeue', 'api', NULL, 0, NULL, now())
"""


def test_a_forged_history_row_is_named_even_with_a_valid_hash(store, fresh_dsn):
    job = claimed_job(store)
    store.job_cancel(job.job_id, actor="alice")
    with pytest.raises(ControlApplied):
        store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    history = _chain_ok(store, job.job_id)
    last = history.transitions[-1].seq
    assert history.transitions[-1].new_status == "CANCELLED"
    jid = job.job_id
    _sql(fresh_dsn, FORGE, jid, last + 1, jid, last + 1, jid, last + 1)
    assert store.job_history(jid).first_bad_seq == last + 1
    _sql(
        fresh_dsn,
        "DELETE FROM workflow_run_transition WHERE job_id = %s AND seq = %s",
        jid,
        last + 1,
    )
    assert store.job_history(jid).first_bad_seq is None
    # a row slipped in before the first
    _sql(fresh_dsn, FORGE, jid, 0, jid, 0, jid, 0)
    assert store.job_history(jid).first_bad_seq == 0


def test_hand_written_sql_on_a_running_job_with_a_pending_cancel(store, fresh_dsn):
    job = claimed_job(store)
    store.job_cancel(job.job_id, actor="alice")
    _sql(fresh_dsn, "UPDATE workflow_run SET status = 'QUEUED' WHERE job_id = %s", job.job_id)
    last = _chain_ok(store, job.job_id).transitions[-1]
    assert (last.kind, last.actor, last.prev_status, last.new_status) == (
        "sql",
        "sql:postgres",
        "RUNNING",
        "QUEUED",
    )
    # the cancel request no longer binds anything a worker holds; it is answered for
    answer = store.job_cancel(job.job_id, actor="bob")
    assert (answer.changed, answer.status) == (True, "CANCELLED")
    assert store.job_get(job.job_id).control is None
    _chain_ok(store, job.job_id)


@pytest.mark.parametrize("at", ["infinity", "-infinity", "10001-01-01 00:00:00+00"])
def test_a_history_row_edited_to_an_unreadable_time_is_named(verbs, store, fresh_dsn, at):
    job = claimed_job(store)
    store.job_cancel(job.job_id, actor="alice")
    with pytest.raises(ControlApplied):
        store.job_checkpoint(job.lease, {"name": "first", "skipped": False, "response": {}})
    _sql(
        fresh_dsn,
        "UPDATE workflow_run_transition SET at = %s::timestamptz WHERE job_id = %s AND seq = 2",
        at,
        job.job_id,
    )
    answer = verbs("job-history", {"jobId": str(job.job_id)})
    assert answer["ok"] and answer["integrity"] != "ok" and answer["firstBadSeq"] == 2, answer
    got = verbs("get-job", {"jobId": str(job.job_id)})
    assert got["ok"] and got["job"]["status"] == "CANCELLED", got


def test_the_report_of_a_job_cancelled_mid_run(verbs, store):
    definition = seed_workflow("127.0.0.1:9", review="invoke")
    names = [s["name"] for s in definition["steps"]]
    job = claimed_job(store, workflow_definition=definition)
    assert verbs("cancel-job", {"jobId": str(job.job_id), "reason": "enough"})["ok"]
    with pytest.raises(ControlApplied):
        store.job_checkpoint(job.lease, {"name": names[0], "skipped": False, "response": {}})
    report = verbs("get-job", {"jobId": str(job.job_id)})["job"]["report"]
    assert report["status"] == "CANCELLED"
    steps = {s["name"]: s for s in report["steps"]}
    assert steps[names[0]]["status"] == "succeeded", report
    assert all(steps[n]["status"] != "succeeded" for n in names[1:]), report
    assert [(a["kind"], a["actor"]) for a in report["operatorActions"]] == [
        ("cancel-request", "alice"),
        ("cancel", "alice"),
    ], report
