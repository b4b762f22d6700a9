"""The composer: discovery, ordering, the two phases, freezing and closing in reverse."""

from __future__ import annotations

import types

import pluggy
import pytest

from protomolt_jobs.hooks import (
    Action,
    ComposerError,
    FileDescriptorContribution,
    InertMount,
    TypePool,
    hookimpl,
    hookspecs,
)
from protomolt_jobs.host.composer import compose, order_roles
from protomolt_jobs.host.nodeconfig import NodeConfig


class Verb:
    def __init__(self, name):
        self.name = name
        self.description = "A verb."
        self.scope = "service-invoke"
        self.input_schema = {"type": "object"}

    def execute(self, input):
        return {"ok": True, "verb": self.name}


class FakeRole:
    def __init__(self, role, requires=(), journal=None, verbs=(), fail_wire=None, fail_start=None):
        self.role = role
        self.requires = frozenset(requires)
        self.journal = journal if journal is not None else []
        self.verbs = verbs
        self.fail_wire = fail_wire
        self.fail_start = fail_start
        self.ctx = None

    def wire(self, ctx):
        self.journal.append(f"wire {self.role}")
        self.ctx = ctx
        if self.fail_wire:
            raise self.fail_wire
        for v in self.verbs:
            ctx.contributions.contribute(Action, Verb(v))

        def start():
            self.journal.append(f"start {self.role}")
            if self.fail_start:
                raise self.fail_start

        return InertMount(start=start, close=lambda: self.journal.append(f"close {self.role}"))


def plugin(module):
    return types.SimpleNamespace(protomolt_role_module=hookimpl(lambda: module))


def fresh_pm():
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def config(tmp_path, roles, **sections):
    lines = ["[node]", f"roles = {list(roles)!r}".replace("'", '"'), f'data_dir = "{tmp_path}"']
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f'{k} = "{v}"' for k, v in table.items()]
    path = tmp_path / "protomolt.toml"
    path.write_text("\n".join(lines) + "\n")
    return NodeConfig.load(path, environ={})


def test_wire_all_then_start_in_order_and_close_in_reverse(tmp_path):
    journal = []
    roles = [
        FakeRole("jobs", {"registry"}, journal, verbs=["get-job"]),
        FakeRole("registry", (), journal, verbs=["put-thing"]),
        FakeRole("parse", {"registry"}, journal),
    ]
    node = compose(
        config(tmp_path, ["jobs", "parse", "registry"], jobs={}),
        plugin_manager=fresh_pm(),
        extra_plugins=[plugin(r) for r in roles],
    )
    assert node.roles == ["registry", "jobs", "parse"]
    assert journal == ["wire registry", "wire jobs", "wire parse"]
    assert node.catalog.names() == ["put-thing", "get-job"]
    assert node.contributions.frozen
    node.start()
    assert journal[3:] == ["start registry", "start jobs", "start parse"]
    node.close()
    node.close()
    assert journal[6:] == ["close parse", "close jobs", "close registry"]


def test_context_carries_settings_data_dir_and_type_pool(tmp_path):
    role = FakeRole("registry")
    compose(
        config(tmp_path, ["registry"], registry={"root": "x"}),
        plugin_manager=fresh_pm(),
        extra_plugins=[plugin(role)],
    ).close()
    assert role.ctx.settings == {"root": "x"}
    assert role.ctx.data_dir == tmp_path
    assert isinstance(role.ctx.contributions.first(TypePool), TypePool)
    assert len(role.ctx.node_id) == 8


def test_two_plugins_claiming_one_role(tmp_path):
    with pytest.raises(ComposerError, match=r"^two modules claim role registry: .* and .*$"):
        compose(
            config(tmp_path, ["registry"]),
            plugin_manager=fresh_pm(),
            extra_plugins=[plugin(FakeRole("registry")), plugin(FakeRole("registry"))],
        )


def test_unknown_role(tmp_path):
    with pytest.raises(ComposerError, match=r"^unknown role search, known roles: \['registry'\]$"):
        compose(
            config(tmp_path, ["search"]),
            plugin_manager=fresh_pm(),
            extra_plugins=[plugin(FakeRole("registry"))],
        )


def test_unknown_required_role():
    modules = {"jobs": FakeRole("jobs", {"registry"})}
    with pytest.raises(ComposerError, match="role jobs requires unknown role registry"):
        order_roles(["jobs"], modules)


def test_cycle():
    modules = {"a": FakeRole("a", {"b"}), "b": FakeRole("b", {"c"}), "c": FakeRole("c", {"a"})}
    with pytest.raises(
        ComposerError, match=r"role dependency cycle through \['a', 'b', 'c', 'a'\]"
    ):
        order_roles(["a", "b", "c"], modules)


def test_required_role_not_mounted_is_skipped():
    modules = {"jobs": FakeRole("jobs", {"registry"}), "registry": FakeRole("registry")}
    assert order_roles(["jobs"], modules) == ["jobs"]


def test_late_contribution_is_refused(tmp_path):
    role = FakeRole("registry")
    node = compose(
        config(tmp_path, ["registry"]), plugin_manager=fresh_pm(), extra_plugins=[plugin(role)]
    )
    with pytest.raises(
        ComposerError, match="^contribution of Action after the wire phase completed$"
    ):
        role.ctx.contributions.contribute(Action, Verb("late-verb"))
    node.close()


def test_wire_failure_closes_what_was_wired(tmp_path):
    journal = []
    roles = [
        FakeRole("registry", (), journal),
        FakeRole("jobs", {"registry"}, journal, fail_wire=ComposerError("jobs cannot wire")),
    ]
    with pytest.raises(ComposerError, match="^jobs cannot wire$"):
        compose(
            config(tmp_path, ["registry", "jobs"]),
            plugin_manager=fresh_pm(),
            extra_plugins=[plugin(r) for r in roles],
        )
    assert journal == ["wire registry", "wire jobs", "close registry"]


def test_other_wire_errors_are_wrapped(tmp_path):
    role = FakeRole("registry", fail_wire=OSError("disk on fire"))
    with pytest.raises(ComposerError, match="node boot failed: role registry failed to wire: disk"):
        compose(
            config(tmp_path, ["registry"]), plugin_manager=fresh_pm(), extra_plugins=[plugin(role)]
        )


def test_start_failure_closes_everything_in_reverse(tmp_path):
    journal = []
    roles = [
        FakeRole("registry", (), journal),
        FakeRole("jobs", {"registry"}, journal, fail_start=RuntimeError("no database")),
    ]
    node = compose(
        config(tmp_path, ["registry", "jobs"]),
        plugin_manager=fresh_pm(),
        extra_plugins=[plugin(r) for r in roles],
    )
    with pytest.raises(ComposerError, match="role jobs failed to start: no database"):
        node.start()
    assert journal[-2:] == ["close jobs", "close registry"]


def test_duplicate_action_names_fail_the_boot(tmp_path):
    roles = [FakeRole("registry", verbs=["get-job"]), FakeRole("jobs", verbs=["get-job"])]
    with pytest.raises(ComposerError, match="Action 'get-job' is already registered"):
        compose(
            config(tmp_path, ["registry", "jobs"]),
            plugin_manager=fresh_pm(),
            extra_plugins=[plugin(r) for r in roles],
        )


def test_misspelt_hook_fails_the_boot(tmp_path):
    bad = types.SimpleNamespace(protomolt_role_modul=hookimpl(lambda: None))
    with pytest.raises(ComposerError, match="unknown hook"):
        compose(config(tmp_path, ["registry"]), plugin_manager=fresh_pm(), extra_plugins=[bad])


def test_non_module_is_refused(tmp_path):
    with pytest.raises(ComposerError, match="returned no role module"):
        compose(
            config(tmp_path, ["registry"]),
            plugin_manager=fresh_pm(),
            extra_plugins=[plugin(object())],
        )


def test_contributed_descriptors_reach_the_type_pool_at_start(tmp_path):
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto(name="demo/v1/doc.proto", package="demo.v1")
    fd.message_type.add(name="Doc")

    class DescRole(FakeRole):
        def wire(self, ctx):
            ctx.contributions.contribute(
                FileDescriptorContribution, FileDescriptorContribution(fd.SerializeToString())
            )
            return super().wire(ctx)

    node = compose(
        config(tmp_path, ["parse"]),
        plugin_manager=fresh_pm(),
        extra_plugins=[plugin(DescRole("parse"))],
    )
    with pytest.raises(KeyError):
        node.type_pool.pool.FindMessageTypeByName("demo.v1.Doc")
    with node:
        assert node.type_pool.pool.FindMessageTypeByName("demo.v1.Doc").name == "Doc"


def test_entry_points_declare_the_jobs_role():
    from importlib import metadata

    names = {ep.name: ep.value for ep in metadata.entry_points(group="protomolt.roles")}
    assert names["jobs"] == "protomolt_jobs.role"


def test_in_process_services_are_reachable_by_name(tmp_path):
    import grpc

    from protomolt_jobs.hooks import InProcessService

    def upper(request: bytes, context) -> bytes:
        return request.upper()

    handler = grpc.method_handlers_generic_handler(
        "demo.v1.Shout",
        {"Upper": grpc.unary_unary_rpc_method_handler(upper)},
    )

    class ServiceRole(FakeRole):
        def wire(self, ctx):
            ctx.contributions.contribute(InProcessService, InProcessService("shout", [handler]))
            return super().wire(ctx)

    node = compose(
        config(tmp_path, ["parse"]),
        plugin_manager=fresh_pm(),
        extra_plugins=[plugin(ServiceRole("parse"))],
    )
    with node:
        assert node.channels.names == ["shout"]
        channel = node.channels.channel("inprocess:shout", False)
        assert node.channels.channel("inprocess:shout", True) is channel
        call = channel.unary_unary("/demo.v1.Shout/Upper")
        assert call(b"hello", timeout=10) == b"HELLO"
        with pytest.raises(ValueError, match="no in-process service named 'nope'"):
            node.channels.channel("inprocess:nope", False)
        socket_path = node.channels.socket_path
        assert socket_path.exists()
    assert not socket_path.exists()
