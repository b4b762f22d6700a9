"""docs/artifacts.md's worked example, as written: the proto, the workflow and the lineage table
come from the doc (blocks marked ``<!-- artifacts-example: ... -->``); the proto is compiled
with ``grpc_tools.protoc`` and its ``Desk`` served on loopback, writing the draft and its two
attachments through a real file ``ArtifactStore``; a real Worker on real PostgreSQL runs the
workflow; the verbs answer through the host catalog as named principals.

Issue 29's acceptance played here: the publication step refuses (ARTIFACT) when the draft
differs from the reviewed one and publishes when it matches; an external send's receipt is an
artifact the report lists, and a send without one does not complete the run; cancelling during
the send (compensate: false) keeps the draft and both attachments, listed in the report;
pruning keeps the bytes of promoted and live artifacts, and a run whose byte key is already
gone is deleted all the same.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from typing import Any

import pytest

from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.maintenance.pruner import Pruner
from protomolt_jobs.runs.artifact_store import FileArtifactStore, key_of
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.guides import DOCS, LoopbackService, compile_proto, doc_blocks
from tests.support.worker_proc import jobs_config, wait_for

GUIDE = DOCS / "artifacts.md"
PROTO = "report/v1/report.proto"


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = doc_blocks(GUIDE, "artifacts-example", tables=True)
    assert set(found) == {
        f"proto {PROTO}",
        "workflow management-report",
        "lineage",
        "explain missing-input",
        "explain review",
    }
    return found


@pytest.fixture(scope="module")
def descriptor_set(blocks) -> bytes:
    return compile_proto(PROTO, blocks[f"proto {PROTO}"])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Desk:
    """``report.v1.Desk`` on loopback. ``Generate`` writes the draft, chart and table through
    ``store`` and answers their ``artifact://`` uris and hashes; ``CheckDocument`` reads them
    back and checks the hashes; ``Send`` answers ``message_id`` (``self.message_id``), and
    waits for :attr:`release` when :attr:`hold_send` is set. ``calls`` lists the methods."""

    def __init__(self, fds: bytes, store: FileArtifactStore) -> None:
        self.store = store
        self.calls: list[str] = []
        self.message_id = "msg-2026-11-0001"
        self.hold_send = False
        self.sending = threading.Event()
        self.release = threading.Event()
        self._service = LoopbackService(fds, "report.v1.Desk", self._answer)
        self.target = self._service.target

    def _answer(self, name, request, context) -> dict[str, Any]:
        self.calls.append(name)
        answer = getattr(self, name.lower() if name != "CheckCompleteness" else "complete")
        return answer(request)

    @staticmethod
    def import_(r) -> dict[str, Any]:
        return {"period": r.period, "revenue": [100.0, 120.0, 130.0], "costs": [80.0, 90.0, 95.0]}

    def complete(self, r) -> dict[str, Any]:
        return {"complete": len(r.revenue) == len(r.costs) == 3}

    def calculate(self, r) -> dict[str, Any]:
        total_revenue, total_costs = sum(r.revenue), sum(r.costs)
        margin = round((total_revenue - total_costs) / total_revenue, 4)
        return {"totalRevenue": total_revenue, "totalCosts": total_costs, "margin": margin}

    def analyze(self, r) -> dict[str, Any]:
        return {"analysis": f"Margin {r.margin:.1%} on revenue {r.total_revenue:g}."}

    def checksources(self, r) -> dict[str, Any]:
        return {"sourcesOk": bool(r.analysis)}

    def generate(self, r) -> dict[str, Any]:
        files = {
            "draft": (f"reports/{r.period}/draft.md", f"# {r.period}\n\n{r.analysis}\n"),
            "chart": (f"reports/{r.period}/chart.svg", f"<svg><text>{r.margin}</text></svg>"),
            "table": (
                f"reports/{r.period}/table.csv",
                f"revenue,costs\n{r.total_revenue:g},{r.total_costs:g}\n",
            ),
        }
        out: dict[str, Any] = {"period": r.period}
        for port, (key, text) in files.items():
            data = text.encode()
            out[f"{port}Uri"] = self.store.put(key, data)
            out[f"{port}Sha256"] = _sha(data)
        return out

    def checkdocument(self, r) -> dict[str, Any]:
        ok = all(
            _sha(self.store.get(key_of(uri)) or b"") == sha
            for uri, sha in (
                (r.draft_uri, r.draft_sha256),
                (r.chart_uri, r.chart_sha256),
                (r.table_uri, r.table_sha256),
            )
        )
        return {"documentOk": ok}

    def publish(self, r) -> dict[str, Any]:
        return {"publishedUrl": f"https://intranet.example/{key_of(r.draft_uri)}"}

    def send(self, r) -> dict[str, Any]:
        if self.hold_send:
            self.sending.set()
            self.release.wait(20)
        return {"messageId": self.message_id}

    def __getattr__(self, name: str) -> Any:
        if name == "import":
            return self.import_
        raise AttributeError(name)

    def stop(self) -> None:
        self.release.set()
        self._service.stop()


@pytest.fixture
def byte_store(tmp_path) -> FileArtifactStore:
    return FileArtifactStore(tmp_path / "data" / "jobs" / "artifacts")


@pytest.fixture
def desk(descriptor_set, byte_store):
    d = Desk(descriptor_set, byte_store)
    yield d
    d.stop()


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=8)
    yield s
    s.close()


@pytest.fixture
def verbs(store):
    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    catalog = Catalog()
    for action in jobs_actions(backend, runtime):
        catalog.register(action)

    def call(verb, body, *, principal="alice"):
        return catalog.execute(verb, body, caller=Caller(principal, unrestricted=True))

    return call


@pytest.fixture
def worker(store, fresh_dsn, byte_store):
    w = Worker(
        store,
        runtime=Runtime(),
        config=jobs_config(fresh_dsn, lease_seconds=3.0),
        dsn=fresh_dsn,
        artifact_store=byte_store,
    )
    w.start()
    yield w
    w.stop(timeout_s=5)


def _workflow(blocks, fds: bytes, target: str) -> dict[str, Any]:
    wf = json.loads(blocks["workflow management-report"])
    wf["schema"]["descriptorSetBase64"] = base64.b64encode(fds).decode()
    for s in wf["steps"]:
        if "target" in s:
            s["target"] = target
    return wf


def _job(verbs, job_id) -> dict[str, Any]:
    return verbs("get-job", {"jobId": job_id})["job"]


def _submit_to_review(verbs, blocks, fds, desk) -> str:
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(blocks, fds, desk.target), "input": {"period": "2026-11"}},
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: _job(verbs, job_id).get("phase") == "waiting_approval" or None, timeout_s=20)
    return job_id


def _accept(verbs, job_id) -> None:
    vote = verbs(
        "approve-step",
        {"jobId": job_id, "stepName": "review", "decision": "accept"},
        principal="controller",
    )
    assert vote["ok"] and vote["decided"], vote


def _settled(verbs, job_id, *statuses) -> dict[str, Any]:
    wait_for(lambda: _job(verbs, job_id)["status"] in statuses or None, timeout_s=20)
    return _job(verbs, job_id)


def _table(blocks, name: str = "lineage") -> list[tuple[str, ...]]:
    rows = []
    for line in blocks[name].strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(tuple(cells))
    return rows


def _inputs_text(art) -> str:
    if art["kind"] == "response" and art["step"] == "review":
        return "(a decision: no request)"
    names = []
    for ref in art["inputs"]:
        port = ref.get("port", "response")
        names.append(ref["step"] if port == "response" else f"{ref['step']}.{port}")
    return ", ".join(names)


def test_the_example_runs_as_written_with_its_lineage_and_receipts(
    verbs, worker, desk, blocks, descriptor_set, byte_store, store
):
    job_id = _submit_to_review(verbs, blocks, descriptor_set, desk)
    assert desk.calls == [
        "Import",
        "CheckCompleteness",
        "Calculate",
        "Analyze",
        "CheckSources",
        "Generate",
        "CheckDocument",
    ]
    _accept(verbs, job_id)
    job = _settled(verbs, job_id, "COMPLETED", "FAILED")
    assert job["status"] == "COMPLETED", job.get("error")
    assert desk.calls[-2:] == ["Publish", "Send"]
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    shown = [(a["step"], a["port"], a["kind"], a["state"], _inputs_text(a)) for a in arts]
    assert shown == _table(blocks)
    assert not any(a["stale"] for a in arts)
    # the draft's recorded hash is its bytes' hash, and it is the one the reviewer saw
    draft = next(a for a in arts if a["port"] == "draft")
    data = byte_store.get(key_of(draft["uri"]))
    assert data is not None and draft["sha256"] == _sha(data)
    review = next(c for c in job["checkpoints"] if c["name"] == "review")
    assert review["seenArtifacts"]["generate.draft"] == draft["sha256"]
    publish = next(c for c in job["checkpoints"] if c["name"] == "publish")
    assert [(c["ref"], c["sha256"]) for c in publish["consumed"]] == [
        ("generate.draft", draft["sha256"])
    ]
    # each state change is a row, logged with its actor and reason, written by the checkpoint
    # statement of the step that made it
    got = verbs("get-artifact", {"artifactId": draft["artifactId"]})["artifact"]
    assert [(t["from"], t["to"], t["reason"]) for t in got["transitions"]] == [
        (None, "draft", "produced by step 'generate'"),
        ("draft", "verified", "validated by step 'check_document'"),
        ("verified", "promoted", "published by step 'publish'"),
    ]
    assert all(t["actor"].startswith("worker:") for t in got["transitions"])
    imported = next(a for a in arts if a["step"] == "import")
    got = verbs("get-artifact", {"artifactId": imported["artifactId"]})["artifact"]
    assert [(t["from"], t["to"]) for t in got["transitions"]] == [("draft", "verified")]
    rows = store.artifact_kept(job_id)
    assert sorted((r["step"], r["port"], r["state"]) for r in rows) == [
        ("analyze", "response", "verified"),
        ("generate", "chart", "verified"),
        ("generate", "draft", "promoted"),
        ("generate", "table", "verified"),
        ("import", "response", "verified"),
        ("send", "receipt", "draft"),
    ]
    # the send's receipt is an artifact, listed by the report with the provider's evidence
    (receipt,) = job["report"]["receipts"]
    assert receipt["step"] == "send"
    assert receipt["value"] == {
        "idempotencyKey": f"{job_id}:send:0",
        "evidence": "msg-2026-11-0001",
    }
    assert {a["artifactId"] for a in job["report"]["artifacts"]} == {a["artifactId"] for a in arts}
    # lineage from the receipt reaches the run's first step
    walk = verbs("lineage", {"artifactId": receipt["artifactId"], "direction": "up"})
    reached = {(n["step"], n["port"]) for n in walk["nodes"]}
    assert {("send", "response"), ("publish", "response"), ("generate", "draft")} <= reached
    assert {("calculate", "response"), ("import", "response")} <= reached


def test_a_draft_changed_after_the_review_is_not_published(
    verbs, worker, desk, blocks, descriptor_set, byte_store
):
    job_id = _submit_to_review(verbs, blocks, descriptor_set, desk)
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    draft = next(a for a in arts if a["port"] == "draft")
    byte_store.put(key_of(draft["uri"]), b"# 2026-11\n\nA better story.\n")
    _accept(verbs, job_id)
    job = _settled(verbs, job_id, "COMPLETED", "FAILED")
    assert job["status"] == "FAILED"
    assert job["error"].startswith("ARTIFACT: consumed artifact 'generate.draft': the bytes at ")
    assert "refusing to publish what was not approved" in job["error"]
    assert "Publish" not in desk.calls and "Send" not in desk.calls
    assert job["attempt"] == 1  # never retried


def test_a_retracted_draft_is_not_published_and_the_retraction_names_its_actor(
    verbs, worker, desk, blocks, descriptor_set
):
    job_id = _submit_to_review(verbs, blocks, descriptor_set, desk)
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    draft = next(a for a in arts if a["port"] == "draft")
    answer = verbs(
        "retract-artifact",
        {"artifactId": draft["artifactId"], "reason": "figures restated"},
        principal="cfo",
    )
    assert answer == {
        "ok": True,
        "artifactId": draft["artifactId"],
        "state": "retracted",
        "changed": True,
    }
    again = verbs("retract-artifact", {"artifactId": draft["artifactId"]}, principal="cfo")
    assert again["changed"] is False
    got = verbs("get-artifact", {"artifactId": draft["artifactId"]})["artifact"]
    assert got["state"] == "retracted"
    assert (got["transitions"][-1]["actor"], got["transitions"][-1]["reason"]) == (
        "cfo",
        "figures restated",
    )
    assert (got["transitions"][-1]["from"], got["transitions"][-1]["to"]) == (
        "verified",
        "retracted",
    )
    _accept(verbs, job_id)
    job = _settled(verbs, job_id, "COMPLETED", "FAILED")
    assert job["status"] == "FAILED"
    assert job["error"] == (
        f"ARTIFACT: consumed artifact 'generate.draft' was retracted (artifact "
        f"{draft['artifactId']})"
    )
    assert "Publish" not in desk.calls


def test_a_send_without_a_receipt_does_not_complete_the_run(
    verbs, worker, desk, blocks, descriptor_set
):
    desk.message_id = ""
    job_id = _submit_to_review(verbs, blocks, descriptor_set, desk)
    _accept(verbs, job_id)
    job = _settled(verbs, job_id, "COMPLETED", "FAILED")
    assert job["status"] == "FAILED"
    assert job["error"] == (
        "RECEIPT: effect 'send' has no receipt (response.message_id is empty): the run does "
        "not complete"
    )
    assert desk.calls.count("Send") == 1


def test_cancel_during_the_send_keeps_the_draft_and_both_attachments(
    verbs, worker, desk, blocks, descriptor_set
):
    desk.hold_send = True
    job_id = _submit_to_review(verbs, blocks, descriptor_set, desk)
    _accept(verbs, job_id)
    assert desk.sending.wait(20)
    answer = verbs(
        "cancel-job", {"jobId": job_id, "compensate": False, "reason": "wrong distribution list"}
    )
    assert answer["ok"], answer
    desk.release.set()
    job = _settled(verbs, job_id, "CANCELLED")
    listed = {(a["step"], a["port"]): a for a in job["report"]["artifacts"]}
    for port in ("draft", "chart", "table"):
        assert listed[("generate", port)]["kind"] == "file"
        assert listed[("generate", port)]["uri"].startswith("artifact://reports/2026-11/")
    # everything the run produced is kept: nothing was touched by the cancel
    assert {a["artifactId"] for a in job["report"]["artifacts"]} == {
        a["artifactId"] for a in verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    }


def test_pruning_keeps_promoted_and_live_bytes_and_a_missing_key_never_blocks(
    verbs, worker, desk, blocks, descriptor_set, byte_store, store, fresh_dsn
):
    # run 1: published (its draft promoted); run 2 waits for its review (live), run 3 is
    # rejected (its files are nobody's), run 4's table was already removed by hand
    published = _submit_to_review(verbs, blocks, descriptor_set, desk)
    _accept(verbs, published)
    assert _settled(verbs, published, "COMPLETED", "FAILED")["status"] == "COMPLETED"
    uris = {
        a["port"]: a["uri"]
        for a in verbs("list-artifacts", {"jobId": published})["artifacts"]
        if a["kind"] == "file"
    }
    rejected = _submit_to_review(verbs, blocks, descriptor_set, desk)
    verbs(
        "approve-step",
        {"jobId": rejected, "stepName": "review", "decision": "reject"},
        principal="controller",
    )
    assert _settled(verbs, rejected, "FAILED")["status"] == "FAILED"
    live = _submit_to_review(verbs, blocks, descriptor_set, desk)  # same files, still waiting
    # every run wrote the same three keys (same period); the live one names them all
    pruner = Pruner(store, config=jobs_config(fresh_dsn), artifact_store=byte_store)
    assert store.job_prune_terminal(0.001, 100) == 2
    assert store.job_get(published) is None and store.job_get(rejected) is None
    result = pruner.run_once()
    assert result.artifact_keys == 0 and result.artifact_keys_kept == 3
    for uri in uris.values():
        assert byte_store.exists(key_of(uri)), uri
    # the promoted draft outlives its run (detached), with its transition
    kept = verbs("list-artifacts", {"jobId": published})
    assert kept["runDeleted"] is True
    assert [(a["port"], a["state"], a["detached"]) for a in kept["artifacts"]] == [
        ("draft", "promoted", True)
    ]
    # the live run ends; its table is gone already; deleting it succeeds all the same
    byte_store.delete(key_of(uris["table"]))
    verbs("cancel-job", {"jobId": live, "compensate": False})
    assert _settled(verbs, live, "CANCELLED")["status"] == "CANCELLED"
    assert store.job_prune_cancelled(0.001, 100) == 1
    assert store.job_get(live) is None
    result = pruner.run_once()
    # chart: deleted; table: already missing, counts as pruned; draft: promoted, kept
    assert (result.artifact_keys, result.artifact_keys_kept) == (2, 1)
    assert byte_store.exists(key_of(uris["draft"]))
    assert not byte_store.exists(key_of(uris["chart"]))
    assert not byte_store.exists(key_of(uris["table"]))
    assert pruner.run_once().artifact_keys == 0  # nothing left queued


def _blocked(step) -> str:
    frontier = [b for b in step["blockedBy"] if b["state"] != "not-reached"]
    text = ", ".join(f"{b['step']} ({b['state']})" for b in frontier)
    rest = len(step["blockedBy"]) - len(frontier)
    if rest:
        text += f" + {rest} not reached" if text else f"{rest} not reached"
    return text


def _waiting(step) -> str:
    out = []
    for w in step["waitingOn"]:
        if w["kind"] == "input":
            paths = ", ".join(f"{p['path']} (owner {p['owner']})" for p in w["paths"])
            out.append(f"{w['verb']}: {paths}")
        elif w["kind"] == "approval":
            who = ", ".join(w["principals"] + w["roles"])
            out.append(f"approval: {w['missingVotes']} more vote(s) of {who}")
        else:
            out.append(w["kind"])
    return "; ".join(out)


def _explain_table(explain) -> list[tuple[str, ...]]:
    return [
        (
            s["name"],
            s["state"],
            _blocked(s),
            _waiting(s),
            ", ".join(f"{m['path']} ({m['owner']})" for m in s["missingInputs"]),
        )
        for s in explain["steps"]
    ]


def test_explain_names_the_missing_period_and_its_owner_then_the_review(
    verbs, worker, desk, blocks, descriptor_set
):
    """Issue 29 item 6 on the management report: submitted without its period, the run waits
    for it (not FAILED) and explain-job names the path and its owner; supply-input lets it run
    on to the review, where explain-job names the vote still missing; both tables as the doc
    shows them."""
    answer = verbs(
        "submit-workflow",
        {"workflow": _workflow(blocks, descriptor_set, desk.target), "input": {}},
    )
    assert answer["ok"], answer
    job_id = answer["jobId"]
    wait_for(lambda: _job(verbs, job_id).get("phase") == "waiting_input" or None, timeout_s=20)
    assert _job(verbs, job_id)["status"] == "WAITING"
    assert desk.calls == []
    explain = verbs("explain-job", {"jobId": job_id})["explain"]
    assert _explain_table(explain) == _table(blocks, "explain missing-input")
    supplied = verbs(
        "supply-input",
        {"jobId": job_id, "path": "period", "value": "2026-11", "reason": "the November report"},
        principal="fiona",
    )
    assert supplied["ok"] and supplied["status"] == "QUEUED", supplied
    wait_for(lambda: _job(verbs, job_id).get("phase") == "waiting_approval" or None, timeout_s=20)
    explain = verbs("explain-job", {"jobId": job_id})["explain"]
    assert _explain_table(explain) == _table(blocks, "explain review")
    assert [(r["path"], r["actor"]) for r in explain["revisions"]] == [("period", "fiona")]
    _accept(verbs, job_id)
    job = _settled(verbs, job_id, "COMPLETED", "FAILED")
    assert job["status"] == "COMPLETED", job.get("error")
    assert verbs("explain-job", {"jobId": job_id})["explain"]["steps"] == []
