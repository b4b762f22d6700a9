"""Operating loop runs (issue 27, bounded loops' gaps): retry-step in a loop body (both scopes)
and requeue-job of a run that failed in a later iteration. Real PostgreSQL, a real Worker,
the test ``Steps/Run`` service on loopback counting calls per step; verbs through the host
catalog as a named principal."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
from tests.support.worker_proc import jobs_config


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
def run_once(store, fresh_dsn):
    """Claim and run one segment of the oldest QUEUED job with a real Worker."""

    def run() -> None:
        worker = Worker(store, runtime=Runtime(), config=jobs_config(fresh_dsn), dsn=fresh_dsn)
        try:
            assert worker.run_once() is True
        finally:
            worker.stop()

    return run


def looping(t: str) -> dict[str, Any]:
    """a -> b -> send (external) -> c -> d; d loops back to b once (max 1) and parks when
    exhausted, so a run ends PAUSED after iterations 0 and 1."""
    return graph(
        [
            step("a", t),
            step("b", t, after=["a"], reads=["a"]),
            step("send", t, after=["b"], effect="external"),
            step("c", t, after=["send"], reads=["b"]),
            step(
                "d",
                t,
                after=["c"],
                reads=["c"],
                loop={"to": "b", "max": 1, "onExhausted": "park", "allowEffects": True},
            ),
        ],
        name="looping-ops",
    )


def _entries(store, job_id) -> list[tuple[str, int]]:
    return [(c["name"], c.get("iteration", 0)) for c in store.job_get(job_id).checkpoints]


def _calls(services, names="a b send c d") -> dict[str, int]:
    return {n: services.step_calls(n) for n in names.split()}


FULL = [
    ("a", 0),
    ("b", 0),
    ("send", 0),
    ("c", 0),
    ("d", 0),
    ("b", 1),
    ("send", 1),
    ("c", 1),
    ("d", 1),
]


def _paused_run(verbs, store, services, run_once) -> str:
    answer = verbs(
        "submit-workflow", {"workflow": looping(services.target), "input": {"text": "x"}}
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    run_once()
    row = store.job_get(job_id)
    assert row.status == "PAUSED" and row.error.startswith("LOOP: loop 'd' exhausted"), row.error
    assert _entries(store, job_id) == FULL
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 2, "d": 2}
    return job_id


def test_retry_step_of_a_body_step_reruns_it_in_the_latest_iteration_and_keeps_the_count(
    verbs, store, services, run_once
):
    job_id = _paused_run(verbs, store, services, run_once)
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "b"})
    assert answer["ok"], answer
    assert answer["dropped"] == ["b", "c", "d"]
    assert answer["keptEffects"] == ["send"]
    # iteration 0 stays whole; iteration 1 keeps only its effect
    stored = _entries(store, job_id)
    assert stored == FULL[:5] + [("send", 1)]
    run_once()
    row = store.job_get(job_id)
    # the count was kept: iteration 1 ran again and the loop exhausted there (no iteration 2)
    assert row.status == "PAUSED" and row.error.startswith("LOOP: loop 'd' exhausted"), row.error
    assert sorted(_entries(store, job_id)) == sorted(FULL)
    assert max(k for _, k in _entries(store, job_id)) == 1
    # b, c, d once more in iteration 1; the effect step was never called again
    assert _calls(services) == {"a": 1, "b": 3, "send": 2, "c": 3, "d": 3}
    keys = [
        m.get("x-protomolt-idempotency-key")
        for r, m in zip(
            services.requests("jobs.test.Steps/Run"),
            services.metadata("jobs.test.Steps/Run"),
            strict=True,
        )
        if r.step == "b"
    ]
    assert keys[-1].endswith(":1"), keys  # the re-run is iteration 1's call


def test_retry_step_only_of_a_body_step_replays_its_dependants_when_its_output_is_unchanged(
    verbs, store, services, run_once
):
    job_id = _paused_run(verbs, store, services, run_once)
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "c", "scope": "only"})
    assert answer["ok"], answer
    assert answer["dropped"] == ["c"] and answer["rerunIfChanged"] == ["d"]
    run_once()
    row = store.job_get(job_id)
    assert row.status == "PAUSED" and row.error.startswith("LOOP: loop 'd' exhausted"), row.error
    # c alone was called again; d#1 replayed (same output hash), so the loop exhausted again
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 3, "d": 2}
    assert max(k for _, k in _entries(store, job_id)) == 1


def test_retry_step_only_of_a_body_step_reruns_its_dependants_when_its_output_changed(
    verbs, store, services, run_once
):
    job_id = _paused_run(verbs, store, services, run_once)

    def run(request, context):
        reply = services._do_run(request, context)
        if request.step == "c" and services.step_calls("c") > 2:
            reply.seen.append("changed")
        return reply

    services.set_handler("Run", run)
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "c", "scope": "only"})
    assert answer["ok"], answer
    run_once()
    row = store.job_get(job_id)
    assert row.status == "PAUSED" and row.error.startswith("LOOP: loop 'd' exhausted"), row.error
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 3, "d": 3}
    stored = _entries(store, job_id)
    assert stored.count(("d", 1)) == 2  # the provisional entry and the one that replaced it
    assert max(k for _, k in stored) == 1


def test_retry_step_only_of_a_step_upstream_of_a_loop_body_is_refused_naming_the_reason(
    verbs, store, services, run_once
):
    job_id = _paused_run(verbs, store, services, run_once)
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "a", "scope": "only"})
    assert answer["ok"] is False and answer["status"] == "PAUSED"
    assert "scope 'dependants'" in answer["error"]
    assert _entries(store, job_id) == FULL


def test_requeue_of_a_run_that_failed_in_iteration_1_resumes_there(
    verbs, store, services, run_once
):
    def c_fails_in_iteration_1(request, context):
        if request.step == "c" and services.step_calls("c") == 2:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")
        return services._do_run(request, context)

    services.set_handler("Run", c_fails_in_iteration_1)
    answer = verbs(
        "submit-workflow", {"workflow": looping(services.target), "input": {"text": "x"}}
    )
    job_id = answer["jobId"]
    run_once()
    row = store.job_get(job_id)
    assert row.status == "FAILED", row.error
    assert _entries(store, job_id) == FULL[:7] + [("c", 1)]
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 2, "d": 1}

    assert verbs("requeue-job", {"jobId": job_id}) == {"ok": True, "status": "QUEUED"}
    assert _entries(store, job_id) == FULL[:7]
    run_once()
    row = store.job_get(job_id)
    # the count was kept: the loop exhausted after iteration 1 (PAUSED), no iteration 2
    assert row.status == "PAUSED" and row.error.startswith("LOOP: loop 'd' exhausted"), row.error
    assert _entries(store, job_id) == FULL
    # only what iteration 1 had not finished was called: c and d
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 3, "d": 2}


GRPC_TOKEN = "loops-grpc"


@pytest.fixture
def node(tmp_path, fresh_dsn):
    from tests.support.node import node_environ, start_node

    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=GRPC_TOKEN))
    yield surfaces
    surfaces.close()


def test_grpc_retry_step_carries_scope_only_and_answers_what_it_kept(node, services):
    from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
    from tests.support.node import http, wait_for

    url = node.http.url
    headers = {"Authorization": f"Bearer {GRPC_TOKEN}", "Content-Type": "application/json"}

    def verb(name, body):
        return http("POST", f"{url}/protomolt/actions/{name}", body=body, headers=headers)[1]

    def status(job_id):
        return verb("get-job", {"jobId": job_id})["job"]["status"]

    answer = verb("submit-workflow", {"workflow": looping(services.target), "input": {"text": "x"}})
    assert answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: status(job_id) == "PAUSED", timeout_s=60)
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 2, "d": 2}

    auth = (("authorization", f"Bearer {GRPC_TOKEN}"),)
    with grpc.insecure_channel(node.grpc.target) as channel:
        retry = channel.unary_unary(
            "/ai.pipestream.proto.service.v1.ProtoMoltService/RetryStep",
            request_serializer=pb.RetryStepRequest.SerializeToString,
            response_deserializer=pb.JobControlResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as bad:
            retry(pb.RetryStepRequest(job_id=job_id, step_name="c", scope="some"), metadata=auth)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "scope" in bad.value.details()
        assert status(job_id) == "PAUSED"
        reply = retry(
            pb.RetryStepRequest(job_id=job_id, step_name="c", scope="only", reason="grpc"),
            metadata=auth,
        )
    assert reply.ok and reply.status == "QUEUED", reply
    assert reply.scope == "only"
    assert list(reply.dropped) == ["c"] and list(reply.rerun_if_changed) == ["d"]
    wait_for(lambda: services.step_calls("c") == 3 and status(job_id) == "PAUSED", timeout_s=60)
    # scope only reached the verb: d was replayed, not called
    assert _calls(services) == {"a": 1, "b": 2, "send": 2, "c": 3, "d": 2}
    history = verb("job-history", {"jobId": job_id})
    (retried,) = [t for t in history["transitions"] if t["kind"] == "retry-step"]
    assert retried["reason"] == "scope only; grpc"
