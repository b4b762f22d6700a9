"""Per-target permits: a per-process cap on segments running against one gRPC target.

A worker takes a permit for the target of a job's *next* unexecuted step before it runs the
segment, and holds it for the whole segment (upstream's documented approximation: a segment
may call several targets, only the first is throttled). The cap protects one-box-per-model
inference servers from an uncapped fleet; it is per process and keyed by the raw target
string, so ``host:1`` and ``dns:///host:1`` count separately.

The wait is cancellable: a graceful stop (or a lost lease) wakes every waiter, which then
gives up without a permit, so a stopping worker never blocks on a busy target.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from protomolt_jobs.errors import ProtomoltJobsError

__all__ = ["PermitCancelled", "TargetPermits"]

# A waiter re-checks its cancel condition at least this often (seconds), so a cancel that
# races the wake-up is still seen promptly.
_RECHECK_S = 0.25


class PermitCancelled(ProtomoltJobsError):
    """The wait for a permit was given up because ``cancelled()`` became true."""

    def __init__(self, target: str) -> None:
        super().__init__(f"gave up waiting for a permit for target {target!r}")
        self.target = target


class TargetPermits:
    """Counting permits keyed by target, ``limit`` each.

    :param limit: permits per target (``max_concurrent_per_target``), >= 1.
    :raises ValueError: when ``limit`` is not a positive integer.
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"max_concurrent_per_target must be a positive integer; got {limit!r}")
        self.limit = limit
        self._cond = threading.Condition()
        self._in_use: dict[str, int] = {}

    def in_use(self, target: str) -> int:
        """Permits currently held for ``target``."""
        with self._cond:
            return self._in_use.get(target, 0)

    def acquire(self, target: str, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Block until a permit for ``target`` is free, then take it.

        :param target: the gRPC target string, as written in the workflow.
        :param cancelled: polled while waiting; when it returns true the wait ends.
        :raises PermitCancelled: when ``cancelled()`` became true before a permit was free.
        """
        with self._cond:
            while self._in_use.get(target, 0) >= self.limit:
                if cancelled():
                    raise PermitCancelled(target)
                self._cond.wait(_RECHECK_S)
            if cancelled():
                raise PermitCancelled(target)
            self._in_use[target] = self._in_use.get(target, 0) + 1

    def release(self, target: str) -> None:
        """Give back one permit for ``target``.

        :raises RuntimeError: when no permit for ``target`` is held (a defect).
        """
        with self._cond:
            held = self._in_use.get(target, 0)
            if held <= 0:
                raise RuntimeError(f"release of a permit for {target!r} that is not held")
            if held == 1:
                del self._in_use[target]
            else:
                self._in_use[target] = held - 1
            self._cond.notify_all()

    def wake_all(self) -> None:
        """Wake every waiter so it re-checks its cancel condition (graceful stop)."""
        with self._cond:
            self._cond.notify_all()

    @contextmanager
    def held(
        self, target: str | None, cancelled: Callable[[], bool] = lambda: False
    ) -> Iterator[None]:
        """``with permits.held(target):`` runs the body under a permit; ``None`` needs none
        (every step is already checkpointed).

        :raises PermitCancelled: as :meth:`acquire`.
        """
        if target is None:
            yield
            return
        self.acquire(target, cancelled)
        try:
            yield
        finally:
            self.release(target)
