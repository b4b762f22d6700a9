"""Flash messages: the outcome of a dashboard form, shown once on the page it redirects to.

Every form posts, the server acts, then answers ``303 See Other`` to a page (POST-redirect-GET:
no page is left on the POST address, a reload does not post again). The outcome rides in this
process's memory under a random key, and the key in a short-lived ``HttpOnly``,
``SameSite=Strict`` cookie: a link cannot forge a message, and a message is shown once (the
next page read takes it and clears the cookie). A message not read within :data:`TTL_S`, or
pushed out by :data:`CAPACITY` newer ones, is dropped.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAPACITY", "COOKIE", "TTL_S", "Flash", "Flashes"]

#: The cookie naming a pending message.
COOKIE = "protomolt_flash"
#: Messages kept at most (the oldest go first).
CAPACITY = 512
#: Seconds a message waits to be read.
TTL_S = 300.0


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

    def __init__(self, capacity: int = CAPACITY, ttl_s: float = TTL_S) -> None:
        self._items: OrderedDict[str, tuple[float, Flash]] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity
        self._ttl_s = ttl_s

    def put(self, flash: Flash) -> str:
        """Keep ``flash``; the key for the cookie."""
        key = secrets.token_urlsafe(18)
        with self._lock:
            self._items[key] = (time.monotonic(), flash)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return key

    def take(self, key: str | None) -> Flash | None:
        """The message under ``key`` (once), or None when unknown or expired."""
        if not key:
            return None
        with self._lock:
            entry = self._items.pop(key, None)
        if entry is None or time.monotonic() - entry[0] > self._ttl_s:
            return None
        return entry[1]
