"""The jobs role without a database: wiring, contributions, the unavailable verbs."""

from __future__ import annotations

import logging

import pytest

import protomolt_jobs.role as jobs_module
from protomolt_jobs.errors import Unavailable
from protomolt_jobs.hooks import ComposerError, RoleModule
from protomolt_jobs.host.composer import compose
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.verbs import NOT_CONFIGURED
from tests.support.roles import MemoryRepository, fresh_plugin_manager, registry_plugin

VERBS = [
    "submit-workflow",
    "get-job",
    "list-jobs",
    "complete-step",
    "cancel-job",
    "pause-job",
    "resume-job",
    "retry-step",
    "reconcile-step",
    "migrate-checkpoint",
    "requeue-job",
    "job-history",
    "approve-step",
    "extend-loop",
    "report-progress",
    "explain-job",
    "supply-input",
    "list-artifacts",
    "get-artifact",
    "lineage",
    "retract-artifact",
    "promote-artifact",
]


def node_for(tmp_path, roles, environ=None):
    env = {"PROTOMOLT_ROLES": ",".join(roles), "PROTOMOLT_NODE_DATA_DIR": str(tmp_path)}
    env.update(environ or {})
    return compose(
        NodeConfig.load(None, environ=env),
        plugin_manager=fresh_plugin_manager(),
        extra_plugins=[registry_plugin(MemoryRepository()), jobs_module],
    )


def test_the_hookimpl_returns_the_jobs_role():
    module = jobs_module.protomolt_role_module()
    assert isinstance(module, RoleModule)
    assert module.role == "jobs"
    assert module.requires == frozenset({"registry"})


def test_jobs_without_a_registry_fails_with_the_exact_message(tmp_path):
    with pytest.raises(ComposerError) as info:
        node_for(tmp_path, ["jobs"])
    assert str(info.value) == (
        "jobs requires a co-mounted registry contributing a WorkflowRepository"
    )


def test_registry_is_wired_first_and_six_actions_are_contributed(tmp_path):
    node = node_for(tmp_path, ["jobs", "registry"])
    try:
        assert node.roles == ["registry", "jobs"]
        assert node.catalog.names() == [
            *VERBS,
            "run-workflow",
            "check-workflow",
            "replay-check",
            "test-workflow",
            "get-workflow",
        ]
        scopes = {m["name"]: m["scope"] for m in node.catalog.manifest()}
        assert scopes["replay-check"] == "workflow-write"
        assert scopes["submit-workflow"] == "workflow-run"
        assert scopes["get-job"] == scopes["list-jobs"] == "service-invoke"
        assert scopes["complete-step"] == "job-complete"
        for entry in node.catalog.manifest():
            assert entry["description"]
            assert entry["inputSchema"]["type"] == "object"
    finally:
        node.close()


@pytest.mark.parametrize("verb", VERBS)
def test_unconfigured_verbs_answer_unavailable(tmp_path, verb, caplog):
    node = node_for(tmp_path, ["registry", "jobs"])
    with caplog.at_level(logging.INFO, logger="protomolt_jobs.jobs_role"):
        node.start()
    try:
        assert any(getattr(r, "action", None) == "jobs_unconfigured" for r in caplog.records)
        with pytest.raises(Unavailable) as info:
            node.catalog.execute(verb, {"anything": 1})
        assert info.value.message == NOT_CONFIGURED
        assert info.value.message == (
            "workflow runs are not configured on this node "
            "(set jobs.dsn in protomolt.toml or PROTOMOLT_JOBS_DSN)"
        )
        assert info.value.code == "unavailable"
    finally:
        node.close()


def test_check_workflow_works_without_a_database(tmp_path):
    node = node_for(tmp_path, ["registry", "jobs"])
    with node:
        answer = node.catalog.execute("check-workflow", {"workflow": {"name": "x"}})
        assert answer["ok"] is False and answer["findings"]


def test_bad_jobs_setting_fails_the_boot_naming_the_key(tmp_path):
    from protomolt_jobs.config import ConfigError

    with pytest.raises(ConfigError, match="jobs.worker_count"):
        node_for(tmp_path, ["registry", "jobs"], {"PROTOMOLT_JOBS_WORKER_COUNT": "0"})


def test_close_before_start_and_twice_is_fine(tmp_path):
    node = node_for(tmp_path, ["registry", "jobs"])
    node.close()
    node.close()


def _scope_table(path: str) -> dict[str, set[str]]:
    """``{scope: {verb or route, ...}}`` from a doc's ``| scope | grants |`` table."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / path).read_text(encoding="utf-8")
    table = text.split("| scope | grants |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[1].split("(", 1)[0])
        out[cells[0].strip("`")] = set(names)
    return out


@pytest.mark.parametrize("doc", ["docs/approvals.md", "docs/configuration.md"])
def test_the_docs_scope_tables_are_the_verbs_declared_scopes(tmp_path, doc):
    node = node_for(tmp_path, ["jobs", "registry"])
    try:
        declared: dict[str, set[str]] = {}
        for entry in node.catalog.manifest():
            declared.setdefault(entry["scope"], set()).add(entry["name"])
    finally:
        node.close()
    documented = {
        scope: {n for n in names if not n.startswith(("GET ", "PUT "))}
        for scope, names in _scope_table(doc).items()
    }
    assert {s: v for s, v in documented.items() if v} == declared
