"""resume-job at a local time in a zone, a date or a time of day on a relative day ("tomorrow
22:00"; issue 28 item 4; docs/verbs.md *Operator control*):
resolved by the database (a time the clocks skip is refused naming ``at``, one they pass twice
is the first), through the catalog, HTTP, gRPC and the CLI; list-jobs and get-job show when a
QUEUED job will run. Real PostgreSQL, a real node, a real Worker and the real render service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from zoneinfo import ZoneInfo

import grpc
import psycopg
import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.local_times import LocalTimeError
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


@pytest.mark.parametrize("form", ["date and time", "time of day"])
def test_resume_at_a_local_time_in_a_zone_starts_no_earlier_and_shows_the_planned_time(
    store, verbs, fresh_dsn, form
):
    with RenderService() as render:
        answer = verbs(
            "submit-workflow",
            {"workflow": render_workflow(render.target), "input": {"scene": "s", "frames": 2}},
        )
        job_id = answer["jobId"]
        assert verbs("pause-job", {"jobId": job_id})["status"] == "PAUSED"  # QUEUED: at once
        local, instant = _local_and_instant(fresh_dsn, "Asia/Tokyo", 10)
        if form == "date and time":
            body = {"at": local, "zone": "Asia/Tokyo"}
        else:  # "HH:MM:SS" 10 s ahead, with tz: the next time Tokyo's clock shows it
            body = {"at": local[11:], "tz": "Asia/Tokyo"}
        answer = verbs("resume-job", {"jobId": job_id, **body})
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


# -- relative days ("tomorrow 22:00") and the tz name (issue 28 item 4) ---------------------


def _expected(day, clock, zone, now=None):
    """What ``day`` at ``clock`` in ``zone`` names, by Python's zoneinfo (an oracle apart
    from the database; fine away from a DST change, which the store test below covers)."""
    tz = ZoneInfo(zone)
    now = now or datetime.now(UTC)
    today = now.astimezone(tz).date()
    hh, mm = (int(x) for x in clock.split(":"))
    at = datetime.combine(today, dtime(hh, mm), tzinfo=tz)
    if day == "tomorrow" or (day == "next" and at <= now):
        at = datetime.combine(today + timedelta(days=1), dtime(hh, mm), tzinfo=tz)
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_relative_days_and_tz_at_every_door(tmp_path, fresh_dsn, capsys):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        auth = {"Authorization": f"Bearer {TOKEN}"}
        job_id = _paused_job(url)

        def resume(body, job=job_id):
            return http(
                "POST",
                f"{url}/protomolt/actions/resume-job",
                {"jobId": job, **body},
                headers=auth,
            )

        for body, field in (
            ({"at": "22:00", "zone": "Europe/Warsaw", "tz": "Europe/Warsaw"}, "tz"),
            ({"at": "22:00", "day": "yesterday", "tz": "Europe/Warsaw"}, "day"),
            ({"at": "22:00", "day": "Tomorrow", "tz": "Europe/Warsaw"}, "day"),
            ({"at": "2026-12-03T22:00", "day": "tomorrow", "tz": "Europe/Warsaw"}, "day"),
            ({"at": "25:00", "day": "tomorrow", "tz": "Europe/Warsaw"}, "at"),
            ({"at": "22:00+01:00", "tz": "Europe/Warsaw"}, "at"),
            ({"at": "22:00", "day": "tomorrow"}, "zone"),  # a local time needs its zone
            ({"at": "22:00"}, "at"),  # ... or an offset
            ({"at": "22:00", "tz": "Mars/Olympus"}, "tz"),
            ({"at": "22:00", "tz": 3}, "tz"),
            ({"day": "tomorrow", "tz": "Europe/Warsaw"}, "at"),
            ({"at": "22:00", "tz": "Europe/Warsaw", "when": "later"}, "when"),
        ):
            status, answer, _ = resume(body)
            assert status == 400, (body, status, answer)
            assert answer["error"] == "invalid-input", answer
            assert answer.get("details", {}).get("field") == field, (body, answer)
            assert field in answer["message"], (body, answer)
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id}, headers=auth
        )
        assert answer["job"]["status"] == "PAUSED"  # refused input changed nothing

        # HTTP: "tomorrow 22:00" in Warsaw, with tz
        status, answer, _ = resume({"at": "22:00", "day": "tomorrow", "tz": "Europe/Warsaw"})
        assert status == 200 and answer["runAfter"] == _expected(
            "tomorrow", "22:00", "Europe/Warsaw"
        ), answer
        planned_http = answer["runAfter"]

        # gRPC: a time of day alone is the next time the clock shows it
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
                        job_id=job_grpc, at="22:00", zone="Asia/Tokyo", tz="Asia/Tokyo"
                    ),
                    metadata=meta,
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'tz'" in refused.value.details()
            with pytest.raises(grpc.RpcError) as refused:
                call(
                    pb.ResumeJobRequest(job_id=job_grpc, at="22:00", day="someday", tz="UTC"),
                    metadata=meta,
                )
            assert "'day'" in refused.value.details()
            expected_next = _expected("next", "06:00", "Asia/Tokyo")
            answer = call(
                pb.ResumeJobRequest(job_id=job_grpc, at="06:00", tz="Asia/Tokyo"), metadata=meta
            )
            assert answer.ok and answer.run_after == expected_next, answer

        # the CLI: --at "tomorrow 22:00" --tz Europe/Warsaw
        job_cli = _paused_job(url)
        door = ["--url", url, "--token", TOKEN]
        for args, field in (
            (["--at", "tomorrow 22:00", "--tz", "Europe/Warsaw", "--zone", "UTC"], "tz"),
            (["--at", "tomorow 22:00", "--tz", "Europe/Warsaw"], "at"),
            (["--at", "tomorrow 22:00"], "zone"),
            # the DST rule at this door too: 02:30 on 2027-03-28 does not exist in Warsaw
            (["--at", "2027-03-28 02:30", "--tz", "Europe/Warsaw"], "at"),
        ):
            main(["jobs", "resume", job_cli, *args, *door])
            captured = capsys.readouterr()
            out = captured.out + captured.err
            assert "invalid-input" in out and f"'{field}'" in out, (args, out)
            assert "Traceback" not in out
        code = main(
            ["jobs", "resume", job_cli, "--at", "tomorrow 22:00", "--tz", "Europe/Warsaw", *door]
        )
        out = capsys.readouterr().out
        planned_cli = _expected("tomorrow", "22:00", "Europe/Warsaw")
        assert code == 0 and planned_cli in out, out

        # list-jobs and get-job show the planned times
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/list-jobs", {"status": "QUEUED"}, headers=auth
        )
        planned = {j["jobId"]: j["runAfter"] for j in answer["jobs"]}
        assert planned == {
            job_id: planned_http,
            job_grpc: expected_next,
            job_cli: planned_cli,
        }, planned
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/get-job", {"jobId": job_cli}, headers=auth
        )
        assert answer["job"]["runAfter"] == planned_cli
    finally:
        surfaces.close()


def _z(text):
    return datetime.fromisoformat(text)


def test_relative_days_follow_the_dst_rule_in_the_database(store):
    """store.resolve_local_day with ``now`` on the eve of Warsaw's clock changes (the verb
    uses the database's now(); the SQL is the same)."""
    warsaw = "Europe/Warsaw"
    # spring forward on 2027-03-28 at 02:00 -> 03:00
    eve = _z("2027-03-27T12:00:00Z")
    with pytest.raises(LocalTimeError) as skipped:
        store.resolve_local_day(dtime(2, 30), warsaw, "tomorrow", now=eve)
    assert skipped.value.field == "at" and "2027-03-28 02:30:00 does not exist" in str(
        skipped.value
    )
    # "next" 02:30 on the night itself (01:30 local): today's 02:30 never comes, tomorrow's
    night = _z("2027-03-28T00:30:00Z")
    assert store.resolve_local_day(dtime(2, 30), warsaw, "next", now=night) == _z(
        "2027-03-29T00:30:00Z"
    )
    # "tomorrow 22:00" across the spring change: 23 hours after "today 22:00"
    assert store.resolve_local_day(dtime(22, 0), warsaw, "today", now=eve) == _z(
        "2027-03-27T21:00:00Z"
    )
    assert store.resolve_local_day(dtime(22, 0), warsaw, "tomorrow", now=eve) == _z(
        "2027-03-28T20:00:00Z"
    )
    # fall back on 2027-10-31 at 03:00 -> 02:00: 02:30 happens twice, the first is taken
    autumn_eve = _z("2027-10-30T12:00:00Z")
    assert store.resolve_local_day(dtime(2, 30), warsaw, "tomorrow", now=autumn_eve) == _z(
        "2027-10-31T00:30:00Z"
    )
    # ... and "tomorrow 22:00" is 25 hours after "today 22:00"
    assert store.resolve_local_day(dtime(22, 0), warsaw, "today", now=autumn_eve) == _z(
        "2027-10-30T20:00:00Z"
    )
    assert store.resolve_local_day(dtime(22, 0), warsaw, "tomorrow", now=autumn_eve) == _z(
        "2027-10-31T21:00:00Z"
    )
    # "next" 02:30 at 02:45 of the first pass: today's (first) 02:30 is past, so tomorrow's
    first_pass = _z("2027-10-31T00:45:00Z")
    assert store.resolve_local_day(dtime(2, 30), warsaw, "next", now=first_pass) == _z(
        "2027-11-01T01:30:00Z"
    )
    # "next" before the time: today's; "today" past the time: today's (a past time means now)
    morning = _z("2027-07-01T06:00:00Z")  # 08:00 in Warsaw
    assert store.resolve_local_day(dtime(9, 0), warsaw, "next", now=morning) == _z(
        "2027-07-01T07:00:00Z"
    )
    assert store.resolve_local_day(dtime(7, 0), warsaw, "next", now=morning) == _z(
        "2027-07-02T05:00:00Z"
    )
    assert store.resolve_local_day(dtime(7, 0), warsaw, "today", now=morning) == _z(
        "2027-07-01T05:00:00Z"
    )
    with pytest.raises(LocalTimeError) as unknown:
        store.resolve_local_day(dtime(7, 0), "Mars/Olympus", "today")
    assert unknown.value.field == "zone"
