"""TEST-ONLY named crash points for crash tests of the worker process.

A crash test runs ``python -m protomolt_jobs.worker`` with the environment variable
``PROTOMOLT_JOBS_CRASH_AT`` set to a point name, optionally with a detail::

    PROTOMOLT_JOBS_CRASH_AT=after_claim               # right after a claim commits
    PROTOMOLT_JOBS_CRASH_AT=after_checkpoint:embed    # right after step 'embed' checkpoints
    PROTOMOLT_JOBS_CRASH_AT=before_settle             # segment done, before its settle write

When the worker reaches the named point, the process ends with ``os._exit(CRASH_EXIT_CODE)``:
no ``finally``, no graceful stop, no lease release, exactly like a SIGKILL there. Only the
worker process entry (:mod:`protomolt_jobs.worker.__main__`) arms a crash point; a worker
embedded in a host never does, and :func:`reached` is then a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["CRASH_EXIT_CODE", "ENV_VAR", "POINTS", "arm_for_tests", "disarm", "reached"]

#: The environment variable the worker process entry reads.
ENV_VAR = "PROTOMOLT_JOBS_CRASH_AT"
#: Exit status of a process that crashed at a crash point (tests tell it from a real crash).
CRASH_EXIT_CODE = 97
#: The named points the worker passes.
POINTS = frozenset({"after_claim", "after_checkpoint", "before_settle"})

_armed: tuple[str, str] | None = None


def arm_for_tests(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """Arm the crash point named by ``environ[ENV_VAR]`` (``point`` or ``point:detail``).

    :returns: ``(point, detail)`` when armed, None when the variable is unset or empty.
    :raises ValueError: naming the variable when the point is unknown.
    """
    global _armed
    spec = (environ.get(ENV_VAR) or "").strip()
    if not spec:
        _armed = None
        return None
    point, _, detail = spec.partition(":")
    if point not in POINTS:
        raise ValueError(
            f"{ENV_VAR}: unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}"
        )
    _armed = (point, detail)
    return _armed


def disarm() -> None:
    """Disarm any crash point."""
    global _armed
    _armed = None


def reached(point: str, detail: str = "") -> None:
    """The worker passes ``point`` (with ``detail``, e.g. a step name); crash if it is armed.

    An armed point without a detail matches every detail.
    """
    armed = _armed
    if armed is None:
        return
    name, want = armed
    if name == point and (not want or want == detail):
        os._exit(CRASH_EXIT_CODE)
