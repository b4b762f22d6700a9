-- 0001: the job row, its transactional outbox, and the rejects table of the request topic.
--
-- Columns, defaults and CHECK constraints follow the upstream V1__workflow_runs.sql
-- (reference/upstream-jobs.md section 2). Additions (DESIGN.md section 5):
--   * lease_token: a fresh gen_random_uuid() stamped by every claim and cleared with the
--     lease; part of the fence, because attempt alone repeats (a graceful release gives the
--     attempt back, a completed parked step resets it to 0);
--   * partial indexes for the claim (QUEUED) and the lease sweep (RUNNING), so both stay
--     fast however many terminal rows accumulate;
--   * outbox seq (drain order; the database assigns it, so no worker clock decides order),
--     claimed_until (the relay's claim lease), and a partial index on PENDING;
--   * workflow_run_rejects for request-topic records that cannot be decoded or validated.
-- Append-only: never edit this file once merged; add 0002_... instead.

CREATE TABLE workflow_run (
    job_id              UUID        PRIMARY KEY,
    workflow_name       TEXT        NOT NULL,
    workflow_definition JSONB       NOT NULL,
    input               JSONB       NOT NULL,
    input_ref           TEXT,
    status              TEXT        NOT NULL,
    attempt             INTEGER     NOT NULL DEFAULT 0,
    max_attempts        INTEGER     NOT NULL DEFAULT 3,
    run_after           TIMESTAMPTZ NOT NULL DEFAULT now(),
    outstanding_step    TEXT,
    checkpoints         JSONB       NOT NULL DEFAULT '[]',
    result              JSONB,
    result_ref          TEXT,
    verdict             TEXT,
    error               TEXT,
    lease_owner         TEXT,
    lease_token         UUID,
    lease_until         TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at        TIMESTAMPTZ,
    CONSTRAINT chk_workflow_run_status
        CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD'))
);

-- Listing (newest first, optionally by status / workflow name) and the upstream scan.
CREATE INDEX idx_workflow_run_status_run_after ON workflow_run (status, run_after);
CREATE INDEX idx_workflow_run_created ON workflow_run (created_at DESC, job_id DESC);
CREATE INDEX idx_workflow_run_name_created
    ON workflow_run (workflow_name, created_at DESC, job_id DESC);

-- The claim: ORDER BY created_at, job_id over QUEUED rows only; the plan walks this index in
-- order and filters run_after <= now(), stopping at the first unlocked row.
CREATE INDEX idx_workflow_run_claim
    ON workflow_run (created_at, job_id) WHERE status = 'QUEUED';

-- The sweep: RUNNING rows whose lease_until < now().
CREATE INDEX idx_workflow_run_sweep
    ON workflow_run (lease_until) WHERE status = 'RUNNING';

CREATE TABLE workflow_run_events_outbox (
    event_id      UUID        PRIMARY KEY,
    seq           BIGSERIAL   NOT NULL,
    event_type    TEXT        NOT NULL,
    payload       BYTEA       NOT NULL,
    kafka_key     TEXT        NOT NULL,
    attempts      INTEGER     NOT NULL DEFAULT 0,
    status        TEXT        NOT NULL DEFAULT 'PENDING',
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ,
    last_error    TEXT,
    claimed_until TIMESTAMPTZ,
    CONSTRAINT uq_workflow_run_events_outbox_seq UNIQUE (seq),
    CONSTRAINT chk_workflow_run_events_outbox_status
        CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED'))
);

CREATE INDEX idx_workflow_run_events_outbox_status_created
    ON workflow_run_events_outbox (status, created_at);

-- The relay's drain: PENDING rows in seq order.
CREATE INDEX idx_workflow_run_events_outbox_pending
    ON workflow_run_events_outbox (seq) WHERE status = 'PENDING';

-- Per-job order: "has this key an earlier PENDING row?"
CREATE INDEX idx_workflow_run_events_outbox_pending_key
    ON workflow_run_events_outbox (kafka_key, seq) WHERE status = 'PENDING';

CREATE TABLE workflow_run_rejects (
    id          BIGSERIAL   PRIMARY KEY,
    topic       TEXT        NOT NULL,
    "partition" INTEGER     NOT NULL,
    "offset"    BIGINT      NOT NULL,
    raw         BYTEA,
    reason      TEXT        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
