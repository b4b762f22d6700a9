"""Authority without services: the [node.groups] / [node.scopes] tables and their errors, the
resolver (api_token, named tokens, groups, scopes, an identity hook), and the catalog's
refusal reports."""

from __future__ import annotations

import logging
import types

import pluggy
import pytest

from protomolt_jobs.config import ConfigError
from protomolt_jobs.errors import PermissionDenied
from protomolt_jobs.hooks import SCOPES, Identity, InertMount, Refusal, hookimpl, hookspecs
from protomolt_jobs.host.authority import Authority
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.host.composer import compose
from protomolt_jobs.host.nodeconfig import HTTP_HEADER_TIMEOUT_S, NodeConfig

TABLES = """
[node]
api_token = "root-secret"
[node.tokens]
viewer-1 = "viewer-secret"
editor-1 = "editor-secret"
editor-2 = "editor2-secret"
carol = "carol-secret"
[node.groups]
viewer = ["viewer-1"]
editor = ["editor-1", "editor-2"]
chief = []
[node.scopes]
viewer = ["service-invoke"]
editor = ["service-invoke", "job-control"]
carol = ["job-approve"]
"""


def load(tmp_path, text, environ=None):
    path = tmp_path / "protomolt.toml"
    path.write_text(text)
    return NodeConfig.load(path, environ=environ or {})


# -- configuration ---------------------------------------------------------------------------


def test_the_tables_load(tmp_path):
    config = load(tmp_path, TABLES)
    assert config.groups == {
        "viewer": frozenset({"viewer-1"}),
        "editor": frozenset({"editor-1", "editor-2"}),
        "chief": frozenset(),
    }
    assert config.scopes == {
        "viewer": frozenset({"service-invoke"}),
        "editor": frozenset({"service-invoke", "job-control"}),
        "carol": frozenset({"job-approve"}),
    }
    assert config.http_header_timeout_s == HTTP_HEADER_TIMEOUT_S == 10.0


def test_without_the_tables_there_are_no_groups_and_no_scopes_table(tmp_path):
    config = load(tmp_path, '[node.tokens]\nalice = "a"\n')
    assert config.groups == {} and config.scopes is None
    # Present but empty is present: everything not granted (everything) is refused.
    assert load(tmp_path, "[node.scopes]\n").scopes == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # An unknown scope name, naming it and the known ones.
        (
            '[node.tokens]\na = "x"\n[node.scopes]\na = ["job-contrl"]\n',
            "unknown scope 'job-contrl'",
        ),
        # A name both a group and a principal.
        (
            '[node.tokens]\neditor = "x"\n[node.groups]\neditor = ["editor"]\n',
            "both a group and a principal",
        ),
        # A grant to nobody the node knows (a misspelt group).
        (
            '[node.groups]\neditor = []\n[node.scopes]\neditors = ["job-control"]\n',
            "node.scopes.editors",
        ),
        # The api_token is never limited.
        ('[node.scopes]\napi = ["job-control"]\n', "holds every scope"),
        # Shapes.
        ('[node]\nscopes = "job-control"\n', "node.scopes"),
        ('[node]\ngroups = ["a"]\n', "node.groups"),
        ('[node.groups]\neditor = "alice"\n', "node.groups.editor"),
        ("[node.groups]\neditor = [1]\n", "node.groups.editor"),
        ('[node.groups]\n"Editor" = []\n', "group name"),
        ('[node.groups]\neditor = ["api"]\n', "names 'api'"),
        ("[node.groups]\nsweeper = []\n", "group name"),
        (
            '[node.groups]\neditor = []\n[node.scopes]\neditor = "job-control"\n',
            "node.scopes.editor",
        ),
        # A misspelt table under [node] is an unknown key.
        ('[node.scope]\neditor = ["job-control"]\n', "unknown key node.scope"),
        ("[node]\nhttp_header_timeout_s = 0\n", "http_header_timeout_s"),
        ('[node]\nhttp_header_timeout_s = "soon"\n', "http_header_timeout_s"),
        ("[node]\nhttp_header_timeout_s = true\n", "http_header_timeout_s"),
        ("[node]\nhttp_header_timeout_s = nan\n", "http_header_timeout_s"),
    ],
)
def test_a_bad_entry_is_a_config_error_naming_it(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load(tmp_path, text)


def test_the_header_deadline_from_the_file_and_the_environment(tmp_path):
    assert load(tmp_path, "[node]\nhttp_header_timeout_s = 2.5\n").http_header_timeout_s == 2.5
    config = load(tmp_path, "", {"PROTOMOLT_NODE_HTTP_HEADER_TIMEOUT_S": "3"})
    assert config.http_header_timeout_s == 3.0
    with pytest.raises(ConfigError, match="PROTOMOLT_NODE_HTTP_HEADER_TIMEOUT_S"):
        load(tmp_path, "", {"PROTOMOLT_NODE_HTTP_HEADER_TIMEOUT_S": "-1"})


def test_the_scope_vocabulary():
    assert {
        "workflow-run",
        "service-invoke",
        "job-complete",
        "job-control",
        "schema-read",
        "workflow-write",
        "job-approve",
        "job-input",
    } == SCOPES


# -- the resolver ------------------------------------------------------------------------------


def test_tokens_resolve_to_principals_with_their_groups_and_granted_scopes(tmp_path):
    authority = Authority.from_config(load(tmp_path, TABLES))
    assert not authority.open and authority.scoped
    api = authority.resolve("root-secret")
    assert api == Caller("api", unrestricted=True)
    viewer = authority.resolve("viewer-secret")
    assert (viewer.name, viewer.groups, viewer.scopes, viewer.unrestricted) == (
        "viewer-1",
        frozenset({"viewer"}),
        frozenset({"service-invoke"}),
        False,
    )
    assert viewer.holds("service-invoke") and not viewer.holds("job-control")
    editor = authority.resolve("  editor2-secret ")
    assert editor.name == "editor-2" and editor.holds("job-control")
    # A principal in no group gets its own grants only.
    carol = authority.resolve("carol-secret")
    assert carol.scopes == frozenset({"job-approve"}) and carol.groups == frozenset()
    for refused in (None, "", "nope", "viewer-secret-but-longer"):
        assert authority.resolve(refused) is None


def test_without_a_scopes_table_every_token_holds_every_scope_and_the_start_warns(tmp_path):
    authority = Authority.from_config(load(tmp_path, '[node.tokens]\nalice = "a"\n'))
    alice = authority.resolve("a")
    assert alice.name == "alice" and alice.unrestricted and alice.holds("job-control")
    assert [action for action, _ in authority.warnings()] == ["scopes_not_configured"]
    # The api_token alone is documented as full rights: nothing to warn about.
    assert Authority(api_token="r").warnings() == []


def test_an_open_node_is_anonymous_and_a_scopes_table_still_binds_it(tmp_path):
    open_node = Authority()
    assert open_node.open
    assert open_node.resolve(None) == Caller("anonymous", unrestricted=True)
    assert open_node.resolve("anything").name == "anonymous"
    bound = Authority.from_config(load(tmp_path, '[node.scopes]\nanonymous = ["schema-read"]\n'))
    anonymous = bound.resolve(None)
    assert anonymous.scopes == frozenset({"schema-read"}) and not anonymous.unrestricted


def test_a_group_member_no_token_names_is_warned_about(tmp_path):
    authority = Authority.from_config(
        load(tmp_path, '[node.tokens]\na = "x"\n[node.groups]\ng = ["a", "ghost"]\n[node.scopes]\n')
    )
    warnings = dict(authority.warnings())
    assert "ghost" in warnings["group_member_without_token"]


class Directory:
    """An identity provider: tokens it knows, and a broken answer on request."""

    def __init__(self):
        self.asked: list[str] = []

    @hookimpl
    def protomolt_resolve_identity(self, token):
        self.asked.append(token)
        if token == "idp-dana":
            return Identity("dana", frozenset({"editor"}))
        if token == "idp-boom":
            raise RuntimeError("provider down")
        if token == "idp-api":
            return Identity("api")
        if token == "idp-junk":
            return "dana"
        return None


def _pm(*plugins):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for p in plugins:
        pm.register(p)
    return pm


def test_an_identity_hook_names_principals_and_groups(tmp_path, caplog):
    directory = Directory()
    authority = Authority.from_config(load(tmp_path, TABLES), _pm(directory))
    dana = authority.resolve("idp-dana")
    # The hook's groups join [node.groups]; [node.scopes] grants by group.
    assert dana.name == "dana" and dana.scopes == frozenset({"service-invoke", "job-control"})
    # The node's own tables are the default when the hook does not know a token.
    assert authority.resolve("viewer-secret").name == "viewer-1"
    # The api_token is never handed to the hook.
    assert authority.resolve("root-secret").name == "api" and "root-secret" not in directory.asked
    with caplog.at_level(logging.INFO, logger="protomolt_jobs.authority"):
        assert authority.resolve("idp-boom") is None
        assert authority.resolve("idp-api") is None  # a reserved principal
        assert authority.resolve("idp-junk") is None  # not an Identity
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["identity_hook_failed", "identity_hook_invalid", "identity_hook_invalid"]
    # A node with a hook is not open, even without tokens of its own.
    hooked = Authority.from_config(load(tmp_path, ""), _pm(Directory()))
    assert not hooked.open and hooked.resolve(None) is None
    assert hooked.resolve("idp-dana").unrestricted  # no [node.scopes]: every scope


def test_the_composer_hands_the_node_the_hook_of_its_plugins(tmp_path):
    directory = Directory()
    role = types.SimpleNamespace(role="r", requires=frozenset(), wire=lambda ctx: InertMount())
    plugin = types.SimpleNamespace(protomolt_role_module=hookimpl(lambda: role))
    config = load(tmp_path, f'[node]\nroles = ["r"]\ndata_dir = "{tmp_path}"\n')
    node = compose(config, plugin_manager=_pm(plugin, directory))
    assert node.authority.resolve("idp-dana").name == "dana"
    assert not node.authority.open


# -- refusals ---------------------------------------------------------------------------------


class Verb:
    def __init__(self, name, scope):
        self.name, self.scope = name, scope
        self.description = "d"
        self.input_schema = {"type": "object"}

    def execute(self, input):
        return {"ok": True}


class Recorder:
    def __init__(self, fail=False):
        self.seen: list[Refusal] = []
        self.fail = fail

    def record_refusal(self, refusal):
        self.seen.append(refusal)
        if self.fail:
            raise RuntimeError("recorder down")


def test_a_refusal_is_reported_to_every_recorder_then_raised(caplog):
    first, broken = Recorder(), Recorder(fail=True)
    catalog = Catalog(refusal_recorders=[first, broken])
    catalog.register(Verb("cancel-job", "job-control"))
    viewer = Caller("viewer-1", frozenset({"service-invoke"}))
    with (
        caplog.at_level(logging.ERROR, logger="protomolt_jobs.catalog"),
        pytest.raises(PermissionDenied, match="it needs scope 'job-control'") as info,
    ):
        catalog.execute("cancel-job", {"jobId": "j-1", "reason": "x"}, caller=viewer)
    assert info.value.details["requiredScope"] == "job-control"
    expected = Refusal("viewer-1", "cancel-job", "job-control", "j-1")
    assert first.seen == [expected] and broken.seen == [expected]
    # The broken recorder is logged; the caller still gets permission-denied, not an error.
    assert [getattr(r, "action", None) for r in caplog.records] == ["refusal_record_failed"]
    # No jobId (or not a string): none in the report.
    with pytest.raises(PermissionDenied):
        catalog.execute("cancel-job", {"jobId": 7}, caller=viewer)
    with pytest.raises(PermissionDenied):
        catalog.execute("cancel-job", ["not", "an", "object"], caller=viewer)
    assert [r.job_id for r in first.seen[1:]] == [None, None]
    # A caller holding the scope is never reported.
    catalog.execute("cancel-job", {"jobId": "j-1"}, caller=Caller("e", frozenset({"job-control"})))
    assert len(first.seen) == 3


def test_without_recorders_a_refusal_is_logged(caplog):
    catalog = Catalog()
    with (
        caplog.at_level(logging.INFO, logger="protomolt_jobs.catalog"),
        pytest.raises(PermissionDenied),
    ):
        catalog.authorize(Caller("v"), "PUT /protomolt/workflows/x", "workflow-write")
    (record,) = [r for r in caplog.records if getattr(r, "action", None) == "permission_denied"]
    assert (record.principal, record.scope, record.job_id) == ("v", "workflow-write", None)


class FakeStore:
    def __init__(self, answer):
        self.answer = answer
        self.calls: list[tuple] = []

    def transition_record_denied(self, job_id, *, actor, reason):
        self.calls.append((job_id, actor, reason))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_jobs_role_records_refusals_naming_a_job_and_logs_the_others(caplog):
    import uuid

    from protomolt_jobs.errors import StoreUnavailable
    from protomolt_jobs.role import JobRefusals

    job = str(uuid.uuid4())
    refusal = Refusal("viewer-1", "cancel-job", "job-control", job)
    recorded = FakeStore(True)
    with caplog.at_level(logging.INFO, logger="protomolt_jobs.jobs_role"):
        JobRefusals(lambda: recorded).record_refusal(refusal)
        assert recorded.calls == [
            (uuid.UUID(job), "viewer-1", "permission-denied: cancel-job needs scope 'job-control'")
        ]
        assert caplog.records == []
        # Logged instead: no job named, not a job id, an unknown job, no store, a store down.
        JobRefusals(lambda: recorded).record_refusal(Refusal("v", "list-jobs", "service-invoke"))
        JobRefusals(lambda: recorded).record_refusal(Refusal("v", "get-job", "s", "nope"))
        JobRefusals(lambda: FakeStore(False)).record_refusal(refusal)
        JobRefusals(lambda: None).record_refusal(refusal)
        JobRefusals(lambda: FakeStore(StoreUnavailable("down"))).record_refusal(refusal)
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["permission_denied"] * 4 + ["refusal_not_recorded", "permission_denied"]


def test_a_token_that_is_not_text_matches_nothing(tmp_path):
    authority = Authority.from_config(load(tmp_path, TABLES))
    assert authority.resolve("\ud800") is None
    assert authority.resolve("viewer-secret\x00") is None
