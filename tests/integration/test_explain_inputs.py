"""Input owners, a missing input that parks the run, supply-input and explain-job on a real node
(issue 29 item 6; docs/explain.md): real PostgreSQL, the node's HTTP and gRPC surfaces on
loopback with real tokens, the jobs role's workers, and the ``Steps/Run`` test service on
loopback. The worked example is docs/explain.md's, read from the page."""

from __future__ import annotations

import copy
import hashlib
import json
import threading

import grpc
import psycopg
import pytest

from protomolt_jobs.host.cli import main
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb
from tests.support.graphs import graph, step
from tests.support.grpc_servers import schema_for
from tests.support.guides import DOCS, doc_blocks
from tests.support.node import http, start_node_with_file, wait_for
from tests.support.worker_proc import enqueue, in_process_worker

ROOT = "root-secret"
TOKENS = {"ana": "ana-secret", "ed-1": "ed-1-secret", "ed-2": "ed-2-secret", "ops": "ops-secret"}
NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
{chr(10).join(f'{name} = "{secret}"' for name, secret in TOKENS.items())}
[node.groups]
data = ["ana"]
editor = ["ed-1", "ed-2"]
ops-team = ["ops"]
[node.scopes]
data = ["service-invoke", "job-input"]
editor = ["service-invoke", "workflow-run", "job-approve"]
ops-team = ["service-invoke", "workflow-run", "job-control", "job-input"]
"""
SERVICE = "/ai.pipestream.proto.service.v1.ProtoMoltService"
GUIDE = DOCS / "explain.md"


def guide_blocks() -> dict[str, str]:
    return doc_blocks(GUIDE, "explain-example")


def doc_workflow(target: str) -> dict:
    """The page's workflow, its targets pointed at the test service, the schema added."""
    workflow = json.loads(guide_blocks()["workflow"])
    for s in workflow["steps"]:
        s["target"] = target
    return {**workflow, "schema": schema_for("descriptorSetBase64")}


def post(url, verb, body, who="root"):
    token = ROOT if who == "root" else TOKENS[who]
    return http(
        "POST",
        f"{url}/protomolt/actions/{verb}",
        body,
        headers={"Authorization": f"Bearer {token}"},
    )


def get_job(url, job_id):
    status, answer, _ = post(url, "get-job", {"jobId": job_id})
    assert status == 200, answer
    return answer["job"]


def submit(url, workflow, input, who="ops"):
    status, answer, _ = post(url, "submit-workflow", {"workflow": workflow, "input": input}, who)
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def status_becomes(url, job_id, wanted, phase=None):
    return wait_for(
        lambda: (
            (job := get_job(url, job_id))["status"] == wanted
            and (phase is None or job.get("phase") == phase)
            and job
        ),
        timeout_s=30,
    )


def explain(url, job_id, who="root"):
    status, answer, _ = post(url, "explain-job", {"jobId": job_id}, who)
    assert status == 200 and answer["ok"], answer
    return answer["explain"]


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        yield surfaces
    finally:
        surfaces.close()


def test_the_guides_run_parks_on_the_missing_input_explain_names_its_owner_supply_finishes_it(
    node, services, fresh_dsn
):
    url = node.http.url
    job_id = submit(url, doc_workflow(services.target), {"text": "q3"})
    job = status_becomes(url, job_id, "WAITING", "waiting_input")
    assert job["outstandingStep"] == "analyse" and "error" not in job
    assert services.step_calls("load") == 1 and services.step_calls("analyse") == 0

    # the park names the path and its owner: its transition and its WAITING event
    _, history, _ = post(url, "job-history", {"jobId": job_id})
    (park,) = [t for t in history["transitions"] if t["kind"] == "park"]
    assert park["reason"] == "waiting for input: 'lang' (owner team:data)"
    with psycopg.connect(fresh_dsn) as conn:
        (verdict,) = conn.execute(
            "SELECT verdict FROM workflow_run_events_outbox "
            "WHERE kafka_key = %s AND event_type = 'WAITING'",
            (job_id,),
        ).fetchone()
    assert verdict == "waiting for input: 'lang' (owner team:data)"

    # explain-job, as the page shows it
    account = explain(url, job_id, who="ana")
    assert account["status"] == "WAITING" and account["waitKind"] == "input"
    assert account["steps"] == json.loads(guide_blocks()["explain steps"])
    assert account["inputs"] == [
        {
            "path": "lang",
            "owner": "team:data",
            "required": True,
            "description": "the report's language",
            "present": False,
        }
    ]
    # the CLI says the same in words
    assert main(["jobs", "explain", job_id, "--url", url, "--token", ROOT]) == 0

    # the owner supplies it: recorded with the actor, the run queued and finished
    supply = json.loads(guide_blocks()["supply"]) | {"jobId": job_id}
    status, answer, _ = post(url, "supply-input", supply, who="ana")
    assert status == 200, answer
    assert answer == {
        "ok": True,
        "status": "QUEUED",
        "step": "analyse",
        "path": "lang",
        "revision": 1,
        "oldSha256": None,
        "newSha256": hashlib.sha256(b'"en"').hexdigest(),
        "owner": "team:data",
        "byOwner": True,
    }
    done = status_becomes(url, job_id, "COMPLETED")
    assert done["input"] == {"text": "q3", "lang": "en"}
    (request,) = [r for r in services.requests("Run") if r.step == "analyse"]
    assert list(request.seen) == ["q3", "load", "en"]
    (revision,) = explain(url, job_id)["revisions"]
    assert revision["actor"] == "ana" and revision["path"] == "lang"
    assert revision["reason"] == "agreed with finance" and revision["step"] == "analyse"
    _, history, _ = post(url, "job-history", {"jobId": job_id})
    (supplied,) = [t for t in history["transitions"] if t["kind"] == "supply-input"]
    assert supplied["actor"] == "ana" and supplied["reason"] == "lang: agreed with finance"
    assert explain(url, job_id)["steps"] == []  # a finished run has nothing undecided

    # a second supply to a run no longer waiting is refused, naming its status
    status, answer, _ = post(url, "supply-input", supply, who="ana")
    assert status == 200 and answer["ok"] is False, answer
    assert answer["error"] == "not-waiting-for-input" and answer["status"] == "COMPLETED"


def test_without_wait_a_missing_required_input_fails_the_step_naming_path_and_owner(node, services):
    url = node.http.url
    workflow = doc_workflow(services.target)
    del workflow["steps"][1]["onMissingInput"]
    job_id = submit(url, workflow, {"text": "q3"})
    job = status_becomes(url, job_id, "FAILED")
    assert (
        job["error"] == "MAPPING: mapping failed: missing required input 'lang' (owner team:data)"
    )
    assert services.step_calls("analyse") == 0


def review_graph(target: str) -> dict:
    return graph(
        [
            step("draft", target),
            step("facts", target),
            {
                "name": "review",
                "after": ["draft"],
                "completion": "approval",
                "approval": {
                    "approvers": {"roles": ["editor"]},
                    "quorum": 2,
                    "end": {"reject": "fail"},
                },
            },
            step("publish", target, after=["review", "facts"], owner="team:web"),
            step("announce", target, after=["publish"]),
        ],
        name="review-graph",
    )


def test_explain_on_a_graph_names_blocking_dependencies_and_the_votes_missing(node, services):
    url = node.http.url
    job_id = submit(url, review_graph(services.target), {"text": "x"})
    status_becomes(url, job_id, "WAITING", "waiting_approval")
    account = explain(url, job_id)
    assert account["kind"] == "graph"
    steps = {s["name"]: s for s in account["steps"]}
    assert set(steps) == {"review", "publish", "announce"}  # draft and facts are decided
    review = steps["review"]
    assert review["state"] == "waiting" and review["blockedBy"] == []
    (votes,) = review["waitingOn"]
    assert votes["kind"] == "approval" and votes["quorum"] == 2 and votes["missingVotes"] == 2
    assert votes["roles"] == ["editor"] and votes["tally"] == {}
    assert steps["publish"]["blockedBy"] == [{"step": "review", "state": "waiting"}]
    assert steps["publish"]["owner"] == "team:web" and steps["publish"]["waitingOn"] == []
    assert steps["announce"]["blockedBy"] == [
        {"step": "review", "state": "waiting"},
        {"step": "publish", "state": "not-reached"},
    ]

    # one vote: one more missing, named with the vote cast
    status, answer, _ = post(
        url,
        "approve-step",
        {"jobId": job_id, "stepName": "review", "decision": "accept"},
        who="ed-1",
    )
    assert status == 200 and answer["ok"], answer
    (votes,) = {s["name"]: s for s in explain(url, job_id)["steps"]}["review"]["waitingOn"]
    assert votes["missingVotes"] == 1 and votes["tally"] == {"accept": 1}
    assert votes["votes"] == [{"principal": "ed-1", "decision": "accept"}]

    # over gRPC: the same account
    with grpc.insecure_channel(node.grpc.target) as channel:
        rpc = channel.unary_unary(
            f"{SERVICE}/ExplainJob",
            request_serializer=pb.ExplainJobRequest.SerializeToString,
            response_deserializer=pb.ExplainJobResponse.FromString,
        )
        answer = rpc(
            pb.ExplainJobRequest(job_id=job_id),
            metadata=(("authorization", f"Bearer {ROOT}"),),
            timeout=10,
        )
    assert answer.ok and answer.job_id == job_id
    steps = {s["name"]: s for s in answer.explain["steps"]}
    assert steps["publish"]["blockedBy"][0]["step"] == "review"


def test_bad_input_is_invalid_input_naming_the_field_on_http_grpc_and_the_cli(
    node, services, capsys
):
    url = node.http.url
    job_id = submit(url, doc_workflow(services.target), {"text": "q3"})
    status_becomes(url, job_id, "WAITING", "waiting_input")
    cases = [
        ("explain-job", {"jobId": "nope"}, "jobId"),
        ("explain-job", {"jobId": job_id, "depth": 2}, "depth"),
        ("supply-input", {"jobId": job_id, "path": "language", "value": "en"}, "path"),
        ("supply-input", {"jobId": job_id, "path": "lang", "value": {"a": 1}}, "value"),
        ("supply-input", {"jobId": job_id, "path": "lang"}, "value"),
        ("supply-input", {"jobId": job_id, "path": "lang", "value": "en", "who": "x"}, "who"),
        ("supply-input", {"jobId": job_id, "path": 3, "value": "en"}, "path"),
    ]
    for verb, body, field in cases:
        status, answer, _ = post(url, verb, body, who="ops")
        assert status == 400 and answer["error"] == "invalid-input", (verb, body, answer)
        assert answer["details"]["field"] == field, (verb, body, answer)
    status, answer, _ = post(
        url, "supply-input", {"jobId": job_id, "path": "language", "value": "en"}, who="ops"
    )
    assert "no field 'language' on jobs.test.Text" in answer["message"]
    _, answer, _ = post(url, "supply-input", {"jobId": job_id, "path": "lang", "value": 7}, "ops")
    assert answer["error"] == "invalid-input" and "'lang'" in answer["message"]

    # gRPC: the same refusals, with the field in the details trailer
    with grpc.insecure_channel(node.grpc.target) as channel:
        supply = channel.unary_unary(
            f"{SERVICE}/SupplyInput",
            request_serializer=pb.SupplyInputRequest.SerializeToString,
            response_deserializer=pb.SupplyInputResponse.FromString,
        )
        explain_rpc = channel.unary_unary(
            f"{SERVICE}/ExplainJob",
            request_serializer=pb.ExplainJobRequest.SerializeToString,
            response_deserializer=pb.ExplainJobResponse.FromString,
        )
        auth = (("authorization", f"Bearer {ROOT}"),)
        bad = pb.SupplyInputRequest(job_id=job_id, path="lang")
        bad.value.struct_value.update({"a": 1})
        for call, request, field in (
            (supply, bad, "value"),
            (supply, pb.SupplyInputRequest(job_id=job_id, path="nope", reason="x"), "value"),
            (explain_rpc, pb.ExplainJobRequest(job_id="nope"), "jobId"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, metadata=auth, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith("invalid-input: ")
            trailers = dict(refused.value.trailing_metadata())
            assert json.loads(trailers["protomolt-error-details-bin"])["field"] == field

    # the CLI: a --value that is not JSON is refused before the call, naming the field
    argv = ["jobs", "supply-input", job_id, "--path", "lang", "--url", url, "--token", ROOT]
    assert main([*argv, "--value", "en"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("invalid-input: --value (field 'value') is not JSON")
    assert main(["jobs", "supply-input", job_id, "--path", "language", "--value", '"en"',
                 "--url", url, "--token", ROOT]) == 2  # fmt: skip
    assert capsys.readouterr().err.startswith("invalid-input: 'path' is not a field path")
    assert main(["jobs", "explain", "zzzz-not-an-id", "--url", url, "--token", ROOT]) == 2
    assert capsys.readouterr().err.startswith("invalid-input: ")
    assert get_job(url, job_id)["status"] == "WAITING"  # nothing was written


def test_supply_input_racing_cancel_ends_in_one_state_and_the_answers_say_which(
    node, services, fresh_dsn
):
    url = node.http.url
    outcomes = []
    # four races, then each order once (a race may always fall the same way on one machine)
    for order in ("race", "race", "race", "race", "supply-first", "cancel-first"):
        job_id = submit(url, doc_workflow(services.target), {"text": "q3"})
        status_becomes(url, job_id, "WAITING", "waiting_input")
        start = threading.Barrier(2)
        supply_first, cancel_first = threading.Event(), threading.Event()
        answers: dict[str, dict] = {}

        def supply(job_id=job_id, start=start, answers=answers, order=order, gate=cancel_first,
                   done=supply_first):  # fmt: skip
            start.wait()
            if order == "cancel-first":
                gate.wait(30)
            body = {"jobId": job_id, "path": "lang", "value": "en"}
            answers["supply"] = post(url, "supply-input", body, who="ops")[1]
            done.set()

        def cancel(job_id=job_id, start=start, answers=answers, order=order, gate=supply_first,
                   done=cancel_first):  # fmt: skip
            start.wait()
            if order == "supply-first":
                gate.wait(30)
            answers["cancel"] = post(url, "cancel-job", {"jobId": job_id}, who="ops")[1]
            done.set()

        threads = [threading.Thread(target=supply), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        final = wait_for(
            lambda job_id=job_id: (
                (s := get_job(url, job_id)["status"]) in ("CANCELLED", "COMPLETED") and s
            )
        )
        with psycopg.connect(fresh_dsn) as conn:
            (revisions,) = conn.execute(
                "SELECT count(*) FROM workflow_input_revision WHERE job_id = %s", (job_id,)
            ).fetchone()
        supplied, cancelled = answers["supply"], answers["cancel"]
        if supplied["ok"]:
            # the supply won: its revision stands, the cancel acted on what followed
            assert supplied["status"] == "QUEUED" and revisions == 1
            assert final == ("CANCELLED" if cancelled["ok"] else "COMPLETED")
        else:
            # the cancel won: the supply says so, and wrote nothing
            assert supplied["error"] == "not-waiting-for-input", supplied
            assert supplied["status"] == "CANCELLED", supplied
            assert cancelled["ok"] and final == "CANCELLED" and revisions == 0
            assert get_job(url, job_id)["input"] == {"text": "q3"}
        outcomes.append((order, supplied["ok"], final))
    assert outcomes[-1][1] is False and outcomes[-2][1] is True, outcomes  # both orders seen


def test_two_operators_supplying_at_once_end_in_one_revision_and_the_loser_is_told(
    node, services, fresh_dsn
):
    url = node.http.url
    for _ in range(3):
        job_id = submit(url, doc_workflow(services.target), {"text": "q3"})
        status_becomes(url, job_id, "WAITING", "waiting_input")
        start = threading.Barrier(2)
        answers: dict[str, dict] = {}

        def supply(value, job_id=job_id, start=start, answers=answers):
            start.wait()
            body = {"jobId": job_id, "path": "lang", "value": value}
            answers[value] = post(url, "supply-input", body, who="ops")[1]

        threads = [threading.Thread(target=supply, args=(v,)) for v in ("en", "de")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        won = [v for v, a in answers.items() if a.get("ok")]
        assert len(won) == 1, answers
        (lost,) = {"en", "de"} - set(won)
        assert answers[lost]["error"] == "not-waiting-for-input", answers[lost]
        assert answers[lost]["status"] != "WAITING", answers[lost]
        with psycopg.connect(fresh_dsn) as conn:
            rows = conn.execute(
                "SELECT path FROM workflow_input_revision WHERE job_id = %s", (job_id,)
            ).fetchall()
        assert rows == [("lang",)], rows
        status_becomes(url, job_id, "COMPLETED")
        assert get_job(url, job_id)["input"]["lang"] == won[0]


def _count_statements(monkeypatch):
    counter = {"n": 0}
    execute = psycopg.Cursor.execute

    def counted(cur, *args, **kwargs):
        counter["n"] += 1
        return execute(cur, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return counter


def test_a_workflow_without_the_new_keys_fails_as_before_with_no_more_statements(
    store, fresh_dsn, services, monkeypatch
):
    """The MAPPING failure of a rule reading through an absent Struct key is today's text, and
    declaring ``inputs`` (with the input present) costs the same statements per run: the
    check is pure Python over the claimed row."""
    plain = {
        "name": "plain",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "steps": [
            step("load", services.target),
            {**step("analyse", services.target), "rules": ["seen += input.meta.source.uri"]},
        ],
    }
    declared = copy.deepcopy(plain)
    declared["inputs"] = {"text": {"owner": "team:data"}}
    declared["steps"][1]["onMissingInput"] = "wait"
    counts = []
    for workflow in (plain, declared):
        job = enqueue(store, workflow, {"text": "q3", "meta": {"other": 1}})
        worker = in_process_worker(store, fresh_dsn)
        counter = _count_statements(monkeypatch)
        assert worker.run_once() is True
        counts.append(counter["n"])
        monkeypatch.undo()
        row = store.job_get(job.job_id)
        assert row.status == "FAILED"
        assert row.error == (
            "MAPPING: mapping failed: Cannot resolve path 'input.meta.source.uri': key 'source' "
            "not found in struct (Rule: 'seen += input.meta.source.uri')"
        )
    assert counts[0] == counts[1], counts


def test_a_graph_step_that_waits_parks_the_run_once_nothing_else_can_run(node, services):
    """Graph: ``analyse`` (an external effect) needs ``lang`` and waits; ``facts``
    (independent) still runs; the run parks on ``analyse`` before its intent is recorded, so
    supply-input lets it finish (no RECOVERY_REQUIRED for a call that never started)."""
    url = node.http.url
    workflow = graph(
        [
            step("load", services.target),
            step("facts", services.target),
            {
                **step(
                    "analyse",
                    services.target,
                    after=["load"],
                    onMissingInput="wait",
                    effect="external",
                ),
                "rules": ['step = "analyse"', "seen += input.lang"],
            },
            step("publish", services.target, after=["analyse", "facts"]),
        ],
        name="graph-inputs",
        inputs={"lang": {"owner": "user:ana"}},
    )
    job_id = submit(url, workflow, {"text": "q3"})
    job = status_becomes(url, job_id, "WAITING", "waiting_input")
    assert job["outstandingStep"] == "analyse"
    assert services.step_calls("facts") == 1 and services.step_calls("analyse") == 0
    assert "effectIntents" not in job  # the step never started
    steps = {s["name"]: s for s in explain(url, job_id)["steps"]}
    assert set(steps) == {"analyse", "publish"}
    assert steps["analyse"]["missingInputs"] == [
        {"path": "lang", "owner": "user:ana", "required": True, "declared": True}
    ]
    assert steps["publish"]["blockedBy"] == [{"step": "analyse", "state": "waiting"}]
    status, answer, _ = post(
        url, "supply-input", {"jobId": job_id, "path": "lang", "value": "de"}, who="ana"
    )
    assert status == 200 and answer["ok"] and answer["byOwner"] is True, answer
    status_becomes(url, job_id, "COMPLETED")
    assert services.step_calls("analyse") == 1 and services.step_calls("facts") == 1


def test_a_value_replaced_while_waiting_marks_the_steps_that_read_it_stale(node, services):
    """While the run waits for ``lang``, an operator corrects ``text``, which ``load`` already
    read: the revision keeps the old value's hash, the run parks again on ``lang``, and
    explain-job reports ``load`` as having read stale input. Pause and resume keep the wait."""
    url = node.http.url
    workflow = doc_workflow(services.target)
    workflow["inputs"]["text"] = {"owner": "team:sales"}
    job_id = submit(url, workflow, {"text": "q3"})
    status_becomes(url, job_id, "WAITING", "waiting_input")

    # pause and resume: still waiting for the input
    assert post(url, "pause-job", {"jobId": job_id}, who="ops")[1]["ok"]
    status_becomes(url, job_id, "PAUSED")
    paused = explain(url, job_id)
    assert paused["run"] == [{"kind": "pause", "reason": "paused by an operator (resume-job)"}]
    assert post(url, "resume-job", {"jobId": job_id}, who="ops")[1]["ok"]
    status_becomes(url, job_id, "WAITING", "waiting_input")

    status, answer, _ = post(
        url, "supply-input", {"jobId": job_id, "path": "text", "value": "q4"}, who="ops"
    )
    assert status == 200 and answer["ok"], answer
    assert answer["oldSha256"] == hashlib.sha256(b'"q3"').hexdigest()
    assert answer["byOwner"] is False and answer["owner"] == "team:sales"
    status_becomes(url, job_id, "WAITING", "waiting_input")  # parked again: lang is missing
    account = explain(url, job_id)
    assert account["staleInput"] == [{"step": "load", "path": "text", "revision": 1}]
    assert [i["present"] for i in account["inputs"]] == [False, True]


def test_explain_names_a_full_queue_for_a_queued_run(store, fresh_dsn, services):
    """explain-job on a QUEUED run whose queue has its maxRunning runs RUNNING (the store's
    ``queue_cap`` read against the real schema)."""
    from protomolt_jobs.runs.submitter import Submitter
    from protomolt_jobs.verbs import ExplainJobAction, JobsBackend
    from protomolt_jobs.workflow import Runtime

    runtime = Runtime()
    backend = JobsBackend(configured=True)
    backend.bind(store, Submitter(store, None, runtime, 3))
    verb = ExplainJobAction(backend, runtime)
    running = enqueue(store, doc_workflow(services.target), {"text": "a"})
    queued = enqueue(store, doc_workflow(services.target), {"text": "b"})
    assert verb.execute({"jobId": str(queued.job_id)})["explain"]["run"] == [
        {"kind": "claim", "queue": "default"}
    ]
    store.queue_limits_sync({"default": {"max_running": 1}})
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE workflow_run SET status = 'RUNNING', lease_owner = 'w', "
            "lease_token = gen_random_uuid(), lease_until = now() + interval '1 minute', "
            "attempt = 1 WHERE job_id = %s",
            (running.job_id,),
        )
    assert store.queue_cap("default")["running"] == 1
    account = verb.execute({"jobId": str(queued.job_id)})["explain"]
    assert account["run"] == [
        {"kind": "queue-cap", "queue": "default", "maxRunning": 1, "running": 1}
    ]
    (first, *_) = account["steps"]
    assert first["name"] == "load" and first["waitingOn"] == account["run"]
