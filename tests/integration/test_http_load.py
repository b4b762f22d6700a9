"""The actions route under a burst: 200 callers released at once by a barrier, each on its own
connection, all get an answer (no connection resets), on a real node over real PostgreSQL."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid

import psycopg
import pytest

from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import node_environ, start_node

CALLERS = 200


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _burst(url: str, body: dict) -> tuple[list[tuple[int, dict]], list[BaseException]]:
    """POST ``body`` to ``url`` from CALLERS threads released together; (answers, errors)."""
    barrier = threading.Barrier(CALLERS)
    answers: list[tuple[int, dict]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    data = json.dumps(body).encode()

    def call() -> None:
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        barrier.wait(timeout=60)
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                answer = (resp.status, json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            answer = (err.code, json.loads(err.read()))
        except OSError as exc:  # a reset, a refused connection, a timeout (URLError too)
            with lock:
                errors.append(exc)
            return
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=call) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return answers, errors


def test_200_concurrent_get_job_callers_all_get_an_answer(node):
    job_id = str(uuid.uuid4())
    answers, errors = _burst(f"{node.actions_url}/get-job", {"jobId": job_id})
    assert errors == []
    assert len(answers) == CALLERS
    assert {status for status, _ in answers} == {200}
    assert all(body == {"ok": False, "error": f"no workflow run {job_id}"} for _, body in answers)


def test_200_concurrent_submits_of_one_job_id_make_exactly_one_row(node, services, fresh_dsn):
    job_id = str(uuid.uuid4())
    envelope = {
        "workflow": seed_workflow(services.target),
        "input": {"text": "burst"},
        "jobId": job_id,
    }
    answers, errors = _burst(f"{node.actions_url}/submit-workflow", envelope)
    assert errors == []
    assert len(answers) == CALLERS
    assert {status for status, _ in answers} == {200}
    assert all(body["ok"] is True and body["jobId"] == job_id for _, body in answers)
    with psycopg.connect(fresh_dsn) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM workflow_run WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert rows == (1,)
