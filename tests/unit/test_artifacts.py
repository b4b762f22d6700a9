"""workflow/artifacts.py and runs/artifacts.py without a store: the verifier's findings on the
artifact keys, the publication checks, port records, ids, and reading old and new entries."""

from __future__ import annotations

import hashlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from protomolt_jobs.runs.artifact_store import FileArtifactStore, key_of, uri_of
from protomolt_jobs.runs.artifacts import RunArtifacts
from protomolt_jobs.workflow import Runtime
from protomolt_jobs.workflow import artifacts as wa
from protomolt_jobs.workflow.envelope import parse_workflow
from protomolt_jobs.workflow.types import FailureKind, WorkflowExecutionError
from protomolt_jobs.workflow.verifier import verify
from tests.support.graphs import graph, step

T = "127.0.0.1:9"
JOB = "3f2b8c4e-1d2a-4b5c-9e8f-0a1b2c3d4e5f"


def _compiled(steps: list[dict[str, Any]]):
    return parse_workflow(graph(steps, name="w"), Runtime())


def _publication(**consume: Any):
    return _compiled(
        [
            step("gen", T, outputs={"draft": {"uri": "response.step", "sha256": "response.step"}}),
            step("check", T, reads=["gen"], validates=["gen.draft"]),
            {
                "name": "review",
                "completion": "approval",
                "approval": {"approvers": {"principals": ["c"]}},
            },
            step("publish", T, reads=["gen"], consumes={"gen.draft": consume}),
        ]
    )


def _gen(sha: str = "a" * 64, uri: str = "artifact://r/draft.md") -> dict[str, Any]:
    return {
        "name": "gen",
        "response": {"step": "gen"},
        "sha256": "1" * 64,
        "artifacts": [{"port": "draft", "kind": "file", "uri": uri, "sha256": sha}],
    }


def _check() -> dict[str, Any]:
    return {"name": "check", "response": {"step": "check"}, "sha256": "2" * 64}


def _review(seen: dict[str, str]) -> dict[str, Any]:
    return {"name": "review", "decision": "accept", "response": {}, "seenArtifacts": seen}


def _fails(fn, kind=FailureKind.ARTIFACT) -> str:
    with pytest.raises(WorkflowExecutionError) as info:
        fn()
    assert info.value.kind is kind
    assert not info.value.retryable
    return info.value.message


# -- the verifier -----------------------------------------------------------------------------


def test_the_verifier_names_the_path_of_each_bad_artifact_key():
    wf = _compiled(
        [
            step("gen", T, outputs={"draft": {"uri": "response.step"}, "response": "x"}),
            step("check", T, validates=["gen.nope", "ghost"]),
            step("send", T, receipt="response.step"),
            step("publish", T, consumes={"gen.draft": {"state": "shiny", "approvedBy": "gen"}}),
        ]
    )
    found = [(f.step, f.error) for f in verify(wf) if f.kind == "artifact"]
    assert found == [
        ("gen", "steps[0].outputs.draft.sha256 must be a CEL string"),
        ("gen", "steps[0].outputs.response: 'response' is reserved"),
        ("gen", "steps[0].outputs.response must be an object"),
        ("check", "steps[1].validates[0]: 'gen.nope' names no step or port"),
        ("check", "steps[1].validates[1]: 'ghost' names no step or port"),
        (
            "send",
            'steps[2].receipt needs effect: "external" (a receipt proves an external effect)',
        ),
        ("publish", "steps[3].consumes.gen.draft.state must be verified or promoted"),
        ("publish", "steps[3].consumes.gen.draft.approvedBy names no approval step"),
    ]


def test_the_verifier_checks_the_cel_of_ports_and_receipts_and_the_order_of_references():
    """A port or receipt expression that cannot compile, or reads a field the response does not
    have, would fail the step only after its call (an external effect already made): the
    verifier names it. So does a non-text media type, and a step that validates or consumes
    an artifact of a step that does not run before it."""
    wf = _compiled(
        [
            step(
                "gen",
                T,
                outputs={
                    "draft": {"uri": "response.((", "sha256": "response.nope", "mediaType": 5},
                    "ok": {"uri": "response.step", "sha256": "response.step"},
                },
                validates=["check"],
            ),
            {**step("send", T, receipt="response.)"), "effect": "external"},
            step("check", T, validates=["gen.ok"]),
            step("publish", T, consumes={"gen.ok": {"state": "verified"}, "late": {}}),
            step("late", T),
        ]
    )
    found = [(f.step, f.error) for f in verify(wf) if f.kind == "artifact"]
    by_step: dict[str, list[str]] = {}
    for name, error in found:
        by_step.setdefault(name, []).append(error)
    gen = by_step["gen"]
    assert any(e.startswith("steps[0].outputs.draft.uri: ") for e in gen), gen
    assert any(e.startswith("steps[0].outputs.draft.sha256: ") and "nope" in e for e in gen), gen
    assert "steps[0].outputs.draft.mediaType must be a string" in gen, gen
    assert "steps[0].validates[0]: 'check' does not run before 'gen'" in gen, gen
    assert not any("outputs.ok" in e for e in gen), gen
    assert any(e.startswith("steps[1].receipt: ") for e in by_step["send"]), by_step
    assert "check" not in by_step, by_step
    assert by_step["publish"] == ["steps[3].consumes.late: 'late' does not run before 'publish'"]


def test_a_workflow_without_artifact_keys_has_no_spec_and_no_findings():
    wf = _compiled([step("a", T), step("b", T, reads=["a"])])
    assert wa.spec(wf) == {}
    assert [f for f in verify(wf) if f.kind == "artifact"] == []


def test_the_verifier_refuses_artifact_keys_on_compensations_and_consumes_on_external_steps():
    """A compensation's entry is its response artifact only (the cancel path's job_compensate
    writes no rows), and an external step's answer is never checked before it arrives: the
    keys that would be silently dropped there are findings naming their path."""
    wf = _compiled(
        [
            step("gen", T, outputs={"d": {"uri": "response.step", "sha256": "response.step"}}),
            step("reserve", T, compensate="release"),
            step(
                "release",
                T,
                outputs={"x": {"uri": "response.step", "sha256": "response.step"}},
                validates=["gen"],
            ),
            {**step("ok", T, consumes={"gen.d": {"state": "verified"}}), "completion": "external"},
        ]
    )
    found = [(f.step, f.error.split(":")[0]) for f in verify(wf) if f.kind == "artifact"]
    assert ("release", "steps[2].outputs") in found, found
    assert ("release", "steps[2].validates") in found, found
    assert ("ok", "steps[3].consumes") in found, found
    assert not [f for f in found if f[0] in ("gen", "reserve")], found


def test_the_verifier_refuses_consumes_on_edge_and_structured_steps():
    """A graph run checks ``consumes`` only before a plain step's call; an edge or structured
    step that declared it would succeed unchecked, and its success counts as the artifact's
    promotion for every later publication: the key is a finding naming its path."""
    edge = {"sources": ["gen"], "produceType": "jobs.test.StepRequest", "rules": []}
    structured = {"targetType": "jobs.test.StepReply", "model": "m"}
    wf = _compiled(
        [
            step("gen", T),
            step("check", T, validates=["gen"]),
            {**step("e", T, consumes={"gen": {"state": "verified"}}), "edge": edge},
            {
                "name": "s",
                "structured": structured,
                "after": ["check"],
                "consumes": {"gen": {"state": "verified"}},
            },
            step("publish", T, consumes={"gen": {"state": "verified"}}, after=["check"]),
        ]
    )
    found = {f.step: f.error for f in verify(wf) if f.kind == "artifact"}
    assert found == {
        "e": "steps[2].consumes: 'e' is an edge step: the consumed artifacts are checked only "
        "before a plain call step's call; publish from a call step",
        "s": "steps[3].consumes: 's' is a structured step: the consumed artifacts are checked "
        "only before a plain call step's call; publish from a call step",
    }


# -- publication checks -----------------------------------------------------------------------


def test_publication_passes_with_the_approved_hash_and_says_what_it_consumed():
    wf = _publication(state="verified", approvedBy="review")
    publish = wf.step("publish")
    entries = [_gen(), _check(), _review({"gen.draft": "a" * 64})]
    assert wa.check_consumed(wf, publish, entries) == [
        {
            "ref": "gen.draft",
            "step": "gen",
            "iteration": 0,
            "port": "draft",
            "kind": "file",
            "attempt": 0,
            "sha256": "a" * 64,
        }
    ]


def test_publication_refuses_a_hash_the_approvers_did_not_see():
    wf = _publication(state="verified", approvedBy="review")
    entries = [_gen(), _check(), _review({"gen.draft": "b" * 64})]
    message = _fails(lambda: wa.check_consumed(wf, wf.step("publish"), entries))
    assert message == (
        "consumed artifact 'gen.draft' is aaaaaaaaaaaa, but approval 'review' saw bbbbbbbbbbbb: "
        "refusing to publish what was not approved"
    )


def test_publication_refuses_an_unverified_or_unreviewed_or_missing_artifact():
    wf = _publication(state="verified", approvedBy="review")
    publish = wf.step("publish")
    assert "is draft; 'publish' needs it verified" in _fails(
        lambda: wa.check_consumed(wf, publish, [_gen(), _review({"gen.draft": "a" * 64})])
    )
    assert "has no hash recorded by approval 'review'" in _fails(
        lambda: wa.check_consumed(wf, publish, [_gen(), _check(), _review({})])
    )
    assert "does not exist" in _fails(lambda: wa.check_consumed(wf, publish, []))


def test_publication_accepts_an_artifact_an_operator_promoted():
    """``promote-artifact`` writes a ``promoted`` row: a publication step that needs the
    artifact promoted accepts it (the row wins over the state derived from the entries)."""
    wf = _publication(state="promoted")
    publish = wf.step("publish")
    entries = [_gen(), _check()]
    assert "is verified; 'publish' needs it promoted" in _fails(
        lambda: wa.check_consumed(wf, publish, entries, rows=dict, job_id=JOB)
    )
    aid = wa.artifact_id(JOB, "gen", 0, "draft", 0, "a" * 64)
    done = wa.check_consumed(wf, publish, entries, rows=lambda: {aid: "promoted"}, job_id=JOB)
    assert [c["ref"] for c in done] == ["gen.draft"]


def test_publication_hashes_stored_bytes_again(tmp_path):
    store = FileArtifactStore(tmp_path)
    data = b"the reviewed draft"
    uri = store.put("r/draft.md", data)
    sha = hashlib.sha256(data).hexdigest()
    wf = _publication(state="verified")
    publish = wf.step("publish")

    def read(u: str) -> bytes | None:
        key = key_of(u)
        if key is None:
            raise ValueError(u)
        return store.get(key)

    entries = [_gen(sha, uri), _check()]
    assert wa.check_consumed(wf, publish, entries, read)[0]["sha256"] == sha
    store.put("r/draft.md", b"edited after the review")
    assert "not the" in _fails(lambda: wa.check_consumed(wf, publish, entries, read))
    store.delete("r/draft.md")
    assert "are missing" in _fails(lambda: wa.check_consumed(wf, publish, entries, read))
    # a uri that is not the store's is not re-hashed
    other = [_gen(sha, "https://elsewhere.example/draft.md"), _check()]
    assert wa.check_consumed(wf, publish, other, read)[0]["sha256"] == sha


# -- ports, receipts, ids --------------------------------------------------------------------


def test_ports_are_read_from_the_response_and_an_empty_one_fails_the_step():
    from tests.support.grpc_servers import message_class

    wf = _compiled(
        [
            step(
                "gen",
                T,
                outputs={
                    "b": {"uri": "'artifact://x/' + response.step", "sha256": "response.step"},
                    "a": {"uri": "response.step", "sha256": "response.step", "mediaType": "t/x"},
                },
            )
        ]
    )
    reply = message_class("jobs.test.StepReply")(step="gen")
    assert wa.port_records(wf, wf.step("gen"), reply) == [
        {"port": "a", "kind": "file", "uri": "gen", "sha256": "gen", "mediaType": "t/x"},
        {"port": "b", "kind": "file", "uri": "artifact://x/gen", "sha256": "gen"},
    ]
    message = _fails(
        lambda: wa.port_records(wf, wf.step("gen"), message_class("jobs.test.StepReply")())
    )
    assert message == "output port 'a' of step 'gen' has no uri in the response"


def test_an_external_step_without_its_receipt_fails_receipt():
    from tests.support.grpc_servers import message_class

    wf = _compiled([step("send", T, effect="external", receipt="response.step")])
    send = wf.step("send")
    reply = message_class("jobs.test.StepReply")
    assert wa.receipt_value(wf, send, reply(step="msg-1")) == "msg-1"
    assert _fails(lambda: wa.receipt_value(wf, send, reply()), FailureKind.RECEIPT) == (
        "effect 'send' has no receipt (response.step is empty): the run does not complete"
    )


def test_artifact_ids_carry_the_run_and_change_with_attempt_and_content():
    a = wa.artifact_id(JOB, "s", 0, "response", 1, "a" * 64)
    assert a == wa.artifact_id(JOB, "s", 0, "response", 1, "a" * 64)
    assert uuid.UUID(a).hex[:16] == uuid.UUID(JOB).hex[:16] == wa.job_prefix(a)
    assert a != wa.artifact_id(JOB, "s", 0, "response", 2, "a" * 64)
    assert a != wa.artifact_id(JOB, "s", 0, "response", 1, "b" * 64)
    assert a != wa.artifact_id(JOB, "s", 1, "response", 1, "a" * 64)


def test_the_file_store_refuses_keys_outside_it_and_deleting_twice_is_fine(tmp_path):
    store = FileArtifactStore(tmp_path / "s")
    assert store.put("a/b.txt", b"x") == uri_of("a/b.txt") == "artifact://a/b.txt"
    assert store.exists("a/b.txt") and store.get("a/b.txt") == b"x"
    assert store.delete("a/b.txt") is True and store.delete("a/b.txt") is False
    assert store.get("a/b.txt") is None
    for bad in ("../x", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            store.put(bad, b"x")
    assert key_of("https://x/y") is None and key_of("artifact://../x") is None


# -- reading entries ---------------------------------------------------------------------------


def _job(checkpoints: list[Any], status: str = "COMPLETED") -> Any:
    return SimpleNamespace(job_id=uuid.UUID(JOB), status=status, checkpoints=checkpoints)


def test_entries_stored_before_artifacts_still_read():
    old = [
        {"name": "a", "skipped": False, "response": {"x": 1}},
        {"name": "b", "skipped": True},
        {"name": "c", "skipped": False, "failed": {"kind": "GRPC", "message": "down"}},
        "not an entry",
    ]
    arts = RunArtifacts(_job(old)).summaries()
    assert [(a["step"], a["sha256"], a["stale"], a["inputs"]) for a in arts] == [
        ("a", None, False, [])
    ]


def test_staleness_follows_current_inputs_transitively():
    def entry(name, sha, inputs=(), attempt=1):
        return {
            "name": name,
            "response": {},
            "sha256": sha,
            "attempt": attempt,
            "inputs": [{"step": s, "iteration": 0, "sha256": h} for s, h in inputs],
        }

    entries = [
        entry("a", "a1"),
        entry("b", "b1", [("a", "a1")]),
        entry("c", "c1", [("b", "b1")]),
        entry("a", "a2", attempt=2),  # a ran again with another output; b and c did not
    ]
    found = RunArtifacts(_job(entries))
    stale = {(a["step"], a["sha256"]): (a["stale"], a["current"]) for a in found.summaries()}
    assert stale == {
        ("a", "a1"): (False, False),
        ("b", "b1"): (True, True),
        ("c", "c1"): (True, True),  # its input b is current but stale itself
        ("a", "a2"): (False, True),
    }


def test_an_entry_without_artifact_keys_asks_for_no_rows():
    from protomolt_jobs.store.artifact_rows import artifact_rows, has_artifact_rows

    plain = {"name": "a", "response": {}, "sha256": "1" * 64, "receipt": {"idempotencyKey": "k"}}
    assert not has_artifact_rows(plain) and artifact_rows(plain, JOB) == []
    asks = {
        **_gen(),
        "attempt": 2,
        "validated": [
            {"step": "imp", "iteration": 0, "port": "response", "kind": "response",
             "attempt": 1, "sha256": "3" * 64}
        ],
    }  # fmt: skip
    assert has_artifact_rows(asks)
    rows = artifact_rows(asks, JOB)
    assert [(r["step"], r["port"], r["state"], r["attempt"]) for r in rows] == [
        ("gen", "draft", "draft", 2),
        ("imp", "response", "verified", 1),
    ]
    # each row carries the id the engine and the read verbs give that artifact
    assert [r["artifactId"] for r in rows] == [
        wa.artifact_id(JOB, r["step"], r["iteration"], r["port"], r["attempt"], r["sha256"])
        for r in rows
    ]


def test_the_file_store_never_follows_a_symlink_out_of_its_root(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    store = FileArtifactStore(tmp_path / "s")
    store.put("ok/a", b"x")
    (tmp_path / "s" / "link").symlink_to(outside, target_is_directory=True)
    (tmp_path / "s" / "ok" / "file-link").symlink_to(outside / "secret")
    for key in ("link/secret", "ok/file-link"):
        with pytest.raises(ValueError, match="outside"):
            store.get(key)
        with pytest.raises(ValueError, match="outside"):
            store.exists(key)
        with pytest.raises(ValueError, match="outside"):
            store.put(key, b"overwrite")
        with pytest.raises(ValueError, match="outside"):
            store.delete(key)
    with pytest.raises(ValueError, match="outside"):
        store.put("link/new", b"planted")
    assert (outside / "secret").read_bytes() == b"not yours"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert store.get("ok/a") == b"x"


def test_publication_refuses_store_bytes_it_cannot_read_again(tmp_path):
    """An ``artifact://`` uri the store refuses (a malformed key, a link out of its root) is
    not skipped as someone else's uri: what cannot be re-hashed is not published."""
    outside = tmp_path / "outside"
    outside.mkdir()
    data = b"the reviewed draft"
    (outside / "draft.md").write_bytes(data)
    store = FileArtifactStore(tmp_path / "s")
    store.put("r/x", b"x")
    (tmp_path / "s" / "link").symlink_to(outside, target_is_directory=True)
    sha = hashlib.sha256(data).hexdigest()
    wf = _publication(state="verified")
    publish = wf.step("publish")

    def read(u: str) -> bytes | None:
        key = key_of(u)
        if key is None:
            raise ValueError(u)
        return store.get(key)

    for uri in ("artifact://link/draft.md", "artifact://../outside/draft.md"):
        entries = [_gen(sha, uri), _check()]
        message = _fails(lambda entries=entries: wa.check_consumed(wf, publish, entries, read))
        assert "cannot be read again" in message and uri in message


def test_the_engine_knows_the_store_scheme():
    from protomolt_jobs.runs.artifact_store import SCHEME

    assert wa.STORE_SCHEME == SCHEME


def test_the_pruner_forgets_a_key_the_store_refuses_and_deletes_nothing_outside(tmp_path):
    from protomolt_jobs.maintenance.pruner import Pruner
    from tests.support.worker_proc import jobs_config

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"not the store's")
    store = FileArtifactStore(tmp_path / "s")
    store.put("r/gone.txt", b"x")
    (tmp_path / "s" / "link").symlink_to(outside, target_is_directory=True)

    queued = ["artifact://link/keep.txt", "artifact://r/gone.txt"]

    class Rows:
        def __init__(self) -> None:
            self.queued = list(queued)
            self.forgotten: list[str] = []

        def artifact_bytes_doomed(self, limit: int) -> list[tuple[str, bool]]:
            return [(u, False) for u in self.queued if u not in self.forgotten]

        def artifact_bytes_forget(self, uris: list[str]) -> int:
            self.forgotten.extend(uris)
            return len(uris)

    rows = Rows()
    pruner = Pruner(rows, config=jobs_config("postgresql://unused/x"), artifact_store=store)
    assert pruner._prune_bytes() == (1, 1)  # deleted r/gone.txt; the link's key: not ours
    assert sorted(rows.forgotten) == sorted(queued)  # neither waits for another pass
    assert (outside / "keep.txt").read_bytes() == b"not the store's"
    assert store.get("r/gone.txt") is None
