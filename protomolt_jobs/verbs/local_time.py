"""``resume-job``'s ``at`` as a local time in a zone, resolved by the database
(``JobStore.resolve_local_time`` / ``resolve_local_day``: a time the clocks skip is refused
naming ``at``, a time they pass twice is the first; docs/verbs.md *Operator control*):

- ``{"at": "2026-12-03T22:00", "zone": "Europe/Warsaw"}``: a local date and time;
- ``{"at": "22:00", "day": "tomorrow", "zone": "Europe/Warsaw"}``: a wall-clock time on a
  relative day (``today``, ``tomorrow``, or ``next``, the default: the next time the clock in
  that zone shows it; store/local_times.py).

``zone`` is the field's name; ``tz`` is accepted as another name for it (the CLI's ``--tz``),
and giving both is refused naming ``tz``. Not a verb: the helper ``resume-job``
(verbs/control.py) calls when ``zone``, ``tz`` or ``day`` is given.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime, time
from functools import lru_cache
from typing import Any

from protomolt_jobs.store.local_times import DAYS
from protomolt_jobs.verbs.base import invalid, optional_string

__all__ = ["DAYS", "LOCAL_FORMAT", "local_fields", "resolve_at"]

#: What ``at`` may hold with ``zone``: a date and a time, or a time alone, no offset.
LOCAL_FORMAT = "YYYY-MM-DDTHH:MM[:SS] (a space instead of T is fine), or HH:MM[:SS] with 'day'"
_LOCAL = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?", re.ASCII)
_CLOCK = re.compile(r"\d{2}:\d{2}(:\d{2})?", re.ASCII)
#: An IANA zone name (``Europe/Warsaw``, ``UTC``); never a POSIX rule like ``UTC+3``, whose
#: sign PostgreSQL reads the other way round.
_ZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}", re.ASCII)


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def local_fields(input: dict[str, Any]) -> bool:
    """True when ``input`` asks for a local time (it gives ``zone``, ``tz`` or ``day``)."""
    return any(input.get(k) is not None for k in ("zone", "tz", "day"))


def _zone(input: dict[str, Any]) -> str:
    zone = optional_string(input, "zone")
    tz = optional_string(input, "tz")
    if zone is not None and tz is not None:
        raise invalid("tz", "Field 'tz' is another name for 'zone': give one of them, not both")
    field = "tz" if tz is not None else "zone"
    name = ((tz if tz is not None else zone) or "").strip()
    if not name or not _ZONE.fullmatch(name) or name not in _zones():
        raise invalid(
            field,
            f"Field '{field}' must be an IANA time zone (like Europe/Warsaw); got '{name}'",
        )
    return name


def resolve_at(store: Any, input: dict[str, Any]) -> datetime | None:
    """The instant ``input``'s ``at`` (with ``day``) names in ``input``'s ``zone`` (or ``tz``).

    :returns: an aware datetime.
    :raises InvalidInput: ``zone``/``tz`` not text or not an IANA zone name, or both given
        (naming ``tz``); ``day`` not one of :data:`DAYS`, or given with a full date; ``at``
        missing, not a local date-time or time (an offset with a zone is refused: give one or
        the other), a date-time field out of range, or a time the clocks skip in that zone.
    :raises StoreError: on a database failure.
    """
    day_raw = optional_string(input, "day")
    day = day_raw.strip() if day_raw is not None else None
    if day is not None and day not in DAYS:
        raise invalid("day", f"Field 'day' must be one of {', '.join(DAYS)}; got '{day_raw}'")
    zone = _zone(input)
    raw = optional_string(input, "at")
    text = (raw or "").strip()
    if not text:
        raise invalid("at", "Field 'at' is required with 'zone': a local time")
    if _CLOCK.fullmatch(text):
        try:
            clock = time.fromisoformat(text)
        except ValueError:
            raise invalid("at", f"Field 'at' is not a valid time of day; got '{raw}'") from None
        resolved: datetime = store.resolve_local_day(clock, zone, day or "next")
        return resolved
    if not _LOCAL.fullmatch(text):
        raise invalid(
            "at",
            f"Field 'at' with 'zone' must be a local date and time or a time of day without "
            f"an offset ({LOCAL_FORMAT}); got '{raw}'",
        )
    if day is not None:
        raise invalid(
            "day",
            "Field 'day' is only for a time of day ('22:00'); 'at' gives its own date",
        )
    try:
        local = datetime.fromisoformat(text.upper().replace(" ", "T"))
    except ValueError:
        raise invalid("at", f"Field 'at' is not a valid date and time; got '{raw}'") from None
    resolved = store.resolve_local_time(local, zone)  # LocalTimeError: invalid-input
    return resolved
