-- 0020: a workflow's own retention (issue 30, item 6).
--
-- A definition's `retention` key says how long its finished runs are kept, per final status
-- (docs/workflows.md, Retention). The submitter stamps it into the new column as seconds per
-- status, e.g. {"COMPLETED": 86400, "FAILED": 2592000} (a status absent from the object has
-- no deadline from the workflow: it is kept). NULL (every run of a workflow without the key,
-- every row a Java node writes, every row from before this migration) keeps the node-wide
-- jobs.run_retention_seconds exactly as before.
--
-- The pruner finds the runs to delete by their expiry, workflow_run_expires_at(), through a
-- partial index that holds only terminal runs with a stamped retention: a run without one is
-- never in it (its predicate is one NULL test, nothing is read from the definition). The
-- node-wide statements gain `retention IS NULL`, and 0004's index is replaced by the same
-- index with that predicate, so a pass never walks over runs a workflow keeps longer and a
-- terminal write maintains as many indexes as before.
--
-- Adding a nullable column without a default is a catalog change (no table rewrite).
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run ADD COLUMN IF NOT EXISTS retention JSONB;

-- When a terminal run's workflow retention ends: completed_at plus the seconds its retention
-- gives its status; NULL when it gives none (the run is kept). Seconds-only intervals do not
-- depend on the session's time zone, so the function is immutable and can be indexed.
CREATE OR REPLACE FUNCTION workflow_run_expires_at(completed_at TIMESTAMPTZ, status TEXT,
                                                   retention JSONB)
RETURNS TIMESTAMPTZ
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT completed_at + make_interval(secs => (retention ->> status)::float8)
$$;

CREATE INDEX IF NOT EXISTS idx_workflow_run_retention_expires
    ON workflow_run (workflow_run_expires_at(completed_at, status, retention))
    WHERE retention IS NOT NULL
      AND status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED');

CREATE INDEX IF NOT EXISTS idx_workflow_run_terminal_completed_node
    ON workflow_run (completed_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'DEAD') AND retention IS NULL;

DROP INDEX IF EXISTS idx_workflow_run_terminal_completed;
