"""The actions route: the node's HTTP JSON surface on the stdlib ``ThreadingHTTPServer``.

Routes:

- ``GET /health`` answers ``{"status": "UP"}``; it is never guarded by the API token.
- ``GET /protomolt/actions``: the catalog manifest (a JSON array).
- ``POST /protomolt/actions/{verb}``: a JSON object body, handed to ``catalog.execute``.
- Extra routes contributed by roles as :class:`HttpRoute` values (the registry's
  ``/protomolt/workflows`` endpoints).

Error mapping (DESIGN.md section 4): an :class:`~protomolt_jobs.errors.ActionError` answers with
its ``http_status`` and its ``to_json()`` envelope ``{"error", "message", "details"?}``. Answers with
``ok: false`` are answers: 200. Errors of the route itself use the same envelope shape:

======================= ====== ==========================================================
condition               status ``error``
======================= ====== ==========================================================
body not a JSON object  400    ``invalid-input`` (also: nested too deep, a lone surrogate
                               escape such as ``"\\ud800"``, a bad ``Content-Length``)
body shorter than said  400    ``invalid-input`` (the connection is closed)
missing or wrong token  401    ``unauthenticated``
unknown path            404    ``not-found``
wrong method            405    ``method-not-allowed`` (with an ``Allow`` header)
body not sent in time   408    ``request-timeout`` (the connection is closed)
chunked body            411    ``length-required`` (the connection is closed)
body over the limit     413    ``payload-too-large``
unexpected exception    500    ``internal-error`` (the traceback stays in the server log)
======================= ====== ==========================================================

The API token, when configured, is read from the ``api_token`` header or from
``Authorization: Bearer <token>``. The server binds 127.0.0.1 unless told otherwise.

Every reply is encodable: a body holding text that UTF-8 cannot carry (a lone surrogate echoed
from the request) is sent with ASCII escapes, and a body that is not JSON at all becomes a 500
``internal-error``. Each connection has a socket timeout (:data:`REQUEST_TIMEOUT_S`), so a
client that stops sending, or idles on a keep-alive connection, releases its thread.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from protomolt_jobs.errors import ActionError
from protomolt_jobs.job_verbs import has_lone_surrogate

__all__ = [
    "MAX_BODY_BYTES",
    "ActionsHttpServer",
    "HttpRequest",
    "HttpResponse",
    "HttpRoute",
    "error_response",
    "token_from_headers",
]

log = logging.getLogger("protomolt_jobs.http_route")

#: Largest request body accepted, in bytes (16 MiB, as upstream).
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Socket timeout of a connection, seconds: a body or the next request must arrive in time.
REQUEST_TIMEOUT_S = 30.0

#: A JSON escape that can decode to a lone surrogate (``\ud800``-``\udfff``); raw UTF-8 cannot
#: carry one, so a body without such an escape needs no scan.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class HttpRequest:
    """One request as a route handler sees it.

    :ivar method: ``GET``, ``POST``, ``PUT``, ...
    :ivar path: the decoded path, without the query string.
    :ivar params: named groups of the route pattern, URL-decoded.
    :ivar query: query parameters (last value wins).
    :ivar headers: request headers, lower-case names.
    :ivar body: the raw body (at most the server's limit).
    :ivar catalog: the node's action catalog (``execute(name, input)``), for handlers that run
        a verb (the registry's PUT runs ``check-workflow``).
    """

    method: str
    path: str
    params: Mapping[str, str]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    catalog: Any

    def json_object(self) -> dict[str, Any]:
        """The body parsed as a JSON object.

        :raises ValueError: when the body is not JSON or not an object; the message says which.
        """
        try:
            value = json.loads(self.body.decode("utf-8")) if self.body else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ValueError(
                "the request body is nested deeper than the JSON parser allows"
            ) from None
        if not isinstance(value, dict):
            raise ValueError("the request body must be a JSON object")  # noqa: TRY004 - one error type for callers
        if _SURROGATE_ESCAPE.search(self.body):
            where = _lone_surrogate_path(value)
            if where is not None:
                raise BodyFieldError(
                    where[0],
                    f"field {where[1]} holds a lone surrogate escape (\\ud800-\\udfff), "
                    "which is not text",
                )
        return value


class BodyFieldError(ValueError):
    """A JSON body that parses but holds a value no field may hold; :attr:`field` is the
    top-level key it sits under."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _lone_surrogate_path(value: dict[str, Any]) -> tuple[str, str] | None:
    """``(top-level key, path)`` of the first key or string holding a lone surrogate, both
    ASCII-escaped (iterative: no recursion on deep bodies); None when there is none."""
    stack: list[tuple[Any, str, str]] = [(value, "", "")]
    while stack:
        item, top, path = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                name = ascii(key)[1:-1]
                child_path = f"{path}.{name}" if path else name
                if has_lone_surrogate(key):
                    return top or name, child_path
                stack.append((child, top or name, child_path))
        elif isinstance(item, list):
            stack.extend((child, top, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str) and has_lone_surrogate(item):
            return top, path
    return None


@dataclass(frozen=True)
class HttpResponse:
    """A handler's answer: a JSON-able ``body`` (or raw ``bytes``) with a status."""

    status: int
    body: Any
    content_type: str = JSON_CONTENT_TYPE
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HttpRoute:
    """A route a role contributes (contribution kind; see ``hooks/contract.py``).

    :ivar methods: the HTTP methods it serves, upper case.
    :ivar pattern: a regular expression the whole path must match; named groups become
        :attr:`HttpRequest.params`.
    :ivar handler: ``handler(request) -> HttpResponse``; an :class:`ActionError` it raises maps
        like a verb's; anything else is a 500.
    """

    methods: frozenset[str]
    pattern: str
    handler: Callable[[HttpRequest], HttpResponse]
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))

    def match(self, path: str) -> dict[str, str] | None:
        """The URL-decoded named groups when ``path`` matches the whole pattern, else None."""
        m = self._regex.fullmatch(path)
        if m is None:
            return None
        return {k: unquote(v) for k, v in m.groupdict().items() if v is not None}


def error_response(status: int, code: str, message: str, **extra: Any) -> HttpResponse:
    """An error answer in the action envelope shape ``{"error", "message", ...extra}``."""
    body: dict[str, Any] = {"error": code, "message": message}
    body.update(extra)
    return HttpResponse(status, body)


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """The API token a request presents: ``api_token`` header, else ``Authorization: Bearer``.

    :param headers: request headers with lower-case names.
    :returns: the token, or None when none is presented.
    """
    token = headers.get("api_token")
    if token:
        return token.strip()
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def _token_ok(expected: str | None, presented: str | None) -> bool:
    if not expected:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


_VERB = r"/protomolt/actions/(?P<verb>[^/]+)"


class ActionsHttpServer:
    """The actions route and the contributed routes, served on daemon threads.

    :param catalog: the node catalog (``manifest()``, ``execute(name, input)``).
    :param host: bind address; 127.0.0.1 by default (loopback only).
    :param port: TCP port; 0 picks a free one (read :attr:`port` after :meth:`start`).
    :param api_token: when set, every route but ``/health`` demands it.
    :param routes: extra :class:`HttpRoute` values (contributed by roles).
    :param max_body_bytes: the request body limit (bytes).
    :param request_timeout_s: socket timeout of a connection (seconds): a body that does not
        arrive in time is 408 and an idle keep-alive connection is closed.
    """

    def __init__(
        self,
        catalog: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8081,
        api_token: str | None = None,
        routes: Iterable[HttpRoute] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.catalog = catalog
        self.request_timeout_s = request_timeout_s
        self.host = host
        self._requested_port = port
        self.api_token = api_token or None
        self.max_body_bytes = max_body_bytes
        self.routes: list[HttpRoute] = [
            HttpRoute(frozenset({"GET"}), r"/protomolt/actions", self._manifest),
            HttpRoute(frozenset({"POST"}), _VERB, self._execute),
            *routes,
        ]
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`), else the requested one."""
        if self._httpd is not None:
            return self._httpd.server_address[1]
        return self._requested_port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> ActionsHttpServer:
        """Bind and serve on a daemon thread; returns once the socket is listening.

        :raises OSError: when the address cannot be bound (port in use).
        """
        with self._lock:
            if self._httpd is not None:
                return self
            handler = _make_handler(self)
            httpd = ThreadingHTTPServer((self.host, self._requested_port), handler)
            httpd.daemon_threads = True
            self._httpd = httpd
            self._thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="protomolt-http",
                daemon=True,
            )
            self._thread.start()
        log.info(
            "actions route listening on %s",
            self.url,
            extra={"action": "http_started", "url": self.url},
        )
        return self

    def close(self) -> None:
        """Stop serving and release the socket. Idempotent."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        log.info("actions route stopped", extra={"action": "http_stopped"})

    # -- built-in routes -------------------------------------------------------------------

    def _manifest(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, list(self.catalog.manifest()))

    def _execute(self, request: HttpRequest) -> HttpResponse:
        try:
            envelope = request.json_object()
        except BodyFieldError as exc:
            return error_response(
                400, "invalid-input", f"Action input refused: {exc}", details={"field": exc.field}
            )
        except ValueError as exc:
            return error_response(
                400, "invalid-input", f"Action input must be a JSON object: {exc}"
            )
        result = self.catalog.execute(request.params["verb"], envelope)
        return HttpResponse(200, result)

    # -- dispatch --------------------------------------------------------------------------

    def dispatch(
        self,
        method: str,
        raw_path: str,
        headers: Mapping[str, str],
        read_body: Callable[[int], bytes],
    ) -> HttpResponse:
        """Answer one request (the handler thread calls this; tests may too).

        :param method: the HTTP method.
        :param raw_path: the request target (path and query).
        :param headers: lower-case header names.
        :param read_body: reads exactly n bytes of the body.
        """
        parts = urlsplit(raw_path)
        path = parts.path or "/"
        if path == "/health":
            if method not in ("GET", "HEAD"):
                return _method_not_allowed({"GET"})
            return HttpResponse(200, {"status": "UP"})
        if not _token_ok(self.api_token, token_from_headers(headers)):
            return error_response(
                401, "unauthenticated", "Missing or invalid API token 'api_token'"
            )
        allowed: set[str] = set()
        for route in self.routes:
            params = route.match(path)
            if params is None:
                continue
            if method not in route.methods:
                allowed |= route.methods
                continue
            length_text = (headers.get("content-length", "0") or "0").strip()
            if not (length_text.isascii() and length_text.isdigit()):
                return error_response(
                    400, "invalid-input", "Content-Length must be a non-negative decimal number"
                )
            length = int(length_text)
            if length > self.max_body_bytes:
                return error_response(
                    413,
                    "payload-too-large",
                    f"Request body exceeds {self.max_body_bytes} bytes",
                    limit=self.max_body_bytes,
                )
            body = read_body(length) if length else b""
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            request = HttpRequest(method, path, params, query, headers, body, self.catalog)
            return self._run(route, request)
        if allowed:
            return _method_not_allowed(allowed)
        return error_response(404, "not-found", f"No route for {method} {path}")

    def _run(self, route: HttpRoute, request: HttpRequest) -> HttpResponse:
        try:
            return route.handler(request)
        except ActionError as err:
            return HttpResponse(err.http_status, err.to_json())
        except Exception:
            correlation = str(uuid.uuid4())
            log.exception(
                "unexpected error serving %s %s (correlation id %s)",
                request.method,
                request.path,
                correlation,
                extra={"action": "http_internal_error", "correlation_id": correlation},
            )
            return error_response(
                500, "internal-error", f"Internal error (correlation id {correlation})"
            )


def _method_not_allowed(allowed: set[str]) -> HttpResponse:
    allow = ", ".join(sorted(allowed))
    return HttpResponse(
        405,
        {"error": "method-not-allowed", "message": f"Method not allowed; allowed: {allow}"},
        headers=(("Allow", allow),),
    )


class _BodyUnreadable(Exception):
    """The body could not be read as announced (timeout, or the client stopped sending)."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.body.get("message", ""))
        self.response = response


def _make_handler(server: ActionsHttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "protomolt-jobs"
        # StreamRequestHandler applies it to the socket: reads of the request line, headers
        # and body all give up after it, so no client holds a thread forever.
        timeout = server.request_timeout_s

        def _handle(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            consumed = {"body": False}

            def read_body(n: int) -> bytes:
                consumed["body"] = True
                try:
                    data = self.rfile.read(n)
                except TimeoutError:
                    raise _BodyUnreadable(
                        error_response(
                            408,
                            "request-timeout",
                            f"The request body did not arrive within "
                            f"{server.request_timeout_s:g} s",
                        )
                    ) from None
                if len(data) < n:
                    raise _BodyUnreadable(
                        error_response(
                            400,
                            "invalid-input",
                            f"The request body ended after {len(data)} of the {n} bytes "
                            "Content-Length announced",
                        )
                    )
                return data

            if "transfer-encoding" in headers:
                # The body length is unknown without decoding chunks we do not support;
                # reading on would take chunk framing for the next request.
                self.close_connection = True
                self._send(
                    error_response(
                        411,
                        "length-required",
                        "Transfer-Encoding is not supported; send the body with Content-Length",
                    )
                )
                return
            try:
                response = server.dispatch(self.command, self.path, headers, read_body)
            except _BodyUnreadable as exc:
                self.close_connection = True
                response = exc.response
            except Exception:
                log.exception("actions route failed", extra={"action": "http_internal_error"})
                response = error_response(500, "internal-error", "Internal error")
            if not consumed["body"] and headers.get("content-length", "0") not in ("", "0"):
                # The body was refused unread (413, 401, 404): the connection cannot be reused.
                self.close_connection = True
            self._send(response)

        def _send(self, response: HttpResponse) -> None:
            try:
                payload = _encode(response.body)
            except (TypeError, ValueError):
                log.exception(
                    "reply of status %d is not JSON",
                    response.status,
                    extra={"action": "http_reply_unencodable", "status": response.status},
                )
                response = error_response(500, "internal-error", "Internal error")
                payload = _encode(response.body)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers:
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args, extra={"action": "http_request"})

    return Handler


def _encode(body: Any) -> bytes:
    """The reply bytes: raw bytes as given, else strict JSON in UTF-8; text UTF-8 cannot carry
    (a lone surrogate echoed from the request) falls back to ASCII escapes.

    :raises TypeError: the body is not JSON-able.
    :raises ValueError: the body holds a non-finite number.
    """
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True, allow_nan=False).encode("ascii")
