"""resume-job at a local time in a zone (issue 28 item 4; docs/verbs.md *Operator control*):
resolved by the database (a time the clocks skip is refused naming ``at``, one they pass twice
is the first), through the catalog, HTTP, gRPC and the CLI; list-jobs and get-job show when a
QUEUED job will run. Real PostgreSQL, a real node, a real Worker and the real render service."""

from __future__ import annotations

from datetime import datetime

import grpc
import psycopg
import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.node import http, node_environ, start_node
from tests.support.render_service import RenderService, render_workflow
from tests.support.worker_proc import jobs_config, wait_for

TOKEN = "resume-at-secret"


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


def _local_and_instant(dsn, zone, ahead_s):
    """A local time ``ahead_s`` from the database's now in ``zone`` (whole seconds), and the
    instant it names."""
    with psycopg.connect(dsn) as conn:
        instant = conn.execute(
            "SELECT date_trunc('second', now()) + make_interval(secs => %s)", (ahead_s,)
        ).fetchone()[0]
        local = conn.execute("SELECT %s::timestamptz AT TIME ZONE %s", (instant, zone)).fetchone()[
            0
        ]
    return local.strftime("%Y-%m-%dT%H:%M:%S"), instant


def test_resume_at_a_local_time_in_a_zone_starts_no_earlier_and_shows_the_planned_time(
    store, verbs, fresh_dsn
):
    with RenderService() as render:
        answer = verbs(
            "submit-workflow",
            {"workflow": render_workflow(render.target), "input": {"scene": "s", "frames": 2}},
        )
        job_id = answer["jobId"]
        assert verbs("pause-job", {"jobId": job_id})["status"] == "PAUSED"  # QUEUED: at once
        local, instant = _local_and_instant(fresh_dsn, "Asia/Tokyo", 5)
        answer = verbs("resume-job", {"jobId": job_id, "at": local, "zone": "Asia/Tokyo"})
        assert answer["ok"] and answer["status"] == "QUEUED", answer
        assert datetime.fromisoformat(answer["runAfter"]) == instant, (answer, instant)
        listed = verbs("list-jobs", {"status": "QUEUED"})["jobs"]
        assert [datetime.fromisoformat(j["runAfter"]) for j in listed] == [instant], listed
        job = verbs("get-job", {"jobId": job_id})["job"]
        assert datetime.fromisoformat(job["runAfter"]) == instant
        w = Worker(store, runtime=Runtime(), config=jobs_config(fresh_dsn), dsn=fresh_dsn)
        w.start()
        try:
            wait_for(
                lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "COMPLETED" or None,
                timeout_s=30,
            )
        finally:
            w.stop(timeout_s=5)
    claims = [t for t in store.job_history(job_id).transitions if t.kind == "claim"]
    assert len(claims) == 1 and claims[0].at >= instant, (claims, instant)
    assert render.rendered == [1, 2]
    # a COMPLETED job is not shown a run-after time in a list
    assert "runAfter" not in verbs("list-jobs", {})["jobs"][0]


def _paused_job(url):
    """A job in a queue no worker of the node serves, paused while QUEUED."""
    workflow = render_workflow("127.0.0.1:1")
    workflow["scheduling"] = {"queue": "nobody-serves-this"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/submit-workflow",
        {"workflow": workflow, "input": {"scene": "s", "frames": 2}},
        headers=auth,
    )
    assert status == 200 and answer["ok"], answer
    job_id = answer["jobId"]
    status, answer, _ = http(
        "POST", f"{url}/protomolt/actions/pause-job", {"jobId": job_id}, headers=auth
    )
    assert answer["status"] == "PAUSED", answer
    return job_id


def test_local_times_at_every_door_and_the_dst_rule(tmp_path, fresh_dsn, capsys):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        auth = {"Authorization": f"Bearer {TOKEN}"}
        job_id = _paused_job(url)

        def resume(body):
            return http(
                "POST",
                f"{url}/protomolt/actions/resume-job",
                {"jobId": job_id, **body},
                headers=auth,
            )

        for body, field in (
            # Europe/Warsaw springs forward on 2027-03-28 at 02:00: 02:30 does not exist
            ({"at": "2027-03-28T02:30", "zone": "Europe/Warsaw"}, "at"),
            ({"at": "2026-12-03T22:00", "zone": "Mars/Olympus"}, "zone"),
            ({"at": "2026-12-03T22:00", "zone": "UTC+3"}, "zone"),
            ({"at": "2026-12-03T22:00:00+01:00", "zone": "Europe/Warsaw"}, "at"),
            ({"zone": "Europe/Warsaw"}, "at"),
            ({"at": "tomorrow 22:00", "zone": "Europe/Warsaw"}, "at"),
            ({"at": "2026-12-03T22:00"}, "at"),  # a local time needs its zone
            ({"at": "2026-12-03T22:00", "zone": 7}, "zone"),
        ):
            status, answer, _ = resume(body)
            assert status == 400, (body, status, answer)
            assert answer["error"] == "invalid-input", answer
            assert answer.get("details", {}).get("field") == field, (body, answer)
            assert f"'{field}'" in answer["message"], (body, answer)
        # refused input changed nothing
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id}, headers=auth
        )
        assert answer["job"]["status"] == "PAUSED"

        # Europe/Warsaw falls back on 2027-10-31 at 03:00: 02:30 happens twice, the first
        # (CEST, +02:00) is taken
        status, answer, _ = resume({"at": "2027-10-31 02:30", "zone": "Europe/Warsaw"})
        assert status == 200 and answer["runAfter"] == "2027-10-31T00:30:00Z", answer

        # gRPC
        job_grpc = _paused_job(url)
        with grpc.insecure_channel(surfaces.grpc.target) as channel:
            call = channel.unary_unary(
                "/ai.pipestream.proto.service.v1.ProtoMoltService/ResumeJob",
                request_serializer=pb.ResumeJobRequest.SerializeToString,
                response_deserializer=pb.JobControlResponse.FromString,
            )
            meta = (("authorization", f"Bearer {TOKEN}"),)
            with pytest.raises(grpc.RpcError) as refused:
                call(
                    pb.ResumeJobRequest(
                        job_id=job_grpc, at="2027-03-28T02:30", zone="Europe/Warsaw"
                    ),
                    metadata=meta,
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "at" in refused.value.details()
            answer = call(
                pb.ResumeJobRequest(
                    job_id=job_grpc, at="2027-07-01T08:00", zone="America/New_York"
                ),
                metadata=meta,
            )
            assert answer.ok and answer.run_after == "2027-07-01T12:00:00Z", answer

        # the CLI
        job_cli = _paused_job(url)
        door = ["--url", url, "--token", TOKEN]
        code = main(
            [
                "jobs",
                "resume",
                job_cli,
                "--at",
                "2027-12-03 22:00",
                "--zone",
                "Europe/Warsaw",
                *door,
            ]
        )
        out = capsys.readouterr().out
        assert code == 0 and "2027-12-03T21:00:00Z" in out, out
        code = main(
            ["jobs", "resume", job_cli, "--at", "2027-12-03 22:00", "--zone", "Nope", *door]
        )
        captured = capsys.readouterr()
        out = captured.out + captured.err
        assert "invalid-input" in out and "zone" in out and "Traceback" not in out, out

        # list-jobs shows when each QUEUED job will run
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/list-jobs", {"status": "QUEUED"}, headers=auth
        )
        planned = {j["jobId"]: j["runAfter"] for j in answer["jobs"]}
        assert planned == {
            job_id: "2027-10-31T00:30:00Z",
            job_grpc: "2027-07-01T12:00:00Z",
            job_cli: "2027-12-03T21:00:00Z",
        }, planned
    finally:
        surfaces.close()
