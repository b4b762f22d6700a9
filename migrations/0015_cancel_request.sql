-- 0015: cancel that keeps what the user asked to keep (issue 27 item 4; docs/verbs.md
-- "Operator control").
--
--   * workflow_run.cancel_request: the last cancel-job's request, kept after it is applied
--     ({actor, reason, requestedAt, compensate}; compensate is null when the caller left it to
--     the workflow's cancel.compensate). The worker reads it when it compensates a cancelled
--     graph run (compensate false: none runs); get-job's report compares it with the
--     checkpoints' times to list the external effects that completed after the request.
--     control is cleared when the request is applied, this column is not.
--
-- NULL for existing rows and for runs never cancelled; no index, no trigger change.
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run ADD COLUMN cancel_request JSONB;
