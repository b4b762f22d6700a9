-- 0017: the submitter's groups recorded with the run (issue 26; docs/approvals.md,
-- "Capabilities and grants").
--
--   * workflow_run.submitted_groups: the groups the submitting caller had at submit, as the
--     node's authority resolved them (an identity hook's groups joined with the [node.groups]
--     entries naming the principal), sorted. A [[jobs.grants]] entry by group matches one of
--     these (or a [node.groups] entry naming submitted_by now). The worker reads it only for
--     a step that declares capabilities, when a grant names groups or an authorize_step hook
--     is installed (one statement per segment), so a run without capability steps never does.
--
-- NULL for existing rows, for a submit whose caller has no group, and for the request topic
-- (whose submitter is kafka:<topic>). No index, no trigger change.
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run ADD COLUMN submitted_groups TEXT[];
