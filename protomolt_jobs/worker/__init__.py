"""The worker fleet: claim loops woken by LISTEN, heartbeats, per-target permits, the segment
executor and its settlement, and the lease sweeper.

- :class:`Worker` (``worker.py``): the claim loops, listener, heartbeat and permits of one
  process, with the graceful stop.
- :class:`Sweeper` (``sweeper.py``): expired leases back to QUEUED, or DEAD.

Threads, not asyncio: see ``docs/worker.md``.
"""

from protomolt_jobs.worker.execute import Settlement
from protomolt_jobs.worker.sweeper import Sweeper
from protomolt_jobs.worker.worker import Worker

__all__ = ["Settlement", "Sweeper", "Worker"]
