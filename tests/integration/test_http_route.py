"""The actions route on loopback: manifest, verbs, error mapping, token, limits, health."""

from __future__ import annotations

import socket

import pytest

from protomolt_jobs.host.http_route import ActionsHttpServer, HttpResponse, HttpRoute
from tests.support.node import ERROR_TABLE, http, stub_catalog


@pytest.fixture
def server():
    catalog, actions = stub_catalog()
    srv = ActionsHttpServer(catalog, port=0, max_body_bytes=1024).start()
    srv.actions = actions
    yield srv
    srv.close()


def test_binds_loopback_by_default_and_port_zero_picks_a_port(server):
    assert server.host == "127.0.0.1"
    assert server.port != 0
    assert server.bound_host == "127.0.0.1"


def test_health_and_manifest(server):
    status, body, _ = http("GET", f"{server.url}/health")
    assert (status, body) == (200, {"status": "UP"})
    status, body, hdrs = http("GET", f"{server.url}/protomolt/actions")
    assert status == 200
    assert hdrs["Content-Type"] == "application/json"
    assert [a["name"] for a in body] == [
        "submit-workflow",
        "get-job",
        "list-jobs",
        "complete-step",
        "run-workflow",
    ]
    assert {"name", "description", "scope", "inputSchema"} <= set(body[0])


def test_post_runs_the_verb_with_the_body(server):
    status, body, _ = http(
        "POST", f"{server.url}/protomolt/actions/get-job", {"jobId": "abc", "n": 1.5}
    )
    assert status == 200
    assert body["echo"] == {"jobId": "abc", "n": 1.5}
    assert server.actions["get-job"].calls == [{"jobId": "abc", "n": 1.5}]


def test_ok_false_answers_are_200(server):
    answer = {"ok": False, "error": "no workflow run 1"}
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/get-job", {"answer": answer})
    assert (status, body) == (200, answer)


@pytest.mark.parametrize("code", sorted(ERROR_TABLE))
def test_every_action_error_maps_to_its_http_status(server, code):
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/get-job", {"raise": code})
    assert status == ERROR_TABLE[code][1]
    assert body == {"error": code, "message": f"stub {code}", "details": {"field": "x"}}


def test_unknown_verb_is_404_unknown_action_listing_the_verbs(server):
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/no-such-verb", {})
    assert status == 404
    assert body["error"] == "unknown-action"
    assert "submit-workflow" in body["details"]["available"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"", b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_400_invalid_input(server, raw):
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/get-job", raw=raw)
    assert status == 400
    assert body["error"] == "invalid-input"
    assert server.actions["get-job"].calls == []


def test_unexpected_exception_is_500_without_a_traceback(server, caplog):
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/get-job", {"boom": True})
    assert status == 500
    assert body["error"] == "internal-error"
    assert "secret stack detail" not in str(body)
    assert "Traceback" not in str(body)


def test_body_over_the_limit_is_413_with_an_envelope(server):
    status, body, _ = http(
        "POST", f"{server.url}/protomolt/actions/get-job", raw=b"{" + b" " * 2000 + b"}"
    )
    assert status == 413
    assert body["error"] == "payload-too-large"
    assert "1024" in body["message"]
    assert server.actions["get-job"].calls == []


def test_default_limit_is_16_mib():
    catalog, _ = stub_catalog()
    assert ActionsHttpServer(catalog).max_body_bytes == 16 * 1024 * 1024


def test_unknown_path_and_wrong_method(server):
    status, body, _ = http("GET", f"{server.url}/nope")
    assert (status, body["error"]) == (404, "not-found")
    status, body, hdrs = http("GET", f"{server.url}/protomolt/actions/get-job")
    assert (status, body["error"]) == (405, "method-not-allowed")
    assert hdrs["Allow"] == "POST"


def test_contributed_routes_are_served_and_their_errors_mapped():
    from protomolt_jobs.errors import Unavailable

    def hello(request):
        if request.query.get("fail"):
            raise Unavailable("not now")
        return HttpResponse(200, {"name": request.params["name"]})

    catalog, _ = stub_catalog()
    route = HttpRoute(frozenset({"GET"}), r"/hello/(?P<name>[^/]+)", hello)
    srv = ActionsHttpServer(catalog, port=0, routes=[route]).start()
    try:
        assert http("GET", f"{srv.url}/hello/a%20b")[:2] == (200, {"name": "a b"})
        status, body, _ = http("GET", f"{srv.url}/hello/x?fail=1")
        assert (status, body["error"]) == (503, "unavailable")
    finally:
        srv.close()


class TestToken:
    @pytest.fixture
    def guarded(self):
        catalog, actions = stub_catalog()
        srv = ActionsHttpServer(catalog, port=0, api_token="s3cret").start()
        srv.actions = actions
        yield srv
        srv.close()

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"api_token": "wrong"},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret"},
        ],
    )
    def test_missing_or_wrong_token_is_401(self, guarded, headers):
        for method, path, body in (
            ("GET", "/protomolt/actions", None),
            ("POST", "/protomolt/actions/get-job", {}),
        ):
            status, answer, _ = http(method, guarded.url + path, body, headers=headers)
            assert status == 401
            assert answer["error"] == "unauthenticated"
        assert guarded.actions["get-job"].calls == []

    @pytest.mark.parametrize(
        "headers", [{"api_token": "s3cret"}, {"Authorization": "Bearer s3cret"}]
    )
    def test_either_header_carries_the_token(self, guarded, headers):
        status, body, _ = http(
            "POST", f"{guarded.url}/protomolt/actions/get-job", {}, headers=headers
        )
        assert status == 200
        assert body["ok"] is True

    def test_health_stays_open(self, guarded):
        assert http("GET", f"{guarded.url}/health")[:2] == (200, {"status": "UP"})


def test_close_releases_the_port_and_is_idempotent():
    catalog, _ = stub_catalog()
    srv = ActionsHttpServer(catalog, port=0).start()
    port = srv.port
    srv.close()
    srv.close()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
