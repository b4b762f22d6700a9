-- 0005: outbox rows written as columns, so a fenced write is one statement (issue #14).
--
-- DESIGN.md section 17: a worker's fenced write updates the row and inserts its events in one
-- data-modifying CTE. The event's type, status and reason can come from the row the statement
-- just changed (the 0002 trigger turns a boundary write into CANCELLED or PAUSED when a control
-- request is pending), so the client cannot build the protobuf payload beforehand. Such rows
-- carry the event as columns instead, and the relay encodes the upstream WorkflowRunEvent
-- bytes at publish time (event_id = the row's event_id, occurred_at = the row's created_at,
-- the writing transaction's now()).
--
--   * payload becomes nullable: NULL on a column row; rows with a payload (every row written
--     before this migration, rows of the other store writes, rows a Java ProtoMolt writes on an
--     adopted database) are published as they are;
--   * workflow_name, attempt, status_after (detail.status), step, verdict, error: the event's
--     fields, kept whole (the encoder truncates to the contract's limits, as build_event did);
--   * a CHECK that a row has its payload or at least the columns every event needs.
-- Existing rows are untouched (new columns are NULL, no table rewrite). Append-only.

ALTER TABLE workflow_run_events_outbox
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN workflow_name TEXT,
    ADD COLUMN attempt       INTEGER,
    ADD COLUMN status_after  TEXT,
    ADD COLUMN step          TEXT,
    ADD COLUMN verdict       TEXT,
    ADD COLUMN error         TEXT;

ALTER TABLE workflow_run_events_outbox
    ADD CONSTRAINT chk_workflow_run_events_outbox_payload_or_columns
    CHECK (payload IS NOT NULL
           OR (workflow_name IS NOT NULL AND attempt IS NOT NULL AND status_after IS NOT NULL))
    NOT VALID;
ALTER TABLE workflow_run_events_outbox
    VALIDATE CONSTRAINT chk_workflow_run_events_outbox_payload_or_columns;
