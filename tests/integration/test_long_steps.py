"""Resumable long steps (issue 28 items 1 and 3; docs/long-steps.md): an 8-frame render step
served by a real gRPC render service on loopback that renders one frame per call and counts
frames, a real Worker (in-process, and real worker processes for the SIGKILL), real
PostgreSQL. Verbs run through the host catalog as a named principal."""

from __future__ import annotations

import copy
import shutil
import tempfile

import grpc
import psycopg
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from protomolt_jobs.errors import LeaseLost
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.progress import ProgressReport
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.browser import browser_paths, require_browser
from tests.support.node import http, node_environ, start_node
from tests.support.render_service import RenderService, render_workflow
from tests.support.worker_proc import WorkerProcess, event_types, jobs_config, wait_for

FRAMES = 8
CHROMIUM, CHROMEDRIVER = browser_paths()


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


@pytest.fixture
def browser():
    """Headless Chromium (Debian's chromium and chromium-driver; tests/support/browser.py)."""
    require_browser(CHROMIUM, CHROMEDRIVER)  # fails this test alone, with the apt-get hint
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="pmj-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)  # fmt: skip
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def render():
    with RenderService(frame_s=0.02) as svc:
        yield svc


def _submit(verbs, render):
    answer = verbs(
        "submit-workflow",
        {"workflow": render_workflow(render.target), "input": {"scene": "s", "frames": FRAMES}},
    )
    assert answer["ok"], answer
    return answer["jobId"]


def _job(verbs, job_id):
    return verbs("get-job", {"jobId": job_id})["job"]


def _progress_rows(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT step, iteration, attempt, seq, percent, state, done"
            " FROM workflow_run_progress WHERE job_id = %s",
            (job_id,),
        ).fetchall()


def test_pause_lands_after_the_current_frame_and_resume_continues_from_it(
    store, verbs, worker, render, fresh_dsn
):
    started = render.hold(2)
    job_id = _submit(verbs, render)
    worker()
    assert started.wait(20), "frame 2 never started"
    answer = verbs("pause-job", {"jobId": job_id, "reason": "after this frame"})
    assert answer["ok"] and answer["status"] == "RUNNING", answer  # a pending request
    render.release(2)
    wait_for(lambda: _job(verbs, job_id)["status"] == "PAUSED" or None, timeout_s=20)
    job = _job(verbs, job_id)
    # stopped after the current frame: frame 2, not 8
    assert render.rendered == [1, 2], render.rendered
    progress = job["progress"]
    assert progress["step"] == "render" and progress["iteration"] == 0
    assert 25 <= progress["percent"] <= 37, progress
    assert progress["details"] == "frame 2 of 8" and progress["updatedAt"]
    attempt_paused = job["attempt"]
    history = [t["kind"] for t in verbs("job-history", {"jobId": job_id})["transitions"]]
    assert history[-1] == "pause", history
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _job(verbs, job_id)["status"] == "COMPLETED" or None, timeout_s=30)
    job = _job(verbs, job_id)
    # continued from the saved frame: 8 frames in all, none twice
    assert render.rendered == list(range(1, FRAMES + 1)), render.rendered
    assert render.started == list(range(1, FRAMES + 1)), render.started
    assert job["result"]["framesDone"] == FRAMES and job["result"]["done"] is True
    assert "progress" not in job  # a finished run shows no step in flight
    # the pause used up no attempt: a resumed run starts its attempts afresh
    assert job["attempt"] == attempt_paused == 1, (job["attempt"], attempt_paused)
    rows = _progress_rows(fresh_dsn, job_id)
    assert len(rows) == 1 and rows[0][3] == FRAMES and rows[0][6] is True, rows
    types = [e for e, _ in event_types(store, job_id)]
    assert types.count("PAUSED") == 1 and types.count("COMPLETED") == 1, types


def test_cancel_between_frames_ends_cancelled_without_further_frames(verbs, worker, render):
    started = render.hold(3)
    job_id = _submit(verbs, render)
    worker()
    assert started.wait(20)
    answer = verbs("cancel-job", {"jobId": job_id, "reason": "enough"})
    assert answer["ok"] and answer["status"] == "RUNNING", answer
    render.release(3)
    wait_for(lambda: _job(verbs, job_id)["status"] == "CANCELLED" or None, timeout_s=20)
    assert render.rendered == [1, 2, 3], render.rendered
    assert render.started == [1, 2, 3], render.started
    job = _job(verbs, job_id)
    assert "progress" not in job and job["error"].startswith("CANCELLED by alice")


def test_sigkill_mid_render_resumes_from_the_last_progress_checkpoint(store, fresh_dsn, render):
    started = render.hold(4)
    job = store.job_insert(_new_job(render)).job
    fast = {
        "lease_seconds": 1.5,
        "poll_interval_ms": 200,
        "sweep_interval_ms": 200,
        "backoff_base_seconds": 0.2,
        "worker_count": 1,
        "pool_max_size": 4,
    }
    a = WorkerProcess(fresh_dsn, worker_id="proc-a", **fast)
    b = WorkerProcess(fresh_dsn, worker_id="proc-b", **fast)
    try:
        a.start()
        assert started.wait(30), "frame 4 never started"
        assert a.kill() == -9
        render.release(4)  # the dead worker's chunk ends on the service side
        b.start()  # its sweeper requeues the expired lease, then it claims the run
        wait_for(lambda: store.job_get(job.job_id).status == "COMPLETED" or None, timeout_s=40)
    finally:
        a.close()
        b.close()
    # frames 1-3 were checkpointed before the kill: only the chunk in flight (4) is repeated
    assert render.started == [1, 2, 3, 4, 4, 5, 6, 7, 8], render.started
    row = store.job_get(job.job_id)
    assert row.result["framesDone"] == FRAMES
    assert row.attempt == 2  # the crash used one attempt, as any crash does


def _new_job(render):
    import uuid

    from protomolt_jobs.store import NewJob

    return NewJob(
        job_id=uuid.uuid4(),
        workflow_name="render",
        workflow_definition=render_workflow(render.target),
        input={"scene": "s", "frames": FRAMES},
        max_attempts=3,
    )


def test_a_progress_report_is_fenced_extends_the_lease_and_a_stale_one_changes_nothing(
    store, fresh_dsn, render
):
    store.job_insert(_new_job(render))
    first = store.job_claim("old-owner", 60)
    report = ProgressReport(step="render", percent=25.0, details="frame 2", state={"nextFrame": 3})
    assert store.job_report_progress(first.lease, 60, report) == 1
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' WHERE job_id = %s",
            (first.job_id,),
        )
    # a report extends the lease like a heartbeat
    assert store.job_report_progress(first.lease, 60, report) == 2
    assert store.job_sweep_expired().requeued == 0
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' WHERE job_id = %s",
            (first.job_id,),
        )
    assert store.job_sweep_expired().requeued == 1
    second = store.job_claim("new-owner", 60)
    assert second.job_id == first.job_id
    before = _progress_rows(fresh_dsn, first.job_id)
    stale = ProgressReport(step="render", percent=90.0, state={"nextFrame": 8})
    with pytest.raises(LeaseLost):
        store.job_report_progress(first.lease, 60, stale)
    assert _progress_rows(fresh_dsn, first.job_id) == before
    saved = store.job_progress_saved(first.job_id, "render")
    assert (saved.percent, saved.state, saved.attempt, saved.seq) == (25.0, {"nextFrame": 3}, 1, 2)
    # a bad report is refused naming the field, before anything is written
    with pytest.raises(ValueError, match="percent"):
        store.job_report_progress(second.lease, 60, ProgressReport(step="render", percent=120))
    assert _progress_rows(fresh_dsn, first.job_id) == before


def test_a_workflow_without_resumable_steps_writes_no_progress(verbs, worker, render, fresh_dsn):
    workflow = render_workflow(render.target)
    del workflow["steps"][0]["resumable"]
    answer = verbs(
        "submit-workflow", {"workflow": workflow, "input": {"scene": "s", "frames": FRAMES}}
    )
    job_id = answer["jobId"]
    worker()
    wait_for(lambda: _job(verbs, job_id)["status"] == "COMPLETED" or None, timeout_s=20)
    assert render.rendered == [1]  # one call, as before
    assert _progress_rows(fresh_dsn, job_id) == []
    assert "progress" not in _job(verbs, job_id)


def test_a_bad_resumable_declaration_is_refused_at_submit_naming_the_field(verbs, render):
    workflow = render_workflow(render.target)
    workflow["steps"][0]["resumable"]["state"] = "scene"
    answer = verbs(
        "submit-workflow", {"workflow": workflow, "input": {"scene": "s", "frames": FRAMES}}
    )
    assert not answer["ok"] and "resumable.state" in str(answer), answer


def test_the_dashboard_and_http_get_job_show_a_paused_renders_progress(
    tmp_path, fresh_dsn, render, browser
):
    token = "long-steps-secret"
    auth = {"Authorization": f"Bearer {token}"}
    started = render.hold(2)
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=token))
    try:
        url = surfaces.http.url
        status, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/submit-workflow",
            {"workflow": render_workflow(render.target), "input": {"scene": "s", "frames": 8}},
            headers=auth,
        )
        assert status == 200 and answer["ok"], answer
        job_id = answer["jobId"]
        assert started.wait(20)
        status, answer, _ = http(
            "POST", f"{url}/protomolt/actions/pause-job", {"jobId": job_id}, headers=auth
        )
        assert status == 200 and answer["ok"], answer
        render.release(2)

        def job():
            _, answer, _ = http(
                "POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id}, headers=auth
            )
            return answer["job"]

        wait_for(lambda: job()["status"] == "PAUSED" or None, timeout_s=20)
        progress = job()["progress"]
        assert (progress["step"], progress["percent"], progress["details"]) == (
            "render",
            25.0,
            "frame 2 of 8",
        )
        # gRPC GetJob carries it too (WorkflowRun.progress)
        with grpc.insecure_channel(surfaces.grpc.target) as channel:
            get = channel.unary_unary(
                "/ai.pipestream.proto.service.v1.ProtoMoltService/GetJob",
                request_serializer=pb.GetJobRequest.SerializeToString,
                response_deserializer=pb.GetJobResponse.FromString,
            )
            answer = get(
                pb.GetJobRequest(job_id=job_id), metadata=(("authorization", f"Bearer {token}"),)
            )
        assert answer.ok and answer.job.status == "PAUSED"
        assert answer.job.progress["percent"] == 25.0 and answer.job.progress["step"] == "render"
        status, body, _ = http(
            "GET", f"{url}/ui/jobs/{job_id}", headers={"Cookie": f"protomolt_token={token}"}
        )
        assert status == 200, body[:500]
        assert b'id="job-progress-bar" max="100" value="25.0"' in body, body[:4000]
        assert b'id="job-progress-percent">25.0 %' in body
        assert b"frame 2 of 8" in body
        # and in a real browser, signed in through the login form
        browser.get(f"{url}/ui/")
        wait_for(lambda: browser.find_elements(By.ID, "token") or None, timeout_s=20)
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.ID, "login-submit").click()
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs") or None, timeout_s=20)
        browser.get(f"{url}/ui/jobs/{job_id}")
        bar = wait_for(
            lambda: (browser.find_elements(By.ID, "job-progress-bar") or [None])[0], timeout_s=20
        )
        assert float(bar.get_attribute("value")) == 25.0
        assert browser.find_element(By.ID, "job-progress-percent").text == "25.0 %"
        assert browser.find_element(By.ID, "job-progress-details").text == "frame 2 of 8"
        assert browser.find_element(By.ID, "job-status").text == "PAUSED"
    finally:
        surfaces.close()
    assert render.rendered == [1, 2]


def test_a_resumable_step_in_a_graph_run_pauses_between_frames_and_resumes(verbs, worker, render):
    workflow = render_workflow(render.target, name="render-graph")
    first = workflow["steps"][0]
    second = copy.deepcopy(first)
    second["name"] = "encode"
    second["after"] = [{"step": "render", "on": "success"}]
    second["rules"] = ["scene = input.scene", "frames = render.frames_total"]
    workflow["steps"].append(second)
    started = render.hold(3)
    answer = verbs("submit-workflow", {"workflow": workflow, "input": {"scene": "s", "frames": 4}})
    assert answer["ok"], answer
    job_id = answer["jobId"]
    worker()
    assert started.wait(20)
    assert verbs("pause-job", {"jobId": job_id})["status"] == "RUNNING"
    render.release(3)
    wait_for(lambda: _job(verbs, job_id)["status"] == "PAUSED" or None, timeout_s=20)
    job = _job(verbs, job_id)
    assert render.rendered == [1, 2, 3] and job["checkpoints"] == [], job
    assert (job["progress"]["step"], job["progress"]["percent"]) == ("render", 75.0)
    drawn = verbs("get-job", {"jobId": job_id, "graph": True})["job"]["graph"]["steps"]
    assert [s.get("progress") for s in drawn] == [
        {"percent": 75.0, "details": "frame 3 of 4"},
        None,
    ], drawn
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _job(verbs, job_id)["status"] == "COMPLETED" or None, timeout_s=30)
    # render continued at frame 4; encode (its own progress row) ran frames 1-4
    assert render.rendered == [1, 2, 3, 4, 1, 2, 3, 4], render.rendered
    names = [c["name"] for c in _job(verbs, job_id)["checkpoints"]]
    assert names == ["render", "encode"], names
