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
