"""Node configuration: TOML, environment overrides, aliases, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.host.nodeconfig import DEFAULT_ROLES, NodeConfig


def write(tmp_path, text):
    path = tmp_path / "protomolt.toml"
    path.write_text(text)
    return path


def test_defaults_without_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = NodeConfig.load(None, environ={})
    assert cfg.roles == list(DEFAULT_ROLES)
    assert cfg.data_dir == (tmp_path / ".protomolt-data").resolve()
    assert (cfg.http_host, cfg.http_port, cfg.grpc_host, cfg.grpc_port) == (
        "127.0.0.1",
        8081,
        "127.0.0.1",
        9090,
    )
    assert cfg.api_token is None
    assert JobsConfig.from_mapping(cfg.section("jobs")).dsn is None


def test_file_values(tmp_path):
    path = write(
        tmp_path,
        """
[node]
roles = ["Registry", " jobs "]
data_dir = "data"
http_port = 0
grpc_host = "0.0.0.0"
api_token = "s3cret"

[jobs]
dsn = "postgresql://postgres@127.0.0.1/x"
worker_count = 4
lease_seconds = 30

[registry]
anything = "goes"
""",
    )
    cfg = NodeConfig.load(path, environ={})
    assert cfg.roles == ["registry", "jobs"]
    assert cfg.data_dir == tmp_path / "data"
    assert cfg.http_port == 0 and cfg.grpc_host == "0.0.0.0" and cfg.api_token == "s3cret"
    jobs = JobsConfig.from_mapping(cfg.section("jobs"))
    assert (jobs.dsn, jobs.worker_count, jobs.lease_seconds) == (
        "postgresql://postgres@127.0.0.1/x",
        4,
        30.0,
    )
    assert cfg.section("registry") == {"anything": "goes"}
    assert cfg.source == path


def test_environment_overrides(tmp_path):
    path = write(tmp_path, '[node]\nroles = ["registry"]\n[jobs]\nworker_count = 4\n')
    env = {
        "PROTOMOLT_ROLES": "registry, JOBS",
        "PROTOMOLT_JOBS_DSN": "postgresql://db/x",
        "PROTOMOLT_JOBS_WORKER_COUNT": "7",
        "PROTOMOLT_JOBS_KAFKA": "127.0.0.1:9092",
        "PROTOMOLT_NODE_HTTP_PORT": "18081",
        "PROTOMOLT_API_TOKEN": "tok",
        "PROTOMOLT_TEST_DSN": "ignored",
    }
    cfg = NodeConfig.load(path, environ=env)
    assert cfg.roles == ["registry", "jobs"]
    assert cfg.http_port == 18081 and cfg.api_token == "tok"
    jobs = JobsConfig.from_mapping(cfg.section("jobs"))
    assert jobs.dsn == "postgresql://db/x"
    assert jobs.worker_count == 7
    assert jobs.kafka_bootstrap == "127.0.0.1:9092"
    assert cfg.origin("jobs", "worker_count") == "PROTOMOLT_JOBS_WORKER_COUNT"


def test_canonical_variable_beats_alias(tmp_path):
    env = {
        "PROTOMOLT_ROLES": "jobs",
        "PROTOMOLT_JOBS_DSN": "postgresql://db/x",
        "PROTOMOLT_JOBS_KAFKA": "alias:1",
        "PROTOMOLT_JOBS_KAFKA_BOOTSTRAP": "canonical:1",
        "PROTOMOLT_API_TOKEN": "alias",
        "PROTOMOLT_NODE_API_TOKEN": "canonical",
    }
    cfg = NodeConfig.load(None, environ=env)
    assert JobsConfig.from_mapping(cfg.section("jobs")).kafka_bootstrap == "canonical:1"
    assert cfg.api_token == "canonical"


def test_other_role_sections_get_overrides(tmp_path):
    path = write(tmp_path, '[node]\nroles = ["registry"]\n[registry]\nroot = "a"\n')
    cfg = NodeConfig.load(path, environ={"PROTOMOLT_REGISTRY_ROOT": "b"})
    assert cfg.section("registry") == {"root": "b"}


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ('[node]\nroles = "x"\nbogus = 1\n', {}, "unknown key node.bogus"),
        ("[node]\nroles = 3\n", {}, "node.roles"),
        ('[node]\nroles = ["jobs", "JOBS"]\n', {}, "names the jobs role twice"),
        ('[node]\nroles = [" "]\n', {}, "node.roles"),
        ("[node]\nhttp_port = 70000\n", {}, "node.http_port"),
        ('[node]\ngrpc_port = "x"\n', {}, "node.grpc_port"),
        ("[node]\nhttp_host = ''\n", {}, "node.http_host"),
        ("[node]\ndata_dir = 5\n", {}, "node.data_dir"),
        ("[node]\napi_token = 5\n", {}, "node.api_token"),
        ("roles = 1\n", {}, "top-level key 'roles'"),
        ("[node\n", {}, "not valid TOML"),
        ('[node]\nroles = ["jobs"]\n[jobs]\nworker_count = 0\n', {}, "jobs.worker_count"),
        ('[node]\nroles = ["jobs"]\n[jobs]\nnope = 1\n', {}, "unknown key jobs.nope"),
        (
            '[node]\nroles = ["jobs"]\n',
            {"PROTOMOLT_JOBS_LEASE_SECONDS": "soon"},
            "jobs.lease_seconds",
        ),
        ('[node]\nroles = ["jobs"]\n', {"PROTOMOLT_JOBS_KAFKA": "k:1"}, "jobs.kafka_bootstrap"),
        ("[node]\n", {"PROTOMOLT_NODE_HTTP_PORT": "-1"}, "PROTOMOLT_NODE_HTTP_PORT"),
    ],
)
def test_errors_name_the_key(tmp_path, text, env, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        NodeConfig.load(write(tmp_path, text), environ=env)


def test_env_error_names_the_variable(tmp_path):
    with pytest.raises(
        ConfigError, match=r"jobs.worker_count .*\(from PROTOMOLT_JOBS_WORKER_COUNT\)"
    ):
        NodeConfig.load(
            None, environ={"PROTOMOLT_ROLES": "jobs", "PROTOMOLT_JOBS_WORKER_COUNT": "x"}
        )


def test_jobs_config_demanded_only_when_mounted(tmp_path):
    path = write(tmp_path, '[node]\nroles = ["registry"]\n[jobs]\nworker_count = "nonsense"\n')
    cfg = NodeConfig.load(path, environ={})
    assert cfg.roles == ["registry"]


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        NodeConfig.load(tmp_path / "nope.toml", environ={})


def test_env_data_dir_relative_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "[node]\n")
    cfg = NodeConfig.load(path, environ={"PROTOMOLT_NODE_DATA_DIR": "rel"})
    assert cfg.data_dir == Path.cwd() / "rel"


def test_mounted_role_without_a_table_still_gets_overrides():
    cfg = NodeConfig.load(
        None,
        environ={
            "PROTOMOLT_ROLES": "registry,parse-text,parse",
            "PROTOMOLT_REGISTRY_ROOT": "/srv/wf",
            "PROTOMOLT_PARSE_TEXT_LIMIT": "5",
            "PROTOMOLT_PARSE_LIMIT": "6",
            "PROTOMOLT_OTHER_THING": "ignored",
        },
    )
    assert cfg.section("registry") == {"root": "/srv/wf"}
    assert cfg.section("parse-text") == {"limit": "5"}
    assert cfg.section("parse") == {"limit": "6"}
    assert cfg.section("other") == {}


def test_metrics_public_and_otlp_endpoint(tmp_path):
    cfg = NodeConfig.load(None, environ={"PROTOMOLT_ROLES": "registry"})
    assert cfg.metrics_public is False and cfg.otlp_endpoint is None
    path = write(
        tmp_path,
        '[node]\nroles = ["registry"]\nmetrics_public = true\notlp_endpoint = "http://c:4317"\n',
    )
    cfg = NodeConfig.load(path, environ={})
    assert cfg.metrics_public is True and cfg.otlp_endpoint == "http://c:4317"
    env = {
        "PROTOMOLT_ROLES": "registry",
        "PROTOMOLT_NODE_METRICS_PUBLIC": "false",
        "PROTOMOLT_NODE_OTLP_ENDPOINT": " ",
    }
    cfg = NodeConfig.load(path, environ=env)
    assert cfg.metrics_public is False and cfg.otlp_endpoint is None


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("METRICS_PUBLIC", "maybe", "node.metrics_public .* must be true or false"),
        ("OTLP_ENDPOINT", "collector:4317", "node.otlp_endpoint .* http:// or https:// URL"),
    ],
)
def test_bad_metrics_public_or_otlp_endpoint_names_the_key(key, value, expected):
    env = {"PROTOMOLT_ROLES": "registry", f"PROTOMOLT_NODE_{key}": value}
    with pytest.raises(ConfigError, match=expected):
        NodeConfig.load(None, environ=env)
