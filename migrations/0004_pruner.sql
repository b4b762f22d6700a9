-- 0004: the pruner's index (surfaces, #13).
--
-- The pruner deletes terminal runs (COMPLETED, FAILED, DEAD) whose completed_at is older than
-- jobs.run_retention_seconds, oldest first, in small batches. This partial index lets each
-- batch find its oldest rows without scanning every terminal run; it holds only terminal
-- rows, so the claim, heartbeat and checkpoint writes of live runs never touch it.
-- PUBLISHED outbox rows are found through idx_workflow_run_events_outbox_status_created.
-- Existing rows stay untouched. Append-only: never edit this file once merged.

CREATE INDEX IF NOT EXISTS idx_workflow_run_terminal_completed
    ON workflow_run (completed_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'DEAD');
