"""A local date-time in an IANA zone resolved to one instant by the database's time zone rules
(``resume-job``'s ``at`` with ``zone``; docs/verbs.md *Operator control*).

Daylight-saving rule (the dashboard's, Temporal's and most schedulers' wall-clock rule): a time
the clocks skip (spring forward: 02:30 on the last Sunday of March in Europe/Warsaw) does not
exist and is refused naming ``at``; a time the clocks pass twice (fall back) is the first of the
two (the earlier instant). The database resolves it (``AT TIME ZONE``), so every node agrees
with the clock the resume time is compared with. :class:`LocalTimesMixin` is one of
:class:`~protomolt_jobs.store.store.JobStore`'s concern mixins.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from protomolt_jobs.errors import InvalidInput
from protomolt_jobs.store import db

__all__ = ["LocalTimeError", "LocalTimesMixin"]


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
        with self._connection() as conn:
            try:
                with conn.transaction():
                    rows = db.rows(conn, "local_time_resolve", {"local": local, "zone": zone})
            except (psycopg.errors.InvalidParameterValue, psycopg.errors.DataException):
                raise LocalTimeError(
                    "zone",
                    f"Field 'zone' must be an IANA time zone (like Europe/Warsaw); got '{zone}'",
                ) from None
        if not rows:
            raise LocalTimeError(
                "at",
                f"Field 'at': {local.isoformat(sep=' ')} does not exist in {zone} (the clocks "
                "skip it when daylight saving time starts); choose another time",
            )
        instant: datetime = rows[0]["instant"]
        return instant
