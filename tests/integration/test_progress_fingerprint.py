"""The fingerprint check on resume from progress (issue 28 item 4; DESIGN.md section 23;
docs/long-steps.md *Resuming from progress: the fingerprint check*): an 8-frame render paused
after frame 3 whose stored definition's adapterVersion (or its input) changed meanwhile stops as
RECOVERY_REQUIRED naming the field, never restarts from zero silently, and ``migrate-checkpoint``
keeps its progress (frames 4-8 only) or discards it (frames 1-8 again). Real PostgreSQL, a real
Worker (and a real node with its dashboard for the form), the real render gRPC service on
loopback; verbs through the host catalog, HTTP and the dashboard's form."""

from __future__ import annotations

import json
import logging

import grpc
import psycopg
import pytest
from google.protobuf import struct_pb2

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.host.grpc_service import ProtoMoltGrpcServer
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.node import http, node_environ, start_node
from tests.support.render_service import RenderService, render_workflow
from tests.support.worker_proc import WorkerProcess, event_types, jobs_config, wait_for

FRAMES = 8


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

    def call(verb, body, *, principal="dora"):
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


@pytest.fixture
def grpc_door(store):
    """The node's real gRPC server over the catalog's verbs: its MigrateCheckpoint stub."""
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    server = ProtoMoltGrpcServer(catalog, port=0, max_workers=4).start()
    channel = grpc.insecure_channel(server.target)
    yield channel.unary_unary(
        "/ai.pipestream.proto.service.v1.ProtoMoltService/MigrateCheckpoint",
        request_serializer=pb.MigrateCheckpointRequest.SerializeToString,
        response_deserializer=pb.JobControlResponse.FromString,
    )
    channel.close()
    server.close()


@pytest.fixture
def worker(store, fresh_dsn):
    w = Worker(
        store,
        runtime=Runtime(),
        config=jobs_config(fresh_dsn, lease_seconds=3.0),
        dsn=fresh_dsn,
    )
    w.start()
    yield w
    w.stop(timeout_s=5)


@pytest.fixture
def render():
    with RenderService(frame_s=0.02) as svc:
        yield svc


def _status(verbs, job_id):
    return verbs("get-job", {"jobId": job_id})["job"]["status"]


def _paused_after_frame_3(verbs, render, shape="sequential"):
    """Submit the 8-frame render (``shape`` "graph": as a graph workflow, run by the graph
    runner), pause it during frame 3: PAUSED after frame 3."""
    started = render.hold(3)
    workflow = render_workflow(render.target)
    if shape == "graph":
        workflow["maxParallel"] = 1
    answer = verbs(
        "submit-workflow", {"workflow": workflow, "input": {"scene": "s", "frames": FRAMES}}
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    assert started.wait(20), "frame 3 never started"
    assert verbs("pause-job", {"jobId": job_id})["status"] == "RUNNING"  # pending
    render.release(3)
    wait_for(lambda: _status(verbs, job_id) == "PAUSED" or None, timeout_s=20)
    assert render.rendered == [1, 2, 3], render.rendered
    return job_id


def _fingerprints(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT adapter_version, input_sha256, definition_sha256, descriptor_sha256, seq"
            " FROM workflow_run_progress WHERE job_id = %s",
            (job_id,),
        ).fetchone()


def _edit_row(dsn, job_id, sql, *params):
    """An operator's repair of the stored run (the run's definition is a snapshot: no verb
    rewrites it; docs/long-steps.md says how it changes)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(sql, (*params, job_id))


@pytest.mark.parametrize("shape", ["sequential", "graph"])
def test_a_changed_adapter_version_needs_recovery_and_keep_continues_from_the_progress(
    store, verbs, worker, render, fresh_dsn, shape, caplog
):
    caplog.set_level(logging.WARNING, logger="protomolt_jobs.worker")
    job_id = _paused_after_frame_3(verbs, render, shape)
    adapter, input_sha, definition_sha, descriptor_sha, seq = _fingerprints(fresh_dsn, job_id)
    # every chunk's report carries the fingerprints of its call
    assert adapter == "render-1.0" and seq == 3
    assert len(input_sha) == len(definition_sha) == len(descriptor_sha) == 64
    _edit_row(
        fresh_dsn,
        job_id,
        "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
        " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
        json.dumps("render-2.0"),
    )
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _status(verbs, job_id) == "RECOVERY_REQUIRED" or None, timeout_s=20)
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["error"] == (
        "progress-mismatch: step 'render' adapterVersion changed "
        "(was 'render-1.0', now 'render-2.0')"
    ), job
    assert job["outstandingStep"] == "render"
    # the worker's log line names the cause (the run's error), not an unproven effect
    lines = [
        r.getMessage()
        for r in caplog.records
        if getattr(r, "action", "") == "job_recovery_required"
    ]
    assert lines == [f"job needs recovery at step 'render': {job['error']}"], lines
    # no frame was rendered under the new adapter, none restarted from zero
    assert render.started == [1, 2, 3], render.started
    assert job["progress"]["percent"] == pytest.approx(37.5)  # the saved progress is shown
    types = [e for e, _ in event_types(store, job_id)]
    assert "RECOVERY_REQUIRED" in types, types

    # replace does not apply to a saved progress: refused naming the field, nothing changed
    with pytest.raises(InvalidInput) as refused:
        verbs(
            "migrate-checkpoint",
            {"jobId": job_id, "stepName": "render", "action": "replace", "response": {}},
        )
    assert refused.value.code == "invalid-input"
    assert refused.value.details["field"] == "action" and "'action'" in refused.value.message
    assert _status(verbs, job_id) == "RECOVERY_REQUIRED"

    answer = verbs(
        "migrate-checkpoint",
        {"jobId": job_id, "stepName": "render", "action": "keep", "reason": "2.0 reads 1.0"},
    )
    assert answer == {"ok": True, "status": "QUEUED", "progress": "kept"}, answer
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=30)
    job = verbs("get-job", {"jobId": job_id})["job"]
    # continued from frame 4: every frame rendered exactly once
    assert render.started == list(range(1, FRAMES + 1)), render.started
    assert render.rendered == list(range(1, FRAMES + 1)), render.rendered
    assert job["result"]["framesDone"] == FRAMES
    adapter, _, definition_after, _, seq = _fingerprints(fresh_dsn, job_id)
    # the later reports carry the new fingerprints
    assert adapter == "render-2.0" and definition_after not in (None, definition_sha)
    assert seq == FRAMES
    kinds = [(t.kind, t.actor) for t in store.job_history(job_id).transitions]
    assert ("migrate-checkpoint:keep", "dora") in kinds, kinds


def test_a_changed_input_needs_recovery_and_discard_renders_from_frame_one(
    verbs, worker, render, fresh_dsn, caplog
):
    caplog.set_level(logging.WARNING, logger="protomolt_jobs.worker")
    job_id = _paused_after_frame_3(verbs, render)
    _edit_row(
        fresh_dsn,
        job_id,
        "UPDATE workflow_run SET input = jsonb_set(input, '{scene}', %s::jsonb) WHERE job_id = %s",
        json.dumps("s-retouched"),
    )
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _status(verbs, job_id) == "RECOVERY_REQUIRED" or None, timeout_s=20)
    error = verbs("get-job", {"jobId": job_id})["job"]["error"]
    assert error.startswith("progress-mismatch: step 'render' inputSha256 changed (was "), error
    assert [
        r.getMessage()
        for r in caplog.records
        if getattr(r, "action", "") == "job_recovery_required"
    ] == [f"job needs recovery at step 'render': {error}"]
    assert render.started == [1, 2, 3]
    answer = verbs(
        "migrate-checkpoint", {"jobId": job_id, "stepName": "render", "action": "discard"}
    )
    assert answer == {"ok": True, "status": "QUEUED", "progress": "dropped"}, answer
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=30)
    job = verbs("get-job", {"jobId": job_id})["job"]
    # the step started again from zero, as the operator chose: frames 1-8 after the first 3
    assert render.started == [1, 2, 3, *range(1, FRAMES + 1)], render.started
    assert job["result"]["framesDone"] == FRAMES
    _, _, _, _, seq = _fingerprints(fresh_dsn, job_id)
    assert seq == FRAMES  # a fresh progress row


def test_an_unchanged_run_resumes_without_recovery(verbs, worker, render, fresh_dsn):
    job_id = _paused_after_frame_3(verbs, render)
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=30)
    assert render.started == list(range(1, FRAMES + 1)), render.started


def _form_post(url, path, fields):
    """One dashboard form post, its redirect followed: the page shown after it."""
    import urllib.parse
    from http.client import HTTPConnection

    parts = urllib.parse.urlsplit(url)
    conn = HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        conn.request(
            "POST",
            path,
            body=urllib.parse.urlencode(fields),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        resp = conn.getresponse()
        assert resp.status == 303, (resp.status, resp.read()[:500])
        location = resp.getheader("Location")
        cookie = (resp.getheader("Set-Cookie") or "").split(";")[0]
        resp.read()
    finally:
        conn.close()
    status, body, _ = http("GET", f"{url}{location}", headers={"Cookie": cookie})
    assert status == 200
    return body


def test_the_dashboard_offers_and_resolves_a_progress_mismatch(tmp_path, fresh_dsn, render):
    """Through a real node: HTTP verbs, its own worker, and the dashboard's migrate form."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url

        def verb(name, body):
            status, answer, _ = http("POST", f"{url}/protomolt/actions/{name}", body)
            assert status == 200, (name, status, answer)
            return answer

        def status_of(job_id):
            return verb("get-job", {"jobId": job_id})["job"]["status"]

        started = render.hold(3)
        job_id = verb(
            "submit-workflow",
            {"workflow": render_workflow(render.target), "input": {"scene": "s", "frames": 8}},
        )["jobId"]
        assert started.wait(20)
        verb("pause-job", {"jobId": job_id})
        render.release(3)
        wait_for(lambda: status_of(job_id) == "PAUSED" or None, timeout_s=20)
        _edit_row(
            fresh_dsn,
            job_id,
            "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
            " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
            json.dumps("render-1.1"),
        )
        verb("resume-job", {"jobId": job_id})
        wait_for(lambda: status_of(job_id) == "RECOVERY_REQUIRED" or None, timeout_s=20)
        # gRPC: replace does not apply to a saved progress, refused naming the field
        with grpc.insecure_channel(surfaces.grpc.target) as channel:
            migrate = channel.unary_unary(
                "/ai.pipestream.proto.service.v1.ProtoMoltService/MigrateCheckpoint",
                request_serializer=pb.MigrateCheckpointRequest.SerializeToString,
                response_deserializer=pb.JobControlResponse.FromString,
            )
            response = struct_pb2.Struct()
            response.update({"framesDone": 3})
            with pytest.raises(grpc.RpcError) as refused:
                migrate(
                    pb.MigrateCheckpointRequest(
                        job_id=job_id, step_name="render", action="replace", response=response
                    )
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'action'" in refused.value.details()
        assert status_of(job_id) == "RECOVERY_REQUIRED"
        page = http("GET", f"{url}/ui/jobs/{job_id}")[1]
        # the step without a checkpoint is offered: it stopped on its saved progress
        assert b'<option value="render" selected>render</option>' in page
        assert b"progress-mismatch: step &#39;render&#39; adapterVersion changed" in page
        shown = _form_post(
            url,
            f"/ui/jobs/{job_id}/action/migrate-checkpoint",
            {"stepName": "render", "action": "keep", "confirm": "on", "reason": "1.1 reads 1.0"},
        )
        assert b"migrate-checkpoint: now QUEUED" in shown
        wait_for(lambda: status_of(job_id) == "COMPLETED" or None, timeout_s=30)
    finally:
        surfaces.close()
    assert render.started == list(range(1, FRAMES + 1)), render.started


def test_after_a_crash_the_next_worker_checks_the_fingerprints_too(store, fresh_dsn, render):
    """The worker is SIGKILLed during frame 4; the run's adapterVersion changes before another
    worker claims it: RECOVERY_REQUIRED naming it, nothing called."""
    import uuid

    from protomolt_jobs.store import NewJob

    started = render.hold(4)
    job = store.job_insert(
        NewJob(
            job_id=uuid.uuid4(),
            workflow_name="render",
            workflow_definition=render_workflow(render.target),
            input={"scene": "s", "frames": FRAMES},
            max_attempts=3,
        )
    ).job
    fast = {
        "lease_seconds": 1.5,
        "poll_interval_ms": 200,
        "sweep_interval_ms": 200,
        "backoff_base_seconds": 0.2,
        "worker_count": 1,
        "pool_max_size": 4,
    }
    a = WorkerProcess(fresh_dsn, worker_id="fp-a", **fast)
    b = WorkerProcess(fresh_dsn, worker_id="fp-b", **fast)
    try:
        a.start()
        assert started.wait(30), "frame 4 never started"
        assert a.kill() == -9
        render.release(4)
        _edit_row(
            fresh_dsn,
            job.job_id,
            "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
            " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
            json.dumps("render-2.0"),
        )
        b.start()  # its sweeper requeues the expired lease, then it claims the run
        wait_for(
            lambda: store.job_get(job.job_id).status == "RECOVERY_REQUIRED" or None, timeout_s=40
        )
    finally:
        a.close()
        b.close()
    row = store.job_get(job.job_id)
    assert row.error == (
        "progress-mismatch: step 'render' adapterVersion changed "
        "(was 'render-1.0', now 'render-2.0')"
    ), row.error
    assert render.started == [1, 2, 3, 4], render.started  # b called nothing


@pytest.mark.parametrize(("action", "progress"), [("keep", "kept"), ("discard", "dropped")])
def test_migrate_checkpoint_at_the_grpc_door_answers_what_became_of_the_progress(
    verbs, worker, render, fresh_dsn, grpc_door, action, progress
):
    job_id = _paused_after_frame_3(verbs, render)
    _edit_row(
        fresh_dsn,
        job_id,
        "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
        " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
        json.dumps("render-2.0"),
    )
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(lambda: _status(verbs, job_id) == "RECOVERY_REQUIRED" or None, timeout_s=20)
    answer = grpc_door(
        pb.MigrateCheckpointRequest(job_id=job_id, step_name="render", action=action),
        timeout=20,
    )
    # the same answer as HTTP's {"ok": true, "status": "QUEUED", "progress": ...}
    assert (answer.ok, answer.status, answer.progress) == (True, "QUEUED", progress), answer
    wait_for(lambda: _status(verbs, job_id) == "COMPLETED" or None, timeout_s=30)
    again = list(range(1, FRAMES + 1)) if action == "discard" else list(range(4, FRAMES + 1))
    assert render.started == [1, 2, 3, *again], render.started
