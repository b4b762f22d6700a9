-- 0018: the database's work per job, cheaper where it was measured (issue 33): room on each
-- heap page of workflow_run for a running job's updates, and the history's foreign key
-- replaced by a delete trigger.
--
-- 1. fillfactor 50.
--
-- A three-step job updates its run row four times (claim, two checkpoints, the completion
-- with the last checkpoint). The claim and the completion change status, which several
-- indexes key or filter on, so they can never be HOT; the checkpoints change only columns no
-- index reads (checkpoints, updated_at, the change_* and history columns), so they are HOT
-- (no index entry written in any of the 13 indexes) whenever the new row version fits on the
-- page of the old one. A run row is about 1.7 KB (definition, input and checkpoints inline),
-- so at the default fillfactor 100 a page holds four rows and no room: measured on
-- `python -m bench floor` (pgbench, the store's exact statements) 35-39 % of updates were
-- HOT. With fillfactor 50 new rows fill half a page and the checkpoints stay on it:
-- 50 % HOT, every update that can be HOT is (docs/benchmarks.md, issue 33). The price is
-- heap size: about 1.6x the heap bytes per job before pruning removes old runs.
--
-- Only pages filled from now on keep the room; an existing table's full pages stay full
-- until the run pruner empties them (no rewrite here: VACUUM FULL would lock the table).
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run SET (fillfactor = 50);

-- 2. The transition log's foreign key to its run, replaced by statement-level delete triggers.
--
-- Every history row is written by workflow_run's own triggers, for the row being inserted or
-- updated under its lock, so the reference cannot dangle from the product's writes; what the
-- foreign key still did was check it again on every write: a queued after-trigger event and
-- an SPI query locking the run row FOR KEY SHARE, five times per three-step job. Profiled on
-- `python -m bench floor` (perf, 4 clients): 4.4 % of the PostgreSQL backends' CPU
-- (AfterTriggerEndQuery running its SPI query), a third of the transition trigger's 14 %.
-- Its other job, ON DELETE CASCADE, is kept by the triggers below: a run's history goes with
-- the run (the pruner, a manual DELETE) and with a TRUNCATE of the runs, in the same
-- statement. The hash chain (workflow_run_transition_hash) and its checks are unchanged.
ALTER TABLE workflow_run_transition DROP CONSTRAINT fk_workflow_run_transition_run;

CREATE FUNCTION workflow_run_delete_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_run_transition AS t USING gone AS g WHERE t.job_id = g.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_workflow_run_delete_history
    AFTER DELETE ON workflow_run
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_run_delete_history();

CREATE FUNCTION workflow_run_truncate_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE workflow_run_transition;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_workflow_run_truncate_history
    AFTER TRUNCATE ON workflow_run
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_run_truncate_history();
