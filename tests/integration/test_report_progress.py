"""ReportProgress (issue 28 item 2; docs/long-steps.md "ReportProgress"): a render service on
loopback that renders every frame in ONE call and reports each frame to the node's real
gRPC server with the call's ``protomolt-progress-token``; a real Worker, real PostgreSQL.

The service learns of a pause in its next report, returns early with its state, and that
state is what the resumed call starts from; a report carrying an earlier attempt's token is
``lease_lost`` and changes nothing; bad input is INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent import futures
from typing import Any, Self

import grpc
import psycopg
import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.host.grpc_service import ProtoMoltGrpcServer
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.progress_token import HEADER, ProgressToken
from protomolt_jobs.store.records import Lease
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.render_service import message_class, render_workflow
from tests.support.worker_proc import WorkerProcess, event_types, jobs_config, wait_for

FRAMES = 8
LEASE_S = 3.0
RPC = "/ai.pipestream.proto.service.v1.ProtoMoltService/ReportProgress"


class ReportingRenderer:
    """``render.v1.Renderer/Render`` rendering frames ``state.next_frame`` (1 when unset) to
    ``frames`` in one call, calling ReportProgress after each frame; on ``pause_requested`` it
    answers at once with ``done`` false and the next frame as its state."""

    def __init__(self, node_target: str, frame_s: float = 0.02) -> None:
        self.node = grpc.insecure_channel(node_target)
        self.frame_s = frame_s
        self.rendered: list[int] = []
        self.first_frames: list[int] = []  # the frame each call started from
        self.tokens: list[str | None] = []  # the token each call carried
        self.answers: list[str] = []
        self.holds: dict[int, threading.Event] = {}
        self.reached: dict[int, threading.Event] = {}
        #: on pause_requested, fail the call (UNAVAILABLE, retryable) instead of answering with the state:
        #: the state saved is then only what ReportProgress wrote
        self.abort_on_pause = False
        self._server: grpc.Server | None = None
        self.target = ""

    def hold(self, frame: int) -> threading.Event:
        self.holds[frame] = threading.Event()
        self.reached[frame] = threading.Event()
        return self.reached[frame]

    def report(self, token: str, **fields: Any) -> pb.ReportProgressResponse:
        request = pb.ReportProgressRequest(token=token, **fields)
        stub = self.node.unary_unary(
            RPC,
            request_serializer=pb.ReportProgressRequest.SerializeToString,
            response_deserializer=pb.ReportProgressResponse.FromString,
        )
        return stub(request, timeout=10)

    def _render(self, request: Any, context: grpc.ServicerContext) -> Any:
        token = dict(context.invocation_metadata()).get(HEADER)
        self.tokens.append(token)
        first = request.state.next_frame or 1
        self.first_frames.append(first)
        out = message_class("render.v1.RenderChunk")()
        out.frames_total = request.frames
        for frame in range(first, request.frames + 1):
            if frame in self.reached:
                self.reached[frame].set()
                self.holds[frame].wait(30)
                if not context.is_active():
                    return out  # its caller is gone (a killed worker): stop, report nothing
            time.sleep(self.frame_s)
            self.rendered.append(frame)
            out.state.next_frame = frame + 1
            out.frames_done = frame
            out.details = f"frame {frame} of {request.frames}"
            if frame == request.frames:
                break
            state = pb.ReportProgressRequest().state
            state.struct_value.update({"nextFrame": frame + 1})
            answer = self.report(
                token or "",
                percent=100.0 * frame / request.frames,
                details=out.details,
                state=state,
            ).answer
            self.answers.append(answer)
            if answer == "pause_requested" and self.abort_on_pause:
                context.abort(grpc.StatusCode.UNAVAILABLE, "paused")
            if answer == "pause_requested":
                out.done = False
                return out  # early, with its state: the engine saves it as progress
            if answer in ("cancel_requested", "lease_lost"):
                context.abort(grpc.StatusCode.ABORTED, answer)
        out.done = True
        return out

    def __enter__(self) -> Self:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.unary_unary_rpc_method_handler(
            self._render,
            request_deserializer=message_class("render.v1.RenderRequest").FromString,
            response_serializer=message_class("render.v1.RenderChunk").SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("render.v1.Renderer", {"Render": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server, self.target = server, f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        for gate in self.holds.values():
            gate.set()
        if self._server is not None:
            self._server.stop(0.5)
        self.node.close()


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=8)
    yield s
    s.close()


@pytest.fixture
def node(store):
    """The catalog's verbs and the node's real gRPC server over them."""
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.lease_s = LEASE_S
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)
    server = ProtoMoltGrpcServer(catalog, port=0, max_workers=8).start()

    def call(verb, body):
        return catalog.execute(verb, body, caller=Caller("alice", unrestricted=True))

    yield call, server
    server.close()


@pytest.fixture
def renderer(node):
    with ReportingRenderer(node[1].target) as svc:
        yield svc


@pytest.fixture
def worker(store, fresh_dsn):
    w = Worker(
        store,
        runtime=Runtime(),
        config=jobs_config(fresh_dsn, lease_seconds=LEASE_S),
        dsn=fresh_dsn,
    )
    w.start()
    yield w
    w.stop(timeout_s=5)


def _workflow(target: str, *, reports: bool = True) -> dict:
    wf = render_workflow(target, name="render-reporting")
    if reports:
        wf["steps"][0]["reportsProgress"] = True
    return wf


def _row(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT attempt, seq, percent, details, state, done"
            " FROM workflow_run_progress WHERE job_id = %s",
            (job_id,),
        ).fetchone()


def _fingerprints(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT adapter_version, input_sha256, definition_sha256, descriptor_sha256, seq,"
            " state FROM workflow_run_progress WHERE job_id = %s",
            (job_id,),
        ).fetchone()


def _lease(dsn, job_id):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT status, attempt, lease_owner, lease_token, lease_until"
            " FROM workflow_run WHERE job_id = %s",
            (job_id,),
        ).fetchone()


def test_the_service_learns_of_the_pause_and_its_saved_state_is_resumed_from(
    store, node, renderer, worker, fresh_dsn
):
    verbs, _ = node
    reached = renderer.hold(3)
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(renderer.target), "input": {"scene": "s", "frames": FRAMES}},
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    assert reached.wait(20), "frame 3 never started"
    # frames 1 and 2 were reported through the node's gRPC server: progress is visible
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["progress"]["details"] == "frame 2 of 8", job
    assert verbs("pause-job", {"jobId": job_id, "reason": "tonight"})["status"] == "RUNNING"
    renderer.holds[3].set()
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "PAUSED" or None)
    # it learnt of the pause in its next report (after frame 3) and returned early
    assert renderer.answers == ["continue", "continue", "pause_requested"], renderer.answers
    assert renderer.rendered == [1, 2, 3], renderer.rendered
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["progress"]["details"] == "frame 3 of 8", job
    _, _, _, _, state, done = _row(fresh_dsn, job_id)
    assert state == {"nextFrame": 4} and done is False, state
    first_token = renderer.tokens[0]
    assert first_token and ProgressToken.decode(first_token).step == "render"

    reached6 = renderer.hold(6)
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    assert reached6.wait(20), "frame 6 never started"
    # the resumed call started from the saved state, with a token of the new claim
    assert renderer.first_frames == [1, 4], renderer.first_frames
    assert renderer.tokens[1] and renderer.tokens[1] != first_token
    # a report carrying the earlier attempt's token is refused and changes nothing
    before_row, before_lease = _row(fresh_dsn, job_id), _lease(fresh_dsn, job_id)
    stale = renderer.report(first_token, percent=99.0, details="stale", state=None)
    assert stale.answer == "lease_lost"
    assert _row(fresh_dsn, job_id) == before_row
    assert _lease(fresh_dsn, job_id) == before_lease
    renderer.holds[6].set()
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "COMPLETED" or None)
    # every frame rendered exactly once across the pause
    assert renderer.rendered == list(range(1, FRAMES + 1)), renderer.rendered
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["result"]["framesDone"] == FRAMES and "progress" not in job
    types = [e for e, _ in event_types(store, job_id)]
    assert types.count("PAUSED") == 1 and types.count("COMPLETED") == 1, types


def _rewritten(token: str, **changes: Any) -> str:
    """``token`` with fields of its JSON body changed (by index), as a holder could."""
    import base64

    prefix, raw = token[:5], token[5:]
    body = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    for index, value in changes.items():
        body[int(index[1:])] = value
    return prefix + base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def test_a_token_rewritten_to_another_step_is_refused_and_stores_nothing(
    node, renderer, worker, fresh_dsn
):
    """The token is bound to the step it was issued for: a holder that rewrites the step (or
    drops the fingerprints) cannot plant a state another step of the run would continue from."""
    verbs, _ = node
    reached = renderer.hold(2)
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(renderer.target), "input": {"scene": "s", "frames": FRAMES}},
    )
    job_id = answer["jobId"]
    assert reached.wait(20), "frame 2 never started"
    token = renderer.tokens[0]
    assert token
    planted = pb.ReportProgressRequest().state
    planted.struct_value.update({"nextFrame": 7})
    body_len = len(json.loads(_b64(token[5:])))
    forged = [
        _rewritten(token, i1="publish"),  # another step
        _rewritten(token, i2=5),  # another iteration
        _rewritten(token, i6=False),  # resumable flag
    ]
    if body_len == 11:
        forged.append(_rewritten(token, i7="other-adapter", i10=""))  # fingerprints dropped
    with psycopg.connect(fresh_dsn) as conn:
        before = conn.execute(
            "SELECT step, iteration, seq, state FROM workflow_run_progress WHERE job_id = %s"
            " ORDER BY step, iteration",
            (job_id,),
        ).fetchall()
    for text in forged:
        try:
            got = renderer.report(text, percent=1.0, details="forged", state=planted).answer
        except grpc.RpcError as err:
            got = err.code().name
        assert got in ("lease_lost", "INVALID_ARGUMENT"), (text, got)
    with psycopg.connect(fresh_dsn) as conn:
        after = conn.execute(
            "SELECT step, iteration, seq, state FROM workflow_run_progress WHERE job_id = %s"
            " ORDER BY step, iteration",
            (job_id,),
        ).fetchall()
    assert after == before, after
    renderer.holds[2].set()
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "COMPLETED" or None)
    assert renderer.rendered == list(range(1, FRAMES + 1)), renderer.rendered


def _b64(raw: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))


def test_a_step_that_does_not_opt_in_gets_no_token(node, renderer, worker):
    verbs, _ = node
    answer = verbs(
        "submit-workflow",
        {
            "workflow": _workflow(renderer.target, reports=False),
            "input": {"scene": "s", "frames": 2},
        },
    )
    job_id = answer["jobId"]
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] != "QUEUED" or None)
    wait_for(lambda: renderer.tokens or None)
    # no header: its one report is refused as a missing token, and the step fails
    assert renderer.tokens[0] is None


def _refusal(renderer, raw: bytes) -> tuple[grpc.StatusCode, str, str | None]:
    stub = renderer.node.unary_unary(RPC)
    with pytest.raises(grpc.RpcError) as caught:
        stub(raw, timeout=10)
    err = caught.value
    details = dict(err.trailing_metadata() or ()).get("protomolt-error-details-bin")
    field = json.loads(details).get("field") if details else None
    return err.code(), err.details(), field


def test_bad_input_is_invalid_argument_naming_the_field(node, renderer):
    valid = ProgressToken(Lease(uuid.uuid4(), "w", 1, uuid.uuid4()), "render", 0, True).encode()
    cases = [
        (pb.ReportProgressRequest(token=""), "token"),
        (pb.ReportProgressRequest(token="garbage"), "token"),
        (pb.ReportProgressRequest(token="pmp1.bm90IGpzb24"), "token"),
        (pb.ReportProgressRequest(token=valid, percent=101.0), "percent"),
        (pb.ReportProgressRequest(token=valid, percent=-1.0), "percent"),
        (pb.ReportProgressRequest(token=valid, details="x" * 1001), "details"),
    ]
    for request, field in cases:
        code, text, named = _refusal(renderer, request.SerializeToString())
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (request, code, text)
        assert text.startswith("invalid-input:") and named == field, (request, text, named)
    code, text, _ = _refusal(renderer, b"\xff\xff\xff garbage")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text.startswith("invalid-input:")
    # a well-formed token whose lease holds no run: lease_lost, nothing written
    assert renderer.report(valid, percent=50.0).answer == "lease_lost"


def test_a_state_json_or_jsonb_cannot_hold_is_invalid_argument_not_internal(node, renderer):
    from google.protobuf import struct_pb2

    valid = ProgressToken(Lease(uuid.uuid4(), "w", 1, uuid.uuid4()), "render", 0, True).encode()
    nan = struct_pb2.Value(number_value=float("nan"))
    deep = struct_pb2.Value(struct_value=struct_pb2.Struct(fields={"frame": nan}))
    nul = struct_pb2.Value(string_value="a\x00b")
    for state in (nan, deep, nul):
        request = pb.ReportProgressRequest(token=valid, percent=10.0, state=state)
        code, text, named = _refusal(renderer, request.SerializeToString())
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (state, code, text)
        assert text.startswith("invalid-input:") and named == "state", (state, text, named)
    # the HTTP door parses NaN and Infinity (Python's json): the verb refuses them itself
    from protomolt_jobs.errors import InvalidInput

    verbs, _ = node
    for state in (float("nan"), {"frame": float("inf")}, ["a\x00b"]):
        with pytest.raises(InvalidInput) as refused:
            verbs("report-progress", {"token": valid, "state": state})
        assert refused.value.details.get("field") == "state", refused.value


def test_a_pending_cancel_is_told_and_lands_when_the_service_stops(node, renderer, worker):
    verbs, _ = node
    reached = renderer.hold(2)
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(renderer.target), "input": {"scene": "s", "frames": FRAMES}},
    )
    job_id = answer["jobId"]
    assert reached.wait(20), "frame 2 never started"
    assert verbs("cancel-job", {"jobId": job_id, "reason": "enough"})["status"] == "RUNNING"
    renderer.holds[2].set()
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "CANCELLED" or None)
    # told in its next report (after frame 2), it stopped: no frame after it
    assert renderer.answers == ["continue", "cancel_requested"], renderer.answers
    assert renderer.rendered == [1, 2], renderer.rendered
    assert len(renderer.first_frames) == 1, renderer.first_frames


def test_a_state_saved_only_by_reports_carries_the_fingerprints_and_is_checked_on_resume(
    store, node, renderer, worker, fresh_dsn
):
    """The service fails its call when told of the pause, so the state it resumes from is
    only what its ReportProgress calls wrote (no chunk report): those rows carry the call's
    fingerprints (from its token), a changed adapterVersion is RECOVERY_REQUIRED naming it,
    and ``keep`` continues from the reported state."""
    verbs, _ = node
    renderer.abort_on_pause = True
    reached = renderer.hold(3)
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(renderer.target), "input": {"scene": "s", "frames": FRAMES}},
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    assert reached.wait(20), "frame 3 never started"
    # frames 1 and 2 reported from inside the call, nothing else wrote the row
    adapter, input_sha, definition_sha, descriptor_sha, seq, state = _fingerprints(
        fresh_dsn, job_id
    )
    assert seq == 2 and state == {"nextFrame": 3}, (seq, state)
    assert adapter == "render-1.0"
    assert all(len(h or "") == 64 for h in (input_sha, definition_sha, descriptor_sha))
    assert verbs("pause-job", {"jobId": job_id, "reason": "tonight"})["status"] == "RUNNING"
    renderer.holds[3].set()
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "PAUSED" or None)
    assert renderer.answers == ["continue", "continue", "pause_requested"], renderer.answers
    # the saved state is the last report's (frame 3 done), still with its fingerprints
    adapter, _, definition_after, _, seq, state = _fingerprints(fresh_dsn, job_id)
    assert (adapter, definition_after, seq, state) == (
        "render-1.0",
        definition_sha,
        3,
        {"nextFrame": 4},
    )

    with psycopg.connect(fresh_dsn) as conn:  # an operator's repair of the stored run
        conn.execute(
            "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
            " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
            (json.dumps("render-2.0"), job_id),
        )
    assert verbs("resume-job", {"jobId": job_id})["ok"]
    wait_for(
        lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "RECOVERY_REQUIRED" or None
    )
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert job["error"] == (
        "progress-mismatch: step 'render' adapterVersion changed "
        "(was 'render-1.0', now 'render-2.0')"
    ), job
    assert renderer.first_frames == [1], renderer.first_frames  # nothing called

    answer = verbs("migrate-checkpoint", {"jobId": job_id, "stepName": "render", "action": "keep"})
    assert answer == {"ok": True, "status": "QUEUED", "progress": "kept"}, answer
    wait_for(lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "COMPLETED" or None)
    # continued from the reported state: frame 4 on, every frame rendered once
    assert renderer.first_frames == [1, 4], renderer.first_frames
    assert renderer.rendered == list(range(1, FRAMES + 1)), renderer.rendered
    adapter, _, _, _, _, _ = _fingerprints(fresh_dsn, job_id)
    assert adapter == "render-2.0"  # the reports after keep stamp the new fingerprints


def test_after_a_crash_a_state_saved_only_by_reports_is_checked_by_the_next_worker(
    store, node, renderer, fresh_dsn
):
    """The worker is SIGKILLed during frame 4 of the one reporting call: the saved state is
    the report after frame 3, written only by ReportProgress. The adapterVersion changes
    before another worker claims the run: RECOVERY_REQUIRED naming it, nothing called; keep
    continues from frame 4."""
    verbs, _ = node
    reached = renderer.hold(4)
    job_id = verbs(
        "submit-workflow",
        {"workflow": _workflow(renderer.target), "input": {"scene": "s", "frames": FRAMES}},
    )["jobId"]
    fast = {
        "lease_seconds": 1.5,
        "poll_interval_ms": 200,
        "sweep_interval_ms": 200,
        "backoff_base_seconds": 0.2,
        "worker_count": 1,
        "pool_max_size": 4,
    }
    a = WorkerProcess(fresh_dsn, worker_id="rp-a", **fast)
    b = WorkerProcess(fresh_dsn, worker_id="rp-b", **fast)
    try:
        a.start()
        assert reached.wait(30), "frame 4 never started"
        adapter, input_sha, definition_sha, _, seq, state = _fingerprints(fresh_dsn, job_id)
        assert (adapter, seq, state) == ("render-1.0", 3, {"nextFrame": 4})
        assert len(input_sha) == len(definition_sha) == 64
        assert a.kill() == -9
        with psycopg.connect(fresh_dsn) as conn:
            conn.execute(
                "UPDATE workflow_run SET workflow_definition = jsonb_set(workflow_definition,"
                " '{steps,0,adapterVersion}', %s::jsonb) WHERE job_id = %s",
                (json.dumps("render-2.0"), job_id),
            )
        renderer.holds[4].set()  # the orphaned call sees its caller gone and stops
        b.start()  # its sweeper requeues the expired lease, then it claims the run
        wait_for(
            lambda: (
                verbs("get-job", {"jobId": job_id})["job"]["status"] == "RECOVERY_REQUIRED" or None
            ),
            timeout_s=40,
        )
        job = verbs("get-job", {"jobId": job_id})["job"]
        assert job["error"] == (
            "progress-mismatch: step 'render' adapterVersion changed "
            "(was 'render-1.0', now 'render-2.0')"
        ), job
        assert renderer.first_frames == [1], renderer.first_frames  # b called nothing
        answer = verbs(
            "migrate-checkpoint", {"jobId": job_id, "stepName": "render", "action": "keep"}
        )
        assert answer["progress"] == "kept", answer
        wait_for(
            lambda: verbs("get-job", {"jobId": job_id})["job"]["status"] == "COMPLETED" or None,
            timeout_s=40,
        )
    finally:
        a.close()
        b.close()
    # continued from the last reported state: frames 1-3 once, then 4-8
    assert renderer.first_frames == [1, 4], renderer.first_frames
    assert renderer.rendered == list(range(1, FRAMES + 1)), renderer.rendered
