"""Node configuration at its boundary: ports that only look like digits, section names that
differ only in case."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError
from protomolt_jobs.host.nodeconfig import NodeConfig


@pytest.mark.parametrize("raw", ["\u00b2", "\u0663", "+80", " -1", "8" * 5000, "65536"])
@pytest.mark.parametrize("key", ["HTTP_PORT", "GRPC_PORT"])
def test_a_port_that_is_not_plain_ascii_digits_is_a_config_error_naming_the_key(key, raw):
    with pytest.raises(ConfigError) as info:
        NodeConfig.load(None, environ={f"PROTOMOLT_NODE_{key}": raw, "PROTOMOLT_ROLES": "registry"})
    message = str(info.value)
    assert message.startswith(f"node.{key.lower()} (PROTOMOLT_NODE_{key}) must be a port number")
    assert len(message) < 300


def test_plain_ports_still_load():
    config = NodeConfig.load(
        None, environ={"PROTOMOLT_NODE_HTTP_PORT": " 8082 ", "PROTOMOLT_ROLES": "registry"}
    )
    assert config.http_port == 8082


@pytest.mark.parametrize(("first", "second"), [("jobs", "JOBS"), ("Node", "node")])
def test_one_section_twice_in_different_case_is_a_config_error(tmp_path, first, second):
    path = tmp_path / "protomolt.toml"
    path.write_text(f"[{first}]\n\n[{second}]\n")
    with pytest.raises(ConfigError, match=rf"has both \[{first}\] and \[{second}\]"):
        NodeConfig.load(path, environ={})


def test_the_host_asks_the_role_module_for_what_only_the_role_knows():
    # The generic host names no jobs key: the alias, the database key, the notes and the
    # extra processes come from the role module's hooks.
    import inspect

    from protomolt_jobs.host import nodeconfig
    from protomolt_jobs.role import protomolt_role_module

    assert not hasattr(NodeConfig, "jobs_config")
    source = inspect.getsource(nodeconfig)
    assert "PROTOMOLT_JOBS_KAFKA" not in source and "kafka_bootstrap" not in source
    module = nodeconfig.role_modules()["jobs"]
    assert type(module) is type(protomolt_role_module())
    assert module.env_aliases == {"PROTOMOLT_JOBS_KAFKA": "kafka_bootstrap"}
    assert module.database_setting == "dsn"
    assert module.startup_notes({"dsn": "postgresql://x/y", "kafka_bootstrap": "k:1"}) == []
    assert "Kafka lanes are off" in module.startup_notes({"dsn": "postgresql://x/y"})[0]
    env = {"PROTOMOLT_ROLES": "jobs", "PROTOMOLT_JOBS_DSN": "postgresql://x/y"}
    config = NodeConfig.load(None, environ={**env, "PROTOMOLT_JOBS_KAFKA": "a:1"})
    assert config.section("jobs")["kafka_bootstrap"] == "a:1"
