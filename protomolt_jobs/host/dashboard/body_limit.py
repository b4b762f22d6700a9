"""The dashboard's request-body bound: a form post larger than :data:`MAX_FORM_BYTES`, or one
sent without ``Content-Length`` (chunked), is refused before any handler reads it.

The node's actions route bounds its bodies itself (``http_route.MAX_BODY_BYTES``); the ``/ui``
mount sits in front of that dispatcher, so without this bound a form handler read a body of any
size into memory, and a refusal that quotes the value (``'zone' must be an IANA time zone ...;
got '...'``) kept it for minutes in the flash store. The largest field a form carries is a JSON
box of at most 1,000,000 characters (``operate._MAX_JSON_CHARS``); url-encoded that is at most
three bytes per character, so :data:`MAX_FORM_BYTES` leaves room for it and the other fields.
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MAX_FORM_BYTES", "BodyLimit"]

#: The largest dashboard request body, in bytes.
MAX_FORM_BYTES = 4 * 1024 * 1024


class BodyLimit:
    """ASGI middleware: a request with a body over ``limit`` bytes answers 413, one with
    ``Transfer-Encoding`` (no length to check before reading) 411; both name the limit and
    close the connection unread. Other requests pass to ``app`` unchanged.

    :param app: the wrapped ASGI app (the dashboard's router).
    :param limit: the largest body, in bytes.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_FORM_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            refused = None
            if b"transfer-encoding" in headers:
                refused = (411, "a form must be sent with Content-Length")
            else:
                length = headers.get(b"content-length", b"0").strip()
                if not length.isdigit() or int(length) > self.limit:
                    refused = (413, f"invalid-input: a form body may be at most {self.limit} bytes")
            if refused is not None:
                response = PlainTextResponse(
                    refused[1], status_code=refused[0], headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @property
    def routes(self) -> list[object]:
        """The wrapped router's routes (what a ``Mount`` lists)."""
        return list(getattr(self.app, "routes", []))
