"""A local date-time in an IANA zone resolved to one instant by the database's time zone rules
(``resume-job``'s ``at`` with ``zone``; docs/verbs.md *Operator control*), and a wall-clock
time on a relative day (``at: "22:00"`` with ``day``: :data:`DAYS`).

Daylight-saving rule (the dashboard's, Temporal's and most schedulers' wall-clock rule): a time
the clocks skip (spring forward: 02:30 on the last Sunday of March in Europe/Warsaw) does not
exist and is refused naming ``at``; a time the clocks pass twice (fall back) is the first of the
two (the earlier instant). The database resolves it (``AT TIME ZONE``), so every node agrees
with the clock the resume time is compared with.

Relative days, in the zone, by the database's clock: ``today`` is the zone's current calendar
date, ``tomorrow`` the next calendar date (so "tomorrow 22:00" the evening after a fall-back
night is 25 hours away, not 24), and ``next`` the next time the wall clock shows that time:
today's when it is still ahead of now, else tomorrow's (a time the clocks skip today does not
occur today: tomorrow's). ``today`` and ``tomorrow`` follow the rule above (a skipped time is
refused naming ``at``); a ``today`` time already past means now, as any past ``at``. :class:`LocalTimesMixin` is one of
:class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, time, timedelta
from typing import Any

import psycopg

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.store import db

__all__ = ["DAYS", "LocalTimeError", "LocalTimesMixin"]

#: The relative days of a wall-clock time (module text).
DAYS = ("today", "tomorrow", "next")


class LocalTimeError(InvalidInput):
    """A local time that names no instant, or an unknown zone: ``invalid-input`` naming the
    field (``details.field``).

    :ivar field: ``at`` (a skipped time) or ``zone`` (not a zone the database knows).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, {"field": field})
        self.field = field


class LocalTimesMixin(db.Database):
    """``JobStore``'s resolution of local times."""

    @db.translated
    def resolve_local_time(self, local: datetime, zone: str) -> datetime:
        """The instant ``local`` (a naive date-time) names in ``zone`` (an IANA name).

        SQL: read-only ``local_time_resolve``. Transaction: one (read).

        :returns: an aware datetime (the first instant when the time happens twice).
        :raises LocalTimeError: ``at`` for a time the clocks skip in ``zone``; ``zone`` for a
            zone the database does not know.
        :raises ValueError: ``local`` carries an offset.
        :raises StoreError: on a database failure.
        """
        if local.tzinfo is not None:
            raise ValueError("local: must be a local time (no offset)")
        with self._connection() as conn, _zone_checked(zone), conn.transaction():
            instant = _resolve(conn, local, zone)
        if instant is None:
            raise _skipped(local, zone)
        return instant

    @db.translated
    def resolve_local_day(
        self, clock: time, zone: str, day: str, *, now: datetime | None = None
    ) -> datetime:
        """The instant the wall-clock time ``clock`` names on ``day`` (:data:`DAYS`) in
        ``zone``, as the module text says.

        SQL: read-only ``local_time_today``, then ``local_time_resolve`` once (``next``: at most
        twice), in one transaction (one ``now()``). Transaction: one (read).

        :param now: the instant "today" is counted from (None: the database's ``now()``).
        :returns: an aware datetime.
        :raises LocalTimeError: ``at`` for a time the clocks skip on that day; ``zone`` for a
            zone the database does not know.
        :raises ValueError: ``day`` not one of :data:`DAYS`; ``clock`` carries an offset.
        :raises StoreError: on a database failure.
        """
        if day not in DAYS:
            raise ValueError(f"day: must be one of {', '.join(DAYS)}; got {day!r}")
        if clock.tzinfo is not None:
            raise ValueError("clock: must be a wall-clock time (no offset)")
        with self._connection() as conn, _zone_checked(zone), conn.transaction():
            today_row = db.one(conn, "local_time_today", {"now": now, "zone": zone})
            assert today_row is not None
            today, current = today_row["today"], today_row["now"]
            local = datetime.combine(today, clock)
            if day == "tomorrow":
                local += timedelta(days=1)
            instant = _resolve(conn, local, zone)
            if day == "next" and (instant is None or instant <= current):
                local = datetime.combine(today + timedelta(days=1), clock)
                instant = _resolve(conn, local, zone)
        if instant is None:
            raise _skipped(local, zone)
        return instant


def _resolve(conn: Any, local: datetime, zone: str) -> datetime | None:
    """The first instant ``local`` names in ``zone``; None when the clocks skip it."""
    rows = db.rows(conn, "local_time_resolve", {"local": local, "zone": zone})
    return rows[0]["instant"] if rows else None


def _skipped(local: datetime, zone: str) -> LocalTimeError:
    return LocalTimeError(
        "at",
        f"Field 'at': {local.isoformat(sep=' ')} does not exist in {zone} (the clocks "
        "skip it when daylight saving time starts); choose another time",
    )


@contextmanager
def _zone_checked(zone: str) -> Iterator[None]:
    """Turn the database's refusal of an unknown zone into ``LocalTimeError("zone")``."""
    try:
        yield
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.DataException):
        raise LocalTimeError(
            "zone", f"Field 'zone' must be an IANA time zone (like Europe/Warsaw); got '{zone}'"
        ) from None
