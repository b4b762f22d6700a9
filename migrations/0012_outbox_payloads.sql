-- 0012: every outbox row carries its payload, for a shared outbox (issue #32, item 1).
--
-- Since 0005 the one-statement fenced writes and the submit insert their events as columns
-- with a NULL payload, and our relay encodes the WorkflowRunEvent when it reads the row
-- (store/events.py column_payload). A Java ProtoMolt relay polling the same outbox calls
-- WorkflowRunEvent.parseFrom(payload) on such a row, throws, and after 10 polls marks it
-- FAILED. jobs.outbox_payloads = "always" (docs/interop.md) closes that gap: store sessions of
-- such a node carry protomolt_jobs.outbox_payloads = always (a connection-start parameter, no
-- statement), and the trigger below fills the payload of each column row they insert, in the
-- inserting statement itself, from the row's own columns:
--
--   * workflow_run_event_varint(n): a protobuf varint (a negative int32/int64 is sign
--     extended to ten bytes, as protobuf does);
--   * workflow_run_event_payload(...): the WorkflowRunEvent bytes column_payload makes, byte
--     for byte (tests/integration/test_outbox_payloads.py proves it over every event type):
--     fields in number order, proto3 defaults omitted, text truncated to the contract's
--     max_len in code points (workflow_name and step 200, verdict 500, error 4000),
--     detail = the Struct {"status": status_after}, occurred_at = created_at (seconds
--     floored, nanos = the microseconds x 1000);
--   * a BEFORE INSERT row trigger whose WHEN clause (payload IS NULL and the session says
--     always) keeps it off every other insert: a default-mode node's rows, rows that come
--     with their payload, and a Java writer's rows never run the function.
-- Existing rows are untouched. Append-only: never edit this file once merged.

CREATE FUNCTION workflow_run_event_varint(n BIGINT) RETURNS BYTEA
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $varint$
DECLARE
    out BYTEA := '\x'::bytea;
    v   BIGINT := n;
BEGIN
    IF v < 0 THEN  -- two's complement over 64 bits: nine 7-bit groups, then the top bit
        FOR i IN 0..8 LOOP
            out := out || set_byte('\x00'::bytea, 0, (((v >> (7 * i)) & 127) | 128)::int);
        END LOOP;
        RETURN out || '\x01'::bytea;
    END IF;
    WHILE v >= 128 LOOP
        out := out || set_byte('\x00'::bytea, 0, ((v & 127) | 128)::int);
        v := v >> 7;
    END LOOP;
    RETURN out || set_byte('\x00'::bytea, 0, v::int);
END
$varint$;

CREATE FUNCTION workflow_run_event_payload(
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
        WHEN 'APPROVAL_ESCALATED' THEN 14 ELSE 0 END;
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

CREATE FUNCTION workflow_run_events_outbox_fill_payload() RETURNS trigger
LANGUAGE plpgsql AS $fill$
BEGIN
    NEW.payload := workflow_run_event_payload(
        NEW.event_id, NEW.event_type, NEW.kafka_key, NEW.created_at, NEW.workflow_name,
        NEW.attempt, NEW.status_after, NEW.step, NEW.verdict, NEW.error);
    RETURN NEW;
END
$fill$;

CREATE TRIGGER trg_workflow_run_events_outbox_payload
    BEFORE INSERT ON workflow_run_events_outbox
    FOR EACH ROW
    WHEN (NEW.payload IS NULL
          AND current_setting('protomolt_jobs.outbox_payloads', true) = 'always')
    EXECUTE FUNCTION workflow_run_events_outbox_fill_payload();
