"""Checkpoint responses are stored with default-valued fields printed, as upstream's transcoder
stores them (issue #20); rows written before, without the defaults, still resume."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.integration.test_role import boot, wait_for, write_config
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.roles import MemoryRepository


@pytest.fixture(scope="module")
def services():
    svc = TestServices().start()
    yield svc
    svc.stop()


def _stored(dsn: str, job_id: str) -> list[dict]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT checkpoints FROM workflow_run WHERE job_id = %s", (job_id,)
        ).fetchone()[0]


def test_defaults_are_printed_and_old_rows_still_resume(tmp_path, fresh_dsn, services):
    repo = MemoryRepository({"seed-review": seed_workflow(services.target)})
    node = boot(write_config(tmp_path, fresh_dsn), repo)
    node.start()
    call = node.catalog.execute
    try:

        def job(job_id):
            return call("get-job", {"jobId": job_id})["job"]

        # A tokenizer answer that leaves text and count at their defaults.
        def tokenize_defaults(request, context):
            out = services.message_class("jobs.test.Tokens")()
            out.ids.append(7)
            return out

        services.set_handler("Tokenize", tokenize_defaults)
        try:
            first = call("submit-workflow", {"workflowName": "seed-review", "input": {"text": "a"}})
            wait_for(lambda: job(first["jobId"])["status"] == "WAITING", what="the park")
            second = call(
                "submit-workflow", {"workflowName": "seed-review", "input": {"text": "a"}}
            )
            wait_for(lambda: job(second["jobId"])["status"] == "WAITING", what="the second park")
        finally:
            services.set_handler("Tokenize", None)
        stored = _stored(fresh_dsn, first["jobId"])
        # name, skipped, response; the fingerprint fields of issue #17 and the artifact fields
        # of issue 29 (docs/artifacts.md) beside them
        fingerprint = {"definitionSha256", "descriptorSha256", "requestSha256", "attempt", "at"}
        fingerprint |= {"sha256", "sizeBytes", "inputs"}
        assert [sorted(set(c) - fingerprint) for c in stored] == [
            ["name", "response", "skipped"]
        ] * 2
        # jobs.test.Tokens: ids (repeated int64, as strings), text, meta (Struct: a message
        # field has presence, so unset it stays out), count.
        assert stored[0]["response"] == {"ids": ["7"], "text": "", "count": 0}

        # A row as an earlier release stored it: defaults left out. It resumes and completes.
        old = _stored(fresh_dsn, second["jobId"])
        for entry in old:
            entry["response"] = {k: v for k, v in entry["response"].items() if v not in ("", 0)}
        assert old[0]["response"] == {"ids": ["7"]}
        with psycopg.connect(fresh_dsn) as conn:
            conn.execute(
                "UPDATE workflow_run SET checkpoints = %s::jsonb WHERE job_id = %s",
                (json.dumps(old), second["jobId"]),
            )
        answer = call(
            "complete-step",
            {"jobId": second["jobId"], "stepName": "review", "response": {"approved": True}},
        )
        assert answer == {"ok": True, "status": "QUEUED"}
        done = wait_for(
            lambda: (j := job(second["jobId"]))["status"] == "COMPLETED" and j,
            what="the old row to resume and complete",
        )
        assert [c["name"] for c in done["checkpoints"]] == ["tokenize", "embed", "review"]
        # The entries written before stay byte for byte as they were.
        assert _stored(fresh_dsn, second["jobId"])[:2] == old
    finally:
        node.close()
