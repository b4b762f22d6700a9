-- 0029: the transition log's row trigger, cheaper per write; the chain it writes is unchanged
-- (issue 33; docs/benchmarks.md "PostgreSQL per job, continued").
--
-- Every store write is its own transaction (or a group commit's few), and PL/pgSQL prepares
-- each expression of a function again at its first use in a transaction
-- (ExecInitExprWithParams), so on the hot path every expression the trigger evaluates costs
-- its set-up once per write. Measured with perf on single-statement UPDATEs: the trigger is
-- about a fifth of the backend's CPU, of which the expressions' set-up is a tenth and
-- jsonb_build_array (inside the hash) another tenth.
--
--   * workflow_run_record_transition(): the same decisions in fewer expressions on the
--     common path (a boundary write with its change named and no control request pending):
--     10 instead of 16. The change_* columns carry the kind, actor, reason and step into the
--     hash and the history row instead of four local variables (they are cleared before the
--     row is stored, as before); now() is read where it is used instead of in a DECLARE
--     default evaluated on every call, heartbeats included; the control branches (yield,
--     cancel, pause, 0024) run only when a request is pending and are otherwise the same
--     statements as 0024's.
--   * workflow_run_transition_hash(): json_build_array instead of jsonb_build_array. For
--     these argument types (text, bigint, integer, NULL) both produce the same text (one
--     escape_json for strings, the integer's own digits, ", " between elements), so every
--     hash is byte for byte the one 0002 defined, and chains written before this migration
--     still verify (tests/integration/test_transition_log.py); json_build_array skips
--     building a jsonb value only to print it.
--
-- Append-only: never edit this file once merged.

CREATE OR REPLACE FUNCTION workflow_run_transition_hash(
    prev BYTEA, job_id UUID, seq BIGINT, prev_status TEXT, new_status TEXT, kind TEXT,
    actor TEXT, reason TEXT, attempt INTEGER, step TEXT, at TIMESTAMPTZ
) RETURNS BYTEA
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT sha256(coalesce(prev, '\x'::bytea) || convert_to(
        json_build_array(job_id::text, seq, prev_status, new_status, kind, actor, reason,
                         attempt, step, (extract(epoch FROM at) * 1000000)::bigint)::text,
        'UTF8'))
$$;

CREATE OR REPLACE FUNCTION workflow_run_record_transition() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    request JSONB;
    at      TIMESTAMPTZ;
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.change_kind := NULL;
        NEW.change_actor := coalesce(NEW.change_actor, 'sql:' || current_user);
        NEW.history_seq := 1;
        NEW.history_head := workflow_run_transition_hash(
            NULL, NEW.job_id, 1, NULL, NEW.status, 'submit', NEW.change_actor,
            NEW.change_reason, NEW.attempt, NEW.change_step, now());
        RETURN NEW;  -- the AFTER INSERT trigger writes the row, then the columns are cleared
    END IF;
    IF OLD.control IS NOT NULL THEN
        -- A pending control request (0002, 0024), unchanged.
        at := now();
        request := OLD.control;
        IF request->>'kind' = 'yield' THEN
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
                NEW.paused_from := CASE WHEN NEW.status = 'WAITING' THEN 'WAITING'
                                        ELSE 'QUEUED' END;
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
    END IF;
    IF NEW.change_kind IS NULL THEN
        IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
            RETURN NEW;  -- no change to record (a heartbeat)
        END IF;
        -- An UPDATE that names no change (hand-written SQL): kind 'sql', no reason, no step.
        NEW.change_kind := 'sql';
        NEW.change_actor := 'sql:' || current_user;
        NEW.change_reason := NULL;
        NEW.change_step := NULL;
    ELSIF NEW.change_actor IS NULL THEN
        NEW.change_actor := 'sql:' || current_user;
    END IF;
    NEW.history_seq := OLD.history_seq + 1;
    NEW.history_head := workflow_run_transition_hash(
        OLD.history_head, NEW.job_id, NEW.history_seq, OLD.status, NEW.status,
        NEW.change_kind, NEW.change_actor, NEW.change_reason, NEW.attempt, NEW.change_step,
        now());
    INSERT INTO workflow_run_transition
        (job_id, seq, prev_status, new_status, kind, actor, reason, attempt, step, at, hash)
    VALUES (NEW.job_id, NEW.history_seq, OLD.status, NEW.status, NEW.change_kind,
            NEW.change_actor, NEW.change_reason, NEW.attempt, NEW.change_step, now(),
            NEW.history_head);
    NEW.change_kind := NULL;
    NEW.change_actor := NULL;
    NEW.change_reason := NULL;
    NEW.change_step := NULL;
    RETURN NEW;
END
$$;
