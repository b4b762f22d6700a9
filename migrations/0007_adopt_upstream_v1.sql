-- 0007: adopt a database created by upstream's Flyway migration V1__workflow_runs.sql.
--
-- Upstream's V1 makes workflow_run and workflow_run_events_outbox with the columns our 0001
-- starts from, without our additions. On such a database migrate() applies this file first,
-- records 0001 as adopted, then the files after 0001 as usual; Java workers keep working on
-- the same tables (Flyway's own history is left alone). On a database our 0001 made (it has
-- workflow_run.lease_token) this file changes nothing.
--
-- What it adds, so the schema is exactly what 0001 makes:
--   * workflow_run.lease_token and our list, claim and sweep indexes;
--   * outbox seq (existing rows numbered in created_at, event_id order), the created_at
--     default, claimed_until, the PENDING indexes; workflow_run_rejects.
-- And, on adopted databases only, the foreign-writer fence: a BEFORE UPDATE trigger that
-- leaves sessions of our store (protomolt_jobs.session set) to their own fence and, for any
-- other writer (a Java worker, whose writes name only job_id):
--   * skips (zero rows) a write to a RUNNING row one of our workers holds (lease_token set),
--     except a sweep of it back to QUEUED once its lease expired;
--   * skips a write that settles or checkpoints a QUEUED row (a stale worker whose lease was
--     swept), and any write to a COMPLETED, FAILED or DEAD row;
--   * clears lease_token on everything else it writes, so a Java claim carries no token and a
--     token never outlives the lease it belonged to.
-- Append-only: never edit this file once merged.

DO $adopt$
BEGIN
    IF EXISTS (SELECT 1
                 FROM information_schema.columns
                WHERE table_schema = current_schema()
                  AND table_name = 'workflow_run'
                  AND column_name = 'lease_token') THEN
        RETURN;
    END IF;

    ALTER TABLE workflow_run ADD COLUMN lease_token UUID;
    CREATE INDEX idx_workflow_run_created ON workflow_run (created_at DESC, job_id DESC);
    CREATE INDEX idx_workflow_run_name_created
        ON workflow_run (workflow_name, created_at DESC, job_id DESC);
    CREATE INDEX idx_workflow_run_claim
        ON workflow_run (created_at, job_id) WHERE status = 'QUEUED';
    CREATE INDEX idx_workflow_run_sweep
        ON workflow_run (lease_until) WHERE status = 'RUNNING';

    ALTER TABLE workflow_run_events_outbox ADD COLUMN seq BIGINT;
    CREATE SEQUENCE workflow_run_events_outbox_seq_seq
        OWNED BY workflow_run_events_outbox.seq;
    UPDATE workflow_run_events_outbox AS o
       SET seq = n.rn
      FROM (SELECT event_id, row_number() OVER (ORDER BY created_at, event_id) AS rn
              FROM workflow_run_events_outbox) AS n
     WHERE o.event_id = n.event_id;
    PERFORM setval('workflow_run_events_outbox_seq_seq',
                   coalesce((SELECT max(seq) FROM workflow_run_events_outbox), 0) + 1,
                   false);
    ALTER TABLE workflow_run_events_outbox
        ALTER COLUMN seq SET DEFAULT nextval('workflow_run_events_outbox_seq_seq'),
        ALTER COLUMN seq SET NOT NULL,
        ALTER COLUMN created_at SET DEFAULT now(),
        ADD COLUMN claimed_until TIMESTAMPTZ,
        ADD CONSTRAINT uq_workflow_run_events_outbox_seq UNIQUE (seq);
    CREATE INDEX idx_workflow_run_events_outbox_pending
        ON workflow_run_events_outbox (seq) WHERE status = 'PENDING';
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

    CREATE FUNCTION protomolt_jobs_foreign_fence() RETURNS trigger
    LANGUAGE plpgsql AS $fence$
    BEGIN
        IF current_setting('protomolt_jobs.session', true) IS NOT NULL THEN
            RETURN NEW;
        END IF;
        IF OLD.status IN ('COMPLETED', 'FAILED', 'DEAD') THEN
            RETURN NULL;
        END IF;
        IF OLD.status = 'RUNNING' AND OLD.lease_token IS NOT NULL THEN
            IF NEW.status = 'QUEUED' AND NEW.lease_owner IS NULL
               AND OLD.lease_until < now() THEN
                NEW.lease_token := NULL;
                RETURN NEW;
            END IF;
            RETURN NULL;
        END IF;
        IF OLD.status = 'QUEUED' AND NEW.status <> 'RUNNING'
           AND (NEW.status <> OLD.status OR NEW.checkpoints IS DISTINCT FROM OLD.checkpoints) THEN
            RETURN NULL;
        END IF;
        NEW.lease_token := NULL;
        RETURN NEW;
    END
    $fence$;

    CREATE TRIGGER trg_workflow_run_foreign_fence
        BEFORE UPDATE ON workflow_run
        FOR EACH ROW EXECUTE FUNCTION protomolt_jobs_foreign_fence();
END
$adopt$;
