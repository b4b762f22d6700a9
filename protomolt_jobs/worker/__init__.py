"""The worker fleet: claim loops woken by LISTEN, heartbeats, per-target permits, the segment
executor and its settlement.

- :class:`Worker` (``worker.py``): the claim loops, listener, heartbeat and permits of one
  process, with the graceful stop.
- The lease sweeper lives in :mod:`protomolt_jobs.maintenance.sweeper`.

Threads, not asyncio: see ``docs/worker.md``.
"""

from protomolt_jobs.worker.settlement import Settlement
from protomolt_jobs.worker.worker import Worker

__all__ = ["Settlement", "Worker"]
