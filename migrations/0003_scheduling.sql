-- 0003: scheduling (issue #18, DESIGN.md section 14): priority, queues, fairness keys, dedup
-- keys, run deadlines, and fleet-wide queue limits.
--
-- Existing rows are not rewritten: every new column has a constant default (PostgreSQL stores
-- it in the catalogue) or is NULL. Old rows read as priority 3, queue 'default', fairness key
-- 'default', fairness_pass 0, so those still QUEUED claim before any job submitted after this
-- migration (whose passes start at 1), in their old created_at order.
--
-- * fairness_pass: the stride-scheduling order key stamped at enqueue (Temporal's fairness):
--   pass = max(base, last_pass[queue, key] + 1 / weight), base = the smallest pass still
--   QUEUED in the queue (or, in an empty queue, the largest pass ever handed out in it). The
--   claim reads the backlog in (priority, fairness_pass, created_at, job_id) order. No slot
--   table: the order key is on the row, so nothing can leak or wedge.
-- * workflow_fairness: last_pass per (queue, fairness key), upserted by the insert's own
--   statement (a CTE).
-- * dedup_key: a partial unique index over non-terminal rows. A run that ends leaves the
--   index, so the key is free again with no cleanup write; a concurrent second insert waits
--   for the first to commit and then finds the conflict (race-proof). Statuses other
--   migrations add are listed here when non-terminal (PAUSED, RECOVERY_REQUIRED); any status
--   not listed frees the key.
-- * deadline_at: now() + budget.deadline at insert; the sweeper ends runs past it.
-- * workflow_queue: fleet-wide limits of a queue (max_running, max_starts_per_second) and the
--   rate limiter's state (next_start_at, a GCRA "theoretical arrival time"). Workers upsert
--   their configured limits at start; the claim of a limited queue locks its row through
--   workflow_queue_permit(), so claimers of a capped queue are serialised (SKIP LOCKED alone
--   would let two claimers each spend the same last slot).
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run
    ADD COLUMN priority      SMALLINT         NOT NULL DEFAULT 3,
    ADD COLUMN queue         TEXT             NOT NULL DEFAULT 'default',
    ADD COLUMN fairness_key  TEXT             NOT NULL DEFAULT 'default',
    ADD COLUMN fairness_pass DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN dedup_key     TEXT,
    ADD COLUMN deadline_at   TIMESTAMPTZ,
    ADD CONSTRAINT chk_workflow_run_priority CHECK (priority BETWEEN 1 AND 5);

-- The claim: per served queue, QUEUED rows in (priority, fairness_pass, created_at, job_id)
-- order; the plan walks this index and stops at the first unlocked row with run_after <= now().
-- It replaces 0001's (created_at, job_id) index, which nothing reads any more.
CREATE INDEX idx_workflow_run_claim_sched
    ON workflow_run (queue, priority, fairness_pass, created_at, job_id)
    WHERE status = 'QUEUED';
DROP INDEX idx_workflow_run_claim;

-- Listing filtered by queue or fairness key (newest first).
CREATE INDEX idx_workflow_run_queue_created
    ON workflow_run (queue, created_at DESC, job_id DESC);
CREATE INDEX idx_workflow_run_fairness_created
    ON workflow_run (fairness_key, created_at DESC, job_id DESC);

-- One live run per dedup key.
CREATE UNIQUE INDEX uq_workflow_run_dedup_live
    ON workflow_run (dedup_key)
    WHERE dedup_key IS NOT NULL
      AND status IN ('QUEUED', 'RUNNING', 'WAITING', 'PAUSED', 'RECOVERY_REQUIRED');

-- The budget sweep: live runs with a deadline.
CREATE INDEX idx_workflow_run_deadline
    ON workflow_run (deadline_at)
    WHERE deadline_at IS NOT NULL
      AND status IN ('QUEUED', 'RUNNING', 'WAITING', 'PAUSED', 'RECOVERY_REQUIRED');

CREATE TABLE workflow_fairness (
    queue        TEXT             NOT NULL,
    fairness_key TEXT             NOT NULL,
    last_pass    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (queue, fairness_key)
);
-- "The largest pass ever handed out in this queue" (the base of an empty queue).
CREATE INDEX idx_workflow_fairness_queue_pass ON workflow_fairness (queue, last_pass);

CREATE TABLE workflow_queue (
    queue                 TEXT             PRIMARY KEY,
    max_running           INTEGER,
    max_starts_per_second DOUBLE PRECISION,
    next_start_at         TIMESTAMPTZ      NOT NULL DEFAULT '-infinity',
    updated_at            TIMESTAMPTZ      NOT NULL DEFAULT now(),
    CONSTRAINT chk_workflow_queue_max_running CHECK (max_running IS NULL OR max_running > 0),
    CONSTRAINT chk_workflow_queue_rate
        CHECK (max_starts_per_second IS NULL OR max_starts_per_second > 0)
);

-- May a claimer start one more job of queue q now? Locks q's limits row (FOR UPDATE) until
-- the claim's transaction ends, then counts RUNNING rows of q. VOLATILE on purpose: under READ
-- COMMITTED each statement inside a volatile function takes a fresh snapshot, so the count
-- runs after the lock is granted and sees the job the previous lock holder just claimed (the
-- claim statement's own snapshot, taken before it waited, would not: that is the SKIP LOCKED
-- budget trap). The rate: a start is allowed while next_start_at <= now() + 0.5 s (a burst of
-- about half a second's worth); the claim statement then moves next_start_at on by
-- 1 / max_starts_per_second. A queue without a row, or with no limits, is always permitted.
CREATE FUNCTION workflow_queue_permit(q TEXT) RETURNS BOOLEAN
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim workflow_queue%ROWTYPE;
    running INTEGER;
BEGIN
    SELECT * INTO lim FROM workflow_queue WHERE queue = q FOR UPDATE;
    IF NOT FOUND THEN
        RETURN TRUE;
    END IF;
    IF lim.max_starts_per_second IS NOT NULL
       AND lim.next_start_at > now() + interval '0.5 seconds' THEN
        RETURN FALSE;
    END IF;
    IF lim.max_running IS NOT NULL THEN
        SELECT count(*) INTO running
          FROM (SELECT 1 FROM workflow_run
                 WHERE status = 'RUNNING' AND queue = q
                 LIMIT lim.max_running) AS r;
        IF running >= lim.max_running THEN
            RETURN FALSE;
        END IF;
    END IF;
    RETURN TRUE;
END
$$;
