"""Every log line about a job carries its id: a run with a retry and a DEAD, read from the
worker process's log in both formats."""

from __future__ import annotations

import json
import logging

import pytest

from protomolt_jobs.store import JobStore
from protomolt_jobs.telemetry.logs import JsonFormatter, TextFormatter
from tests.support.grpc_servers import seed_workflow
from tests.support.worker_proc import WorkerProcess, enqueue, wait_for


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=2)
    try:
        yield s
    finally:
        s.close()


def _run_to_dead(store, dsn, log_format: str) -> tuple[str, str]:
    # Nothing listens on port 1: every attempt fails UNAVAILABLE, the first is retried, the
    # second (of max_attempts=2) makes the job DEAD.
    job = enqueue(store, seed_workflow("127.0.0.1:1"), {"text": "nobody answers"}, max_attempts=2)
    worker = WorkerProcess(
        dsn, worker_id=f"logs-{log_format}", log_format=log_format, backoff_base_seconds=0.1
    )
    with worker:  # started by the with (a second start() left the first process running)
        wait_for(lambda: store.job_get(job.job_id).status == "DEAD", timeout_s=60)
        assert worker.terminate() == 0
        return str(job.job_id), worker.logs()


def test_json_lines_name_the_job_on_every_job_line(store, fresh_dsn):
    job_id, text = _run_to_dead(store, fresh_dsn, "json")
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    about_job = [
        r
        for r in records
        if job_id in json.dumps(r) or "attempt" in r or r.get("action", "").startswith("job_")
    ]
    assert about_job, text
    for record in about_job:
        assert record.get("job_id") == job_id, record
    attempts = {r.get("attempt") for r in about_job}
    assert {1, 2} <= attempts  # the retry and the last attempt both say which attempt
    assert any(r["level"] == "WARNING" and "DEAD" in r["message"] for r in about_job), text


def test_text_lines_carry_the_job_fields_after_the_message(store, fresh_dsn):
    job_id, text = _run_to_dead(store, fresh_dsn, "text")
    lines = [line for line in text.splitlines() if job_id in line]
    assert len(lines) >= 2, text
    for line in lines:
        assert f"job_id={job_id}" in line, line
    assert any("attempt=2" in line and "DEAD" in line for line in lines), text


def test_the_formatters_render_the_job_fields():
    record = logging.LogRecord("protomolt_jobs.worker", logging.INFO, "", 0, "settled", (), None)
    record.action, record.job_id, record.attempt, record.step = "job_settled", "j-1", 2, "embed"
    assert (
        TextFormatter()
        .format(record)
        .endswith("settled [job_settled job_id=j-1 attempt=2 step=embed]")
    )
    body = json.loads(JsonFormatter().format(record))
    assert body["job_id"] == "j-1" and body["attempt"] == 2 and body["step"] == "embed"
    assert body["level"] == "INFO" and body["message"] == "settled"
