"""``JobStore``: the job row, the claim, fenced writes, the sweep, parked completions, the outbox.

The row is the truth; the broker is only propagation. Every commit point writes its outbox
row in the same transaction as the job change, so an event exists if and only if its change
committed.

Leases and fencing
------------------
``job_claim`` moves the oldest eligible QUEUED row to RUNNING in one statement, stamping
``lease_owner`` (the worker id), ``lease_token = gen_random_uuid()``, ``lease_until = now() +
lease_s`` and ``attempt + 1``. ``(job_id, lease_owner, attempt, lease_token)`` is the fence
(:class:`~.records.Lease`). Every later write of that worker about the job (heartbeat,
checkpoint, park, complete, fail, retry, dead, release) is conditioned on ``status =
'RUNNING'`` and the fence. A write that matches no row raises
:class:`~protomolt_jobs.errors.LeaseLost` and rolls back: nothing changed, no outbox row.

Who is authoritative: the database. A lease is live while ``lease_until >= now()`` by the
database clock; the worker extends it with heartbeats. When a worker stops heartbeating (crash,
partition, stall) the sweeper (``job_sweep_expired``) moves the row back to QUEUED, or to DEAD
when ``attempt >= max_attempts`` (a crash loop ends). The next claim stamps a new random
``lease_token``, so the old owner's fence can never match again, even if it wakes up and writes.
``attempt`` alone would not do: ``job_release`` gives the attempt back (``attempt - 1``) and
``job_complete_parked`` resets it to 0, so the same ``(job_id, owner, attempt)`` can be handed
out twice; the token never repeats.

Stored text
-----------
Text parameters and JSON values are passed through :mod:`~.scrub` at the write boundary: NUL
and lone surrogates (which PostgreSQL ``text``/``jsonb`` refuse) become U+FFFD, in the row and
in its event alike, so a worker can always settle a job whatever its error text or response.

Reading rows
------------
Job queries select the JSONB columns as ``::text``; :meth:`JobRecord.from_row` decodes them in
Python after the transaction commits and never raises: an undecodable column (e.g. nested
deeper than the decoder's recursion limit) is None on the record and named in
``JobRecord.unreadable``. A claim therefore commits even for such a row and hands it to the
worker, which fails it, instead of rolling back and blocking every later claim on it.

Failures
--------
- The worker dies: its lease expires, the sweep requeues (or kills) the job.
- The database cannot be reached: a call that gets no healthy connection within
  ``connect_timeout_s`` raises :class:`~protomolt_jobs.errors.StoreUnavailable` (a
  ``StoreError`` and an ``Unavailable``: verbs answer ``unavailable``), never a long wait.
- A pooled connection the server killed while it sat idle (restart, ``pg_terminate_backend``,
  an idle timeout) is noticed before it is used, without a round trip (its socket has the
  server's goodbye to read), closed, and the call goes on with a fresh connection
  (:meth:`~.db.Database._connection`).
- A read whose connection breaks under it (the server killed it after that look) runs once
  more on a fresh connection (:func:`~.db.read_retried_once`).
- The database connection drops mid-write: the transaction rolls back; the store raises
  :class:`~protomolt_jobs.errors.StoreUnavailable` (driver error as ``__cause__``) and does not
  retry, because it cannot know whether the server committed; the write may be retried by the
  caller while its lease is live.
- The process dies after commit and before the caller learns of it: the change and its event
  are both durable; the caller's next fenced write is either valid (same lease) or LeaseLost.

Transactions: every public method is exactly one transaction. Pooled connections are in
autocommit mode: a method that runs one statement (the claim, the heartbeat, reads, the outbox
calls) is that statement's own transaction, sent in one round trip; a method that runs more
(a fenced write and its outbox row, an insert and its NOTIFY, the parked gate) opens one with
``with pool.connection() as conn, conn.transaction():``. A private ``_name_txn(conn, ...)``
does the work when two steps must share it.

Outbox claims: see :mod:`~.outbox`.

Layout
------
``JobStore`` is one facade composed of mixins, one module per concern, over one base:

- :mod:`~.db`: ``Database`` (the pool, the healthy connection, ``ping``, ``close``, the event
  of a change in its transaction), error translation and the statement helpers;
  :mod:`~.checks`: the argument checks;
- :mod:`~.inserts`: ``job_insert``, ``reject_insert``;
- :mod:`~.reads`: ``job_get``, ``job_list``, ``job_statuses``, ``job_history``,
  ``job_budget_cost_pauses``, ``metrics_counts``;
- :mod:`~.claims`: ``job_claim``, ``queue_limits_sync``, the heartbeats;
- :mod:`~.settles`: the fenced writes of a claimed run (checkpoint ... release, budget pause,
  stop, intent, recovery required);
- :mod:`~.control`: the operator writes (cancel ... recover) and the parked gate;
- :mod:`~.loops`: an exhausted loop's pause, ``extend-loop`` and the extensions' read;
- :mod:`~.inputs`: the input park, ``supply-input`` and its revisions (migration 0028);
- :mod:`~.outbox`: the relay's outbox calls;
- :mod:`~.maintenance`: the sweeps and the prunes.

The mixins share only what :class:`~.db.Database` defines; none imports another.
"""

from __future__ import annotations

from protomolt_jobs.store.approvals import ApprovalMixin
from protomolt_jobs.store.audit import AuditMixin
from protomolt_jobs.store.claims import ClaimsMixin
from protomolt_jobs.store.control import ControlMixin
from protomolt_jobs.store.db import NOTIFY_CHANNEL
from protomolt_jobs.store.inputs import InputsMixin
from protomolt_jobs.store.inserts import InsertsMixin
from protomolt_jobs.store.local_times import LocalTimesMixin
from protomolt_jobs.store.loops import LoopsMixin
from protomolt_jobs.store.maintenance import (
    SWEEP_BATCH_DEFAULT,
    SWEEP_MAX_BATCHES_DEFAULT,
    MaintenanceMixin,
)
from protomolt_jobs.store.outbox import OUTBOX_CLAIM_S_DEFAULT, OutboxMixin
from protomolt_jobs.store.preemption import PreemptionMixin
from protomolt_jobs.store.progress import ProgressMixin
from protomolt_jobs.store.reads import LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, ReadsMixin
from protomolt_jobs.store.settles import SettlesMixin

__all__ = [
    "LIST_LIMIT_DEFAULT",
    "LIST_LIMIT_MAX",
    "NOTIFY_CHANNEL",
    "OUTBOX_CLAIM_S_DEFAULT",
    "SWEEP_BATCH_DEFAULT",
    "SWEEP_MAX_BATCHES_DEFAULT",
    "JobStore",
]


class JobStore(
    ApprovalMixin,
    AuditMixin,
    InsertsMixin,
    ReadsMixin,
    ClaimsMixin,
    SettlesMixin,
    ControlMixin,
    LoopsMixin,
    ProgressMixin,
    PreemptionMixin,
    InputsMixin,
    LocalTimesMixin,
    OutboxMixin,
    MaintenanceMixin,
):
    """The durable store of jobs and their outbox, over a psycopg connection pool.

    Open one with :meth:`open` (or construct it on an open pool). Each method's docstring gives
    its SQL and its transaction; a database failure is raised as
    :class:`~protomolt_jobs.errors.StoreError`.

    :param pool: an open ``psycopg_pool.ConnectionPool``; the store closes it in :meth:`close`.
    :param connect_timeout_s: how long a call waits for a healthy connection before it raises
        :class:`~protomolt_jobs.errors.StoreUnavailable`, seconds.
    """
