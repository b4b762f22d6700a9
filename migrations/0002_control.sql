-- 0002: operator control (PAUSED, CANCELLED, a pending control request) and the transition log.
--
-- DESIGN.md sections 10 and 11, issue #15. Existing rows are untouched: every new column is
-- NULL or a constant default (no table rewrite), and old rows simply have no history yet.
--
--   * statuses PAUSED (not terminal) and CANCELLED (terminal). The status CHECK is replaced
--     whole; a later migration adding a status (RECOVERY_REQUIRED, #17) replaces it again;
--   * control: a request recorded on a RUNNING row ({kind, actor, reason, requestedAt}), honoured
--     by the trigger below at the worker's next boundary write;
--   * paused_from: the status a PAUSED job returns to on resume (QUEUED, or WAITING with its
--     outstanding_step kept);
--   * change_kind, change_actor, change_reason, change_step: set by the statement that changes
--     the row, read and cleared by the trigger (always NULL in a stored row);
--   * history_seq, history_head: the last transition's sequence number and hash, so the next
--     one chains without reading the log;
--   * workflow_run_transition: the append-only log, one row per change, hash-chained per job.
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run DROP CONSTRAINT chk_workflow_run_status;
ALTER TABLE workflow_run ADD CONSTRAINT chk_workflow_run_status
    CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD',
                      'PAUSED', 'CANCELLED')) NOT VALID;
ALTER TABLE workflow_run VALIDATE CONSTRAINT chk_workflow_run_status;

ALTER TABLE workflow_run
    ADD COLUMN control       JSONB,
    ADD COLUMN paused_from   TEXT,
    ADD COLUMN change_kind   TEXT,
    ADD COLUMN change_actor  TEXT,
    ADD COLUMN change_reason TEXT,
    ADD COLUMN change_step   TEXT,
    ADD COLUMN history_seq   BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN history_head  BYTEA;

CREATE TABLE workflow_run_transition (
    job_id      UUID        NOT NULL,
    seq         BIGINT      NOT NULL,
    prev_status TEXT,
    new_status  TEXT        NOT NULL,
    kind        TEXT        NOT NULL,
    actor       TEXT        NOT NULL,
    reason      TEXT,
    attempt     INTEGER     NOT NULL,
    step        TEXT,
    at          TIMESTAMPTZ NOT NULL,
    hash        BYTEA       NOT NULL,
    CONSTRAINT pk_workflow_run_transition PRIMARY KEY (job_id, seq),
    -- A run's history goes with the run (retention deletes both); never on its own.
    CONSTRAINT fk_workflow_run_transition_run FOREIGN KEY (job_id)
        REFERENCES workflow_run (job_id) ON DELETE CASCADE
);

-- The chained hash of one transition: sha256(previous hash || canonical JSON of the fields).
-- jsonb's text form is canonical (whatever the session settings); the time enters as integer
-- microseconds since the epoch, so TimeZone and DateStyle cannot change a hash.
CREATE FUNCTION workflow_run_transition_hash(
    prev BYTEA, job_id UUID, seq BIGINT, prev_status TEXT, new_status TEXT, kind TEXT,
    actor TEXT, reason TEXT, attempt INTEGER, step TEXT, at TIMESTAMPTZ
) RETURNS BYTEA
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT sha256(coalesce(prev, '\x'::bytea) || convert_to(
        jsonb_build_array(job_id::text, seq, prev_status, new_status, kind, actor, reason,
                          attempt, step, (extract(epoch FROM at) * 1000000)::bigint)::text,
        'UTF8'))
$$;

-- The row triggers. BEFORE INSERT OR UPDATE: apply a pending control request at a worker's
-- boundary write, number and hash the change; on UPDATE also append the transition row, in the
-- same statement. AFTER INSERT appends a new run's first row ("submit"): only after the insert
-- happened, since a BEFORE INSERT trigger also fires for an insert that ON CONFLICT DO NOTHING
-- then drops (a resubmission, a dedup hit).
--
-- A boundary write is an UPDATE of a RUNNING row that names its change (change_kind set:
-- checkpoint, complete, fail, retry, dead, park, release, sweep, stop) and leaves control as it
-- was; the heartbeat names none and is never a boundary. There a pending request wins:
--   cancel -> CANCELLED whatever the write wanted (the checkpoint it carries is kept; result
--             and verdict are not stored), lease cleared, completed_at = now();
--   pause  -> PAUSED (paused_from QUEUED, or WAITING for a park), lease cleared; except that a
--             FAILED or DEAD verdict stands (the pause request is dropped with it).
-- An UPDATE is recorded when the status changes or change_kind is set. Only a statement that
-- sets change_kind names its change: an UPDATE without it (hand-written SQL) is kind 'sql',
-- actor 'sql:<role>', whatever else the columns hold.
CREATE FUNCTION workflow_run_record_transition() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    request JSONB;
    kind    TEXT;
    actor   TEXT;
    reason  TEXT;
    step    TEXT;
    at      TIMESTAMPTZ := now();
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.change_kind := NULL;
        NEW.change_actor := coalesce(NEW.change_actor, 'sql:' || current_user);
        NEW.history_seq := 1;
        NEW.history_head := workflow_run_transition_hash(
            NULL, NEW.job_id, 1, NULL, NEW.status, 'submit', NEW.change_actor,
            NEW.change_reason, NEW.attempt, NEW.change_step, at);
        RETURN NEW;  -- the AFTER INSERT trigger writes the row, then the columns are cleared
    END IF;
    request := OLD.control;
    IF request IS NOT NULL AND OLD.status = 'RUNNING' AND NEW.change_kind IS NOT NULL
       AND NEW.control IS NOT DISTINCT FROM OLD.control THEN
        IF request->>'kind' = 'cancel' THEN
            NEW.status := 'CANCELLED';
            NEW.result := OLD.result;
            NEW.verdict := OLD.verdict;
            NEW.error := 'CANCELLED by ' || (request->>'actor')
                         || coalesce(': ' || (request->>'reason'), '');
            NEW.completed_at := at;
            NEW.outstanding_step := NULL;
            NEW.paused_from := NULL;
        ELSIF NEW.status NOT IN ('FAILED', 'DEAD') THEN
            NEW.paused_from := CASE WHEN NEW.status = 'WAITING' THEN 'WAITING' ELSE 'QUEUED' END;
            IF NEW.status <> 'WAITING' THEN
                NEW.outstanding_step := NULL;
            END IF;
            NEW.status := 'PAUSED';
            NEW.result := OLD.result;
            NEW.verdict := OLD.verdict;
            NEW.completed_at := NULL;
        END IF;
        IF NEW.status IN ('CANCELLED', 'PAUSED') THEN
            NEW.change_kind := request->>'kind';
            NEW.change_actor := request->>'actor';
            NEW.change_reason := request->>'reason';
        END IF;
        NEW.control := NULL;
        NEW.lease_owner := NULL;
        NEW.lease_token := NULL;
        NEW.lease_until := NULL;
    END IF;
    IF NEW.change_kind IS NOT NULL THEN
        kind := NEW.change_kind;
        actor := coalesce(NEW.change_actor, 'sql:' || current_user);
        reason := NEW.change_reason;
        step := NEW.change_step;
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        kind := 'sql';
        actor := 'sql:' || current_user;
    ELSE
        RETURN NEW;  -- no change to record (a heartbeat)
    END IF;
    NEW.history_seq := OLD.history_seq + 1;
    NEW.history_head := workflow_run_transition_hash(
        OLD.history_head, NEW.job_id, NEW.history_seq, OLD.status, NEW.status, kind, actor,
        reason, NEW.attempt, step, at);
    INSERT INTO workflow_run_transition
        (job_id, seq, prev_status, new_status, kind, actor, reason, attempt, step, at, hash)
    VALUES (NEW.job_id, NEW.history_seq, OLD.status, NEW.status, kind, actor, reason,
            NEW.attempt, step, at, NEW.history_head);
    NEW.change_kind := NULL;
    NEW.change_actor := NULL;
    NEW.change_reason := NULL;
    NEW.change_step := NULL;
    RETURN NEW;
END
$$;

-- The first transition of a new run (its change_* columns still hold the submit's actor and
-- reason; the next recorded UPDATE clears them, and until then nothing reads them).
CREATE FUNCTION workflow_run_record_submit() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO workflow_run_transition
        (job_id, seq, prev_status, new_status, kind, actor, reason, attempt, step, at, hash)
    VALUES (NEW.job_id, 1, NULL, NEW.status, 'submit', NEW.change_actor, NEW.change_reason,
            NEW.attempt, NEW.change_step, now(), NEW.history_head);
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_workflow_run_transition
    BEFORE INSERT OR UPDATE ON workflow_run
    FOR EACH ROW EXECUTE FUNCTION workflow_run_record_transition();

CREATE TRIGGER trg_workflow_run_submit
    AFTER INSERT ON workflow_run
    FOR EACH ROW EXECUTE FUNCTION workflow_run_record_submit();
