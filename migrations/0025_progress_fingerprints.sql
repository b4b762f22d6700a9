-- 0025: the fingerprints of a progress checkpoint (issue 28 item 4; DESIGN.md section 23;
-- docs/long-steps.md "Resuming from progress: the fingerprint check").
--
--   * workflow_run_progress.definition_sha256 and descriptor_sha256: the definition's and the
--     step's descriptors' SHA-256 when the report was written (workflow/effects.py
--     fingerprint(), the same values a step's checkpoint entry carries). With adapter_version
--     and input_sha256 (migration 0022) they are compared with the current ones when a
--     resumable step continues from the saved state; a difference stops the run as
--     RECOVERY_REQUIRED (progress-mismatch). NULL: written before this migration, by a
--     ReportProgress-only call, or accepted by migrate-checkpoint keep: nothing to compare.
--
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run_progress
    ADD COLUMN definition_sha256 TEXT,
    ADD COLUMN descriptor_sha256 TEXT;
