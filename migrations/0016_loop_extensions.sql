-- 0016: bounded loops (issue 27 item 1; docs/workflows.md "Bounded loops", docs/verbs.md
-- "extend-loop").
--
--   * workflow_run.loop_extensions: {loop step: re-runs added by extend-loop} for this run
--     (the definition's loop.max plus this is the loop's bound). The worker reads it only
--     when a loop reaches its bound (job_loop_extensions), never on the claim.
--
-- NULL for existing rows and for runs no extend-loop touched; no index, no trigger change.
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run ADD COLUMN loop_extensions JSONB;
