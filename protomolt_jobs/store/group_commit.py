"""Group commit of the claim loops' fenced writes (River's completer, in the store).

Each claim loop's checkpoint and settle is one fenced statement in autocommit. Under load,
several loops have such a write ready at the same moment; :class:`GroupCommit` lets one of
them (the *leader*) carry every write waiting at that moment in one transaction, so one commit
(one WAL flush) serves them all. Each writer waits for that commit before it goes on, so a
step's checkpoint is durable before the next step's call, as before.

- **Idle**: a writer that finds no transaction in flight leads at once, with only its own
  write: the same single statement in autocommit as without this class (no added latency, no
  added statement).
- **Under load**: while a transaction is in flight, writers queue. When it commits, the next
  waiting writer leads the whole queue (up to ``max_batch``): each write's own statement with
  its own fence, sent in one pipeline (psycopg's pipeline mode, one round trip) ending in one
  Sync. With no ``BEGIN`` sent, the statements up to the Sync are one implicit transaction
  that commits at the Sync: the same statements as alone, one commit.
- **Each write keeps its answer.** A fenced statement that matches no row changed nothing and
  does not disturb the others: that writer alone gets ``LeaseLost``; a write the trigger turned
  into CANCELLED or PAUSED hands back that status to its writer alone.
- **An error the server reports** (a statement or the commit failed; the implicit transaction
  is then rolled back whole, so nothing of the batch was stored) makes every write of the
  batch run again on its own, as without this class: each writer gets exactly the answer it
  would have had alone.
- **A broken connection** (the outcome is unknown: the commit may have happened) is raised to
  every writer of the batch, as a lone write's broken connection is raised to it; none is run
  again, since any of them may be stored.

Writes of several jobs share a transaction but never a row: each run row is written only by
its lease holder, one write at a time. The transition log is per row (the trigger chains each
run's history on its own row), so it is the same as with one transaction per write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from protomolt_jobs import crashpoints
from protomolt_jobs.errors import ProtomoltJobsError, StoreError
from protomolt_jobs.store import db
from protomolt_jobs.store.queries import QUERIES
from protomolt_jobs.store.records import Lease

__all__ = ["MAX_BATCH_DEFAULT", "GroupCommit"]

#: Most writes one transaction carries.
MAX_BATCH_DEFAULT = 64


class _Write:
    """One writer's fenced statement and, once done, its answer."""

    __slots__ = ("done", "error", "lease", "params", "query", "row")

    def __init__(self, query: str, lease: Lease, params: dict[str, Any]) -> None:
        self.query = query
        self.lease = lease
        self.params = params
        self.done = False
        self.row: dict[str, Any] | None = None
        self.error: BaseException | None = None


class _BatchAborted(ProtomoltJobsError):
    """The server reported an error in the batch: its transaction rolled back, nothing of it
    is stored."""


class GroupCommit:
    """Carries concurrent fenced writes in one transaction (see the module's docstring).

    :param connection: ``() -> context manager of a healthy autocommit connection``
        (``Database._connection``).
    :param max_batch: most writes in one transaction (>= 1).
    :param max_leaders: batches in flight at once (1: measured best at 16 claim loops on two
        cores, docs/benchmarks.md).
    """

    def __init__(
        self,
        connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
        *,
        max_batch: int = MAX_BATCH_DEFAULT,
        max_leaders: int = 1,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1; got {max_batch!r}")
        self._connection = connection
        self._max_batch = max_batch
        self._max_leaders = max_leaders
        self._cond = threading.Condition()
        self._queue: list[_Write] = []
        self._leaders = 0
        #: Transactions committed with more than one write, and the writes they carried
        #: (tests and the benchmark read them).
        self.batches = 0
        self.batched_writes = 0

    def waiting(self) -> int:
        """Writes queued for the next transaction right now."""
        with self._cond:
            return len(self._queue)

    def write(self, query: str, lease: Lease, params: dict[str, Any]) -> dict[str, Any]:
        """Run the fenced ``query`` alone or in the batch that is forming.

        :returns: the row the statement returned.
        :raises LeaseLost: the fence matched no row (nothing changed).
        :raises TypeError: when ``lease`` is not a :class:`~.records.Lease`.
        :raises psycopg.Error: the write failed (``db.translated`` makes it a StoreError).
        """
        db.fence_params(lease, {})  # a malformed lease fails here, alone, before any I/O
        item = _Write(query, lease, params)
        with self._cond:
            self._queue.append(item)
            while self._leaders >= self._max_leaders and not item.done:
                self._cond.wait()
            if item.done:
                return self._answer(item)
            self._leaders += 1
            batch = self._queue[: self._max_batch]
            if item not in batch:  # the leader always carries its own write
                batch[-1:] = [item]
            taken = set(map(id, batch))
            self._queue = [w for w in self._queue if id(w) not in taken]
        try:
            self._run(batch)
        finally:
            with self._cond:
                for w in batch:
                    w.done = True
                self._leaders -= 1
                self._cond.notify_all()
        return self._answer(item)

    @staticmethod
    def _answer(item: _Write) -> dict[str, Any]:
        if item.error is not None:
            raise item.error
        if item.row is None:  # its leader was interrupted (not by an error it could hand on)
            raise StoreError("the write's batch ended without an answer; its outcome is unknown")
        return item.row

    def _run(self, batch: list[_Write]) -> None:
        if len(batch) == 1:
            self._alone(batch[0])
            return
        try:
            self._together(batch)
        except _BatchAborted:
            for w in batch:  # nothing was stored: each runs as it would have alone
                w.row, w.error = None, None
                self._alone(w)
            return
        except Exception as exc:  # noqa: BLE001  # no connection, or it broke: each writer gets it
            for w in batch:
                w.row, w.error = None, exc
            return
        with self._cond:
            self.batches += 1
            self.batched_writes += len(batch)

    def _alone(self, w: _Write) -> None:
        try:
            with self._connection() as conn:
                w.row = db.fenced(conn, w.query, w.lease, w.params)
        except Exception as exc:  # noqa: BLE001  # handed to its writer's thread
            w.error = exc

    def _together(self, batch: list[_Write]) -> None:
        params = [db.fence_params(w.lease, w.params) for w in batch]
        with self._connection() as conn:
            try:
                with conn.pipeline():
                    cursors = []
                    try:
                        for w, p in zip(batch, params, strict=True):
                            cur = conn.cursor(row_factory=dict_row)
                            cur.execute(QUERIES[w.query], p)
                            cursors.append(cur)
                    except psycopg.Error:
                        raise
                    except Exception as exc:
                        # A client-side failure (a parameter psycopg cannot send): leaving the
                        # pipeline would send its Sync and commit what was sent, so end the
                        # connection first; the server rolls back a transaction with no Sync.
                        conn.close()
                        raise _BatchAborted() from exc
                    crashpoints.reached("group_commit_sent", str(len(batch)))
                # the pipeline's Sync is answered: the implicit transaction has committed
                rows = [cur.fetchone() for cur in cursors]
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise  # the outcome is unknown
                raise _BatchAborted() from exc
        crashpoints.reached("group_commit_done", str(len(batch)))
        for w, row in zip(batch, rows, strict=True):
            if row is None:  # this write alone: its fence matched no row, nothing changed
                w.error = db.lease_lost(w.lease, w.query)
            else:
                w.row = row
