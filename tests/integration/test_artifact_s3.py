"""The ``s3`` extra against a local S3-compatible server (moto's, on loopback): the
``ArtifactStore`` contract, and a node whose plugin answers ``protomolt_artifact_store`` uses it
for the jobs role instead of its file store."""

from __future__ import annotations

import boto3
import pytest
from moto.server import ThreadedMotoServer

import protomolt_jobs.role as jobs_module
from protomolt_jobs.host.composer import compose
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.runs.artifact_store import FileArtifactStore
from protomolt_jobs.runs.s3_store import S3ArtifactStore, S3ArtifactStorePlugin
from tests.support.roles import MemoryRepository, fresh_plugin_manager, registry_plugin

CREDENTIALS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "test",
    "aws_secret_access_key": "test",
}


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, **CREDENTIALS).create_bucket(Bucket="reports")
    yield url
    server.stop()


def test_the_s3_store_keeps_the_artifact_store_contract(endpoint):
    store = S3ArtifactStore("reports", prefix="pmj/", endpoint_url=endpoint, **CREDENTIALS)
    assert store.put("2026-11/draft.md", b"# draft") == "artifact://2026-11/draft.md"
    assert store.exists("2026-11/draft.md")
    assert store.get("2026-11/draft.md") == b"# draft"
    raw = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
    assert raw.get_object(Bucket="reports", Key="pmj/2026-11/draft.md")["Body"].read() == (
        b"# draft"
    )
    assert store.delete("2026-11/draft.md") is True
    # a key already gone: None, False, and deleting it again is no error (counts as pruned)
    assert store.get("2026-11/draft.md") is None
    assert store.exists("2026-11/draft.md") is False
    assert store.delete("2026-11/draft.md") is False
    with pytest.raises(ValueError):
        store.put("../escape", b"x")


def test_a_plugin_store_replaces_the_file_store_of_the_jobs_role(endpoint, tmp_path):
    env = {"PROTOMOLT_ROLES": "registry,jobs", "PROTOMOLT_NODE_DATA_DIR": str(tmp_path)}
    plugin = S3ArtifactStorePlugin("reports", endpoint_url=endpoint, **CREDENTIALS)
    node = compose(
        NodeConfig.load(None, environ=env),
        plugin_manager=fresh_plugin_manager(),
        extra_plugins=[registry_plugin(MemoryRepository()), jobs_module, plugin],
    )
    try:
        assert isinstance(node.mount("jobs").artifact_store, S3ArtifactStore)
    finally:
        node.close()
    plain = compose(
        NodeConfig.load(None, environ=env),
        plugin_manager=fresh_plugin_manager(),
        extra_plugins=[registry_plugin(MemoryRepository()), jobs_module],
    )
    try:
        store = plain.mount("jobs").artifact_store
        assert isinstance(store, FileArtifactStore)
        assert store.root == tmp_path / "jobs" / "artifacts"
    finally:
        plain.close()
