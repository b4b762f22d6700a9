"""Times on the dashboard: relative times and durations beside the absolute ones, and the
zones the resume form offers.

Every absolute time on the pages is UTC (``2026-12-01 15:55:32``); beside it the page says how
far it is from the moment the page was rendered (``3 min ago``, ``in 2 h``).

A local time typed in a zone (the resume form: ``datetime-local`` and an IANA zone) is not
resolved here: the form sends it to ``resume-job`` as ``at`` and ``zone``, and the database
resolves it by the rule every door shares (store/local_times.py: a time the clocks skip is
refused naming ``at``, one they pass twice is the first).
"""

from __future__ import annotations

import datetime
import zoneinfo
from functools import lru_cache

from protomolt_jobs.errors import InvalidInput

__all__ = [
    "DEFAULT_ZONE",
    "FormError",
    "between",
    "duration",
    "parse_instant",
    "relative",
    "zones",
]

UTC = datetime.UTC
#: The zone a resume form starts with.
DEFAULT_ZONE = "UTC"


class FormError(InvalidInput):
    """A form field the dashboard refuses before any verb runs: ``invalid-input`` naming it.

    :param field: the form field (``at``, ``zone``, ``response``, ``confirm`` ...).
    :param message: what is wrong, naming the field.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, {"field": field})
        self.field = field

    def __str__(self) -> str:
        return f"invalid-input: {self.message}"


@lru_cache(maxsize=1)
def zones() -> tuple[str, ...]:
    """The IANA zones the resume form offers: UTC first, then every zone name sorted."""
    names = sorted(n for n in zoneinfo.available_timezones() if n != DEFAULT_ZONE)
    return (DEFAULT_ZONE, *names)


def parse_instant(value: object) -> datetime.datetime | None:
    """An RFC 3339 / ISO time as the verbs write it (``...Z`` or an offset), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def duration(seconds: float | None) -> str:
    """``0.4 s``, ``12 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``, ``3 y 207 d`` (years
    of 365 days; "" for None)."""
    if seconds is None:
        return ""
    s = abs(seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{int(s)} s"
    if s < 3600:
        minutes, rest = divmod(int(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if s < 86400:
        hours, rest = divmod(int(s) // 60, 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    if s < 365 * 86400:
        days, rest = divmod(int(s) // 3600, 24)
        return f"{days} d {rest} h" if rest else f"{days} d"
    years, rest = divmod(int(s) // 86400, 365)
    return f"{years} y {rest} d" if rest else f"{years} y"


def relative(value: object, now: datetime.datetime | None = None) -> str:
    """How far ``value`` (a verb's time text) is from ``now``: ``just now``, ``5 s ago``,
    ``in 3 min`` ("" when it does not read as a time)."""
    moment = parse_instant(value)
    if moment is None:
        return ""
    delta = (moment - (now or datetime.datetime.now(UTC))).total_seconds()
    if abs(delta) < 1:
        return "just now"
    text = duration(delta if abs(delta) >= 10 else round(delta))
    text = text.replace(".0 s", " s")
    return f"in {text}" if delta > 0 else f"{text} ago"


def between(start: object, end: object) -> str:
    """The duration from ``start`` to ``end`` (verb time texts), or "" when either is missing."""
    a, b = parse_instant(start), parse_instant(end)
    if a is None or b is None:
        return ""
    return duration((b - a).total_seconds())
