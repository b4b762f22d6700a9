-- 0006: step effects (issue #17, DESIGN.md sections 10 and 13).
--
-- Existing rows are untouched: the new columns are NULL (no table rewrite).
--
--   * status RECOVERY_REQUIRED (not terminal, no lease): a step's state cannot be proven (an
--     external step's intent without its checkpoint and no probe that could tell, or a
--     checkpoint whose fingerprint changed); outstanding_step names the step, error the reason;
--     reconcile-step or migrate-checkpoint send it back to QUEUED;
--   * effect_intents: {step: {key, generation, attempt, at}}, written by the worker (fenced)
--     before it calls a step with effect 'external';
--   * step_generations: {step: n}, grown by retry-step (the idempotency key's last part);
--   * workflow_checkpoint_stamp(entry): a new entry that carries a fingerprint gets the
--     database's time as "at" (older writers' entries are stored as they come).
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run DROP CONSTRAINT chk_workflow_run_status;
ALTER TABLE workflow_run ADD CONSTRAINT chk_workflow_run_status
    CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD',
                      'PAUSED', 'CANCELLED', 'RECOVERY_REQUIRED')) NOT VALID;
ALTER TABLE workflow_run VALIDATE CONSTRAINT chk_workflow_run_status;

ALTER TABLE workflow_run
    ADD COLUMN effect_intents   JSONB,
    ADD COLUMN step_generations JSONB;

CREATE FUNCTION workflow_checkpoint_stamp(entry JSONB) RETURNS JSONB
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN entry ? 'definitionSha256'
                THEN entry || jsonb_build_object('at', now())
                ELSE entry END
$$;
