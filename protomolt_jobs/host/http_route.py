"""The actions route: the node's HTTP JSON surface, a Starlette app served by uvicorn.

Routes:

- ``GET /health`` answers readiness (:func:`readiness`: 200 ``{"status": "UP", ...}`` or 503
  ``{"status": "DOWN", "components": {...}}``); it is never guarded by the API token.
- ``GET /protomolt/actions``: the catalog manifest (a JSON array).
- ``POST /protomolt/actions/{verb}``: a JSON object body, handed to ``catalog.execute``.
- Extra routes contributed by roles as :class:`HttpRoute` values (the registry's
  ``/protomolt/workflows`` endpoints, each with the scope it needs), and plain Starlette routes
  or mounts a host adds (``extra``: a dashboard, ``/metrics``); both sit behind the same token.

Who calls: the token guard in front of every route but ``/health`` asks the node's
:class:`~protomolt_jobs.host.authority.Authority` once per request and keeps the
:class:`~protomolt_jobs.host.catalog.Caller` in the request's state (:data:`CALLER_STATE`):
the manifest lists only what it may run, a verb runs as it (``permission-denied`` naming the
scope otherwise, reported to the roles), a route with a ``scope`` refuses it the same way, and
the dashboard acts as it.

:func:`actions_app` builds the ASGI app (another host can mount it); :class:`ActionsHttpServer`
serves it with uvicorn on a daemon thread. Handlers and verbs are synchronous: they run in the
app's own thread pool (:data:`HANDLER_THREADS` threads), so a slow database call never blocks
the event loop, and callers beyond the pool wait in line instead of being reset (uvicorn's
listen backlog is 2048).

Error mapping (DESIGN.md section 4): an :class:`~protomolt_jobs.errors.ActionError` answers with
its ``http_status`` and its ``to_json()`` envelope ``{"error", "message", "details"?}``. Answers with
``ok: false`` are answers: 200. Errors of the route itself use the same envelope shape:

======================= ====== ==========================================================
condition               status ``error``
======================= ====== ==========================================================
body not a JSON object  400    ``invalid-input`` (also: nested too deep, a lone surrogate
                               escape such as ``"\\ud800"``)
bad ``Content-Length``  400    refused by uvicorn's HTTP parser before the app runs (a plain
                               text body, not the envelope; the connection is closed)
missing or wrong token  401    ``unauthenticated``
scope not held          403    ``permission-denied`` naming the scope (a verb or a scoped
                               route); the refusal is reported to the roles
write from another site 403    ``permission-denied``: a POST/PUT/DELETE/PATCH whose ``Origin``
                               names another host than ``Host`` (or is ``null``): a
                               page of another site, which needs no CORS preflight for a
                               ``text/plain`` or form body; nothing runs
unknown path            404    ``not-found``
wrong method            405    ``method-not-allowed`` (with an ``Allow`` header)
body not sent in time   408    ``request-timeout`` (the connection is closed)
chunked body            411    ``length-required`` (the connection is closed)
body over the limit     413    ``payload-too-large`` (the connection is closed)
unexpected exception    500    ``internal-error`` (the traceback stays in the server log)
======================= ====== ==========================================================

A client that closes its side before the announced body has arrived gets no answer (there is
no one left to read it); the verb is not run.

The API token, when configured, is read from the ``api_token`` header or from
``Authorization: Bearer <token>``. The server binds 127.0.0.1 unless told otherwise.

Every reply is encodable: a body holding text that UTF-8 cannot carry (a lone surrogate echoed
from the request) is sent with ASCII escapes, and a body that is not JSON at all becomes a 500
``internal-error``. The body must arrive within ``request_timeout_s``, and an idle keep-alive
connection is closed after ``min(request_timeout_s, 5)`` seconds.

Headers have a deadline of their own, ``header_timeout_s`` (``[node] http_header_timeout_s``,
10 s by default): uvicorn has none, so a client sending its headers a byte at a time held a
connection for good. The server speaks HTTP/1.1 through :class:`HeaderDeadlineProtocol`
(uvicorn's h11 protocol with a timer): a connection whose request headers are not complete
within the deadline (counted from the connection for its first request, from the first byte
of a later one) gets ``408`` with ``Connection: close`` and is closed; the event loop never
waits on a slow sender, so other callers are answered meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.to_thread
import h11
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from protomolt_jobs.errors import ActionError, ProtomoltJobsError
from protomolt_jobs.host.authority import Authority
from protomolt_jobs.host.catalog import Caller
from protomolt_jobs.host.nodeconfig import HTTP_HEADER_TIMEOUT_S
from protomolt_jobs.input_rules import has_lone_surrogate

__all__ = [
    "CALLER_STATE",
    "HANDLER_THREADS",
    "HTTP_HEADER_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "ActionsHttpServer",
    "HeaderDeadlineProtocol",
    "HttpRequest",
    "HttpResponse",
    "HttpRoute",
    "actions_app",
    "caller_of",
    "cross_site",
    "error_response",
    "token_from_headers",
]

log = logging.getLogger("protomolt_jobs.http_route")

#: Largest request body accepted, in bytes (16 MiB, as upstream).
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Seconds a request body has to arrive in full (408 after that).
REQUEST_TIMEOUT_S = 30.0
#: Threads that run handlers and verbs. Above the gRPC server's 64 workers would only queue
#: on the database pool; below it, bursts wait in the app instead of in the pool.
HANDLER_THREADS = 64
#: uvicorn's listen backlog: connections the kernel holds before the app accepts them.
LISTEN_BACKLOG = 2048
#: Key of the request's ASGI ``state`` under which the token guard keeps the resolved
#: :class:`~protomolt_jobs.host.catalog.Caller` (None on a public path without a valid token).
CALLER_STATE = "protomolt_caller"

#: A JSON escape that can decode to a lone surrogate (``\\ud800``-``\\udfff``); raw UTF-8 cannot
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
    :ivar caller: who sent it (resolved by the token guard); None only for ``/health``.
    """

    method: str
    path: str
    params: Mapping[str, str]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    catalog: Any
    caller: Caller | None = None

    def json_object(self) -> dict[str, Any]:
        """The body parsed as a JSON object.

        :raises ValueError: when the body is not JSON or not an object; the message says which.
        """
        try:
            value = json.loads(self.body.decode("utf-8")) if self.body else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            message = "the request body is nested deeper than the JSON parser allows"
            key = _top_level_key_of_deepest(self.body)
            if key is not None:
                raise BodyFieldError(key, f"field {key} {message[17:]}") from None
            raise ValueError(message) from None
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


class BodyFieldError(ProtomoltJobsError, ValueError):
    """A JSON body that parses but holds a value no field may hold; :attr:`field` is the
    top-level key it sits under."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _top_level_key_of_deepest(body: bytes) -> str | None:
    """The top-level key (ASCII-escaped) whose value nests deepest in a JSON object ``body``
    that the parser refused as too deep, or None (not an object, no key). A linear scan of
    the bytes: strings are skipped, brackets counted."""
    depth, deepest, key, best = 0, 0, None, None
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == 0x22:  # '"': a string; at depth 1 followed by ':' it is a top-level key
            j = i + 1
            while j < n and body[j] != 0x22:
                j += 2 if body[j] == 0x5C else 1
            if depth == 1:
                k = j + 1
                while k < n and body[k] in b" \t\r\n":
                    k += 1
                if k < n and body[k] == 0x3A:
                    try:
                        key = ascii(json.loads(body[i : j + 1]))[1:-1]
                    except ValueError:
                        key = None
            i = j + 1
            continue
        if c in b"[{":
            depth += 1
            if depth > deepest:
                deepest, best = depth, key
        elif c in b"]}":
            depth -= 1
        i += 1
    return best


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
    :ivar scope: the scope a caller must hold (one of
        :data:`~protomolt_jobs.hooks.contract.SCOPES`; refused with 403 ``permission-denied``
        naming it, before the handler runs), or "" for any caller the token guard let in.
    """

    methods: frozenset[str]
    pattern: str
    handler: Callable[[HttpRequest], HttpResponse]
    scope: str = ""
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


def principal_of(
    presented: str | None, api_token: str | None, tokens: Mapping[str, str] | None = None
) -> str | None:
    """Who presents ``presented`` on a node with these tokens and no identity hook: the name
    of a matching ``[node.tokens]`` entry, ``api`` for the node's single ``api_token``,
    ``anonymous`` on a node with no token at all (:meth:`Authority.principal`).

    :returns: the principal, or None when the node has tokens and none matches (refuse).
    """
    return Authority(api_token=api_token, tokens=tokens).principal(presented)


def caller_of(scope: Mapping[str, Any]) -> Caller | None:
    """The caller the token guard resolved for an ASGI request ``scope`` (None: none, as on a
    public path presenting no valid token)."""
    state = scope.get("state")
    caller = state.get(CALLER_STATE) if isinstance(state, dict) else None
    return caller if isinstance(caller, Caller) else None


_VERB = r"/protomolt/actions/(?P<verb>[^/]+)"
_HEALTH = "/health"


def _health_up(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, {"status": "UP"})


def readiness(health: Callable[[], dict[str, Any]]) -> Callable[[HttpRequest], HttpResponse]:
    """A ``/health`` handler over a node's readiness (``Node.health``): 200 with the body
    while its ``status`` is ``UP``, else 503 with the same body (``{"status": "DOWN",
    "components": {...}}`` naming what is down). Liveness is the server answering at all."""

    def handler(request: HttpRequest) -> HttpResponse:
        body = health()
        return HttpResponse(200 if body.get("status") == "UP" else 503, body)

    return handler


class _Dispatcher:
    """The app's endpoint for :class:`HttpRoute` values: token, framing, limits, thread pool.

    Settings are read per request, so a server's :attr:`ActionsHttpServer.max_body_bytes`
    may change while it runs (tests do).
    """

    def __init__(
        self,
        catalog: Any,
        *,
        authority: Authority,
        routes: Iterable[HttpRoute],
        max_body_bytes: int,
        request_timeout_s: float,
        health: Callable[[HttpRequest], HttpResponse],
        handler_threads: int,
    ) -> None:
        self.catalog = catalog
        self.authority = authority
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.handler_threads = handler_threads
        self.health_route = HttpRoute(frozenset({"GET", "HEAD"}), _HEALTH, health)
        self.routes: list[HttpRoute] = [
            HttpRoute(frozenset({"GET"}), r"/protomolt/actions", self._manifest),
            HttpRoute(frozenset({"POST"}), _VERB, self._execute),
            *routes,
        ]
        self._limiter: anyio.CapacityLimiter | None = None

    # -- built-in routes -------------------------------------------------------------------

    def _manifest(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, list(self.catalog.manifest(_caller(request))))

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
        result = self.catalog.execute(request.params["verb"], envelope, caller=_caller(request))
        return HttpResponse(200, result)

    # -- the ASGI side ---------------------------------------------------------------------

    @property
    def api_token(self) -> str | None:
        """The node's single ``api_token`` (None: none configured)."""
        return self.authority.api_token

    def resolve(self, headers: Mapping[str, str]) -> Caller | None:
        """The request's caller (:meth:`Authority.resolve` of the token it presents); None
        when refused."""
        return self.authority.resolve(token_from_headers(headers))

    async def endpoint(self, request: Request) -> Response:
        """Answer one request (a Starlette endpoint)."""
        method = request.method
        # The raw path keeps percent-escapes, so a name holding "%2F" matches as one segment
        # and route groups are decoded once (HttpRoute.match).
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
        headers = {k.lower(): v for k, v in request.headers.items()}
        if "transfer-encoding" in headers:
            # Bodies are bounded by Content-Length before reading; an unbounded chunked body
            # is refused unread and the connection closed (its framing is not worth draining).
            return _send(
                error_response(
                    411,
                    "length-required",
                    "Transfer-Encoding is not supported; send the body with Content-Length",
                ),
                method,
                close=True,
            )
        route: HttpRoute | None
        params: dict[str, str]
        if path == _HEALTH:
            route, params = self.health_route, {}
            if method not in route.methods:
                return _send(_method_not_allowed({"GET"}), method)
        else:
            # The token was checked by _TokenGuard, in front of every route.
            route, params, allowed = self._match(method, path)
            if route is None:
                if allowed:
                    return _send(_method_not_allowed(allowed), method, close=_has_body(headers))
                return _send(
                    error_response(404, "not-found", f"No route for {method} {path}"),
                    method,
                    close=_has_body(headers),
                )
        if method not in _SAFE_METHODS and cross_site(headers):
            # Checked before the body is read: a foreign page's write runs nothing.
            return _send(
                error_response(
                    403,
                    "permission-denied",
                    "a page of another site cannot write to this node "
                    f"(Origin {headers.get('origin', '')!r} is not {headers.get('host', '')!r})",
                ),
                method,
                close=_has_body(headers),
            )
        length_text = (headers.get("content-length", "0") or "0").strip()
        if not (length_text.isascii() and length_text.isdigit()):
            return _send(
                error_response(
                    400, "invalid-input", "Content-Length must be a non-negative decimal number"
                ),
                method,
                close=True,
            )
        length = int(length_text)
        if length > self.max_body_bytes:
            return _send(
                error_response(
                    413,
                    "payload-too-large",
                    f"Request body exceeds {self.max_body_bytes} bytes",
                    limit=self.max_body_bytes,
                ),
                method,
                close=True,
            )
        body = b""
        if length:
            try:
                body = await self._read_body(request, length)
            except TimeoutError:
                return _send(
                    error_response(
                        408,
                        "request-timeout",
                        f"The request body did not arrive within {self.request_timeout_s:g} s",
                    ),
                    method,
                    close=True,
                )
            except ClientDisconnect:
                # Nobody is left to read an answer; uvicorn drops it.
                return _send(
                    error_response(400, "invalid-input", "The client closed before the body"),
                    method,
                    close=True,
                )
        query = {k: v[-1] for k, v in parse_qs(request.url.query).items()}
        http_request = HttpRequest(
            method,
            unquote(path),
            params,
            query,
            headers,
            body,
            self.catalog,
            caller_of(request.scope),
        )
        response = await anyio.to_thread.run_sync(
            _run, route, http_request, limiter=self._thread_limiter()
        )
        return _send(response, method)

    async def _read_body(self, request: Request, length: int) -> bytes:
        chunks: list[bytes] = []
        with anyio.fail_after(self.request_timeout_s):
            async for chunk in request.stream():
                chunks.append(chunk)
        return b"".join(chunks)[:length]

    def _match(self, method: str, path: str) -> tuple[HttpRoute | None, dict[str, str], set[str]]:
        allowed: set[str] = set()
        for route in self.routes:
            params = route.match(path)
            if params is None:
                continue
            if method not in route.methods:
                allowed |= route.methods
                continue
            return route, params, allowed
        return None, {}, allowed

    def _thread_limiter(self) -> anyio.CapacityLimiter:
        # Created on first use: a limiter belongs to the running event loop. This app's own
        # pool, so mounting it in another host does not resize that host's default pool.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.handler_threads)
        return self._limiter


def _caller(request: HttpRequest) -> Caller:
    """The request's caller; a request that reached a handler without one (a host that serves
    the app without the guard) holds no scope at all."""
    return request.caller if request.caller is not None else Caller("anonymous")


def _run(route: HttpRoute, request: HttpRequest) -> HttpResponse:
    """Run one handler (in a pool thread) after its scope check; action errors map (a scope
    not held is 403 ``permission-denied``), anything else is a 500."""
    try:
        if route.scope:
            request.catalog.authorize(
                _caller(request), f"{request.method} {request.path}", route.scope
            )
        return route.handler(request)
    except ActionError as err:
        return HttpResponse(err.http_status, err.to_json())
    except Exception:  # a 500 with a correlation id, not a crash
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


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site(headers: Mapping[str, str]) -> bool:
    """True when a browser sent the request from a page of another origin.

    Browsers name the page's origin in ``Origin`` on every cross-origin POST, including the
    "simple" ones (a ``text/plain`` or form body) they send without a CORS preflight; ``null``
    is an opaque origin (a sandboxed frame, a ``data:`` page). Clients other than browsers
    send no ``Origin``, so they are never refused here.

    :param headers: request headers, lower-case names.
    """
    origin = headers.get("origin")
    if origin is None:
        return False
    if origin.strip() in ("", "null"):
        return True
    try:
        netloc = urlsplit(origin.strip()).netloc
    except ValueError:  # not a URL ("http://[" ...): no page of ours sends that
        return True
    return netloc.lower() != headers.get("host", "").strip().lower()


def _has_body(headers: Mapping[str, str]) -> bool:
    return headers.get("content-length", "0").strip() not in ("", "0")


def _unauthenticated() -> HttpResponse:
    return error_response(401, "unauthenticated", "Missing or invalid API token 'api_token'")


def _method_not_allowed(allowed: set[str]) -> HttpResponse:
    allow = ", ".join(sorted(allowed))
    return HttpResponse(
        405,
        {"error": "method-not-allowed", "message": f"Method not allowed; allowed: {allow}"},
        headers=(("Allow", allow),),
    )


def _send(response: HttpResponse, method: str, *, close: bool = False) -> Response:
    """The Starlette response for ``response``; ``close`` asks uvicorn to close the connection
    after it (a body left unread, or a stalled one, cannot be skipped reliably)."""
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
    headers = dict(response.headers)
    if close:
        headers["Connection"] = "close"
    return Response(
        payload if method != "HEAD" else b"",
        status_code=response.status,
        headers=headers,
        media_type=response.content_type,
    )


def _cookie(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header, or None."""
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return unquote(value.strip().strip('"')) or None
    return None


class _TokenGuard:
    """ASGI middleware: every route but ``/health`` demands a token the node's authority
    resolves (the built-in routes, role routes and a host's extra routes alike), and the
    resolved caller is kept in the request's state (:data:`CALLER_STATE`). Public paths
    (``public(path)``) pass without one; their caller is kept when the token resolves."""

    def __init__(
        self,
        app: Any,
        dispatcher: _Dispatcher,
        public: Callable[[str], bool] = lambda path: False,
        token_cookie: str | None = None,
        login_redirect: Callable[[str], str | None] = lambda path: None,
    ) -> None:
        self.app = app
        self.dispatcher = dispatcher
        self.public = public
        self.token_cookie = token_cookie
        self.login_redirect = login_redirect

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path != _HEALTH:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            if self.token_cookie and "cookie" in headers and not token_from_headers(headers):
                # A browser (the dashboard) presents the token as a cookie.
                cookie = _cookie(headers["cookie"], self.token_cookie)
                if cookie:
                    headers["api_token"] = cookie
            caller = await self._resolve(headers)
            scope.setdefault("state", {})[CALLER_STATE] = caller
            if caller is None and not self.public(path):
                login = self.login_redirect(path) if scope["method"] in ("GET", "HEAD") else None
                if login is not None:
                    # A browser page: send it to the login form instead of a JSON 401.
                    await RedirectResponse(login, status_code=303)(scope, receive, send)
                    return
                response = _send(_unauthenticated(), scope["method"], close=_has_body(headers))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _resolve(self, headers: Mapping[str, str]) -> Caller | None:
        if self.dispatcher.authority.identity_hook is None:
            # The node's own tables: a few constant-time comparisons, fine on the loop.
            return self.dispatcher.resolve(headers)
        # An identity provider may do I/O: never on the event loop.
        return await anyio.to_thread.run_sync(
            self.dispatcher.resolve, headers, limiter=self.dispatcher._thread_limiter()
        )


_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


def actions_app(
    catalog: Any,
    *,
    api_token: str | None = None,
    tokens: Mapping[str, str] | None = None,
    authority: Authority | None = None,
    routes: Iterable[HttpRoute] = (),
    extra: Sequence[BaseRoute] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    health: Callable[[HttpRequest], HttpResponse] = _health_up,
    handler_threads: int = HANDLER_THREADS,
    public: Callable[[str], bool] = lambda path: False,
    token_cookie: str | None = None,
    login_redirect: Callable[[str], str | None] = lambda path: None,
) -> Starlette:
    """The node's HTTP surface as an ASGI app (mountable by another host).

    :param catalog: the node :class:`~protomolt_jobs.host.catalog.Catalog` (``manifest``,
        ``execute``, ``authorize``).
    :param api_token: when set, every route but ``/health`` demands it (principal ``api``).
        Ignored when ``authority`` is given.
    :param tokens: named tokens (``[node.tokens]``: principal -> token); any of them is
        accepted too, and its name is the verb's principal (the history's actor); every
        scope (no ``[node.scopes]``). Ignored when ``authority`` is given.
    :param authority: the node's resolver (tokens, groups, scopes, identity hook); None: one
        built from ``api_token`` and ``tokens``.
    :param routes: :class:`HttpRoute` values contributed by roles (synchronous handlers).
    :param extra: Starlette routes or mounts a host adds (``Route("/metrics", ...)``,
        ``Mount("/ui", ...)``); they are matched before the catalog routes and sit behind the
        token too.
    :param max_body_bytes: the request body limit (bytes).
    :param request_timeout_s: seconds a request body has to arrive (408 after that).
    :param health: the ``/health`` handler (``GET``/``HEAD``, no token).
    :param handler_threads: threads that run handlers and verbs.
    :param public: ``public(path)`` True exempts that path from the token (``/metrics`` with
        ``metrics_public``, the dashboard's login form and assets).
    :param token_cookie: a cookie name also accepted as the token (the dashboard's login).
    :param login_redirect: ``login_redirect(path)`` gives the URL a GET without the token is
        redirected to (the dashboard's login form), or None for the JSON 401.
    :returns: the Starlette app; ``app.state.dispatcher`` holds the live settings.
    """
    dispatcher = _Dispatcher(
        catalog,
        authority=authority or Authority(api_token=api_token, tokens=tokens),
        routes=routes,
        max_body_bytes=max_body_bytes,
        request_timeout_s=request_timeout_s,
        health=health,
        handler_threads=handler_threads,
    )
    app = Starlette(
        routes=[*extra, Route("/{path:path}", dispatcher.endpoint, methods=_ALL_METHODS)],
    )
    app.add_middleware(
        _TokenGuard,
        dispatcher=dispatcher,
        public=public,
        token_cookie=token_cookie,
        login_redirect=login_redirect,
    )
    app.state.dispatcher = dispatcher
    return app


class ActionsHttpServer:
    """:func:`actions_app` served by uvicorn on a daemon thread.

    :param catalog: the node catalog (``manifest``, ``execute``, ``authorize``).
    :param host: bind address; 127.0.0.1 by default (loopback only).
    :param port: TCP port; 0 picks a free one (read :attr:`port` after :meth:`start`).
    :param api_token: when set, every route but ``/health`` demands it (ignored with
        ``authority``).
    :param tokens: named tokens, every scope (ignored with ``authority``).
    :param authority: the node's resolver; None: one built from ``api_token`` and ``tokens``.
    :param routes: extra :class:`HttpRoute` values (contributed by roles).
    :param extra: Starlette routes or mounts (see :func:`actions_app`).
    :param max_body_bytes: the request body limit (bytes).
    :param request_timeout_s: seconds a body has to arrive (408 after that); an idle
        keep-alive connection is closed after ``min(request_timeout_s, 5)`` seconds.
    :param health: the ``/health`` handler.
    :param handler_threads: threads that run handlers and verbs.
    :param public: paths exempt from the token (see :func:`actions_app`).
    :param token_cookie: a cookie name also accepted as the token.
    :param header_timeout_s: seconds a connection has to deliver a request's headers before
        it gets 408 and is closed (:class:`HeaderDeadlineProtocol`).
    """

    def __init__(
        self,
        catalog: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8081,
        api_token: str | None = None,
        tokens: Mapping[str, str] | None = None,
        authority: Authority | None = None,
        header_timeout_s: float = HTTP_HEADER_TIMEOUT_S,
        routes: Iterable[HttpRoute] = (),
        extra: Sequence[BaseRoute] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        health: Callable[[HttpRequest], HttpResponse] = _health_up,
        handler_threads: int = HANDLER_THREADS,
        public: Callable[[str], bool] = lambda path: False,
        token_cookie: str | None = None,
        login_redirect: Callable[[str], str | None] = lambda path: None,
    ) -> None:
        if not header_timeout_s > 0:
            raise ValueError(f"header_timeout_s must be above 0; got {header_timeout_s!r}")
        self.catalog = catalog
        self.host = host
        self._requested_port = port
        self.header_timeout_s = float(header_timeout_s)
        self.app = actions_app(
            catalog,
            api_token=api_token,
            tokens=tokens,
            authority=authority,
            routes=routes,
            extra=extra,
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout_s,
            health=health,
            handler_threads=handler_threads,
            public=public,
            token_cookie=token_cookie,
            login_redirect=login_redirect,
        )
        self._dispatcher: _Dispatcher = self.app.state.dispatcher
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # Live settings (read per request).
    @property
    def api_token(self) -> str | None:
        return self._dispatcher.api_token

    @property
    def max_body_bytes(self) -> int:
        return self._dispatcher.max_body_bytes

    @max_body_bytes.setter
    def max_body_bytes(self, value: int) -> None:
        self._dispatcher.max_body_bytes = value

    @property
    def request_timeout_s(self) -> float:
        return self._dispatcher.request_timeout_s

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`), else the requested one."""
        if self._socket is not None:
            return int(self._socket.getsockname()[1])
        return self._requested_port

    @property
    def bound_host(self) -> str | None:
        """The address the listening socket is bound to (after :meth:`start`)."""
        return None if self._socket is None else str(self._socket.getsockname()[0])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> ActionsHttpServer:
        """Bind and serve on a daemon thread; returns once uvicorn accepts connections.

        :raises OSError: when the address cannot be bound (port in use).
        :raises RuntimeError: uvicorn did not start within ``timeout_s``.
        """
        with self._lock:
            if self._server is not None:
                return self
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.host, self._requested_port))
                sock.listen(LISTEN_BACKLOG)
            except OSError:
                sock.close()
                raise
            config = uvicorn.Config(
                self.app,
                http=HeaderDeadlineProtocol.with_deadline(self.header_timeout_s),
                lifespan="off",
                log_config=None,
                access_log=False,
                server_header=False,
                backlog=LISTEN_BACKLOG,
                timeout_keep_alive=max(1, int(min(self.request_timeout_s, 5.0))),
                timeout_graceful_shutdown=5,
            )
            server = uvicorn.Server(config)
            thread = threading.Thread(
                target=server.run,
                kwargs={"sockets": [sock]},
                name="protomolt-http",
                daemon=True,
            )
            self._server, self._socket, self._thread = server, sock, thread
            thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # uvicorn has no started event; it flips a flag
        if not server.started:
            self.close()
            raise RuntimeError(f"the actions route did not start within {timeout_s:g} s")
        log.info(
            "actions route listening on %s",
            self.url,
            extra={"action": "http_started", "url": self.url},
        )
        return self

    def close(self) -> None:
        """Stop serving (in-flight requests get up to 5 s) and release the socket. Idempotent."""
        with self._lock:
            server, sock, thread = self._server, self._socket, self._thread
            self._server = self._socket = self._thread = None
        if server is None:
            return
        server.should_exit = True
        if thread is not None:
            thread.join(timeout=10)
        if sock is not None:
            sock.close()
        log.info("actions route stopped", extra={"action": "http_stopped"})


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline on request headers.

    A timer starts when the connection is made and, for each later request on a kept-alive
    connection, when its first byte arrives; it is cancelled once h11 has parsed the complete
    request line and headers. When it fires first, the client gets ``408 Request Timeout``
    with ``Connection: close`` and the connection is closed (logged with action
    ``http_header_timeout``). Bodies keep their own deadline (``request_timeout_s``, 408
    from the app) and idle keep-alive connections uvicorn's ``timeout_keep_alive``.

    Use :meth:`with_deadline` to get the class for a given deadline (uvicorn builds one
    protocol object per connection from the class it is given).
    """

    #: Seconds a connection has to deliver a request's headers.
    header_timeout_s: float = HTTP_HEADER_TIMEOUT_S

    @classmethod
    def with_deadline(cls, header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
        """This protocol with a deadline of ``header_timeout_s`` seconds (above 0)."""
        if not header_timeout_s > 0:
            raise ValueError(f"header_timeout_s must be above 0; got {header_timeout_s!r}")
        return type(cls.__name__, (cls,), {"header_timeout_s": float(header_timeout_s)})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            # Closed, or the request line and headers are complete (h11 moved on).
            self._cancel_header_deadline()
        elif self._header_timer is None:
            # The first bytes of a later request on a kept-alive connection.
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _cancel_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info(
            "closed a connection whose request headers did not arrive within %g s",
            self.header_timeout_s,
            extra={
                "action": "http_header_timeout",
                "client": f"{self.client[0]}:{self.client[1]}" if self.client else None,
            },
        )
        # h11 cannot answer a request it has not parsed: the reply is written as it is.
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\ncontent-length: 40\r\n\r\n"
            b"request headers did not arrive in time\r\n"
        )
        self.transport.close()


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
