-- 0014: approval steps (issue 26, DESIGN.md section 20; docs/approvals.md).
--
--   * workflow_run.wait_kind: why a WAITING run waits: NULL (an external step, as before) or
--     'approval' (votes decide it). WAITING stays the status, so the partial indexes and the
--     Java consumers that know WAITING are unchanged; get-job shows phase 'waiting_approval'.
--   * workflow_run.submitted_by: the principal that submitted the run (no self-approval).
--   * workflow_run.wait_seq: the transition seq of the park that opened the approval step the
--     run waits on. Votes are keyed by it, so a step opened again (retry-step of it or of a
--     step before it, a later loop iteration) never counts an earlier opening's votes.
--   * workflow_run.wake_at, wait_timers: an approval step's timers (escalations, expiry) as
--     absolute database times, stamped by the park; wake_at is the earliest not yet fired.
--     The sweeper's timer pass reads the partial index below (WAITING rows with a timer
--     only; a run without approval timers never enters it).
--   * workflow_approval_vote: one vote per principal per approval step and opening (wait_seq),
--     written under the run's row lock by approve-step. Its transitions ('vote', 'decision')
--     are rows of the run's hash-chained transition log.
--
-- The columns are NULL for existing rows and for workers that do not know them. Append-only:
-- never edit this file once merged.

ALTER TABLE workflow_run
    ADD COLUMN wait_kind    TEXT,
    ADD COLUMN wait_seq     BIGINT,
    ADD COLUMN submitted_by TEXT,
    ADD COLUMN wake_at      TIMESTAMPTZ,
    ADD COLUMN wait_timers  JSONB;

CREATE INDEX idx_workflow_run_wake ON workflow_run (wake_at)
    WHERE wake_at IS NOT NULL AND status = 'WAITING';

CREATE TABLE workflow_approval_vote (
    job_id     UUID        NOT NULL REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    step       TEXT        NOT NULL,
    opened_seq BIGINT      NOT NULL,
    principal  TEXT        NOT NULL,
    groups     TEXT[]      NOT NULL DEFAULT '{}',
    decision   TEXT        NOT NULL,
    comment    TEXT,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step, opened_seq, principal)
);
