"""A database that cannot be reached is ``unavailable`` within a short bound, on the store, on
the actions route (503) and on gRPC (UNAVAILABLE); killed idle connections are replaced before
use. The shared PostgreSQL is never stopped: each test drops its own database WITH (FORCE),
which ends the node's connections and refuses new ones, as a database outage does."""

from __future__ import annotations

import time
import uuid

import grpc
import psycopg
import pytest
from google.protobuf import json_format

from protomolt_jobs.errors import StoreError, StoreUnavailable, Unavailable
from protomolt_jobs.host.grpc_service import RPCS, SERVICE_NAME
from protomolt_jobs.store import JobStore
from tests.support import pg
from tests.support.factories import queued_job
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for


def _drop(dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    pg.drop_database(name)


def _terminate_others(dsn: str) -> set[int]:
    """pg_terminate_backend every other backend of the test's database; their pids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        pids = {r[0] for r in rows}
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pids


def _gone(dsn: str, pids: set[int]) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        alive = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
        ).fetchone()[0]
    return alive == 0


class TestStore:
    def test_a_dropped_database_is_store_unavailable_within_the_bound(self, fresh_dsn):
        store = JobStore.open(fresh_dsn, max_size=3, connect_timeout_s=1.0)
        try:
            job = queued_job(store)
            _drop(fresh_dsn)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                store.job_get(job.job_id)
            assert time.monotonic() - started < 3.0
            assert "cannot be reached" in str(caught.value)
            # One exception, both meanings: an outage to duties, `unavailable` to verbs.
            assert isinstance(caught.value, StoreError)
            assert isinstance(caught.value, Unavailable)
            assert caught.value.code == "unavailable"
        finally:
            store.close()

    def test_a_port_with_no_server_is_store_unavailable_at_every_call(self, fresh_dsn):
        store = JobStore.open(fresh_dsn, max_size=2, connect_timeout_s=1.0)
        try:
            # Point the pool's future connections at a closed port, then end the live ones.
            params = psycopg.conninfo.conninfo_to_dict(fresh_dsn)
            with socket_port() as port:
                pass  # bound and closed again: nothing listens there now
            params["port"] = str(port)
            params["host"] = "127.0.0.1"
            store.pool.conninfo = psycopg.conninfo.make_conninfo(**params)
            pids = _terminate_others(fresh_dsn)
            wait_for(lambda: _gone(fresh_dsn, pids), timeout_s=10)
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    store.job_list()
                assert time.monotonic() - started < 3.0
        finally:
            store.close()

    def test_killed_idle_connections_are_replaced_before_use(self, fresh_dsn):
        store = JobStore.open(fresh_dsn, max_size=4)
        try:
            job = queued_job(store)
            # Fill the pool with idle connections, then kill every one of them.
            conns = [store.pool.getconn() for _ in range(4)]
            for c in conns:
                store.pool.putconn(c)
            pids = _terminate_others(fresh_dsn)
            assert len(pids) == 4
            wait_for(lambda: _gone(fresh_dsn, pids), timeout_s=10)
            for _ in range(6):
                again = store.job_get(job.job_id)
                assert again is not None and again.status == "QUEUED"
        finally:
            store.close()


class socket_port:
    """A free TCP port on loopback, closed again on exit (nothing listens there after)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


@pytest.fixture
def node(tmp_path, fresh_dsn):
    # The default bound (jobs.connect_timeout_seconds = 2): answers must come within 3 s.
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    yield surfaces
    surfaces.close()


def _verb_inputs(services) -> dict[str, dict]:
    job_id = str(uuid.uuid4())
    return {
        "submit-workflow": {"workflow": seed_workflow(services.target), "input": {"text": "x"}},
        "get-job": {"jobId": job_id},
        "list-jobs": {},
        "complete-step": {"jobId": job_id, "stepName": "review", "response": {}},
    }


def _grpc(channel, rpc: str, envelope: dict):
    _, req_cls, resp_cls = RPCS[rpc]
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    return stub(json_format.ParseDict(envelope, req_cls()), timeout=10)


_RPC = {
    "submit-workflow": "SubmitWorkflow",
    "get-job": "GetJob",
    "list-jobs": "ListJobs",
    "complete-step": "CompleteStep",
}


def test_every_verb_is_unavailable_when_the_database_is_gone(node, services, fresh_dsn):
    inputs = _verb_inputs(services)
    # Healthy first: every verb answers.
    for verb, envelope in inputs.items():
        assert http("POST", f"{node.actions_url}/{verb}", envelope)[0] == 200
    _drop(fresh_dsn)
    for verb, envelope in inputs.items():
        started = time.monotonic()
        status, body, _ = http("POST", f"{node.actions_url}/{verb}", envelope)
        elapsed = time.monotonic() - started
        assert (status, body["error"]) == (503, "unavailable"), (verb, body)
        assert (
            "database cannot be reached" in body["message"] or "database failed" in body["message"]
        ), body
        assert elapsed < 3.0, (verb, elapsed)
    channel = grpc.insecure_channel(node.grpc.target)
    try:
        for verb, envelope in inputs.items():
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                _grpc(channel, _RPC[verb], envelope)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, verb
            assert time.monotonic() - started < 3.0
    finally:
        channel.close()


_CONTROL_RPC = {
    "cancel-job": "CancelJob",
    "pause-job": "PauseJob",
    "resume-job": "ResumeJob",
    "retry-step": "RetryStep",
    "requeue-job": "RequeueJob",
    "job-history": "JobHistory",
}


def test_every_control_verb_and_health_are_unavailable_quickly_when_the_database_is_gone(
    node, fresh_dsn
):
    job_id = str(uuid.uuid4())
    inputs = {verb: {"jobId": job_id} for verb in _CONTROL_RPC}
    inputs["retry-step"]["stepName"] = "review"
    for verb, envelope in inputs.items():
        status, body, _ = http("POST", f"{node.actions_url}/{verb}", envelope)
        assert (status, body["ok"]) == (200, False), (verb, body)
    health = node.actions_url.replace("/protomolt/actions", "/health")
    assert http("GET", health)[0] == 200
    _drop(fresh_dsn)
    for verb, envelope in inputs.items():
        started = time.monotonic()
        status, body, _ = http("POST", f"{node.actions_url}/{verb}", envelope)
        elapsed = time.monotonic() - started
        assert (status, body["error"]) == (503, "unavailable"), (verb, body)
        assert elapsed < 3.0, (verb, elapsed)
    started = time.monotonic()
    status, body, _ = http("GET", health)
    assert status == 503, body
    assert time.monotonic() - started < 3.0
    channel = grpc.insecure_channel(node.grpc.target)
    try:
        for verb, envelope in inputs.items():
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                _grpc(channel, _CONTROL_RPC[verb], envelope)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, verb
            assert time.monotonic() - started < 3.0, verb
    finally:
        channel.close()


def test_after_terminating_the_nodes_idle_connections_the_next_verb_succeeds(node, fresh_dsn):
    job_id = str(uuid.uuid4())
    assert http("POST", f"{node.actions_url}/get-job", {"jobId": job_id})[0] == 200
    pids = _terminate_others(fresh_dsn)
    assert pids
    wait_for(lambda: _gone(fresh_dsn, pids), timeout_s=10)
    # The very next call of each verb answers from the database.
    status, body, _ = http("POST", f"{node.actions_url}/get-job", {"jobId": job_id})
    assert (status, body) == (200, {"ok": False, "error": f"no workflow run {job_id}"})
    status, body, _ = http("POST", f"{node.actions_url}/list-jobs", {})
    assert (status, body) == (200, {"ok": True, "jobs": []})
