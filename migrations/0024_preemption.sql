-- 0024: preemption (issue 28 item 5; DESIGN.md section 23; docs/long-steps.md "Preemption").
--
--   * workflow_run_record_transition(): the row trigger of 0002 learns a third request kind,
--     control = {kind: 'yield', actor, reason, for, requestedAt}, set on a RUNNING row by the
--     sweeper's preemption pass (job_preempt_request). It is honoured ONLY at a progress
--     report (change_kind 'progress', job_progress: the chunk boundary of a resumable step):
--     there the report is stored and the run goes back to QUEUED in the same statement, its
--     attempt given back (attempt - 1, as a graceful release: a yield uses up no attempt),
--     run_after = now(), lease cleared, and a transition of kind 'yield' by the requesting
--     actor is logged. Until that commit the row stays RUNNING, so the queue's max_running
--     counts it and the queue is never oversubscribed. Any other boundary write drops the
--     request (the run finished its resumable step first, settled, was released or swept)
--     and goes on as written. A cancel or pause recorded after it overwrites it. The cancel
--     and pause branches are unchanged.
--   * workflow_run_event_payload(): event type YIELDED = 15 (jobs.proto) in the payload the
--     outbox trigger writes for a shared outbox.
--
-- Append-only: never edit this file once merged.

CREATE OR REPLACE FUNCTION workflow_run_record_transition() RETURNS trigger
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
    IF request IS NOT NULL AND request->>'kind' = 'yield' THEN
        -- 0024: a preemption's yield request is honoured only at a progress report (the
        -- chunk boundary of a resumable step): the run goes back to QUEUED with its attempt
        -- given back and its lease cleared. Any other boundary write (a checkpoint, the
        -- settle, a release, the sweep) drops it and goes on as written; the heartbeat (no
        -- change named) keeps it.
        IF OLD.status = 'RUNNING' AND NEW.change_kind IS NOT NULL
           AND NEW.control IS NOT DISTINCT FROM OLD.control THEN
            IF NEW.change_kind = 'progress' AND NEW.status = 'RUNNING' THEN
                NEW.status := 'QUEUED';
                NEW.attempt := greatest(OLD.attempt - 1, 0);
                NEW.run_after := at;
                NEW.lease_owner := NULL;
                NEW.lease_token := NULL;
                NEW.lease_until := NULL;
                NEW.change_kind := 'yield';
                NEW.change_actor := request->>'actor';
                NEW.change_reason := request->>'reason';
            END IF;
            NEW.control := NULL;
        END IF;
        request := NULL;
    END IF;
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

CREATE OR REPLACE FUNCTION workflow_run_event_payload(
    event_id      UUID,
    event_type    TEXT,
    kafka_key     TEXT,
    created_at    TIMESTAMPTZ,
    workflow_name TEXT,
    attempt       INTEGER,
    status_after  TEXT,
    step          TEXT,
    verdict       TEXT,
    error         TEXT
) RETURNS BYTEA
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $payload$
DECLARE
    -- "ACCEPTED" and "TYPE_ACCEPTED" both name type 1; anything else is 0 (UNSPECIFIED).
    type_name TEXT := CASE WHEN event_type LIKE 'TYPE\_%' THEN substr(event_type, 6)
                           ELSE coalesce(event_type, '') END;
    type_no   INTEGER;
    texts     TEXT[];
    tags      INTEGER[] := ARRAY[10, 18, 26, 42, 58, 66];  -- fields 1, 2, 3, 5, 7, 8 (LEN)
    out       BYTEA := '\x'::bytea;
    part      BYTEA;
    epoch     NUMERIC;
    seconds   BIGINT;
    nanos     INTEGER;
BEGIN
    type_no := CASE type_name
        WHEN 'ACCEPTED' THEN 1 WHEN 'STEP_CHECKPOINT' THEN 2 WHEN 'WAITING' THEN 3
        WHEN 'COMPLETED' THEN 4 WHEN 'FAILED' THEN 5 WHEN 'DEAD' THEN 6
        WHEN 'CANCELLED' THEN 7 WHEN 'PAUSED' THEN 8 WHEN 'RESUMED' THEN 9
        WHEN 'REQUEUED' THEN 10 WHEN 'CONTROL_REQUESTED' THEN 11
        WHEN 'RECOVERY_REQUIRED' THEN 12 WHEN 'APPROVAL_DECIDED' THEN 13
        WHEN 'APPROVAL_ESCALATED' THEN 14
        WHEN 'YIELDED' THEN 15 ELSE 0 END;
    texts := ARRAY[event_id::text, coalesce(kafka_key, ''),
                   left(coalesce(workflow_name, ''), 200), left(coalesce(step, ''), 200),
                   left(coalesce(verdict, ''), 500), left(coalesce(error, ''), 4000)];
    FOR i IN 1..6 LOOP
        IF texts[i] <> '' THEN
            part := convert_to(texts[i], 'UTF8');
            out := out || set_byte('\x00'::bytea, 0, tags[i])
                       || workflow_run_event_varint(length(part)) || part;
        END IF;
        IF i = 3 AND type_no <> 0 THEN  -- field 4, type (VARINT)
            out := out || '\x20'::bytea || workflow_run_event_varint(type_no);
        END IF;
        IF i = 4 AND coalesce(attempt, 0) <> 0 THEN  -- field 6, attempt (VARINT)
            out := out || '\x30'::bytea || workflow_run_event_varint(attempt);
        END IF;
    END LOOP;
    -- field 9, detail: Struct{fields: {"status": Value{string_value}}}
    part := convert_to(coalesce(status_after, ''), 'UTF8');
    part := '\x1a'::bytea || workflow_run_event_varint(length(part)) || part;
    part := '\x0a06737461747573'::bytea || '\x12'::bytea
            || workflow_run_event_varint(length(part)) || part;
    part := '\x0a'::bytea || workflow_run_event_varint(length(part)) || part;
    out := out || '\x4a'::bytea || workflow_run_event_varint(length(part)) || part;
    -- field 10, occurred_at: Timestamp{seconds, nanos}
    part := '\x'::bytea;
    IF created_at IS NOT NULL THEN
        epoch := extract(epoch FROM created_at);
        seconds := floor(epoch)::bigint;
        nanos := ((epoch - seconds) * 1000000000)::integer;
        IF seconds <> 0 THEN
            part := part || '\x08'::bytea || workflow_run_event_varint(seconds);
        END IF;
        IF nanos <> 0 THEN
            part := part || '\x10'::bytea || workflow_run_event_varint(nanos);
        END IF;
    END IF;
    RETURN out || '\x52'::bytea || workflow_run_event_varint(length(part)) || part;
END
$payload$;
