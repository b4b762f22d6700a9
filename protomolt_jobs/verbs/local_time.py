"""``resume-job``'s ``at`` as a local date-time in a zone (``{"at": "2026-12-03T22:00",
"zone": "Europe/Warsaw"}``), resolved by the database (``JobStore.resolve_local_time``:
a time the clocks skip is refused naming ``at``, a time they pass twice is the first).

Not a verb: the helper ``resume-job`` (verbs/control.py) calls when ``zone`` is given.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime
from functools import lru_cache
from typing import Any

from protomolt_jobs.verbs.base import invalid, optional_string

__all__ = ["LOCAL_FORMAT", "resolve_at"]

#: What ``at`` may hold with ``zone``: a date and a time, no offset (seconds optional).
LOCAL_FORMAT = "YYYY-MM-DDTHH:MM[:SS] (a space instead of T is fine)"
_LOCAL = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?", re.ASCII)
#: An IANA zone name (``Europe/Warsaw``, ``UTC``); never a POSIX rule like ``UTC+3``, whose
#: sign PostgreSQL reads the other way round.
_ZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}", re.ASCII)


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def resolve_at(store: Any, input: dict[str, Any]) -> datetime | None:
    """The instant ``input``'s ``at`` names in ``input``'s ``zone``.

    :returns: an aware datetime.
    :raises InvalidInput: ``zone`` not text or not an IANA zone name; ``at`` missing, not a
        local date-time (an offset with a zone is refused: give one or the other), or a time
        the clocks skip in that zone.
    :raises StoreError: on a database failure.
    """
    zone = optional_string(input, "zone")
    zone = (zone or "").strip()
    if not zone or not _ZONE.fullmatch(zone) or zone not in _zones():
        raise invalid(
            "zone", f"Field 'zone' must be an IANA time zone (like Europe/Warsaw); got '{zone}'"
        )
    raw = optional_string(input, "at")
    text = (raw or "").strip()
    if not text:
        raise invalid("at", "Field 'at' is required with 'zone': a local date and time")
    if not _LOCAL.fullmatch(text):
        raise invalid(
            "at",
            f"Field 'at' with 'zone' must be a local date and time without an offset "
            f"({LOCAL_FORMAT}); got '{raw}'",
        )
    try:
        local = datetime.fromisoformat(text.upper().replace(" ", "T"))
    except ValueError:
        raise invalid("at", f"Field 'at' is not a valid date and time; got '{raw}'") from None
    resolved: datetime = store.resolve_local_time(local, zone)  # LocalTimeError: invalid-input
    return resolved
