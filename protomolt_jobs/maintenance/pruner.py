"""Pruner: retention for the outbox and for finished runs.

Two deletions, each in small batches (one short autocommit statement per batch, rows taken
``FOR UPDATE SKIP LOCKED``, so no batch waits on a relay or a worker and none holds locks for
long), oldest first, in database time:

- PUBLISHED outbox rows published more than ``outbox_retention_seconds`` ago;
- terminal runs (COMPLETED, FAILED, DEAD, CANCELLED) completed more than
  ``run_retention_seconds`` ago (their transition log goes with them, ``ON DELETE CASCADE``);
- terminal runs of workflows with their own ``retention`` (the run's ``retention`` column,
  migration 0020) whose retention for their final status has ended, with their PUBLISHED
  outbox rows. The node-wide statements leave such runs alone, and this one runs even when
  ``run_retention_seconds`` is 0 (docs/workflows.md, Retention).

Never deleted, and the queries say so in their ``WHERE`` clauses: a PENDING or FAILED outbox
row (an event not yet published, or the outbox's dead letter), and a QUEUED, RUNNING, WAITING
or PAUSED run. Rows our store did not write (``origin`` NULL, migration 0013: a Java
ProtoMolt's runs and outbox rows on a shared database, which upstream keeps forever) are left
alone unless ``jobs.prune_foreign_rows`` is true. A retention of 0 turns that deletion off. Several pruners (one per process) are safe:
they skip each other's locked rows.

Artifact bytes (issue 29; docs/artifacts.md): deleting a run whose entries declare ports
queues their ``artifact://`` keys (migration 0027's trigger, in the same DELETE; promoted ports
are kept, detached, with their bytes). Each pass then deletes the queued keys through the node's
``ArtifactStore``, except those a kept artifact or a stored run (live or not yet pruned) still
names; a key already missing counts as pruned, and a store that cannot be reached leaves the
key queued for the next pass. Neither ever blocks deleting a run.

Without a broker (``jobs.kafka_bootstrap`` unset) nothing publishes, so PENDING rows only
grow; the pruner never deletes them, and warns once (action ``outbox_pending_without_broker``)
when more than :data:`PENDING_WARN_ROWS` are waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protomolt_jobs.config import JobsConfig
from protomolt_jobs.errors import StoreError
from protomolt_jobs.runs.artifact_store import key_of
from protomolt_jobs.service import PeriodicService

__all__ = ["PENDING_WARN_ROWS", "PruneResult", "Pruner"]

#: PENDING outbox rows beyond which a node without a broker warns (once per process).
PENDING_WARN_ROWS = 1000
#: Rows per pruning statement.
BATCH_ROWS = 500
#: Most batches of each kind per pass (bounds one pass; the next pass continues).
MAX_BATCHES = 20


@dataclass(frozen=True)
class PruneResult:
    """What one pass deleted.

    :ivar outbox_rows: PUBLISHED outbox rows deleted.
    :ivar runs: terminal runs deleted (both kinds).
    :ivar retained_runs: of ``runs``, those deleted under their workflow's own retention.
    :ivar artifact_keys: byte keys of deleted runs deleted from the ``ArtifactStore`` (or
        found already missing).
    :ivar artifact_keys_kept: byte keys left in place because a kept artifact or a stored run
        still names them.
    """

    outbox_rows: int = 0
    runs: int = 0
    retained_runs: int = 0
    artifact_keys: int = 0
    artifact_keys_kept: int = 0


class Pruner(PeriodicService):
    """The retention component (a :class:`~protomolt_jobs.service.PeriodicService`: one pass
    per jittered ``prune_interval_seconds``, the first after one interval; a store failure is
    a warning and the pass is retried after a backoff).

    :param store: the job store (``outbox_prune_published``, ``job_prune_terminal``,
        ``job_prune_cancelled``, ``job_prune_retention``, ``outbox_pending_count``).
    :param config: ``JobsConfig`` (``outbox_retention_seconds``, ``run_retention_seconds``,
        ``prune_interval_seconds``, ``prune_foreign_rows``, ``kafka_bootstrap``, ``worker_id``;
        validated there).
    :param batch_rows: rows per statement (> 0).
    :param max_batches: most statements of each kind per pass (> 0).
    :param artifact_store: the node's ``ArtifactStore`` (deleted runs' bytes go from it); None:
        no byte pass.
    """

    name = "pruner"
    transient = (StoreError,)

    def __init__(
        self,
        store: Any,
        *,
        config: JobsConfig,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
        artifact_store: Any = None,
    ) -> None:
        super().__init__(interval_s=config.prune_interval_seconds, worker_id=config.worker_id)
        if batch_rows < 1 or max_batches < 1:
            raise ValueError(
                f"pruner: batch_rows and max_batches must be >= 1; got {batch_rows}, {max_batches}"
            )
        self._store = store
        self.outbox_retention_s = config.outbox_retention_seconds
        self.run_retention_s = config.run_retention_seconds
        #: Also delete rows our store did not write (``jobs.prune_foreign_rows``).
        self.foreign_rows = config.prune_foreign_rows
        self.broker = bool(config.kafka_bootstrap)
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self._warned_pending = False
        self._artifacts = artifact_store

    def run_once(self) -> PruneResult:
        """One pass: prune the outbox, then the runs, then check the PENDING backlog.

        :returns: :class:`PruneResult`.
        :raises StoreError: when a statement fails (batches already deleted stay deleted).
        """
        outbox_rows = runs = 0
        if self.outbox_retention_s > 0:
            outbox_rows = self._drain(self._store.outbox_prune_published, self.outbox_retention_s)
        if self.run_retention_s > 0:
            runs = self._drain(self._store.job_prune_terminal, self.run_retention_s)
            runs += self._drain(self._store.job_prune_cancelled, self.run_retention_s)
        retained, retained_outbox = self._drain_retained()
        runs += retained
        outbox_rows += retained_outbox
        keys, kept = self._prune_bytes()
        if outbox_rows or runs:
            self.log.info(
                "pruned %d published outbox rows and %d finished runs",
                outbox_rows,
                runs,
                extra={
                    "action": "pruned",
                    "worker_id": self.worker_id,
                    "outbox_rows": outbox_rows,
                    "runs": runs,
                },
            )
        if not self.broker and not self._warned_pending:
            pending = self._store.outbox_pending_count(PENDING_WARN_ROWS + 1)
            if pending > PENDING_WARN_ROWS:
                self._warned_pending = True
                self.log.warning(
                    "more than %d outbox rows are PENDING and no broker is configured "
                    "(jobs.kafka_bootstrap): they are never published nor pruned; configure a "
                    "broker, or delete them by hand (docs/operations.md, Retention)",
                    PENDING_WARN_ROWS,
                    extra={
                        "action": "outbox_pending_without_broker",
                        "worker_id": self.worker_id,
                        "pending_at_least": pending,
                    },
                )
        return PruneResult(
            outbox_rows=outbox_rows,
            runs=runs,
            retained_runs=retained,
            artifact_keys=keys,
            artifact_keys_kept=kept,
        )

    def _prune_bytes(self) -> tuple[int, int]:
        """The byte pass: ``(keys deleted or already missing, keys kept as referenced)``."""
        if self._artifacts is None:
            return 0, 0
        deleted = kept = 0
        for _ in range(self.max_batches):
            if self._stop.is_set():
                break
            batch = self._store.artifact_bytes_doomed(self.batch_rows)
            done: list[str] = []
            for uri, referenced in batch:
                key = key_of(uri)
                if referenced or key is None:
                    kept += 1
                    done.append(uri)
                    continue
                try:
                    self._artifacts.delete(key)  # False: already missing, counts as pruned
                except ValueError as exc:  # a key the store refuses (out of its root): not ours
                    self.log.warning(
                        "artifact bytes %s are not the store's to delete (kept): %s",
                        uri,
                        exc,
                        extra={"action": "artifact_prune_refused", "worker_id": self.worker_id},
                    )
                    kept += 1
                    done.append(uri)
                    continue
                except Exception as exc:  # noqa: BLE001 - any store error: the key waits a pass
                    self.log.warning(
                        "artifact bytes %s could not be deleted (next pass retries): %s",
                        uri,
                        exc,
                        extra={"action": "artifact_prune_failed", "worker_id": self.worker_id},
                    )
                    continue
                deleted += 1
                done.append(uri)
            self._store.artifact_bytes_forget(done)
            if len(batch) < self.batch_rows or not done:
                break
        return deleted, kept

    def _drain(self, prune: Any, retention_s: float) -> int:
        deleted = 0
        for _ in range(self.max_batches):
            if self._stop.is_set():  # a stop mid-pass ends it between batches
                break
            n = prune(retention_s, self.batch_rows, foreign_rows=self.foreign_rows)
            deleted += n
            if n < self.batch_rows:
                break
        return deleted

    def _drain_retained(self) -> tuple[int, int]:
        """The runs whose workflow retention ended, batch by batch: ``(runs, outbox rows)``."""
        runs = outbox_rows = 0
        for _ in range(self.max_batches):
            if self._stop.is_set():
                break
            n, events = self._store.job_prune_retention(
                self.batch_rows, foreign_rows=self.foreign_rows
            )
            runs += n
            outbox_rows += events
            if n < self.batch_rows:
                break
        return runs, outbox_rows

    def _wait_before_first_pass(self) -> bool:
        return True

    def _started_fields(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "outbox_retention_s": self.outbox_retention_s,
            "run_retention_s": self.run_retention_s,
            "foreign_rows": self.foreign_rows,
        }

    def _failed_pass(self, exc: BaseException) -> None:
        self.log.warning(
            "prune failed (next pass retries)",
            extra={"action": "prune_failed", "worker_id": self.worker_id, "error": str(exc)},
        )
