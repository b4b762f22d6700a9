"""The actions route at its input boundary: text UTF-8 cannot carry, deep bodies, framing
it does not support, and clients that stop sending."""

from __future__ import annotations

import json
import socket
import time

import pytest

from protomolt_jobs.host.http_route import ActionsHttpServer, HttpResponse, HttpRoute
from protomolt_jobs.host.registry import WorkflowStore, workflow_routes
from tests.support.node import http, stub_catalog


def _odd_route(request):
    kind = request.query.get("kind")
    if kind == "surrogate":
        return HttpResponse(200, {"echo": "a\ud800b", "\udfff": 1})
    if kind == "nan":
        return HttpResponse(200, {"n": float("nan")})
    return HttpResponse(200, {"obj": object()})


@pytest.fixture
def server(tmp_path):
    catalog, actions = stub_catalog()
    store = WorkflowStore(tmp_path / "workflows")
    routes = [HttpRoute(frozenset({"GET"}), r"/odd", _odd_route), *workflow_routes(store)]
    srv = ActionsHttpServer(catalog, port=0, routes=routes, request_timeout_s=1.0).start()
    srv.actions = actions
    srv.store = store
    yield srv
    srv.close()


def _exchange(server, data: bytes, *, shut_write: bool = False, timeout: float = 10) -> bytes:
    """Send raw bytes; everything the server sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        if shut_write:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk


def _status_and_body(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


# A body as raw JSON text: json.dumps would escape the surrogate the same way.
SURROGATE_BODIES = [
    ('{"jobId": "\\ud800"}', "jobId"),
    ('{"\\ud800": 1}', "\\ud800"),
    ('{"input": {"a": [1, {"\\udfff": 2}]}, "workflowName": "x"}', "input"),
    ('{"input": {"a": ["ok", "x\\udc00y"]}}', "input"),
    ('{"workflowName": "\\ud83d"}', "workflowName"),
]


@pytest.mark.parametrize(("raw", "field"), SURROGATE_BODIES)
def test_a_lone_surrogate_anywhere_is_400_naming_the_field(server, raw, field):
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/list-jobs", raw=raw.encode())
    assert status == 400
    assert body["error"] == "invalid-input"
    assert body["details"] == {"field": field}
    assert "lone surrogate" in body["message"]
    assert server.actions["list-jobs"].calls == []


def test_a_surrogate_pair_and_an_escaped_backslash_are_text(server):
    raw = b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}'
    status, body, _ = http("POST", f"{server.url}/protomolt/actions/get-job", raw=raw)
    assert status == 200
    assert body["echo"] == {"a": "\U0001f600", "b": "\\ud800"}


def test_a_reply_holding_a_lone_surrogate_is_sent_escaped(server):
    status, body, _ = http("GET", f"{server.url}/odd?kind=surrogate")
    assert status == 200
    assert body == {"echo": "a\ud800b", "\udfff": 1}


@pytest.mark.parametrize("kind", ["nan", "object"])
def test_a_reply_that_is_not_json_is_500_internal_error(server, kind):
    status, body, _ = http("GET", f"{server.url}/odd?kind={kind}")
    assert status == 500
    assert body == {"error": "internal-error", "message": "Internal error"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "a"),
        ("[" * 100_000, None),
        (
            '{"jobId": "x", "input": {"t": "[[[", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}}",
            "input",
        ),
    ],
)
def test_a_body_nested_past_the_parser_is_400_not_500(tmp_path, raw, field):
    catalog, actions = stub_catalog()
    srv = ActionsHttpServer(catalog, port=0).start()
    try:
        status, body, _ = http("POST", f"{srv.url}/protomolt/actions/get-job", raw=raw.encode())
    finally:
        srv.close()
    assert status == 400
    assert body["error"] == "invalid-input"
    assert "nested deeper" in body["message"]
    # docs/verbs.md: details.field is the top-level key the deep value sits under.
    assert body.get("details", {}).get("field") == field, body
    assert actions["get-job"].calls == []


def test_chunked_transfer_encoding_is_411_and_closes_the_connection(server):
    body = b'{"jobId": "x"}'
    request = (
        b"POST /protomolt/actions/get-job HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
        # A pipelined request: it must not be served from the chunk framing above.
        + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    reply = _exchange(server, request)
    status, answer = _status_and_body(reply)
    assert status == 411
    assert answer["error"] == "length-required"
    assert b"connection: close" in reply.lower()
    assert reply.count(b"HTTP/1.1 ") == 1
    assert server.actions["get-job"].calls == []


def test_a_body_that_never_arrives_is_408_within_the_timeout(server):
    request = (
        b"POST /protomolt/actions/get-job HTTP/1.1\r\nHost: x\r\n"
        b'Content-Length: 100\r\n\r\n{"jobId":'
    )
    started = time.monotonic()
    reply = _exchange(server, request)
    assert time.monotonic() - started < 8
    status, answer = _status_and_body(reply)
    assert status == 408
    assert answer["error"] == "request-timeout"
    assert server.actions["get-job"].calls == []


def test_a_body_cut_short_by_the_client_runs_nothing(server):
    # The client closes its side before the 100 bytes it announced: there is no one left to
    # answer, so the server closes the connection without running the verb.
    request = (
        b"POST /protomolt/actions/get-job HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}"
    )
    assert _exchange(server, request, shut_write=True) == b""
    assert server.actions["get-job"].calls == []


def test_an_idle_keep_alive_connection_is_closed_by_the_server(server):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    started = time.monotonic()
    reply = _exchange(server, request)  # returns once the server closes the connection
    assert time.monotonic() - started < 8
    assert _status_and_body(reply) == (200, {"status": "UP"})


@pytest.mark.parametrize("length", ["\u00b2", "+5", "-1", "1e3", "\u0663"])
def test_a_content_length_that_is_not_plain_decimal_is_400(server, length):
    request = (
        b"POST /protomolt/actions/get-job HTTP/1.1\r\nHost: x\r\nContent-Length: "
        + length.encode("utf-8")
        + b"\r\nConnection: close\r\n\r\n{}"
    )
    # uvicorn's HTTP parser refuses the request before the app runs: a plain-text 400 and a
    # closed connection (the envelope cannot be given for a request that does not parse).
    reply = _exchange(server, request)
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert server.actions["get-job"].calls == []


def test_default_request_timeout_is_30_s():
    catalog, _ = stub_catalog()
    assert ActionsHttpServer(catalog, port=0).request_timeout_s == 30.0


class TestRegistryPut:
    def test_a_definition_with_a_lone_surrogate_is_422_and_not_stored(self, server):
        raw = b'{"name": "x", "steps": [{"name": "\\ud800"}]}'
        status, body, _ = http("PUT", f"{server.url}/protomolt/workflows/x", raw=raw)
        # 422 and upstream's 42201, as upstream's registry refuses a body (docs/interop.md)
        assert (status, body["error"], body["error_code"]) == (422, "invalid-input", 42201)
        assert body["details"] == {"field": "steps"}
        assert server.store.names() == []

    def test_a_definition_nested_past_the_parser_is_422(self, server):
        raw = ('{"a":' * 100_000 + "1" + "}" * 100_000).encode()
        server.max_body_bytes = len(raw) + 1
        status, body, _ = http("PUT", f"{server.url}/protomolt/workflows/x", raw=raw)
        assert (status, body["error_code"]) == (422, 42201)
        assert "nested deeper" in body["message"]
        assert server.store.names() == []

    def test_a_name_with_a_trailing_newline_is_refused(self, server):
        status, body, _ = http("PUT", f"{server.url}/protomolt/workflows/nl%0A", {"name": "nl"})
        assert (status, body["error_code"]) == (422, 42201)
        assert "workflow names match" in body["message"]
        assert body["details"] == {"field": "name"}
        assert list(server.store.directory.iterdir()) == []


class TestCrossSite:
    """A page of another site may POST to a loopback node without a preflight (a text/plain
    or form body needs none); on a node without a token nothing else stops it, so the route
    refuses a write whose ``Origin`` names another host (curl and other clients send none)."""

    @pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1"])
    def test_a_post_from_another_origin_is_403_and_runs_nothing(self, server, origin):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
            status, body, _ = http(
                "POST",
                f"{server.url}/protomolt/actions/submit-workflow",
                raw=b'{"jobId": "x"}',
                headers={"Origin": origin, "Content-Type": ctype},
            )
            assert (status, body["error"]) == (403, "permission-denied"), body
            assert "another site" in body["message"]
        assert server.actions["submit-workflow"].calls == []
        status, body, _ = http(
            "PUT",
            f"{server.url}/protomolt/workflows/x",
            raw=b"{}",
            headers={"Origin": origin},
        )
        assert (status, body["error"]) == (403, "permission-denied"), body

    def test_a_post_from_the_nodes_own_origin_or_none_runs(self, server):
        own = server.url  # http://127.0.0.1:<port>
        for headers in ({"Origin": own}, {}):
            status, body, _ = http(
                "POST", f"{server.url}/protomolt/actions/submit-workflow", {"a": 1}, headers=headers
            )
            assert status == 200, body
        assert len(server.actions["submit-workflow"].calls) == 2
        # Reads are not writes: a GET with a foreign Origin is answered (CORS keeps the
        # answer from the foreign page).
        status, _, _ = http(
            "GET", f"{server.url}/protomolt/actions", headers={"Origin": "http://evil.example"}
        )
        assert status == 200
