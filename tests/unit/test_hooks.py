"""The host contract: contributions registry, type pool, markers and hookspecs."""

from __future__ import annotations

import pluggy
import pytest
from google.protobuf import descriptor_pb2, struct_pb2, timestamp_pb2

from protomolt_jobs.hooks import (
    Action,
    ComposerError,
    Contributions,
    FileDescriptorContribution,
    InertMount,
    InProcessService,
    TypePool,
    WorkflowRepository,
    hookimpl,
    hookspecs,
)


class Verb:
    name = "get-job"
    description = "d"
    scope = "service-invoke"
    input_schema = None  # set per instance

    def __init__(self):
        self.input_schema = {}

    def execute(self, input):
        return {}


class Repo:
    def workflow(self, name):
        return None

    def names(self):
        return []

    def put(self, name, definition):
        pass


def test_contributions_in_order_and_frozen():
    c = Contributions()
    a, b = Verb(), Verb()
    c.contribute(Action, a)
    c.contribute(Action, b)
    assert c.all(Action) == (a, b)
    assert c.first(Action) is a
    assert c.all(WorkflowRepository) == ()
    assert c.first(WorkflowRepository) is None
    c.freeze()
    with pytest.raises(
        ComposerError, match="^contribution of Action after the wire phase completed$"
    ):
        c.contribute(Action, Verb())
    assert c.all(Action) == (a, b)


def test_contribution_type_and_null_checked():
    c = Contributions()
    with pytest.raises(ValueError, match="must not be null"):
        c.contribute(Action, None)
    with pytest.raises(TypeError, match="contribution of WorkflowRepository"):
        c.contribute(WorkflowRepository, Verb())
    c.contribute(WorkflowRepository, Repo())


def test_type_pool_adds_imports_from_default_pool():
    fd = descriptor_pb2.FileDescriptorProto(
        name="t/v1/thing.proto",
        package="t.v1",
        dependency=["google/protobuf/struct.proto", "google/protobuf/timestamp.proto"],
    )
    msg = fd.message_type.add(name="Thing")
    msg.field.add(
        name="data",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".google.protobuf.Struct",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = TypePool()
    assert pool.add_file(fd.SerializeToString()) == "t/v1/thing.proto"
    assert pool.pool.FindMessageTypeByName("t.v1.Thing").fields_by_name[
        "data"
    ].message_type.full_name == ("google.protobuf.Struct")
    # twice is a no-op
    pool.add_file(fd.SerializeToString())
    assert struct_pb2 and timestamp_pb2


def test_type_pool_missing_import_is_clear():
    fd = descriptor_pb2.FileDescriptorProto(name="x.proto", dependency=["nowhere/missing.proto"])
    with pytest.raises(ValueError, match="imports nowhere/missing.proto"):
        TypePool().add_file(fd.SerializeToString())


def test_type_pool_resolves_imports_from_available():
    dep = descriptor_pb2.FileDescriptorProto(name="a.proto", package="a")
    dep.message_type.add(name="A")
    top = descriptor_pb2.FileDescriptorProto(name="b.proto", package="b", dependency=["a.proto"])
    pool = TypePool()
    pool.add_file(top.SerializeToString(), available={"a.proto": dep.SerializeToString()})
    assert pool.pool.FindMessageTypeByName("a.A").full_name == "a.A"


def test_contribution_dataclasses_validate():
    with pytest.raises(ValueError):
        FileDescriptorContribution(b"")
    with pytest.raises(ValueError):
        InProcessService(" ", [object()])
    with pytest.raises(ValueError):
        InProcessService("parse", [])


def test_inert_mount_closes_once():
    calls = []
    m = InertMount(start=lambda: calls.append("start"), close=lambda: calls.append("close"))
    m.close()
    m.close()
    m.start()
    assert calls == ["close", "start"]


def test_hookspec_accepts_role_plugin_and_rejects_misspelt_hooks():
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)

    class Good:
        @hookimpl
        def protomolt_role_module(self):
            return "module"

    class Misspelt:
        @hookimpl
        def protomolt_role_modul(self):
            return "module"

    pm.register(Good())
    pm.check_pending()
    assert pm.hook.protomolt_role_module() == ["module"]
    pm.register(Misspelt())
    with pytest.raises(pluggy.PluginValidationError):
        pm.check_pending()
