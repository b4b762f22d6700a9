"""A client built from upstream's service package reaches our node (issue #20, slice 2).

The client knows only ``ai.pipestream.proto.grpc.service.v1.ProtoMoltService`` and the message
layout upstream declares (``tests/support/upstream.py``, hand-built from the reference), not
our generated classes; it submits a stored workflow and reads the job back.
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from protomolt_jobs.host.grpc_service import (
    REFLECTION_V1,
    SERVICE_NAME,
    UPSTREAM_SERVICE_NAME,
    alias_file,
)
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.integration.test_grpc_service import _list_services
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for
from tests.support.upstream import UPSTREAM_SERVICE_PACKAGE, upstream_service_classes


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _upstream_call(channel, rpc: str, request, response_name: str):
    cls = upstream_service_classes()[response_name]
    stub = channel.unary_unary(
        f"/{UPSTREAM_SERVICE_PACKAGE}.ProtoMoltService/{rpc}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=cls.FromString,
    )
    return stub(request, timeout=15)


def test_an_upstream_client_submits_and_reads_a_job(node, services):
    status, _, _ = http(
        "PUT",
        f"{node.http.url}/protomolt/workflows/seed-review",
        seed_workflow(services.target, review="invoke"),
    )
    assert status in (200, 201)
    up = upstream_service_classes()
    job_id = str(uuid.uuid4())
    request = up["SubmitWorkflowRequest"](workflow_name="seed-review", job_id=job_id)
    request.input.update({"text": "hello brave new world"})
    with grpc.insecure_channel(node.grpc.target) as channel:
        submitted = _upstream_call(channel, "SubmitWorkflow", request, "SubmitWorkflowResponse")
        assert (submitted.ok, submitted.job_id, submitted.status) == (True, job_id, "QUEUED")

        def finished():
            got = _upstream_call(
                channel, "GetJob", up["GetJobRequest"](job_id=job_id), "GetJobResponse"
            )
            return got.job.status == "COMPLETED" and got

        got = wait_for(finished)
        assert got.ok and got.job.job_id == job_id and got.job.workflow_name == "seed-review"
        assert [c.name for c in got.job.checkpoints] == ["tokenize", "embed", "review"]
        assert got.job.attempt == 1 and got.job.completed_at
        assert got.job.input["text"] == "hello brave new world"
        assert len(got.job.result.fields) > 0

        # Unknown job: an answer, not an error, under the alias as under our name.
        missing = _upstream_call(
            channel, "GetJob", up["GetJobRequest"](job_id=str(uuid.uuid4())), "GetJobResponse"
        )
        assert not missing.ok and missing.error.startswith("no workflow run ")


def test_reflection_lists_and_describes_both_names(node):
    with grpc.insecure_channel(node.grpc.target) as channel:
        names = _list_services(channel, REFLECTION_V1)
        assert SERVICE_NAME in names and UPSTREAM_SERVICE_NAME in names
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        ours = pool.FindServiceByName(SERVICE_NAME)
        alias = pool.FindServiceByName(UPSTREAM_SERVICE_NAME)
        # Generic: every RPC of our service (whatever RPCs are added later) has the alias.
        assert [m.name for m in alias.methods] == [m.name for m in ours.methods]
        assert alias.file.name == "ai/pipestream/proto/grpc/service/v1/protomolt_service.proto"
        method = alias.methods_by_name["GetJob"]
        assert method.input_type.full_name == f"{UPSTREAM_SERVICE_PACKAGE}.GetJobRequest"
        # A reflection-only client of the alias calls it.
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        stub = channel.unary_unary(
            f"/{UPSTREAM_SERVICE_NAME}/GetJob",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            stub(req_cls(job_id="nope"), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_alias_file_mirrors_every_rpc_and_message():
    alias = alias_file()
    assert alias.package == UPSTREAM_SERVICE_PACKAGE
    assert [m.name for m in alias.service[0].method] == [
        m.name for m in pb.DESCRIPTOR.services_by_name["ProtoMoltService"].methods
    ]
    ours = list(pb.DESCRIPTOR.message_types_by_name)
    names = [m.name for m in alias.message_type]
    assert names[: len(ours)] == ours
    assert {"CompiledWorkflow", "WorkflowStep", "SchemaSource", "CelRule"} <= set(names)
    refs = [f.type_name for m in alias.message_type for f in m.field if f.type_name]
    assert refs and not any(".ai.pipestream.proto.service.v1." in r for r in refs)
    # Upstream's typed inline workflow on the requests that carry one.
    by_name = {m.name: m for m in alias.message_type}
    for request in ("SubmitWorkflowRequest", "RunWorkflowRequest", "CheckWorkflowRequest"):
        (workflow,) = [f for f in by_name[request].field if f.name == "workflow"]
        assert workflow.type_name == f".{UPSTREAM_SERVICE_PACKAGE}.CompiledWorkflow"


def _typed(up, wf: dict):
    """The seed workflow as upstream's typed CompiledWorkflow (the fields it uses)."""
    compiled = up["CompiledWorkflow"](name=wf["name"], input_type=wf["inputType"])
    compiled.schema.descriptor_set_base64 = wf["schema"]["descriptorSetBase64"]
    for step in wf["steps"]:
        s = compiled.steps.add(name=step["name"], target=step["target"], method=step["method"])
        s.rules.extend(step.get("rules", []))
        if step.get("completion"):
            s.completion = step["completion"]
    compiled.output.type = wf["output"]["type"]
    compiled.output.rules.extend(wf["output"].get("rules", []))
    return compiled


def test_an_upstream_client_submits_an_inline_typed_workflow(node, services):
    up = upstream_service_classes()
    wf = seed_workflow(services.target, review="invoke")
    with grpc.insecure_channel(node.grpc.target) as channel:
        checked = _upstream_call(
            channel,
            "CheckWorkflow",
            up["CheckWorkflowRequest"](workflow=_typed(up, wf)),
            "CheckWorkflowResponse",
        )
        assert checked.ok and list(checked.findings) == []
        broken = _typed(up, wf)
        broken.steps[1].rules.append("nosuch = input.text")
        found = _upstream_call(
            channel,
            "CheckWorkflow",
            up["CheckWorkflowRequest"](workflow=broken),
            "CheckWorkflowResponse",
        )
        assert not found.ok and found.findings[0].step == broken.steps[1].name

        job_id = str(uuid.uuid4())
        request = up["SubmitWorkflowRequest"](workflow=_typed(up, wf), job_id=job_id)
        request.input.update({"text": "inline from java"})
        submitted = _upstream_call(channel, "SubmitWorkflow", request, "SubmitWorkflowResponse")
        assert (submitted.ok, submitted.job_id) == (True, job_id)
        got = wait_for(
            lambda: (
                (
                    g := _upstream_call(
                        channel, "GetJob", up["GetJobRequest"](job_id=job_id), "GetJobResponse"
                    )
                ).job.status
                == "COMPLETED"
                and g
            )
        )
        assert got.job.workflow_name == wf["name"]
