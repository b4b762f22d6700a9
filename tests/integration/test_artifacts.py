"""Artifacts with lineage and receipts (issue 29; docs/artifacts.md): real PostgreSQL, a real
Worker, the test ``Steps/Run`` service on loopback. Verbs run through the host catalog as a
named principal, as a surface would call them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from google.protobuf import json_format

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.host.catalog import Caller, Catalog
from protomolt_jobs.runs.submitter import Submitter
from protomolt_jobs.store import JobStore
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.worker import Worker
from protomolt_jobs.workflow import Runtime
from tests.support.graphs import graph, step
from tests.support.grpc_servers import message_class
from tests.support.worker_proc import jobs_config, wait_for


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
def worker(store, fresh_dsn):
    workers = []

    def start():
        w = Worker(
            store,
            runtime=Runtime(),
            config=jobs_config(fresh_dsn, lease_seconds=3.0),
            dsn=fresh_dsn,
        )
        w.start()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop(timeout_s=5)


def _status(verbs, job_id) -> str:
    return verbs("get-job", {"jobId": job_id})["job"]["status"]


def _settled(verbs, job_id, status="COMPLETED") -> dict[str, Any]:
    wait_for(lambda: _status(verbs, job_id) == status or None, timeout_s=20)
    return verbs("get-job", {"jobId": job_id})["job"]


def _submit(verbs, workflow) -> str:
    answer = verbs("submit-workflow", {"workflow": workflow, "input": {"text": "x"}})
    assert answer["ok"], answer
    return answer["jobId"]


def _sha(response: dict[str, Any]) -> tuple[str, int]:
    msg = json_format.ParseDict(response, message_class("jobs.test.StepReply")())
    data = msg.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest(), len(data)


def three_steps(t: str) -> dict[str, Any]:
    """a -> b -> send (effect: external), each reading the one before."""
    return graph(
        [
            step("a", t),
            step("b", t, reads=["a"]),
            step("send", t, reads=["b"], effect="external"),
        ],
        name="three",
    )


def a_answers_differently_the_second_time(services) -> None:
    def run(request, context):
        reply = services._do_run(request, context)
        if request.step == "a" and services.step_calls("a") > 1:
            reply.seen.append("changed")
        return reply

    services.set_handler("Run", run)


def _by(arts, step, port="response", current=True):
    (found,) = [
        a for a in arts if a["step"] == step and a["port"] == port and a["current"] is current
    ]
    return found


def test_three_steps_make_one_artifact_each_with_hashes_producers_and_lineage(
    verbs, services, worker
):
    job_id = _submit(verbs, three_steps(services.target))
    worker()
    job = _settled(verbs, job_id)
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    responses = [a for a in arts if a["kind"] == "response"]
    assert [a["step"] for a in responses] == ["a", "b", "send"]
    for art, entry in zip(responses, job["checkpoints"], strict=True):
        sha, size = _sha(entry["response"])
        assert (art["sha256"], art["sizeBytes"]) == (sha, size)
        assert art["producer"]["jobId"] == job_id
        assert art["producer"]["step"] == entry["name"]
        assert art["producer"]["attempt"] == 1
        assert art["producer"]["definitionSha256"] == entry["definitionSha256"]
        assert art["producer"]["descriptorSha256"] == entry["descriptorSha256"]
        assert art["state"] == "draft" and art["stale"] is False
    a, b, send = responses
    # lineage recorded when the request was built: b read a's exact output, send read b's
    assert b["inputs"] == [
        {"step": "a", "iteration": 0, "sha256": a["sha256"], "artifactId": a["artifactId"]}
    ]
    assert [i["artifactId"] for i in send["inputs"]] == [b["artifactId"]]
    # the external send's receipt is an artifact, and the report lists it
    receipt = _by(arts, "send", "receipt")
    assert receipt["kind"] == "receipt"
    assert receipt["value"] == {"idempotencyKey": f"{job_id}:send:0"}
    assert [r["artifactId"] for r in job["report"]["receipts"]] == [receipt["artifactId"]]
    listed = {r["artifactId"] for r in job["report"]["artifacts"]}
    assert listed == {x["artifactId"] for x in arts}
    # lineage from the last artifact reaches the first
    walk = verbs("lineage", {"artifactId": send["artifactId"], "direction": "up"})
    assert walk["ok"]
    reached = {n["step"]: n["distance"] for n in walk["nodes"]}
    assert reached == {"send": 0, "b": -1, "a": -2}
    assert {"from": a["artifactId"], "to": b["artifactId"]} in walk["edges"]
    down = verbs("lineage", {"artifactId": a["artifactId"], "direction": "down", "depth": 1})
    assert [n["step"] for n in down["nodes"]] == ["a", "b"]
    # get-artifact: metadata and the value inline
    got = verbs("get-artifact", {"artifactId": b["artifactId"]})
    assert got["ok"] and got["artifact"]["value"] == job["checkpoints"][1]["response"]
    assert got["artifact"]["sha256"] == b["sha256"]


def test_retry_step_changing_the_first_output_marks_the_downstream_artifacts_stale(
    verbs, services, worker
):
    a_answers_differently_the_second_time(services)
    job_id = _submit(verbs, three_steps(services.target))
    worker()
    _settled(verbs, job_id)
    before = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    old_b = _by(before, "b")
    answer = verbs("retry-step", {"jobId": job_id, "stepName": "a", "scope": "only"})
    assert answer["ok"] and answer["keptEffects"] == ["send"], answer
    _settled(verbs, job_id)
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    new_a, new_b, send = _by(arts, "a"), _by(arts, "b"), _by(arts, "send")
    assert new_a["sha256"] != _by(before, "a")["sha256"]
    # b ran again on a's new output: fresh; the kept send read the old b: stale
    assert new_b["stale"] is False and new_b["sha256"] != old_b["sha256"]
    assert send["stale"] is True
    # the superseded b (built from the old a) is listed, not current, and stale
    superseded = _by(arts, "b", current=False)
    assert superseded["artifactId"] == old_b["artifactId"] and superseded["stale"] is True
    walk = verbs("lineage", {"artifactId": send["artifactId"], "direction": "up"})
    assert walk["artifact"]["stale"] is True
    assert [n["artifactId"] for n in walk["nodes"] if n["distance"] == -1] == [old_b["artifactId"]]


def test_the_artifact_verbs_refuse_malformed_input_naming_the_field(verbs, services, worker):
    job_id = _submit(verbs, three_steps(services.target))
    worker()
    _settled(verbs, job_id)
    art = verbs("list-artifacts", {"jobId": job_id})["artifacts"][0]["artifactId"]
    for verb, body, field in [
        ("list-artifacts", {}, "jobId"),
        ("list-artifacts", {"jobId": "nope"}, "jobId"),
        ("list-artifacts", {"jobId": job_id, "x": 1}, "x"),
        ("get-artifact", {"artifactId": 7}, "artifactId"),
        ("get-artifact", {"artifactId": "not-a-uuid"}, "artifactId"),
        ("lineage", {"artifactId": art, "direction": "sideways"}, "direction"),
        ("lineage", {"artifactId": art, "depth": 0}, "depth"),
        ("lineage", {"artifactId": art, "depth": "deep"}, "depth"),
    ]:
        with pytest.raises(InvalidInput) as info:
            verbs(verb, body)
        assert info.value.details["field"] == field, (verb, body)
    missing = "00000000-0000-0000-0000-000000000000"
    assert verbs("get-artifact", {"artifactId": missing}) == {
        "ok": False,
        "error": f"no artifact {missing}",
    }


# -- cost: a workflow without artifact keys runs the statements it ran before ----------------

#: The statements one job of :func:`three_plain` costs the store, by name, in order (the same
#: on the commit before artifacts: measured there with this test): its submit, the claim, two
#: checkpoints and the completion carrying the last one.
PLAIN_JOB_WRITES = [
    "job_insert",
    "job_checkpoint",
    "job_checkpoint",
    "job_complete_with_checkpoint",
]


def three_plain(t: str) -> dict[str, Any]:
    """a -> b -> c, each reading the one before; no artifact key, no effect."""
    return graph([step("a", t), step("b", t, reads=["a"]), step("c", t, reads=["b"])], name="plain")


def _recording(monkeypatch) -> list[tuple[str, Any]]:
    """Every named store statement run from now on: ``[(name, params)]``."""
    import psycopg

    from protomolt_jobs.store.db import QUERIES

    names = {text: name for name, text in QUERIES.items()}
    seen: list[tuple[str, Any]] = []
    real = psycopg.Cursor.execute

    def counting(self, query, params=None, **kw):
        name = names.get(query) if isinstance(query, str) else None
        if name is not None:
            seen.append((name, params))
        return real(self, query, params, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    return seen


def _writes_of(seen, job_id) -> list[str]:
    return [
        name
        for name, params in seen
        if isinstance(params, dict)
        and str(params.get("job_id", "")) == job_id
        and name.startswith("job_")
        and name not in ("job_get", "job_history", "job_progress_current")
    ]


def test_a_workflow_without_artifact_keys_costs_the_statements_it_cost_before(
    verbs, services, worker, monkeypatch
):
    seen = _recording(monkeypatch)
    job_id = _submit(verbs, three_plain(services.target))
    worker()
    _settled(verbs, job_id)
    mine = _writes_of(seen, job_id)
    claims = [name for name, _ in seen if name.startswith("job_claim")]
    assert mine == PLAIN_JOB_WRITES, mine
    assert claims, "the claim ran"
    # and the entries carry the artifact fields, computed in Python before the write
    job = verbs("get-job", {"jobId": job_id})["job"]
    assert all("sha256" in c and "sizeBytes" in c for c in job["checkpoints"])


def test_a_graph_run_records_lineage_when_each_request_is_built(verbs, services, worker):
    from tests.support.graphs import diamond

    job_id = _submit(verbs, diamond(services.target, sleep_ms=50))
    worker()
    job = _settled(verbs, job_id)
    arts = {a["step"]: a for a in verbs("list-artifacts", {"jobId": job_id})["artifacts"]}
    assert set(arts) == {"a", "b", "c", "d"}
    for entry in job["checkpoints"]:
        assert arts[entry["name"]]["sha256"] == _sha(entry["response"])[0]
    assert [i["artifactId"] for i in arts["d"]["inputs"]] == [
        arts["b"]["artifactId"],
        arts["c"]["artifactId"],
    ]
    walk = verbs("lineage", {"artifactId": arts["a"]["artifactId"], "direction": "down"})
    assert {n["step"]: n["distance"] for n in walk["nodes"]} == {"a": 0, "b": 1, "c": 1, "d": 2}


def test_a_response_supplied_by_complete_step_is_a_hashed_artifact(verbs, services, worker):
    from tests.support.grpc_servers import seed_workflow

    answer = verbs(
        "submit-workflow", {"workflow": seed_workflow(services.target), "input": {"text": "a b"}}
    )
    job_id = answer["jobId"]
    worker()
    _settled(verbs, job_id, "WAITING")
    done = verbs(
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True, "note": "ok"}},
    )
    assert done["ok"], done
    _settled(verbs, job_id)
    arts = {a["step"]: a for a in verbs("list-artifacts", {"jobId": job_id})["artifacts"]}
    review = message_class("jobs.test.Review")(approved=True, note="ok")
    data = review.SerializeToString(deterministic=True)
    assert arts["review"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert arts["review"]["sizeBytes"] == len(data)
    assert arts["review"]["inputs"] == []  # nothing built its request: an outside answer
    assert [i["artifactId"] for i in arts["embed"]["inputs"]] == [arts["tokenize"]["artifactId"]]
    assert not any(a["stale"] for a in arts.values())


def test_artifact_rows_go_in_with_the_checkpoint_that_produces_them(
    verbs, services, worker, store, monkeypatch
):
    from protomolt_jobs.store.db import QUERIES

    wf = graph(
        [
            step(
                "a",
                services.target,
                outputs={
                    "p": {"uri": "'artifact://x/' + response.step", "sha256": "response.step"}
                },
            ),
            step("b", services.target, reads=["a"], validates=["a.p"]),
            step("c", services.target, reads=["b"]),
        ],
        name="ports",
    )
    seen = _recording(monkeypatch)
    job_id = _submit(verbs, wf)
    worker()
    _settled(verbs, job_id)
    # a's port and b's verification ride in their checkpoints' own statements; c has no
    # artifact keys: it still completes the run in one statement
    assert _writes_of(seen, job_id) == [
        "job_insert",
        "job_checkpoint_artifacts",
        "job_checkpoint_artifacts",
        "job_complete_with_checkpoint",
    ]
    writers = {
        name
        for name, _ in seen
        if "INSERT INTO workflow_artifact" in QUERIES[name]
        or "UPDATE workflow_artifact" in QUERIES[name]
    }
    assert writers == {"job_checkpoint_artifacts"}
    rows = store.artifact_kept(job_id)
    assert [(r["step"], r["port"], r["state"], r["uri"]) for r in rows] == [
        ("a", "p", "verified", "artifact://x/a")
    ]


# -- complete-step, compensation and promote-artifact (the gaps left by issue 29) ------------


def _external_review_with_a_port(t: str) -> dict[str, Any]:
    """The seed's tokenize -> embed -> review, the external review declaring an output port
    and validating ``embed``."""
    from tests.support.grpc_servers import seed_workflow

    wf = seed_workflow(t)
    review = wf["steps"][2]
    assert review["name"] == "review" and review["completion"] == "external"
    review.pop("validate", None)
    review["outputs"] = {
        "note": {
            "uri": "'artifact://notes/' + response.note",
            "sha256": "response.note",
            "mediaType": "text/plain",
        }
    }
    review["validates"] = ["embed"]
    return wf


def test_complete_step_turns_a_declared_port_into_an_artifact_row_in_its_own_statement(
    verbs, services, worker, store, monkeypatch
):
    from protomolt_jobs.store.db import QUERIES

    answer = verbs(
        "submit-workflow",
        {"workflow": _external_review_with_a_port(services.target), "input": {"text": "a b"}},
    )
    job_id = answer["jobId"]
    worker()
    _settled(verbs, job_id, "WAITING")
    # an answer that does not give the port is refused naming 'response'; the run stays parked
    with pytest.raises(InvalidInput) as info:
        verbs("complete-step", {"jobId": job_id, "stepName": "review", "response": {}})
    assert info.value.details["field"] == "response"
    assert "output port 'note'" in str(info.value)
    assert _status(verbs, job_id) == "WAITING"
    seen = _recording(monkeypatch)
    done = verbs(
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True, "note": "n1"}},
        principal="carol",
    )
    assert done == {"ok": True, "status": "QUEUED"}, done
    writers = [
        name
        for name, _ in seen
        if "INSERT INTO workflow_artifact" in QUERIES[name]
        or "UPDATE workflow_artifact" in QUERIES[name]
    ]
    assert writers == ["job_complete_parked_artifacts"], writers
    job = _settled(verbs, job_id)
    entry = job["checkpoints"][-1]
    assert entry["name"] == "review"
    assert entry["artifacts"] == [
        {
            "port": "note",
            "kind": "file",
            "uri": "artifact://notes/n1",
            "sha256": "n1",
            "mediaType": "text/plain",
        }
    ]
    assert [v["step"] for v in entry["validated"]] == ["embed"]
    rows = {(r["step"], r["port"]): (r["state"], r["uri"]) for r in store.artifact_kept(job_id)}
    assert rows == {
        ("review", "note"): ("draft", "artifact://notes/n1"),
        ("embed", "response"): ("verified", None),
    }
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    port = _by(arts, "review", "note")
    assert (port["kind"], port["state"], port["uri"]) == ("file", "draft", "artifact://notes/n1")
    assert _by(arts, "embed")["state"] == "verified"
    got = verbs("get-artifact", {"artifactId": _by(arts, "embed")["artifactId"]})
    assert [
        (t["actor"], t["from"], t["to"], t["reason"]) for t in got["artifact"]["transitions"]
    ] == [("carol", "draft", "verified", "validated by step 'review'")]
    got = verbs("get-artifact", {"artifactId": port["artifactId"]})
    assert [(t["actor"], t["to"]) for t in got["artifact"]["transitions"]] == [("carol", "draft")]


def test_a_cancelled_runs_compensation_entry_is_a_hashed_artifact_with_its_inputs(
    verbs, services, worker
):
    t = services.target
    wf = graph(
        [
            step("reserve", t, compensate="release"),
            step("slow", t, sleep_ms=12_000, after=["reserve"]),
            step("release", t, reads=["reserve"]),
        ],
        name="compensated",
        cancel={"interruptCalls": True},
    )
    job_id = _submit(verbs, wf)
    worker()
    wait_for(lambda: services.step_calls("slow") == 1 or None, timeout_s=20)
    assert verbs("cancel-job", {"jobId": job_id})["ok"] is True
    _settled(verbs, job_id, "CANCELLED")

    def released():
        job = verbs("get-job", {"jobId": job_id})["job"]
        return job if [c["name"] for c in job["checkpoints"]] == ["reserve", "release"] else None

    job = wait_for(released, timeout_s=20)
    reserve, release = job["checkpoints"]
    assert (release["sha256"], release["sizeBytes"]) == _sha(release["response"])
    assert release["inputs"] == [{"step": "reserve", "iteration": 0, "sha256": reserve["sha256"]}]
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    comp = _by(arts, "release")
    assert comp["sha256"] == release["sha256"]
    assert [i["artifactId"] for i in comp["inputs"]] == [_by(arts, "reserve")["artifactId"]]


def _promotable(t: str) -> dict[str, Any]:
    """a, b validating a, a review, and a publication that needs a promoted."""
    return graph(
        [
            step("a", t),
            step("b", t, reads=["a"], validates=["a"]),
            {
                "name": "review",
                "completion": "approval",
                "approval": {
                    "approvers": {"principals": ["carl"]},
                    "decisions": ["accept", "reject"],
                    "end": {"reject": "fail"},
                },
            },
            step("pub", t, reads=["a"], consumes={"a": {"state": "promoted"}}),
        ],
        name="promotable",
    )


def test_promote_artifact_promotes_only_what_is_verified_and_logs_who_and_why(
    verbs, services, worker
):
    job_id = _submit(verbs, _promotable(services.target))
    worker()
    _settled(verbs, job_id, "WAITING")
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    a, b = _by(arts, "a"), _by(arts, "b")
    assert (a["state"], b["state"]) == ("verified", "draft")
    for body, field in [
        ({"artifactId": a["artifactId"]}, "reason"),
        ({"artifactId": a["artifactId"], "reason": "  "}, "reason"),
        ({"artifactId": a["artifactId"], "reason": 7}, "reason"),
        ({"reason": "x"}, "artifactId"),
        ({"artifactId": "nope", "reason": "x"}, "artifactId"),
        ({"artifactId": a["artifactId"], "reason": "x", "colour": "red"}, "colour"),
    ]:
        with pytest.raises(InvalidInput) as info:
            verbs("promote-artifact", body)
        assert info.value.details["field"] == field, body
    # a draft nobody validated is refused, naming its state; nothing is written
    refused = verbs("promote-artifact", {"artifactId": b["artifactId"], "reason": "ship it"})
    assert refused["ok"] is False and refused["errorKind"] == "not-verified"
    assert refused["state"] == "draft" and "is draft" in refused["error"]
    assert verbs("get-artifact", {"artifactId": b["artifactId"]})["artifact"]["transitions"] == []
    done = verbs(
        "promote-artifact",
        {"artifactId": a["artifactId"], "reason": "board signed off"},
        principal="olga",
    )
    assert done == {
        "ok": True,
        "artifactId": a["artifactId"],
        "state": "promoted",
        "changed": True,
    }
    again = verbs("promote-artifact", {"artifactId": a["artifactId"], "reason": "twice"})
    assert (again["ok"], again["state"], again["errorKind"]) == (False, "promoted", "not-verified")
    got = verbs("get-artifact", {"artifactId": a["artifactId"]})["artifact"]
    assert got["state"] == "promoted"
    assert [(t["actor"], t["from"], t["to"], t["reason"]) for t in got["transitions"]] == [
        ("worker:test-worker", "draft", "verified", "validated by step 'b'"),
        ("olga", "verified", "promoted", "board signed off"),
    ]
    # the publication that needs it promoted accepts the operator's promotion
    decided = verbs(
        "approve-step",
        {"jobId": job_id, "stepName": "review", "decision": "accept"},
        principal="carl",
    )
    assert decided["ok"], decided
    job = _settled(verbs, job_id)
    assert [c["name"] for c in job["checkpoints"]][-1] == "pub"
    assert [c["ref"] for c in job["checkpoints"][-1]["consumed"]] == ["a"]


def test_an_artifact_an_operator_promoted_outlives_its_pruned_run(verbs, services, worker, store):
    t = services.target
    job_id = _submit(verbs, graph([step("a", t), step("b", t, validates=["a"])], name="kept"))
    worker()
    _settled(verbs, job_id)
    a = _by(verbs("list-artifacts", {"jobId": job_id})["artifacts"], "a")
    assert a["state"] == "verified"
    done = verbs("promote-artifact", {"artifactId": a["artifactId"], "reason": "the final one"})
    assert done["ok"] is True, done
    wait_for(lambda: store.job_prune_terminal(0.001, 100) == 1 or None, timeout_s=10)
    kept = verbs("list-artifacts", {"jobId": job_id})
    assert kept["runDeleted"] is True
    assert [(k["artifactId"], k["state"], k["detached"]) for k in kept["artifacts"]] == [
        (a["artifactId"], "promoted", True)
    ]


# -- reconcile-step done and migrate-checkpoint replace: the operator's answer's rows --------


def _ported(t: str) -> dict[str, Any]:
    """a -> b (a port 'q', validating a) -> c: the operator answers for a or b."""
    return graph(
        [
            step(
                "a",
                t,
                outputs={
                    "p": {"uri": "'artifact://x/' + response.step", "sha256": "response.step"}
                },
            ),
            step(
                "b",
                t,
                reads=["a"],
                outputs={
                    "q": {"uri": "'artifact://y/' + response.step", "sha256": "response.step"}
                },
                validates=["a"],
            ),
            step("c", t, reads=["b"]),
        ],
        name="ported",
    )


def _stuck_on(store, job_id: str, step_name: str, done: list[dict[str, Any]]) -> None:
    """Claim the job, checkpoint ``done`` entries as a worker would, stop it RECOVERY_REQUIRED
    on ``step_name``."""
    claimed = store.job_claim("w-op", 60)
    assert str(claimed.job_id) == job_id
    for entry in done:
        store.job_checkpoint(claimed.lease, entry)
    store.job_recovery_required(claimed.lease, step_name, "checkpoint-mismatch: operator test")


def _a_entry(text: str) -> dict[str, Any]:
    sha, size = _sha({"step": text})
    return {
        "name": "a",
        "skipped": False,
        "response": {"step": text},
        "sha256": sha,
        "sizeBytes": size,
        "artifacts": [{"port": "p", "kind": "file", "uri": f"artifact://x/{text}", "sha256": text}],
    }


def _writers(seen) -> list[str]:
    from protomolt_jobs.store.db import QUERIES

    return [
        name
        for name, _ in seen
        if "INSERT INTO workflow_artifact" in QUERIES[name]
        or "UPDATE workflow_artifact" in QUERIES[name]
    ]


def test_reconcile_done_writes_the_answers_port_and_validation_rows_in_its_own_statement(
    verbs, services, worker, store, monkeypatch
):
    job_id = _submit(verbs, _ported(services.target))
    _stuck_on(store, job_id, "b", [_a_entry("a")])
    before = store.job_get(job_id)
    body = {"jobId": job_id, "stepName": "b", "outcome": "done"}
    # an answer that does not give the declared port is refused naming 'response'; the run
    # is left as it was, no row written
    with pytest.raises(InvalidInput) as info:
        verbs("reconcile-step", {**body, "response": {"step": ""}})
    assert info.value.details["field"] == "response"
    assert "output port 'q'" in str(info.value) and "sha256" in str(info.value)
    after = store.job_get(job_id)
    assert (after.status, after.history_seq) == ("RECOVERY_REQUIRED", before.history_seq)
    assert [(r["step"], r["port"]) for r in store.artifact_kept(job_id)] == [("a", "p")]
    seen = _recording(monkeypatch)
    done = verbs("reconcile-step", {**body, "response": {"step": "b1"}}, principal="dora")
    assert done == {"ok": True, "status": "QUEUED"}, done
    assert _writers(seen) == ["job_recover_artifacts"]
    entry = store.job_get(job_id).checkpoints[-1]
    assert entry["name"] == "b"
    assert entry["receipt"] == {"reconciledBy": "dora"}
    assert (entry["sha256"], entry["sizeBytes"]) == _sha({"step": "b1"})
    assert entry["artifacts"] == [
        {"port": "q", "kind": "file", "uri": "artifact://y/b1", "sha256": "b1"}
    ]
    assert [v["step"] for v in entry["validated"]] == ["a"]
    rows = {(r["step"], r["port"]): (r["state"], r["uri"]) for r in store.artifact_kept(job_id)}
    assert rows == {
        ("a", "p"): ("draft", "artifact://x/a"),
        ("a", "response"): ("verified", None),
        ("b", "q"): ("draft", "artifact://y/b1"),
    }
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    got = verbs("get-artifact", {"artifactId": _by(arts, "a")["artifactId"]})["artifact"]
    assert [(t["actor"], t["from"], t["to"], t["reason"]) for t in got["transitions"]] == [
        ("dora", "draft", "verified", "validated by step 'b'")
    ]
    got = verbs("get-artifact", {"artifactId": _by(arts, "b", "q")["artifactId"]})["artifact"]
    assert [(t["actor"], t["to"]) for t in got["transitions"]] == [("dora", "draft")]
    # the run goes on after the answer
    worker()
    job = _settled(verbs, job_id)
    assert [c["name"] for c in job["checkpoints"]] == ["a", "b", "c"]
    assert services.step_calls("b") == 0


def test_reconcile_done_of_a_step_without_artifact_keys_writes_as_before(
    verbs, services, store, monkeypatch
):
    job_id = _submit(verbs, three_plain(services.target))
    _stuck_on(store, job_id, "a", [])
    seen = _recording(monkeypatch)
    done = verbs(
        "reconcile-step",
        {"jobId": job_id, "stepName": "a", "outcome": "done", "response": {"step": "a"}},
    )
    assert done["ok"], done
    assert _writes_of(seen, job_id) == ["job_recover"]
    assert store.artifact_kept(job_id) == []


def test_migrate_replace_writes_the_new_answers_port_row_in_its_own_statement(
    verbs, services, worker, store, monkeypatch
):
    job_id = _submit(verbs, _ported(services.target))
    _stuck_on(store, job_id, "b", [_a_entry("a")])
    before = store.job_get(job_id)
    body = {"jobId": job_id, "stepName": "a", "action": "replace"}
    with pytest.raises(InvalidInput) as info:
        verbs("migrate-checkpoint", {**body, "response": {"step": ""}})
    assert info.value.details["field"] == "response"
    assert "output port 'p'" in str(info.value) and "sha256" in str(info.value)
    after = store.job_get(job_id)
    assert (after.status, after.history_seq) == ("RECOVERY_REQUIRED", before.history_seq)
    assert after.checkpoints == before.checkpoints
    seen = _recording(monkeypatch)
    done = verbs("migrate-checkpoint", {**body, "response": {"step": "a2"}}, principal="eve")
    assert done == {"ok": True, "status": "QUEUED"}, done
    assert _writers(seen) == ["job_recover_artifacts"]
    (entry,) = store.job_get(job_id).checkpoints
    assert (entry["sha256"], entry["sizeBytes"]) == _sha({"step": "a2"})
    assert entry["artifacts"] == [
        {"port": "p", "kind": "file", "uri": "artifact://x/a2", "sha256": "a2"}
    ]
    # the replaced entry's row stays as it was (its checkpoint wrote it); the answer's is new
    rows = sorted((r["sha256"], r["state"], r["uri"]) for r in store.artifact_kept(job_id))
    assert rows == [("a", "draft", "artifact://x/a"), ("a2", "draft", "artifact://x/a2")]
    arts = verbs("list-artifacts", {"jobId": job_id})["artifacts"]
    got = verbs("get-artifact", {"artifactId": _by(arts, "a", "p")["artifactId"]})["artifact"]
    assert got["uri"] == "artifact://x/a2"
    assert [(t["actor"], t["to"]) for t in got["transitions"]] == [("eve", "draft")]
    worker()
    job = _settled(verbs, job_id)
    assert [c["name"] for c in job["checkpoints"]] == ["a", "b", "c"]
    assert services.step_calls("a") == 0


def _sized(t: str) -> dict[str, Any]:
    """a -> b, b with a port 'q' whose size is the response's text."""
    size = "response.step"
    uri = "'artifact://y/' + response.step"
    return graph(
        [
            step("a", t),
            step(
                "b", t, reads=["a"], outputs={"q": {"uri": uri, "sha256": size, "sizeBytes": size}}
            ),
        ],
        name="sized",
    )


@pytest.mark.parametrize(
    "text",
    ["\u00b2", "99999999999999999999"],  # isdigit() but not int(); past BIGINT
    ids=["superscript-two", "past-bigint"],
)
@pytest.mark.parametrize("verb", ["reconcile-step", "migrate-checkpoint"])
def test_an_operator_answers_odd_port_size_never_fails_the_verb(verbs, services, store, text, verb):
    # A port's sizeBytes is kept as a number only when it is one BIGINT holds; other text
    # stays text in the entry, as for any other non-number: the answer is stored, not a 500.
    job_id = _submit(verbs, _sized(services.target))
    b_entry = {
        "name": "b",
        "skipped": False,
        "response": {"step": "b"},
        "artifacts": [{"port": "q", "kind": "file", "uri": "artifact://y/b", "sha256": "b"}],
    }
    if verb == "reconcile-step":
        _stuck_on(store, job_id, "b", [_a_entry("a") | {"artifacts": []}])
        body = {"jobId": job_id, "stepName": "b", "outcome": "done"}
    else:
        _stuck_on(store, job_id, "b", [_a_entry("a") | {"artifacts": []}, b_entry])
        body = {"jobId": job_id, "stepName": "b", "action": "replace"}
    done = verbs(verb, {**body, "response": {"step": text}})
    assert done == {"ok": True, "status": "QUEUED"}, done
    entry = store.job_get(job_id).checkpoints[-1]
    assert entry["artifacts"][0]["sha256"] == text
    (row,) = [r for r in store.artifact_kept(job_id) if r["sha256"] == text]
    assert (row["port"], row["size_bytes"]) == ("q", None)


@pytest.mark.parametrize("verb", ["reconcile-step", "migrate-checkpoint"])
def test_an_operator_answers_port_uri_past_the_uri_index_is_invalid_input(
    verbs, services, store, verb
):
    # workflow_artifact's uri index refuses an entry over ~2.7 KB: the statement failed
    # (ProgramLimitExceeded, answered 'unavailable'). A uri over PORT_URI_MAX_BYTES is the
    # answer's fault: invalid-input naming 'response', the run left as it was.
    from protomolt_jobs.workflow.artifacts import PORT_URI_MAX_BYTES

    job_id = _submit(verbs, _ported(services.target))
    _stuck_on(store, job_id, "b", [_a_entry("a")])
    before = store.job_get(job_id)
    if verb == "reconcile-step":
        body = {"jobId": job_id, "stepName": "b", "outcome": "done"}
    else:
        body = {"jobId": job_id, "stepName": "a", "action": "replace"}
    # 3200 hex characters without repeats: the index cannot compress them below its bound
    long = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(50))
    with pytest.raises(InvalidInput) as info:
        verbs(verb, {**body, "response": {"step": long}})
    assert info.value.details["field"] == "response"
    assert f"uri is longer than {PORT_URI_MAX_BYTES} bytes" in str(info.value)
    after = store.job_get(job_id)
    assert (after.status, after.history_seq) == ("RECOVERY_REQUIRED", before.history_seq)
    # a uri at the bound is stored
    step_text = long[: PORT_URI_MAX_BYTES - len("artifact://x/")]
    done = verbs(verb, {**body, "response": {"step": step_text}})
    assert done == {"ok": True, "status": "QUEUED"}, done


def test_a_promote_that_loses_a_race_answers_the_state_it_lost_to(
    verbs, services, store, fresh_dsn
):
    # promote-artifact reads the row verified, then its update waits on a change another
    # operator has in flight (a retract) and finds it retracted: nothing is promoted, and the
    # answer names the state the artifact is in now, not the verified it was read in.
    import threading

    import psycopg

    job_id = _submit(verbs, _ported(services.target))
    _stuck_on(store, job_id, "b", [_a_entry("a")])
    body = {"jobId": job_id, "stepName": "b", "outcome": "done", "response": {"step": "b1"}}
    assert verbs("reconcile-step", body)["ok"]
    art = _by(verbs("list-artifacts", {"jobId": job_id})["artifacts"], "a")
    assert art["state"] == "verified"
    answer: dict[str, Any] = {}

    def promote() -> None:
        answer.update(
            verbs("promote-artifact", {"artifactId": art["artifactId"], "reason": "ship it"})
        )

    # the watcher polls from its own autocommit session: pg_stat_activity is read once per
    # transaction
    with psycopg.connect(fresh_dsn) as other, psycopg.connect(fresh_dsn, autocommit=True) as w:
        other.execute(
            "UPDATE workflow_artifact SET state = 'retracted' WHERE artifact_id = %s",
            (art["artifactId"],),
        )
        racer = threading.Thread(target=promote)
        racer.start()

        def waiting() -> bool | None:
            rows = w.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%%workflow_artifact%%'"
            ).fetchone()
            return True if rows and rows[0] else None

        wait_for(waiting, timeout_s=10)
        other.commit()
    racer.join(10)
    assert answer["ok"] is False and answer["changed"] is False
    assert answer["state"] == "retracted", answer
    assert "is retracted" in answer["error"]
    got = verbs("get-artifact", {"artifactId": art["artifactId"]})["artifact"]
    assert got["state"] == "retracted"


def test_a_step_whose_port_uri_is_past_the_bound_fails_artifact(verbs, services, worker):
    # The worker's door to the same index: a called step's port uri over the bound fails the
    # step ARTIFACT (never retried) instead of a checkpoint statement the index refuses.
    long = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(50))

    def run(request, context):
        reply = services._do_run(request, context)
        if request.step == "a":
            reply.step = long
        return reply

    services.set_handler("Run", run)
    job_id = _submit(verbs, _ported(services.target))
    worker()
    job = _settled(verbs, job_id, status="FAILED")
    assert job["error"].startswith("ARTIFACT: output port 'p' of step 'a': uri is longer than")
    assert services.step_calls("a") == 1
