"""Checkpoints as artifacts (issue #17): a parked job whose step output type changes in the
host's type pool before complete-step is not failed on resume; it waits as RECOVERY_REQUIRED
with ``checkpoint-mismatch`` until ``migrate-checkpoint`` keeps, discards or replaces the
checkpoint. Real PostgreSQL, a real Worker, gRPC servers that count calls."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import TEST_PROTO_PATH, descriptor_set, seed_workflow
from tests.support.worker_proc import enqueue, jobs_config


def pool(change=None) -> descriptor_pool.DescriptorPool:
    """The test types in a pool of their own; ``change(tokens DescriptorProto)`` edits
    ``jobs.test.Tokens`` first (the host's type pool after a deploy)."""
    files = descriptor_pb2.FileDescriptorSet()
    files.CopyFrom(descriptor_set())
    if change is not None:
        for f in files.file:
            if f.name == TEST_PROTO_PATH:
                change(next(m for m in f.message_type if m.name == "Tokens"))
    p = descriptor_pool.DescriptorPool()
    for f in files.file:
        p.Add(f)
    return p


def add_field(tokens):
    tokens.field.add(
        name="source",
        number=9,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        json_name="source",
    )


def count_becomes_text(tokens):
    field = next(f for f in tokens.field if f.name == "count")
    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_STRING


def verbs_for(store, runtime):
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)

    def call(verb, body, *, principal="carol"):
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


def run_once(store, fresh_dsn, runtime):
    worker = Worker(store, runtime=runtime, config=jobs_config(fresh_dsn), dsn=fresh_dsn)
    assert worker.run_once() is True


def parked_then_types_change(store, fresh_dsn, services, change):
    """A job parked on review under the old types; complete-step and the resume under the new
    ones. Returns (job id, new runtime, verbs under it)."""
    old = Runtime(pool=pool())
    wf = seed_workflow(services.target, schema="type")
    job = enqueue(store, wf, {"text": "one two three"})
    run_once(store, fresh_dsn, old)
    assert store.job_get(job.job_id).status == "WAITING"
    new = Runtime(pool=pool(change))
    verbs = verbs_for(store, new)
    jid = str(job.job_id)
    answer = verbs(
        "complete-step",
        {"jobId": jid, "stepName": "review", "response": {"approved": True, "note": "ok"}},
    )
    assert answer == {"ok": True, "status": "QUEUED"}
    run_once(store, fresh_dsn, new)
    return job.job_id, new, verbs


def test_a_type_change_under_a_parked_job_needs_recovery_not_failure(store, fresh_dsn, services):
    jid, new, verbs = parked_then_types_change(store, fresh_dsn, services, add_field)
    row = store.job_get(jid)
    assert row.status == "RECOVERY_REQUIRED", row.error
    assert row.outstanding_step == "tokenize"
    assert row.error == "checkpoint-mismatch: step 'tokenize' descriptorSha256 changed"
    assert row.lease_owner is None
    # get-job shows the fingerprints
    shown = verbs("get-job", {"jobId": str(jid)})["job"]
    assert shown["checkpoints"][0]["descriptorSha256"] == row.checkpoints[0]["descriptorSha256"]

    # keep: the old response still parses as the new Tokens; the next mismatch is embed's
    # (its input type is Tokens), kept too; then the run completes without calling again.
    answer = verbs(
        "migrate-checkpoint", {"jobId": str(jid), "stepName": "tokenize", "action": "keep"}
    )
    assert answer == {"ok": True, "status": "QUEUED"}
    run_once(store, fresh_dsn, new)
    row = store.job_get(jid)
    assert row.status == "RECOVERY_REQUIRED" and row.outstanding_step == "embed"
    assert verbs(
        "migrate-checkpoint",
        {"jobId": str(jid), "stepName": "embed", "action": "keep", "reason": "compatible"},
    ) == {"ok": True, "status": "QUEUED"}
    run_once(store, fresh_dsn, new)
    row = store.job_get(jid)
    assert row.status == "COMPLETED", row.error
    assert services.calls("Tokenize") == 1 and services.calls("Embed") == 1
    kinds = [(t.kind, t.actor) for t in store.job_history(jid).transitions]
    assert kinds.count(("migrate-checkpoint:keep", "carol")) == 2


def test_discard_runs_the_step_again(store, fresh_dsn, services):
    jid, new, verbs = parked_then_types_change(store, fresh_dsn, services, add_field)
    answer = verbs(
        "migrate-checkpoint", {"jobId": str(jid), "stepName": "tokenize", "action": "discard"}
    )
    # a sequential workflow: every later step read tokenize's response, so they go too
    assert answer == {"ok": True, "status": "QUEUED", "dropped": ["tokenize", "embed", "review"]}
    run_once(store, fresh_dsn, new)
    row = store.job_get(jid)
    assert row.status == "WAITING" and row.outstanding_step == "review"
    assert services.calls("Tokenize") == 2 and services.calls("Embed") == 2


def test_keep_is_refused_when_the_old_response_no_longer_parses(store, fresh_dsn, services):
    jid, _, verbs = parked_then_types_change(store, fresh_dsn, services, count_becomes_text)
    assert store.job_get(jid).status == "RECOVERY_REQUIRED"
    answer = verbs(
        "migrate-checkpoint", {"jobId": str(jid), "stepName": "tokenize", "action": "keep"}
    )
    assert answer["ok"] is False and answer["status"] == "RECOVERY_REQUIRED"
    assert "no longer parses as jobs.test.Tokens" in answer["error"]
    assert store.job_get(jid).status == "RECOVERY_REQUIRED"
    # replace with a response of the new type: accepted
    answer = verbs(
        "migrate-checkpoint",
        {
            "jobId": str(jid),
            "stepName": "tokenize",
            "action": "replace",
            "response": {"ids": ["1"], "text": "one", "count": "1"},
        },
    )
    assert answer == {"ok": True, "status": "QUEUED"}
    assert store.job_get(jid).checkpoints[0]["response"]["count"] == "1"


def test_migrate_checkpoint_over_the_typed_grpc_rpc(store, fresh_dsn, services):
    import grpc

    from protomolt_jobs.host.grpc_service import ProtoMoltGrpcServer
    from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb

    jid, new, _ = parked_then_types_change(store, fresh_dsn, services, add_field)
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, new, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, new):
        catalog.register(action)
    srv = ProtoMoltGrpcServer(catalog, port=0, max_workers=4).start()
    channel = grpc.insecure_channel(srv.target)
    try:

        def call(rpc, request):
            stub = channel.unary_unary(
                f"/ai.pipestream.proto.service.v1.ProtoMoltService/{rpc}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=pb.JobControlResponse.FromString,
            )
            return stub(request, timeout=10)

        # reconcile-step is for an unproven external step, but any RECOVERY_REQUIRED run takes
        # it only for a step without a checkpoint: tokenize has one
        refused = call(
            "ReconcileStep",
            pb.ReconcileStepRequest(job_id=str(jid), step_name="tokenize", outcome="not-done"),
        )
        assert refused.ok is False and "already has a checkpoint" in refused.error
        answer = call(
            "MigrateCheckpoint",
            pb.MigrateCheckpointRequest(
                job_id=str(jid), step_name="tokenize", action="discard", reason="new types"
            ),
        )
        assert answer.ok is True and answer.status == "QUEUED"
        assert list(answer.dropped) == ["tokenize", "embed", "review"]
        with pytest.raises(grpc.RpcError) as bad:
            call(
                "MigrateCheckpoint",
                pb.MigrateCheckpointRequest(job_id=str(jid), step_name="tokenize", action="x"),
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'action'" in bad.value.details()
    finally:
        channel.close()
        srv.close()
    transitions = store.job_history(jid).transitions
    assert [(t.kind, t.actor) for t in transitions][-1] == (
        "migrate-checkpoint:discard",
        "anonymous",
    )
