-- The schema upstream's Flyway migration V1__workflow_runs.sql creates (the Java ProtoMolt's
-- jobs store), written from the facts in reference/upstream-jobs.md section 2: the same
-- tables, columns, types, nulls, defaults, constraints and indexes. Tests create a database
-- with it and let migrate() adopt it.

CREATE TABLE workflow_run (
    job_id              UUID PRIMARY KEY,
    workflow_name       TEXT NOT NULL,
    workflow_definition JSONB NOT NULL,
    input               JSONB NOT NULL,
    input_ref           TEXT,
    status              TEXT NOT NULL,
    attempt             INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 3,
    run_after           TIMESTAMPTZ NOT NULL DEFAULT now(),
    outstanding_step    TEXT,
    checkpoints         JSONB NOT NULL DEFAULT '[]',
    result              JSONB,
    result_ref          TEXT,
    verdict             TEXT,
    error               TEXT,
    lease_owner         TEXT,
    lease_until         TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at        TIMESTAMPTZ,
    CONSTRAINT chk_workflow_run_status CHECK (status IN
        ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD'))
);
CREATE INDEX idx_workflow_run_status_run_after ON workflow_run (status, run_after);

CREATE TABLE workflow_run_events_outbox (
    event_id     UUID PRIMARY KEY,
    event_type   TEXT NOT NULL,
    payload      BYTEA NOT NULL,
    kafka_key    TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    status       TEXT NOT NULL DEFAULT 'PENDING',
    created_at   TIMESTAMPTZ NOT NULL,
    published_at TIMESTAMPTZ,
    last_error   TEXT,
    CONSTRAINT chk_workflow_run_events_outbox_status CHECK (status IN
        ('PENDING', 'PUBLISHED', 'FAILED'))
);
CREATE INDEX idx_workflow_run_events_outbox_status_created
    ON workflow_run_events_outbox (status, created_at);
