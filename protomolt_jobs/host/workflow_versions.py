"""Stored workflow versions and the last test result of each, in files beside the definitions.

The registry keeps the current definition of ``name`` in ``<dir>/<name>.json`` (upstream's
layout, served verbatim). Each ``PUT`` also writes, under ``<dir>/.versions/<name>/``:

- ``<n>.definition.json``: the text stored as version ``n`` (1, 2, ...), kept so an earlier
  version can be read back (``get-workflow {version}``); a PUT of the same text as the latest
  version keeps its number (and replaces its ``lastTest``);
- ``<n>.json``: the version's record, ``{"version", "sha256", "storedAt", "storedBy",
  "lastTest"}``; ``sha256`` is the hex SHA-256 of the stored text, ``storedAt`` ISO-8601 UTC,
  ``storedBy`` the caller's principal, ``lastTest`` the last test result (see
  :func:`summary_of_tests`) or None.

The current version of ``name`` is the highest ``n`` whose ``sha256`` is the current file's:
a crash between the record and the definition's replacement leaves the previous version
current, and a definition copied in by hand has no version (None) until it is PUT. Every file
is written to a temporary file that replaces it, so a reader never sees half of one; the
records live on disk, so they survive a restart. ``.versions`` cannot clash with a workflow's
name (names start with a letter or digit).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["VERSIONS_DIR", "Versions", "summary_of_tests"]

#: The subdirectory of the registry's directory holding the versions.
VERSIONS_DIR = ".versions"

_RECORD = re.compile(r"([1-9][0-9]{0,17})\.json")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sha256_of(text: str) -> str:
    """The hex SHA-256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_atomically(directory: Path, name: str, text: str) -> None:
    """Write ``text`` to ``directory/name`` through a temporary file that replaces it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, directory / name)
    except BaseException:  # no stray temp file, re-raised
        Path(tmp).unlink(missing_ok=True)
        raise


def summary_of_tests(answer: dict[str, Any], *, by: str, via: str) -> dict[str, Any]:
    """A ``test-workflow`` answer as a version's ``lastTest``: ``{"ok", "passed", "failed",
    "cases": [{"name", "passed", "difference"?, "step"?}], "error"?, "at", "by", "via"}``
    (``via``: ``put`` or ``test-workflow``; ``at``: ISO-8601 UTC; ``error``: why no case ran,
    such as no tests)."""
    cases = []
    for case in answer.get("cases") or []:
        if not isinstance(case, dict):
            continue
        row = {"name": case.get("name"), "passed": bool(case.get("passed"))}
        for key in ("difference", "step"):
            if case.get(key):
                row[key] = case[key]
        cases.append(row)
    summary: dict[str, Any] = {
        "ok": bool(answer.get("ok")),
        "passed": sum(1 for c in cases if c["passed"]),
        "failed": sum(1 for c in cases if not c["passed"]),
        "cases": cases,
    }
    if answer.get("error"):
        summary["error"] = str(answer["error"])
    summary.update({"at": _now(), "by": by, "via": via})
    return summary


class Versions:
    """The version records of one registry directory (module docstring).

    Not locked on its own: the registry's store calls it under its lock.
    """

    def __init__(self, directory: Path) -> None:
        self.root = Path(directory) / VERSIONS_DIR

    def _dir(self, name: str) -> Path:
        return self.root / name

    def numbers(self, name: str) -> list[int]:
        """The versions recorded for ``name``, ascending."""
        try:
            entries = os.listdir(self._dir(name))
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for e in entries if (m := _RECORD.fullmatch(e)))

    def record(self, name: str, version: int) -> dict[str, Any] | None:
        """Version ``version``'s record, or None when absent or unreadable."""
        try:
            value = json.loads((self._dir(name) / f"{version}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def definition_text(self, name: str, version: int) -> str | None:
        """The text stored as ``version``, or None."""
        try:
            return (self._dir(name) / f"{version}.definition.json").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def current(self, name: str, text: str) -> int | None:
        """The version whose text is ``text`` (the highest such), or None."""
        digest = sha256_of(text)
        for n in reversed(self.numbers(name)):
            record = self.record(name, n)
            if record is not None and record.get("sha256") == digest:
                return n
        return None

    def add(self, name: str, text: str, *, by: str, test: dict[str, Any] | None) -> int:
        """Record ``text`` as the next version of ``name``; call before the definition's file
        is replaced. The same text as the latest version keeps that version's number (a role
        storing its workflow at every start does not add one per start); its ``lastTest`` is
        replaced when ``test`` is given. :returns: the version's number."""
        directory = self._dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        numbers = self.numbers(name)
        if numbers:
            latest = self.record(name, numbers[-1])
            if latest is not None and latest.get("sha256") == sha256_of(text):
                if test is not None:
                    self.set_test(name, numbers[-1], test)
                return numbers[-1]
        version = (numbers[-1] if numbers else 0) + 1
        write_atomically(directory, f"{version}.definition.json", text)
        record = {
            "version": version,
            "sha256": sha256_of(text),
            "storedAt": _now(),
            "storedBy": by,
            "lastTest": test,
        }
        write_atomically(directory, f"{version}.json", json.dumps(record, indent=2) + "\n")
        return version

    def set_test(self, name: str, version: int, test: dict[str, Any]) -> bool:
        """Replace ``version``'s ``lastTest``; False when no such record."""
        record = self.record(name, version)
        if record is None:
            return False
        record["lastTest"] = test
        write_atomically(self._dir(name), f"{version}.json", json.dumps(record, indent=2) + "\n")
        return True
