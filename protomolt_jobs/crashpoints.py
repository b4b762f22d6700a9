"""TEST-ONLY named crash points, so crash tests can kill a process exactly at a commit edge.

A point is a place in the code where a process may die in production (a SIGKILL, an OOM kill)
and leave state that recovery must handle. A test arms one point; when the code reaches it the
process ends with ``os._exit(CRASH_EXIT_CODE)``: no ``finally``, no graceful stop, no lease
release, exactly like a SIGKILL there. Nothing arms a point unless a test does, and then
:func:`reached` is a no-op.

=================== ======================================================== ==============
point               where                                                    passed by
=================== ======================================================== ==============
after_claim         right after a claim commits (detail: workflow name)      worker
after_checkpoint    right after a step's checkpoint commits (detail: step)   worker
after_intent        an external step's intent committed, before its call     worker
                    (detail: step)
before_checkpoint   a step answered, before its checkpoint is written        worker
                    (detail: step)
before_settle       segment done, before its settle write                    worker
group_commit_sent   a batch of >= 2 fenced writes sent in one pipeline, its     worker
                    Sync not sent (detail: the batch's size)
group_commit_done   a batch's transaction committed, its writers not yet     worker
                    answered (detail: the batch's size)
after_publish       events acked by the broker, before they are marked       relay
after_row_commit    a request's row committed, before its offset commits     request consumer
=================== ======================================================== ==============

The worker process entry (``python -m protomolt_jobs.worker``) arms the point named by the
environment variable ``PROTOMOLT_JOBS_CRASH_AT`` (``point`` or ``point:detail``)::

    PROTOMOLT_JOBS_CRASH_AT=after_checkpoint:embed

Tests of the relay and the request consumer run them in a subprocess that calls :func:`arm`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["CRASH_EXIT_CODE", "ENV_VAR", "POINTS", "arm", "arm_for_tests", "disarm", "reached"]

#: The environment variable the worker process entry reads.
ENV_VAR = "PROTOMOLT_JOBS_CRASH_AT"
#: Exit status of a process that crashed at a crash point (tests tell it from a real crash).
CRASH_EXIT_CODE = 97
#: Every named point (see the table above).
POINTS = frozenset(
    {
        "after_claim",
        "after_checkpoint",
        "after_intent",
        "before_checkpoint",
        "before_settle",
        "after_publish",
        "after_row_commit",
        "group_commit_sent",
        "group_commit_done",
    }
)

_armed: tuple[str, str] | None = None


def arm(point: str, detail: str = "") -> None:
    """Arm ``point`` (tests only); with ``detail``, only that detail crashes.

    :raises ValueError: naming the point when it is not one of :data:`POINTS`.
    """
    global _armed
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}")
    _armed = (point, detail)


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
    """The code passes ``point`` (with ``detail``, e.g. a step name); crash if it is armed.

    An armed point without a detail matches every detail.
    """
    armed = _armed
    if armed is None:
        return
    name, want = armed
    if name == point and (not want or want == detail):
        os._exit(CRASH_EXIT_CODE)
