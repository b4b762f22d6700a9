"""Flash messages: the outcome of a dashboard form, shown once on the page it redirects to.

Every form posts, the server acts, then answers ``303 See Other`` to a page (POST-redirect-GET:
no page is left on the POST address, a reload does not post again). The outcome rides in this
process's memory under a random key, and the key in a short-lived ``HttpOnly``,
``SameSite=Strict`` cookie: a link cannot forge a message, and a message is shown once (the
next page read takes it and clears the cookie). A message not read within :data:`TTL_S`, or
pushed out by :data:`CAPACITY` newer ones, is dropped; so are the oldest once the messages
held pass :data:`MAX_CHARS` characters in all (a refused form's values are kept to type them
back, and a form body may be 4 MiB). A sentence longer than :data:`TEXT_CHARS` is cut.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAPACITY", "COOKIE", "MAX_CHARS", "TEXT_CHARS", "TTL_S", "Flash", "Flashes"]

#: The cookie naming a pending message.
COOKIE = "protomolt_flash"
#: Messages kept at most (the oldest go first).
CAPACITY = 512
#: Seconds a message waits to be read.
TTL_S = 300.0
#: Characters held in all (sentences and typed-back form values) before the oldest go.
MAX_CHARS = 16 * 1024 * 1024
#: The longest sentence kept (a refusal quoting a huge value is cut, with "…").
TEXT_CHARS = 4000


def _size(flash: Flash) -> int:
    """About how many characters ``flash`` holds."""
    return (
        len(flash.text)
        + sum(len(k) + len(v) for k, v in flash.form.items())
        + sum(len(str(r)) for r in flash.rows)
    )


@dataclass(frozen=True)
class Flash:
    """One outcome: ``kind`` ``message`` (it worked), ``warning`` (a bulk action done for some
    jobs, refused for others) or ``error`` (refused, with why), the
    sentence, for a bulk action one row per job (``{jobId, ok, status, text}``), and for a
    refused form what was typed."""

    kind: str
    text: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: the values a refused form held, typed back into it
    form: dict[str, str] = field(default_factory=dict)


class Flashes:
    """The pending messages of one dashboard (thread-safe; bounded)."""

    def __init__(
        self, capacity: int = CAPACITY, ttl_s: float = TTL_S, max_chars: int = MAX_CHARS
    ) -> None:
        self._items: OrderedDict[str, tuple[float, Flash, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._max_chars = max_chars
        self._chars = 0

    def put(self, flash: Flash) -> str:
        """Keep ``flash`` (its sentence cut to :data:`TEXT_CHARS`); the key for the cookie."""
        if len(flash.text) > TEXT_CHARS:
            flash = Flash(flash.kind, flash.text[: TEXT_CHARS - 1] + "…", flash.rows, flash.form)
        key = secrets.token_urlsafe(18)
        size = _size(flash)
        with self._lock:
            self._items[key] = (time.monotonic(), flash, size)
            self._chars += size
            while len(self._items) > self._capacity or (
                self._chars > self._max_chars and len(self._items) > 1
            ):
                self._chars -= self._items.popitem(last=False)[1][2]
        return key

    def take(self, key: str | None) -> Flash | None:
        """The message under ``key`` (once), or None when unknown or expired."""
        if not key:
            return None
        with self._lock:
            entry = self._items.pop(key, None)
            if entry is not None:
                self._chars -= entry[2]
        if entry is None or time.monotonic() - entry[0] > self._ttl_s:
            return None
        return entry[1]
