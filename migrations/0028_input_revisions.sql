-- 0028: input ownership (issue 29 item 6; DESIGN.md section 24; docs/explain.md).
--
--   * workflow_run.wait_kind gains the value 'input' (the column is free text since 0014, no
--     CHECK): a run parked because a step with onMissingInput "wait" needs an input path the
--     run lacks. WAITING stays the status; outstanding_step is the step.
--   * workflow_input_revision: one row per supply-input, appended in the transaction that
--     patches workflow_run.input and requeues the run (under the run's row lock): who, which
--     path, the SHA-256 of the old and new value (canonical JSON; old NULL when the path was
--     absent), both values, the reason. Runs that never wait for input never touch it.
--
-- Append-only: never edit this file once merged.

CREATE TABLE workflow_input_revision (
    job_id     UUID        NOT NULL REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    seq        BIGINT      GENERATED ALWAYS AS IDENTITY,
    path       TEXT        NOT NULL,
    old_sha256 TEXT,
    new_sha256 TEXT        NOT NULL,
    old_value  JSONB,
    new_value  JSONB       NOT NULL,
    actor      TEXT        NOT NULL,
    reason     TEXT,
    step       TEXT,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);
