-- 0011: the transition hash is STABLE, so the planner inlines it (issue #14, performance).
--
-- 0002 declared workflow_run_transition_hash IMMUTABLE, but its body calls jsonb_build_array and
-- convert_to, which PostgreSQL marks STABLE. A SQL function whose body is more volatile than
-- its declaration is never inlined: every recorded change ran it through the SQL-function
-- executor, which parses and plans the body again on each call (about a tenth of the server's
-- CPU per job, measured with perf on `python -m bench throughput`). Declared STABLE, the
-- trigger's expression inlines it and its plan is cached with the trigger's. The hash itself
-- (what it computes, hence every stored chain) is unchanged. Append-only: never edit this file
-- once merged.

ALTER FUNCTION workflow_run_transition_hash(
    BYTEA, UUID, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, INTEGER, TEXT, TIMESTAMPTZ
) STABLE;
