-- 0022: progress checkpoints of long steps (issue 28 items 1 and 3; DESIGN.md section 23;
-- docs/long-steps.md).
--
--   * workflow_run_progress: the last progress report of one step of one run, keyed by
--     (job_id, step, iteration) (iteration 0 outside a loop). Written by one fenced statement
--     per report (job_progress in store/queries.sql) that also extends the run's lease, so a
--     report is the heartbeat; kept apart from workflow_run so a report never rewrites the wide
--     run row's checkpoints and the row stays HOT-updatable.
--     percent (0..100, NULL when the step gives none), details (free text), state (the saved
--     state of a resumable step, JSON) or state_ref (a reference to it), adapter_version and
--     input_sha256 (fingerprints of the call that produced it), attempt (the claim's attempt
--     that wrote it), seq (reports of this step so far), done (the step said it is finished).
--
-- A run's progress rows go with the run (ON DELETE CASCADE). Append-only: never edit this file
-- once merged.

CREATE TABLE workflow_run_progress (
    job_id          UUID NOT NULL REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    step            TEXT NOT NULL,
    iteration       INT NOT NULL DEFAULT 0,
    attempt         INT NOT NULL,
    seq             INT NOT NULL DEFAULT 1,
    percent         DOUBLE PRECISION CHECK (percent IS NULL OR (percent >= 0 AND percent <= 100)),
    details         TEXT,
    state           JSONB,
    state_ref       TEXT,
    adapter_version TEXT,
    input_sha256    TEXT,
    done            BOOLEAN NOT NULL DEFAULT false,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step, iteration)
);
