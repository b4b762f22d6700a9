-- 0013: which writer made a row, so the pruner leaves the rows it did not write alone
-- (issue #32, item 6).
--
-- Upstream keeps terminal runs and PUBLISHED outbox rows forever; on a database a Java
-- ProtoMolt shares (adopted by 0007) our pruner must not delete its rows after our retention.
-- workflow_run.origin and workflow_run_events_outbox.origin say who inserted the row:
--
--   * 'protomolt-jobs': a session of our store (protomolt_jobs.session set, store/db.py
--     SESSION_SETTING; an operator session that sets it counts as ours);
--   * NULL: any other writer (a Java node, whose INSERTs name only upstream's columns), and
--     rows of an adopted database that were there before this migration and cannot be proven
--     ours (conservative: they are kept).
--
-- A column DEFAULT does it, not a trigger: the expression (current_setting, a CASE) is
-- evaluated in the INSERT's own projection, nothing more runs per row. An UPDATE never
-- changes origin: a Java-submitted run our workers completed is still not ours to prune.
-- The pruner's statements keep to origin = 'protomolt-jobs' unless jobs.prune_foreign_rows.
--
-- Backfill without a table rewrite: the column is added with a constant default (PostgreSQL
-- stores it once and existing rows read it), then the default becomes the session
-- expression for new rows. On a database our 0001 created every existing row is ours (Java
-- nodes joining such a database are not supported, docs/interop.md); on an adopted one only
-- the outbox's column rows (0005: only our statements write those columns) are provably
-- ours, and everything else that existed before this migration stays NULL.
-- Append-only: never edit this file once merged.

DO $origin$
DECLARE
    adopted BOOLEAN := EXISTS (SELECT 1
                                 FROM pg_trigger
                                WHERE tgname = 'trg_workflow_run_foreign_fence'
                                  AND tgrelid = 'workflow_run'::regclass);
BEGIN
    IF adopted THEN
        ALTER TABLE workflow_run ADD COLUMN origin TEXT;
        ALTER TABLE workflow_run_events_outbox ADD COLUMN origin TEXT;
        UPDATE workflow_run_events_outbox
           SET origin = 'protomolt-jobs'
         WHERE workflow_name IS NOT NULL;
    ELSE
        ALTER TABLE workflow_run ADD COLUMN origin TEXT DEFAULT 'protomolt-jobs';
        ALTER TABLE workflow_run_events_outbox ADD COLUMN origin TEXT DEFAULT 'protomolt-jobs';
    END IF;
END
$origin$;

ALTER TABLE workflow_run
    ALTER COLUMN origin SET DEFAULT
        (CASE WHEN coalesce(current_setting('protomolt_jobs.session', true), '') <> ''
              THEN 'protomolt-jobs' END);
ALTER TABLE workflow_run_events_outbox
    ALTER COLUMN origin SET DEFAULT
        (CASE WHEN coalesce(current_setting('protomolt_jobs.session', true), '') <> ''
              THEN 'protomolt-jobs' END);
