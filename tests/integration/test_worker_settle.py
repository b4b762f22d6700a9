"""The worker's settlement of one job, driven by ``Worker.run_once()`` in the test thread:
real PostgreSQL, real gRPC test servers on loopback, short leases and backoff."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import psycopg
import pytest

from protomolt_jobs.maintenance.sweeper import Sweeper
from protomolt_jobs.worker import Settlement, Worker
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import BoxServer, expected_tokens, seed_workflow
from tests.support.worker_proc import (
    enqueue,
    event_types,
    events,
    in_process_worker,
    jobs_config,
    wait_for,
)


def _sql(dsn, query, *params):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()


def test_seed_scenario_retry_replay_park_complete(store, fresh_dsn, services):
    """Issue 5's first acceptance bullet."""
    workflow = seed_workflow(services.target)
    job = enqueue(store, workflow, {"text": "hello brave world"})
    services.fail_next("Embed", 1, grpc.StatusCode.UNAVAILABLE, "model loading")
    # a 1 s backoff base: long enough to observe the job waiting out its run_after
    worker = in_process_worker(store, fresh_dsn, backoff_base_seconds=1.0)
    try:
        # attempt 1: tokenize checkpoints, embed answers UNAVAILABLE -> QUEUED with backoff
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "QUEUED"
        assert row.attempt == 1
        assert row.error == f"GRPC: gRPC UNAVAILABLE from {services.target}: model loading"
        assert [c["name"] for c in row.checkpoints] == ["tokenize"]
        (in_future,) = _sql(
            fresh_dsn, "SELECT run_after > now() FROM workflow_run WHERE job_id = %s", job.job_id
        )
        assert in_future, "run_after must be in the future after a retryable failure"
        # the backoff is real: the job is not claimable until run_after passes
        assert worker.run_once() is False

        # attempt 2: tokenize is replayed (not called), embed succeeds, review parks
        wait_for(worker.run_once, timeout_s=10)
        row = store.job_get(job.job_id)
        assert row.status == "WAITING"
        assert row.outstanding_step == "review"
        assert row.attempt == 2
        assert row.lease_owner is None
        assert services.calls("Tokenize") == 1
        assert services.calls("Embed") == 2
        assert services.calls("Review") == 0
        assert worker.run_once() is False  # a parked job is not claimable

        # complete-step: requeues; the next segment composes the output
        from protomolt_jobs.store import ParkedStepCompleted

        entry = {"name": "review", "skipped": False, "response": {"approved": True, "note": "ok"}}
        assert isinstance(
            store.job_complete_parked(job.job_id, "review", entry), ParkedStepCompleted
        )
        assert store.job_get(job.job_id).status == "QUEUED"
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "COMPLETED"
        assert row.verdict == "3 steps, output jobs.test.Summary"
        assert row.result["ids"] == [str(i) for i in expected_tokens("hello brave world")]
        assert row.result["approved"] is True
        assert row.result["tier"] == "long"
        assert services.calls("Tokenize") == 1
        assert services.calls("Embed") == 2
        assert services.calls("Review") == 0  # the human answered, nobody called the desk

        assert event_types(store, job.job_id) == [
            ("ACCEPTED", ""),
            ("STEP_CHECKPOINT", "tokenize"),
            ("STEP_CHECKPOINT", "embed"),
            ("WAITING", "review"),
            ("STEP_CHECKPOINT", "review"),
            ("COMPLETED", ""),
        ]
        assert events(store, job.job_id)[-1].verdict == "3 steps, output jobs.test.Summary"
    finally:
        worker.stop()


def test_retries_exhausted_go_dead_with_the_last_error_verbatim(store, fresh_dsn, services):
    workflow = seed_workflow(services.target)
    job = enqueue(store, workflow, {"text": "a b"}, max_attempts=3)
    services.fail_next("Tokenize", 100, grpc.StatusCode.RESOURCE_EXHAUSTED, "quota spent")
    worker = in_process_worker(store, fresh_dsn, backoff_base_seconds=0.05)
    sweeper = Sweeper(store, config=jobs_config(fresh_dsn))
    try:
        outcomes = []
        for _ in range(3):
            wait_for(lambda: store.job_get(job.job_id).status != "RUNNING" and worker.run_once())
            outcomes.append(store.job_get(job.job_id).status)
        assert outcomes == ["QUEUED", "QUEUED", "DEAD"]
        row = store.job_get(job.job_id)
        detail = f"GRPC: gRPC RESOURCE_EXHAUSTED from {services.target}: quota spent"
        assert row.error == detail
        assert row.attempt == 3
        assert services.calls("Tokenize") == 3
        dead = [e for e in events(store, job.job_id) if e.type == 6]
        assert len(dead) == 1 and dead[0].error == detail
        # nothing requeues a DEAD job: not the sweeper, not a claim
        sweeper.run_once()
        time.sleep(0.2)  # past any backoff the job could have had
        assert worker.run_once() is False
        assert store.job_get(job.job_id).status == "DEAD"
        assert services.calls("Tokenize") == 3
    finally:
        worker.stop()


def test_validation_failure_is_a_verdict_with_the_violations(store, fresh_dsn, services):
    # an empty text tokenizes to no ids; the embedder then answers no values, which breaks
    # Embedding.values min_items = 1, and the embed step declares validate: true
    workflow = seed_workflow(services.target)
    job = enqueue(store, workflow, {"text": ""})
    worker = in_process_worker(store, fresh_dsn)
    try:
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "FAILED"
        assert row.error.startswith("VALIDATION: response failed validation: ")
        assert "values" in row.error
        assert row.attempt == 1
        assert services.calls("Embed") == 1  # never retried
        assert event_types(store, job.job_id) == [
            ("ACCEPTED", ""),
            ("STEP_CHECKPOINT", "tokenize"),
            ("FAILED", "embed"),
        ]
        assert events(store, job.job_id)[-1].error == row.error
    finally:
        worker.stop()


def test_a_non_retryable_grpc_code_fails_loud(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target), {"text": "x", "fail": True})
    worker = in_process_worker(store, fresh_dsn)
    try:
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "FAILED"
        assert row.error == (
            f"GRPC: gRPC FAILED_PRECONDITION from {services.target}: asked to fail"
        )
        assert event_types(store, job.job_id)[-1] == ("FAILED", "tokenize")
    finally:
        worker.stop()


def test_unparseable_snapshot_and_bad_input_fail_with_the_reference_texts(
    store, fresh_dsn, services
):
    bad_method = seed_workflow(services.target)
    bad_method["steps"][0]["method"] = "jobs.test.Tokenizer/Nope"
    j1 = enqueue(store, bad_method, {"text": "x"})
    j2 = enqueue(store, seed_workflow(services.target), {"text": 5, "nosuchfield": 1})
    worker = in_process_worker(store, fresh_dsn)
    try:
        assert worker.run_once() and worker.run_once()
        r1, r2 = store.job_get(j1.job_id), store.job_get(j2.job_id)
        assert r1.status == "FAILED"
        assert r1.error.startswith("WORKFLOW: stored workflow does not parse")
        assert r2.status == "FAILED"
        assert r2.error.startswith(
            "MAPPING: stored input is not valid proto3 JSON for jobs.test.Text: "
        )
        assert services.calls("Tokenize") == 0
    finally:
        worker.stop()


def test_lost_lease_abandons_the_run_and_writes_nothing(store, fresh_dsn, services, caplog):
    job = enqueue(store, seed_workflow(services.target), {"text": "one two"})
    services.set_delay("Tokenize", 1.0)
    worker = in_process_worker(store, fresh_dsn, lease_seconds=30)
    caplog.set_level(logging.INFO, logger="protomolt_jobs")
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(worker.run_once()))
    t.start()
    try:
        wait_for(lambda: services.calls("Tokenize") == 1)
        # the lease expires under the worker (a stall); the sweeper takes the job back
        _sql(
            fresh_dsn,
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' "
            "WHERE job_id = %s RETURNING 1",
            job.job_id,
        )
        assert Sweeper(store, config=jobs_config(fresh_dsn)).run_once().requeued == 1
        t.join(20)
        assert result == [True]
        row = store.job_get(job.job_id)
        assert row.status == "QUEUED"
        assert row.checkpoints == []  # the late tokenize response was not written
        assert event_types(store, job.job_id) == [("ACCEPTED", "")]
        assert any(getattr(r, "action", None) == "lease_lost" for r in caplog.records)
    finally:
        t.join(20)
        worker.stop()


def test_settle_outcome_enum_names_what_was_written(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b c"})
    worker = in_process_worker(store, fresh_dsn)
    try:
        claimed = store.job_claim("test-worker", 5)
        assert claimed.job_id == job.job_id
        worker.heartbeat.start()
        assert worker.executor.execute(claimed) is Settlement.COMPLETED
        assert store.job_get(job.job_id).verdict == "3 steps, output jobs.test.Summary"
        assert services.calls("Review") == 1
    finally:
        worker.stop()


def test_the_last_steps_checkpoint_commits_with_the_completion(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b c"})
    calls: list[str] = []
    for name in ("job_checkpoint", "job_complete"):
        real = getattr(store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    worker = in_process_worker(store, fresh_dsn)
    try:
        claimed = store.job_claim("test-worker", 5)
        worker.heartbeat.start()
        assert worker.executor.execute(claimed) is Settlement.COMPLETED
    finally:
        worker.stop()
    # Three steps, two checkpoint transactions: the third rides with the completion.
    assert calls == ["job_checkpoint", "job_checkpoint", "job_complete"]
    row = store.job_get(job.job_id)
    assert [c["name"] for c in row.checkpoints] == ["tokenize", "embed", "review"]
    assert event_types(store, job.job_id) == [
        ("ACCEPTED", ""),
        ("STEP_CHECKPOINT", "tokenize"),
        ("STEP_CHECKPOINT", "embed"),
        ("STEP_CHECKPOINT", "review"),
        ("COMPLETED", ""),
    ]


# -- nothing the engine can classify is retried as a defect --------------------------------------


def _settled_once(store, job_id, status):
    row = store.job_get(job_id)
    assert row.status == status
    assert row.attempt == 1
    assert row.lease_owner is None
    return row


def test_a_response_whose_any_cannot_be_rendered_fails_once_without_a_retry(store, fresh_dsn):
    with BoxServer() as boxes:
        boxes.packed_type = "jobs.anytest.Missing"
        job = enqueue(store, boxes.workflow(), {"word": "hi"})
        worker = in_process_worker(store, fresh_dsn, backoff_base_seconds=0.05)
        try:
            assert worker.run_once() is True
            row = _settled_once(store, job.job_id, "FAILED")
            assert row.error.startswith(
                "WORKFLOW: could not render the checkpoint for 'pack' as JSON: "
            )
            assert "jobs.anytest.Missing" in row.error
            assert row.checkpoints == []
            assert worker.run_once() is False
            assert boxes.calls == 1  # the service was not called again
            assert event_types(store, job.job_id) == [("ACCEPTED", ""), ("FAILED", "pack")]

            # an Any of a type the schema holds is stored, and the job completes
            boxes.packed_type = "jobs.anytest.Inner"
            ok = enqueue(store, boxes.workflow(), {"word": "yo"})
            assert worker.run_once() is True
            row = _settled_once(store, ok.job_id, "COMPLETED")
            item = {"@type": "type.googleapis.com/jobs.anytest.Inner", "word": "yo"}
            assert row.checkpoints[0]["response"]["item"] == item
            assert row.result["item"] == item
        finally:
            worker.stop()


def test_network_targets_use_the_factorys_channels_across_jobs(store, fresh_dsn, services):
    made: list[tuple[str, bool]] = []
    channels: dict[tuple[str, bool], grpc.Channel] = {}

    def factory(target: str, tls: bool) -> grpc.Channel:
        made.append((target, tls))
        return channels.setdefault((target, tls), grpc.insecure_channel(target))

    jobs = [
        enqueue(store, seed_workflow(services.target, review="invoke"), {"text": f"a b {i}"})
        for i in range(2)
    ]
    worker = Worker(
        store,
        runtime=Runtime(channel_factory=factory),
        config=jobs_config(fresh_dsn),
        dsn=fresh_dsn,
    )
    try:
        assert worker.run_once() and worker.run_once()
        for job in jobs:
            assert store.job_get(job.job_id).status == "COMPLETED"
        # one lookup per segment, one channel for both jobs, still open (the factory owns it)
        assert made == [(services.target, False)] * 2
        assert len(channels) == 1
        grpc.channel_ready_future(channels[(services.target, False)]).result(timeout=5)
    finally:
        worker.stop()
        for ch in channels.values():
            ch.close()


def test_a_factory_refusing_a_network_target_falls_back_to_a_segment_channel(
    store, fresh_dsn, services
):
    def factory(target: str, tls: bool) -> grpc.Channel:
        raise ValueError("not sharing")

    job = enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b"})
    worker = Worker(
        store,
        runtime=Runtime(channel_factory=factory),
        config=jobs_config(fresh_dsn),
        dsn=fresh_dsn,
    )
    try:
        assert worker.run_once() is True
        assert store.job_get(job.job_id).status == "COMPLETED"
    finally:
        worker.stop()


def test_a_channel_factory_refusing_the_target_fails_once(store, fresh_dsn, services):
    made: list[str] = []

    def factory(target: str, tls: bool) -> grpc.Channel:
        made.append(target)
        raise ValueError("no in-process service named 'nobody' on this node")

    job = enqueue(store, seed_workflow("inprocess:nobody"), {"text": "a b"})
    worker = Worker(
        store,
        runtime=Runtime(channel_factory=factory),
        config=jobs_config(fresh_dsn, backoff_base_seconds=0.05),
        dsn=fresh_dsn,
    )
    try:
        assert worker.run_once() is True
        row = _settled_once(store, job.job_id, "FAILED")
        assert row.error == (
            "WORKFLOW: outbound channel policy rejected step: target 'inprocess:nobody': "
            "no in-process service named 'nobody' on this node"
        )
        assert event_types(store, job.job_id)[-1] == ("FAILED", "tokenize")
        assert worker.run_once() is False
        assert made == ["inprocess:nobody"]
    finally:
        worker.stop()


@pytest.mark.parametrize(
    "deadline", [10**400, -1, "5000", True], ids=["1e400", "negative", "string", "boolean"]
)
def test_a_stored_deadline_that_is_not_sane_fails_the_job_once(
    store, fresh_dsn, services, deadline
):
    workflow = seed_workflow(services.target)
    workflow["deadlineMs"] = deadline
    job = enqueue(store, workflow, {"text": "a b"})
    worker = in_process_worker(store, fresh_dsn, backoff_base_seconds=0.05)
    try:
        assert worker.run_once() is True
        row = _settled_once(store, job.job_id, "FAILED")
        assert row.error.startswith(
            "WORKFLOW: stored workflow does not parse: 'deadlineMs' of the workflow must be a "
            "whole number of milliseconds"
        )
        assert worker.run_once() is False
        assert services.calls("Tokenize") == 0
    finally:
        worker.stop()


def test_stored_checkpoints_that_are_not_an_array_fail_the_job(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target), {"text": "a b"})
    _sql(
        fresh_dsn,
        "UPDATE workflow_run SET checkpoints = '5'::jsonb WHERE job_id = %s RETURNING 1",
        job.job_id,
    )
    worker = in_process_worker(store, fresh_dsn)
    try:
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "FAILED"
        assert row.lease_owner is None
        assert row.error.startswith("WORKFLOW: stored row is not readable JSON: checkpoints")
        assert services.calls("Tokenize") == 0
    finally:
        worker.stop()


def test_the_stored_input_error_names_the_input_once(store, fresh_dsn, services):
    job = enqueue(store, seed_workflow(services.target), {"text": ["not", "a", "string"]})
    worker = in_process_worker(store, fresh_dsn)
    try:
        assert worker.run_once() is True
        row = store.job_get(job.job_id)
        assert row.status == "FAILED"
        prefix = "MAPPING: stored input is not valid proto3 JSON for jobs.test.Text: "
        assert row.error.startswith(prefix)
        assert "proto3 JSON" not in row.error[len(prefix) :]
        assert "'input'" not in row.error
    finally:
        worker.stop()


def test_a_settled_job_never_logs_a_lost_lease(store, fresh_dsn, services, caplog):
    """A heartbeat racing the settling write finds the row settled: not a lost lease."""
    caplog.set_level(logging.DEBUG, logger="protomolt_jobs")
    worker = in_process_worker(store, fresh_dsn, lease_seconds=0.3)
    services.set_delay("Tokenize", 0.25)  # a beat is due while the job runs and settles
    jobs = [
        enqueue(store, seed_workflow(services.target, review="invoke"), {"text": "a b"})
        for _ in range(4)
    ]
    try:
        worker.heartbeat.start()
        for _ in jobs:
            assert worker.run_once() is True
        assert {store.job_get(j.job_id).status for j in jobs} == {"COMPLETED"}
        lost = [
            r
            for r in caplog.records
            if getattr(r, "action", None) == "lease_lost" and r.levelno >= logging.WARNING
        ]
        assert lost == []
    finally:
        worker.stop()


def test_a_completed_job_carries_no_error_of_an_earlier_attempt(tmp_path, fresh_dsn, services):
    """Issue 31: embed answers UNAVAILABLE once, the retry completes the job. get-job and the
    dashboard show no error on the COMPLETED row; the failure stays in the history (the
    retry's reason) and the page's history table."""
    from tests.support.node import http, node_environ, start_node
    from tests.support.node import wait_for as wait_until

    services.fail_next("Embed", 1, grpc.StatusCode.UNAVAILABLE, "model loading")
    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url
        status, body, _ = http(
            "POST",
            f"{url}/protomolt/actions/submit-workflow",
            {"workflow": seed_workflow(services.target, review="invoke"), "input": {"text": "hi"}},
        )
        assert status == 200 and body["ok"], body
        job_id = body["jobId"]

        def completed():
            _, got, _ = http("POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id})
            return got["job"] if got["job"]["status"] == "COMPLETED" else None

        job = wait_until(completed, timeout_s=30)
        assert "error" not in job, job
        assert services.calls("Embed") == 2
        _, history, _ = http("POST", f"{url}/protomolt/actions/job-history", {"jobId": job_id})
        retries = [t for t in history["transitions"] if t["kind"] == "retry"]
        assert len(retries) == 1 and "GRPC: gRPC UNAVAILABLE" in retries[0]["reason"], retries
        assert history["integrity"] == "ok"
        status, page, _ = http("GET", f"{url}/ui/jobs/{job_id}")
        assert status == 200
        assert b"error-text" not in page
        assert b"GRPC: gRPC UNAVAILABLE" in page  # in the history table only
        (stored,) = _sql(fresh_dsn, "SELECT error FROM workflow_run WHERE job_id = %s", job_id)
        assert stored is None
    finally:
        surfaces.close()
