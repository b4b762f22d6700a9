"""/health and gRPC health tell live from ready: a node is ready only while its database
answers the probe and every background component of every role runs."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protomolt_jobs.service import Backoff
from tests.support import pg
from tests.support.node import http, node_environ, start_node, wait_for


@pytest.fixture
def node(tmp_path, fresh_dsn):
    surfaces = start_node(node_environ(tmp_path / "data", fresh_dsn))
    try:
        yield surfaces
    finally:
        surfaces.close()


def _health(surfaces) -> tuple[int, dict]:
    status, body, _ = http("GET", f"{surfaces.http.url}/health")
    return status, body


def _grpc_status(surfaces) -> int:
    with grpc.insecure_channel(surfaces.grpc.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_a_started_node_is_ready_and_names_its_components(node):
    _status, body = wait_for(lambda: (r := _health(node))[0] == 200 and r)
    assert body["status"] == "UP"
    jobs = body["components"]["jobs"]
    assert jobs["status"] == "UP"
    assert {"database", "sweeper", "worker"} <= set(jobs["components"])
    assert jobs["components"]["worker"]["parts"]["claim_loop_0"]["status"] == "UP"
    assert _grpc_status(node) == health_pb2.HealthCheckResponse.SERVING


def test_a_loop_that_raises_makes_the_node_not_ready_while_it_backs_off(node):
    wait_for(lambda: _health(node)[0] == 200)
    sweeper = node.node.mount("jobs").app.sweeper
    sweeper._restart_backoff = Backoff(2.0, 2.0)  # a wide window to observe the backoff
    sweeper.inject_failure()
    _status, body = wait_for(lambda: (r := _health(node))[0] == 503 and r, timeout_s=10)
    assert body["status"] == "DOWN"
    down = body["components"]["jobs"]["components"]["sweeper"]
    assert down["status"] == "DOWN" and down["state"] == "BACKING_OFF"
    assert "InjectedFailure" in down["lastError"]
    assert body["components"]["jobs"]["components"]["database"]["status"] == "UP"
    assert _grpc_status(node) == health_pb2.HealthCheckResponse.NOT_SERVING
    # restarted after the backoff: ready again
    wait_for(lambda: _health(node)[0] == 200, timeout_s=10)
    assert sweeper.health().restarts == 1
    assert _grpc_status(node) == health_pb2.HealthCheckResponse.SERVING


def test_a_database_gone_is_named_within_three_seconds(tmp_path, pg_template):
    name = pg.new_name("pmjt_gone")
    dsn = pg.create_database(name, template=pg_template)
    surfaces = start_node(node_environ(tmp_path / "data", dsn))
    try:
        wait_for(lambda: _health(surfaces)[0] == 200)
        pg.drop_database(name)  # WITH (FORCE): every connection of the node ends now
        t0 = time.monotonic()
        _status, body = wait_for(lambda: (r := _health(surfaces))[0] == 503 and r, timeout_s=10)
        took_s = time.monotonic() - t0
        database = body["components"]["jobs"]["components"]["database"]
        assert database["status"] == "DOWN" and database["error"]
        assert took_s <= 3.0, took_s
        assert _grpc_status(surfaces) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        t0 = time.monotonic()
        surfaces.close()
        close_s = time.monotonic() - t0
        pg.drop_database(name)
    assert close_s < 15.0, close_s  # bounded even with the database gone
