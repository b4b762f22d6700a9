-- 0010: the default fairness key's pass without a lock (issue #18, a follow-up of 0003).
--
-- 0003 stamped each new run's fairness pass from a per-(queue, key) counter row
-- (workflow_fairness) upserted inside the insert statement, so concurrent submits of one key
-- waited for each other's commit on that row's lock. For a named fairnessKey that is the
-- price of exact interleaving, paid by that tenant's own submits; but every run without a
-- fairnessKey has the key 'default', so every workflow that uses none of the scheduling keys
-- paid it too (docs/benchmarks.md, "Concurrent submits"). job_insert now stamps the default
-- key without the counter: pass = max(base, the key's largest pass still QUEUED) + 1/weight,
-- the largest pass read from this index (one probe). Named keys keep the counter row.
-- Existing rows are not rewritten. Append-only: never edit this file once merged.

CREATE INDEX idx_workflow_run_fairness_tail
    ON workflow_run (queue, fairness_pass)
    WHERE status = 'QUEUED' AND fairness_key = 'default';
