-- Every runtime query of protomolt-jobs, by name. Loaded once by queries.py.
-- Conventions: each block opens with "-- name: <noun_verb>" and one "-- description:" line;
-- parameters are %(name)s only; every time comparison and stored time is the database's now()
-- (the transaction's start time), never the caller's clock.
-- Fenced queries carry "status = 'RUNNING' AND job_id AND lease_owner AND attempt AND
-- lease_token": zero rows returned means the caller's lease is lost (the store raises LeaseLost
-- and rolls back). lease_token is a fresh gen_random_uuid() per claim, cleared with the lease:
-- attempt alone cannot fence, because job_release gives an attempt back (attempt - 1) and
-- job_complete_parked resets it to 0, so (job_id, owner, attempt) can be handed out again.
-- Job reads return the JSONB columns as ::text: the store decodes them in Python after the
-- transaction commits, so one undecodable row can never roll back a claim.

-- ---------------------------------------------------------------------------------------------
-- migrations
-- ---------------------------------------------------------------------------------------------

-- name: migrate_lock
-- description: session advisory lock serialising migration runners (blocks until granted).
SELECT pg_advisory_lock(%(key)s)

-- name: migrate_unlock
-- description: release the migration runners' advisory lock.
SELECT pg_advisory_unlock(%(key)s)

-- name: database_ping
-- description: one trivial round trip: the readiness probe of /health and gRPC health.
SELECT 1

-- name: migrate_history_create
-- description: the history of applied migration files (created under the lock, idempotent).
CREATE TABLE IF NOT EXISTS protomolt_jobs_schema_history (
    version    TEXT        PRIMARY KEY,
    name       TEXT        NOT NULL,
    checksum   TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)

-- name: migrate_history_list
-- description: every applied migration, oldest version first.
SELECT version, name, checksum, applied_at
  FROM protomolt_jobs_schema_history
 ORDER BY version

-- name: migrate_history_insert
-- description: record one applied migration file (same transaction as the file's SQL).
INSERT INTO protomolt_jobs_schema_history (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: migrate_existing_columns
-- description: the columns of workflow_run and the outbox as they stand (adopting upstream's V1).
SELECT table_name, column_name
  FROM information_schema.columns
 WHERE table_schema = current_schema()
   AND table_name IN ('workflow_run', 'workflow_run_events_outbox')

-- ---------------------------------------------------------------------------------------------
-- jobs: insert and reads
-- ---------------------------------------------------------------------------------------------

-- name: job_insert
-- description: insert a new job idempotently on job_id (and on a live dedup_key), stamping its fairness pass (a named key through its counter row; the default key without a lock, migration 0010), writing its ACCEPTED event (FAILED with the error for a job failed at birth) and NOTIFY protomolt_jobs (QUEUED only), all in one statement; no row back means it already existed (no event, no notify); the row comes back without workflow_definition and input (the caller sent them).
WITH base AS (
    -- Virtual time of the queue: the smallest pass still QUEUED (one index probe per
    -- priority), or in an empty queue the largest pass ever handed out there.
    SELECT coalesce(
               (SELECT min(head.fairness_pass)
                  FROM (VALUES (1), (2), (3), (4), (5)) AS pr (priority)
                 CROSS JOIN LATERAL (SELECT w.fairness_pass
                                       FROM workflow_run AS w
                                      WHERE w.status = 'QUEUED' AND w.queue = %(queue)s
                                        AND w.priority = pr.priority
                                      ORDER BY w.fairness_pass
                                      LIMIT 1) AS head),
               (SELECT max(f.last_pass) FROM workflow_fairness AS f
                 WHERE f.queue = %(queue)s),
               0) AS pass
), counted AS (
    -- A named key: pass = max(base, last_pass[key]) + 1/weight; the key's row lock orders its
    -- submits (exact interleaving; concurrent submits of that one key wait for each other).
    INSERT INTO workflow_fairness AS f (queue, fairness_key, last_pass)
    SELECT %(queue)s, %(fairness_key)s, base.pass + %(stride)s FROM base
     WHERE %(fairness_key)s::text <> 'default'
    ON CONFLICT (queue, fairness_key) DO UPDATE
       SET last_pass = greatest((SELECT pass FROM base) + %(stride)s,
                                f.last_pass + %(stride)s)
    RETURNING f.last_pass
), stamp AS (
    -- The default key (every run without fairnessKey) takes no lock: pass = max(base, its
    -- largest pass still QUEUED) + 1/weight, read from idx_workflow_run_fairness_tail.
    -- Concurrent default submits that cannot see each other's rows may share a pass
    -- (created_at then orders them), so they never wait for one another.
    SELECT coalesce(
               (SELECT last_pass FROM counted),
               greatest((SELECT pass FROM base),
                        coalesce((SELECT t.fairness_pass
                                    FROM workflow_run AS t
                                   WHERE t.status = 'QUEUED' AND t.queue = %(queue)s
                                     AND t.fairness_key = 'default'
                                   ORDER BY t.fairness_pass DESC
                                   LIMIT 1), 0)) + %(stride)s
           ) AS last_pass
), inserted AS (
INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,
                          max_attempts, error, completed_at, priority, queue, fairness_key,
                          fairness_pass, dedup_key, deadline_at, trace_context, change_actor,
                          change_reason, submitted_by, submitted_groups, retention)
SELECT %(job_id)s, %(workflow_name)s, %(workflow_definition)s, %(input)s, %(status)s,
       %(max_attempts)s, %(error)s,
       CASE WHEN %(status)s::text IN ('COMPLETED', 'FAILED', 'DEAD') THEN now() END,
       %(priority)s, %(queue)s, %(fairness_key)s, stamp.last_pass, %(dedup_key)s,
       now() + make_interval(secs => %(deadline_s)s), %(trace_context)s,
       %(actor)s, %(error)s, %(actor)s, %(groups)s::text[], %(retention)s
  FROM stamp
ON CONFLICT DO NOTHING
RETURNING job_id, workflow_name, status, attempt, max_attempts, run_after, outstanding_step,
          checkpoints::text AS checkpoints, result::text AS result, verdict, error,
          lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
          priority, queue, fairness_key, dedup_key, deadline_at
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(), CASE WHEN i.status = 'QUEUED' THEN 'ACCEPTED' ELSE i.status END,
           i.job_id::text, now(), i.workflow_name, i.attempt, i.status, NULL, NULL,
           CASE WHEN i.status <> 'QUEUED' THEN i.error END
      FROM inserted AS i
    RETURNING 1
)
SELECT inserted.*, now() AS tx_now, (SELECT count(*) FROM events) AS events,
       CASE WHEN status = 'QUEUED'
            THEN (SELECT 1 FROM pg_notify('protomolt_jobs', '')) END AS notified
  FROM inserted

-- name: job_get_live_dedup
-- description: the live (non-terminal) run holding a dedup key, if any.
SELECT job_id, workflow_name, workflow_definition::text AS workflow_definition,
       input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
       checkpoints::text AS checkpoints, result::text AS result, verdict, error,
       lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
       priority, queue, fairness_key, dedup_key, deadline_at
  FROM workflow_run
 WHERE dedup_key = %(dedup_key)s
   AND status IN ('QUEUED', 'RUNNING', 'WAITING', 'PAUSED', 'RECOVERY_REQUIRED')

-- name: job_get
-- description: one job's full row by job_id.
SELECT job_id, workflow_name, workflow_definition::text AS workflow_definition,
       input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
       checkpoints::text AS checkpoints, result::text AS result, verdict, error,
       lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
       priority, queue, fairness_key, dedup_key, deadline_at,
       control::text AS control, paused_from, history_seq,
       effect_intents::text AS effect_intents, step_generations::text AS step_generations,
       wait_kind, submitted_by, wait_timers::text AS wait_timers,
       cancel_request::text AS cancel_request, submitted_groups
  FROM workflow_run
 WHERE job_id = %(job_id)s

-- name: job_list
-- description: jobs newest first, optionally filtered by status, workflow name, queue, fairness key and an id range (an id prefix padded with 0s and fs: the primary key's order is the hex order) (NULL = any).
SELECT job_id, workflow_name, workflow_definition::text AS workflow_definition,
       input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
       checkpoints::text AS checkpoints, result::text AS result, verdict, error,
       lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
       priority, queue, fairness_key, dedup_key, deadline_at, wait_kind
  FROM workflow_run
 WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(fairness_key)s::text IS NULL OR fairness_key = %(fairness_key)s::text)
   AND (%(id_low)s::uuid IS NULL OR job_id BETWEEN %(id_low)s::uuid AND %(id_high)s::uuid)
 ORDER BY created_at DESC, job_id DESC
 LIMIT %(limit)s OFFSET %(offset)s

-- name: job_replay_runs
-- description: a workflow's runs in the given statuses, newest first, at most %(limit)s (replay-check; read only): the live ones are few, so the status index finds them; finished ones come by idx_workflow_run_name_created.
SELECT job_id, workflow_name, workflow_definition::text AS workflow_definition,
       input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
       checkpoints::text AS checkpoints, result::text AS result, verdict, error,
       lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
       priority, queue, fairness_key, dedup_key, deadline_at, wait_kind
  FROM workflow_run
 WHERE workflow_name = %(workflow_name)s
   AND status = ANY(%(statuses)s::text[])
 ORDER BY created_at DESC, job_id DESC
 LIMIT %(limit)s

-- name: job_lock
-- description: one job's full row under FOR UPDATE (the gate of parked completions).
SELECT job_id, workflow_name, workflow_definition::text AS workflow_definition,
       input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
       checkpoints::text AS checkpoints, result::text AS result, verdict, error,
       lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
       priority, queue, fairness_key, dedup_key, deadline_at,
       control::text AS control, paused_from, history_seq,
       effect_intents::text AS effect_intents, step_generations::text AS step_generations,
       wait_kind, wait_seq, submitted_by, wait_timers::text AS wait_timers
  FROM workflow_run
 WHERE job_id = %(job_id)s
   FOR UPDATE

-- name: job_notify
-- description: wake idle claim loops (LISTEN protomolt_jobs); delivered only if the transaction commits.
SELECT pg_notify('protomolt_jobs', '')

-- ---------------------------------------------------------------------------------------------
-- jobs: the claim and the fenced writes of the lease holder
-- ---------------------------------------------------------------------------------------------

-- name: job_claim
-- description: lease the first eligible QUEUED job of the served queues in one statement (SKIP LOCKED): strict priority, then fairness pass, then age; attempt + 1, a fresh lease_token.
UPDATE workflow_run
   SET status = 'RUNNING',
       lease_owner = %(worker_id)s,
       lease_token = gen_random_uuid(),
       lease_until = now() + make_interval(secs => %(lease_s)s),
       attempt = attempt + 1,
       updated_at = now(),
       change_kind = 'claim',
       change_actor = 'worker:' || %(worker_id)s
 WHERE job_id = (SELECT head.job_id
                   FROM unnest(%(queues)s::text[]) AS served (queue)
                  CROSS JOIN LATERAL (SELECT w.job_id, w.priority, w.fairness_pass,
                                             w.created_at
                                        FROM workflow_run AS w
                                       WHERE w.status = 'QUEUED' AND w.queue = served.queue
                                         AND w.run_after <= now()
                                         AND NOT EXISTS (
                                               -- A queue limited since this worker last
                                               -- read the limits: never claimed past them
                                               -- (job_claim_limited is the way in).
                                               SELECT 1 FROM workflow_queue AS l
                                                WHERE l.queue = served.queue
                                                  AND (l.max_running IS NOT NULL
                                                       OR l.max_starts_per_second IS NOT NULL))
                                       ORDER BY w.priority, w.fairness_pass, w.created_at,
                                                w.job_id
                                         FOR UPDATE SKIP LOCKED
                                       LIMIT 1) AS head
                  ORDER BY head.priority, head.fairness_pass, head.created_at, head.job_id
                  LIMIT 1)
   AND status = 'QUEUED'
RETURNING job_id, workflow_name, workflow_definition::text AS workflow_definition,
          input::text AS input, status, attempt, max_attempts, run_after, outstanding_step,
          checkpoints::text AS checkpoints, result::text AS result, verdict, error,
          lease_owner, lease_token, lease_until, created_at, updated_at, completed_at,
          priority, queue, fairness_key, dedup_key, deadline_at, trace_context,
          effect_intents::text AS effect_intents, step_generations::text AS step_generations,
          submitted_by

-- name: job_claim_limited
-- description: job_claim when some served queues have fleet-wide limits: a limited queue is tried only when workflow_queue_permit() (which locks its limits row, serialising its claimers) allows a start, and a start moves its rate limiter on, all in one statement.
WITH head AS (
    SELECT h.job_id, h.queue
      FROM unnest(%(queues)s::text[]) AS served (queue)
     CROSS JOIN LATERAL (SELECT w.job_id, w.queue, w.priority, w.fairness_pass, w.created_at
                           FROM workflow_run AS w
                          WHERE w.status = 'QUEUED' AND w.queue = served.queue
                            AND w.run_after <= now()
                            AND CASE WHEN NOT served.queue = ANY (%(limited)s::text[])
                                     -- Limited since this worker last read the limits:
                                     -- passed over until it knows (never past the cap).
                                     THEN NOT EXISTS (
                                              SELECT 1 FROM workflow_queue AS l
                                               WHERE l.queue = served.queue
                                                 AND (l.max_running IS NOT NULL
                                                      OR l.max_starts_per_second IS NOT NULL))
                                     -- Serving other queues too: a limited queue whose row
                                     -- another claimer holds is passed over this time, so
                                     -- its claimers never queue up behind one another while
                                     -- other queues have work (the permit re-locks the row
                                     -- we hold at once).
                                     WHEN %(skip_busy)s
                                          AND NOT EXISTS (SELECT 1 FROM workflow_queue AS l
                                                           WHERE l.queue = served.queue
                                                             FOR UPDATE SKIP LOCKED)
                                     THEN FALSE
                                     ELSE workflow_queue_permit(served.queue) END
                          ORDER BY w.priority, w.fairness_pass, w.created_at, w.job_id
                            FOR UPDATE SKIP LOCKED
                          LIMIT 1) AS h
     ORDER BY h.priority, h.fairness_pass, h.created_at, h.job_id
     LIMIT 1
), claimed AS (
    UPDATE workflow_run AS w
       SET status = 'RUNNING',
           lease_owner = %(worker_id)s,
           lease_token = gen_random_uuid(),
           lease_until = now() + make_interval(secs => %(lease_s)s),
           attempt = w.attempt + 1,
           updated_at = now(),
           change_kind = 'claim',
           change_actor = 'worker:' || %(worker_id)s
      FROM head
     WHERE w.job_id = head.job_id
       AND w.status = 'QUEUED'
    RETURNING w.job_id, w.workflow_name, w.workflow_definition::text AS workflow_definition,
              w.input::text AS input, w.status, w.attempt, w.max_attempts, w.run_after,
              w.outstanding_step, w.checkpoints::text AS checkpoints, w.result::text AS result,
              w.verdict, w.error, w.lease_owner, w.lease_token, w.lease_until, w.created_at,
              w.updated_at, w.completed_at, w.priority, w.queue, w.fairness_key, w.dedup_key,
              w.deadline_at, w.effect_intents::text AS effect_intents,
              w.step_generations::text AS step_generations, w.submitted_by
), started AS (
    UPDATE workflow_queue AS q
       SET next_start_at = greatest(q.next_start_at, now())
                           + make_interval(secs => 1.0 / q.max_starts_per_second)
      FROM claimed
     WHERE q.queue = claimed.queue
       AND claimed.queue = ANY (%(limited)s::text[])
       AND q.max_starts_per_second IS NOT NULL
)
SELECT * FROM claimed

-- name: queue_limits_upsert
-- description: record one queue's fleet-wide limits (a worker's configuration at start; NULL = unlimited); the rate limiter's state is kept.
INSERT INTO workflow_queue AS q (queue, max_running, max_starts_per_second, updated_at)
VALUES (%(queue)s, %(max_running)s, %(max_starts_per_second)s, now())
ON CONFLICT (queue) DO UPDATE
   SET max_running = excluded.max_running,
       max_starts_per_second = excluded.max_starts_per_second,
       updated_at = now()

-- name: queue_limits_list
-- description: every queue with a fleet-wide limit (the claimers of these go through workflow_queue_permit).
SELECT queue, max_running, max_starts_per_second
  FROM workflow_queue
 WHERE max_running IS NOT NULL OR max_starts_per_second IS NOT NULL
 ORDER BY queue

-- name: job_heartbeat
-- description: fenced (status, lease_owner, attempt, lease_token): extend lease_until to now() + lease_s.
UPDATE workflow_run
   SET lease_until = now() + make_interval(secs => %(lease_s)s),
       updated_at = now()
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
   AND lease_owner = %(owner)s AND attempt = %(attempt)s
   AND lease_token = %(token)s
RETURNING lease_until, control::text AS control

-- name: job_controls
-- description: read-only: the pending operator requests (control) of the given jobs; the heartbeat's cancel poll of jobs with an interruptible call in flight (one statement per poll, never per job).
SELECT job_id, control::text AS control
  FROM workflow_run
 WHERE job_id = ANY(%(job_ids)s) AND control IS NOT NULL

-- fragment: checkpoint_append
-- description: job_checkpoint's CTEs, open at the end: "moved" (the fenced append of %(entry)s, recorded as checkpoint by worker:<owner>) and "events" (its STEP_CHECKPOINT event, then the CANCELLED/PAUSED event when the trigger applied a pending request); the statement closes "events" with ")" or goes on with artifact_rows.
WITH moved AS (
    UPDATE workflow_run
       SET checkpoints = checkpoints || jsonb_build_array(workflow_checkpoint_stamp(%(entry)s::jsonb)),
           updated_at = now(),
           change_kind = 'checkpoint',
           change_actor = 'worker:' || %(owner)s,
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(), e.event_type, m.job_id::text,
           now() + (e.ord - 1) * interval '1 microsecond', m.workflow_name, m.attempt,
           e.status_after, %(step)s, NULL, e.error
      FROM moved AS m
     CROSS JOIN LATERAL (VALUES
           (1, 'STEP_CHECKPOINT', 'RUNNING', NULL),
           (2, CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status END, m.status,
            CASE WHEN m.status = 'CANCELLED' THEN m.error END)
         ) AS e (ord, event_type, status_after, error)
     WHERE e.event_type IS NOT NULL
     ORDER BY e.ord
    RETURNING 1

-- name: job_checkpoint
-- description: fenced (status, lease_owner, attempt, lease_token): append one entry to checkpoints and write its STEP_CHECKPOINT event (detail.status RUNNING), then the CANCELLED/PAUSED event when the trigger applied a pending request; one statement. The second event's created_at (and so its occurred_at) is now() + 1 microsecond, so it sorts after the first by (created_at, event_id), the order a Java relay claims in.
-- include: checkpoint_append
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- fragment: artifact_rows
-- description: the last CTEs of a statement whose CTE "moved" holds the run's row as written (job_id): it opens with the ")" that closes the CTE before it; they upsert its artifact rows %(rows)s (a JSON array of store/artifact_rows.py's rows) into workflow_artifact, a promoted or retracted state never changed, and log each state change in workflow_artifact_transition by %(actor)s; "logged" holds one row per change.
), wanted AS (
    SELECT DISTINCT ON (1)
           (r->>'artifactId')::uuid AS artifact_id,
           m.job_id, r->>'step' AS step, (r->>'iteration')::int AS iteration,
           r->>'port' AS port, r->>'kind' AS kind, r->>'sha256' AS sha256,
           (r->>'sizeBytes')::bigint AS size_bytes, r->>'mediaType' AS media_type,
           r->>'uri' AS uri, r->>'state' AS state, r->>'reason' AS reason
      FROM moved AS m
     CROSS JOIN jsonb_array_elements(%(rows)s::jsonb) AS r
     ORDER BY 1, CASE r->>'state' WHEN 'promoted' THEN 0 WHEN 'verified' THEN 1 ELSE 2 END
), prior AS (
    SELECT a.artifact_id, a.state
      FROM workflow_artifact AS a
      JOIN wanted AS w ON w.artifact_id = a.artifact_id
), upserted AS (
    INSERT INTO workflow_artifact AS a
        (artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type,
         uri, state)
    SELECT artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type,
           uri, state
      FROM wanted
    ON CONFLICT (artifact_id) DO UPDATE
       SET state = EXCLUDED.state
     WHERE a.state NOT IN ('promoted', 'retracted') AND a.state <> EXCLUDED.state
    RETURNING a.artifact_id, a.state
), logged AS (
    INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)
    SELECT u.artifact_id, %(actor)s,
           COALESCE(p.state, CASE WHEN u.state <> 'draft' THEN 'draft' END), u.state, w.reason
      FROM upserted AS u
      JOIN wanted AS w ON w.artifact_id = u.artifact_id
      LEFT JOIN prior AS p ON p.artifact_id = u.artifact_id
    RETURNING 1
)

-- name: job_checkpoint_artifacts
-- description: job_checkpoint for an entry that asks for artifact rows (store/artifact_rows.py; migration 0027): the same fenced append and events, and in the same statement the rows %(rows)s (ports and a declared receipt as draft, validated artifacts verified, consumed ones promoted) upserted into workflow_artifact, a promoted or retracted state never changed by a worker, each change logged in workflow_artifact_transition with actor 'worker:<owner>'; nothing is written when the fence matches no row.
-- include: checkpoint_append
-- include: artifact_rows
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events,
       (SELECT count(*) FROM logged) AS artifact_changes
  FROM moved

-- name: job_park
-- description: fenced (status, lease_owner, attempt, lease_token): WAITING on outstanding_step, lease cleared, with its WAITING event (or the CANCELLED/PAUSED event of a pending request the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'WAITING',
           outstanding_step = %(step)s,
           wait_kind = NULL,
           wake_at = NULL,
           wait_timers = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           updated_at = now(),
           change_kind = 'park',
           change_actor = 'worker:' || %(owner)s,
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'WAITING' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, %(step)s, NULL,
           CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_complete
-- description: fenced (status, lease_owner, attempt, lease_token): COMPLETED with result, verdict and completed_at, error cleared (an earlier attempt's failure stays in the history), with its COMPLETED event (or the CANCELLED/PAUSED event of a pending request the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'COMPLETED',
           result = %(result)s,
           verdict = %(verdict)s,
           error = NULL,
           outstanding_step = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           completed_at = now(),
           updated_at = now(),
           change_kind = 'complete',
           change_actor = 'worker:' || %(owner)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'COMPLETED' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, NULL,
           CASE WHEN m.status = 'COMPLETED' THEN %(verdict)s END,
           CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_complete_with_checkpoint
-- description: fenced (status, lease_owner, attempt, lease_token): append the final step's checkpoint entry and COMPLETED, error cleared (as job_complete), with the STEP_CHECKPOINT (detail.status RUNNING) and COMPLETED events in that order (or CANCELLED/PAUSED for a pending request the trigger applied); one statement. The second event's created_at (and so its occurred_at) is now() + 1 microsecond, so it sorts after the first by (created_at, event_id), the order a Java relay claims in.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'COMPLETED',
           checkpoints = checkpoints || jsonb_build_array(workflow_checkpoint_stamp(%(entry)s::jsonb)),
           result = %(result)s,
           verdict = %(verdict)s,
           error = NULL,
           outstanding_step = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           completed_at = now(),
           updated_at = now(),
           change_kind = 'complete',
           change_actor = 'worker:' || %(owner)s,
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(), e.event_type, m.job_id::text,
           now() + (e.ord - 1) * interval '1 microsecond', m.workflow_name, m.attempt,
           e.status_after, e.step, e.verdict, e.error
      FROM moved AS m
     CROSS JOIN LATERAL (VALUES
           (1, 'STEP_CHECKPOINT', 'RUNNING', %(step)s, NULL, NULL),
           (2, CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'COMPLETED' END,
            m.status,
            CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN %(step)s END,
            CASE WHEN m.status = 'COMPLETED' THEN %(verdict)s END,
            CASE WHEN m.status = 'CANCELLED' THEN m.error END)
         ) AS e (ord, event_type, status_after, step, verdict, error)
     ORDER BY e.ord
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_fail
-- description: fenced (status, lease_owner, attempt, lease_token): FAILED with the verbatim error and completed_at, with its FAILED event (or CANCELLED for a pending cancel the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'FAILED',
           error = %(error)s,
           outstanding_step = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           completed_at = now(),
           updated_at = now(),
           change_kind = 'fail',
           change_actor = 'worker:' || %(owner)s,
           change_reason = %(error)s,
           change_step = nullif(%(step)s, '')
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'FAILED' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, %(step)s, NULL,
           CASE WHEN m.status = 'PAUSED' THEN NULL ELSE m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_retry
-- description: fenced (status, lease_owner, attempt, lease_token): back to QUEUED at now() + backoff_s, error kept, NOTIFY protomolt_jobs; no event (or the CANCELLED/PAUSED event of a pending request the trigger applied, and no NOTIFY); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'QUEUED',
           run_after = now() + make_interval(secs => %(backoff_s)s),
           error = %(error)s,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           updated_at = now(),
           change_kind = 'retry',
           change_actor = 'worker:' || %(owner)s,
           change_reason = 'backoff ' || %(backoff_s)s || ' s: ' || %(error)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error, run_after
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(), m.status, m.job_id::text, now(), m.workflow_name, m.attempt,
           m.status, NULL, NULL, CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
     WHERE m.status IN ('CANCELLED', 'PAUSED')
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, run_after, now() AS tx_now,
       (SELECT count(*) FROM events) AS events,
       CASE WHEN status = 'QUEUED'
            THEN (SELECT 1 FROM pg_notify('protomolt_jobs', '')) END AS notified
  FROM moved

-- name: job_dead
-- description: fenced (status, lease_owner, attempt, lease_token): DEAD (attempts exhausted) with the error, with its DEAD event (or CANCELLED for a pending cancel the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'DEAD',
           error = %(error)s,
           outstanding_step = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           completed_at = now(),
           updated_at = now(),
           change_kind = 'dead',
           change_actor = 'worker:' || %(owner)s,
           change_reason = %(error)s,
           change_step = nullif(%(step)s, '')
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'DEAD' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, %(step)s, NULL,
           CASE WHEN m.status = 'PAUSED' THEN NULL ELSE m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_release
-- description: fenced (status, lease_owner, attempt, lease_token): graceful stop, QUEUED now, the attempt given back (attempt - 1; the token, not the attempt, keeps the old lease dead), NOTIFY protomolt_jobs; no event (or the CANCELLED/PAUSED event of a pending request the trigger applied, and no NOTIFY); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'QUEUED',
           run_after = now(),
           attempt = attempt - 1,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           updated_at = now(),
           change_kind = 'release',
           change_actor = 'worker:' || %(owner)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(), m.status, m.job_id::text, now(), m.workflow_name, m.attempt,
           m.status, NULL, NULL, CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
     WHERE m.status IN ('CANCELLED', 'PAUSED')
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events,
       CASE WHEN status = 'QUEUED'
            THEN (SELECT 1 FROM pg_notify('protomolt_jobs', '')) END AS notified
  FROM moved

-- ---------------------------------------------------------------------------------------------
-- jobs: the sweeper and parked completions
-- ---------------------------------------------------------------------------------------------

-- name: job_sweep_expired
-- description: a batch of RUNNING jobs past lease_until: QUEUED, or when attempt >= max_attempts DEAD, unless an external step has an intent and no checkpoint (an effect nothing proves, issue #17): then RECOVERY_REQUIRED naming that step (outstanding_step), never a dead letter.
WITH expired AS (
  SELECT e.job_id,
         CASE WHEN jsonb_typeof(e.effect_intents) = 'object' THEN
           (SELECT k FROM jsonb_object_keys(e.effect_intents) AS k
             WHERE NOT EXISTS (SELECT 1
                                 FROM jsonb_array_elements(CASE WHEN jsonb_typeof(e.checkpoints) = 'array'
                                                                THEN e.checkpoints
                                                                ELSE '[]'::jsonb END) AS c
                                WHERE c->>'name' = k)
             ORDER BY k LIMIT 1)
         END AS unproven
    FROM workflow_run AS e
   WHERE e.status = 'RUNNING' AND e.lease_until < now()
   ORDER BY e.lease_until
   LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
)
UPDATE workflow_run AS w
   SET status = CASE WHEN w.attempt < w.max_attempts THEN 'QUEUED'
                     WHEN x.unproven IS NOT NULL THEN 'RECOVERY_REQUIRED'
                     ELSE 'DEAD' END,
       error = CASE
                 WHEN w.attempt < w.max_attempts THEN w.error
                 WHEN x.unproven IS NOT NULL THEN
                   'lease expired after attempt ' || w.attempt || ' of ' || w.max_attempts
                   || ' (worker ' || coalesce(w.lease_owner, '(unknown)')
                   || ' stopped heartbeating); no attempts left, and step ''' || x.unproven
                   || ''' has effect ''external'', an intent and no checkpoint: reconcile-step'
                   || ' must say whether it happened'
                 ELSE
                   'lease expired after attempt ' || w.attempt || ' of ' || w.max_attempts
                   || ' (worker ' || coalesce(w.lease_owner, '(unknown)')
                   || ' stopped heartbeating); no attempts left, the job is dead'
                   || coalesce('; previous error: ' || w.error, '')
               END,
       outstanding_step = CASE WHEN w.attempt >= w.max_attempts AND x.unproven IS NOT NULL
                               THEN x.unproven ELSE w.outstanding_step END,
       completed_at = CASE WHEN w.attempt >= w.max_attempts AND x.unproven IS NULL
                           THEN now() END,
       run_after = CASE WHEN w.attempt >= w.max_attempts THEN w.run_after ELSE now() END,
       lease_owner = NULL,
       lease_token = NULL,
       lease_until = NULL,
       updated_at = now(),
       change_kind = CASE WHEN w.attempt >= w.max_attempts AND x.unproven IS NOT NULL
                          THEN 'recovery-required' ELSE 'sweep' END,
       change_actor = 'sweeper',
       change_step = CASE WHEN w.attempt >= w.max_attempts AND x.unproven IS NOT NULL
                          THEN x.unproven END,
       change_reason = CASE
                         WHEN w.attempt >= w.max_attempts AND x.unproven IS NOT NULL THEN
                           'lease expired after attempt ' || w.attempt || ' of ' || w.max_attempts
                           || ' with no attempts left; step ''' || x.unproven
                           || ''' has an intent and no checkpoint'
                         WHEN w.attempt >= w.max_attempts THEN
                           'lease expired after attempt ' || w.attempt || ' of ' || w.max_attempts
                           || ' (worker ' || coalesce(w.lease_owner, '(unknown)')
                           || ' stopped heartbeating); no attempts left, the job is dead'
                           || coalesce('; previous error: ' || w.error, '')
                         ELSE 'lease of worker ' || coalesce(w.lease_owner, '(unknown)')
                              || ' expired'
                       END
  FROM expired AS x
 WHERE w.job_id = x.job_id
   AND w.status = 'RUNNING'
   AND w.lease_until < now()
RETURNING w.job_id, w.workflow_name, w.status, w.attempt, w.error, w.outstanding_step,
          now() AS tx_now

-- name: job_budget_expired
-- description: a batch of live runs past their budget deadline (deadline_at, stamped at insert from budget.deadline) whose budget.onExceeded is not pause end FAILED with a reason naming the budget, lease and parked step cleared (a worker still holding one loses it at its next fenced write).
UPDATE workflow_run AS w
   SET status = 'FAILED',
       error = 'BUDGET: budget.deadline '
               || coalesce(w.workflow_definition -> 'budget' ->> 'deadline', '')
               || ' exceeded: the run was due to end by ' || w.deadline_at::text
               || ' (status ' || w.status
               || coalesce(', parked on step ' || w.outstanding_step, '') || ')',
       outstanding_step = NULL,
       lease_owner = NULL,
       lease_token = NULL,
       lease_until = NULL,
       completed_at = now(),
       updated_at = now(),
       paused_from = NULL,
       change_kind = 'budget',
       change_actor = 'sweeper',
       change_reason = 'budget.deadline exceeded (due by ' || w.deadline_at::text || ')'
 WHERE w.job_id = ANY (ARRAY(SELECT e.job_id
                               FROM workflow_run AS e
                              WHERE e.deadline_at IS NOT NULL AND e.deadline_at < now()
                                AND e.status IN ('QUEUED', 'RUNNING', 'WAITING', 'PAUSED',
                                                 'RECOVERY_REQUIRED')
                                AND (e.workflow_definition -> 'budget' ->> 'onExceeded')
                                    IS DISTINCT FROM 'pause'
                              ORDER BY e.deadline_at
                              LIMIT %(limit)s
                              FOR UPDATE SKIP LOCKED))
   AND w.deadline_at < now()
   AND w.status IN ('QUEUED', 'RUNNING', 'WAITING', 'PAUSED', 'RECOVERY_REQUIRED')
RETURNING w.job_id, w.workflow_name, w.status, w.attempt, w.error, now() AS tx_now

-- name: job_budget_expired_pause
-- description: a batch of runs past their budget deadline whose budget.onExceeded is pause: QUEUED and WAITING -> PAUSED now (paused_from remembers which; a parked step stays outstanding_step), RUNNING without a pending request -> a pause request from the sweeper in control (applied at the worker's next boundary write, as an operator's pause); the reason names the budget. PAUSED rows and rows with a pending request are left alone.
UPDATE workflow_run AS w
   SET status = CASE WHEN w.status = 'RUNNING' THEN w.status ELSE 'PAUSED' END,
       paused_from = CASE WHEN w.status = 'RUNNING' THEN NULL ELSE w.status END,
       control = CASE WHEN w.status = 'RUNNING' THEN
                   jsonb_build_object('kind', 'pause', 'actor', 'sweeper',
                                      'reason', 'budget.deadline '
                                        || coalesce(w.workflow_definition -> 'budget' ->> 'deadline', '')
                                        || ' exceeded (due by ' || w.deadline_at::text || ')',
                                      'requestedAt', now())
                 END,
       error = CASE WHEN w.status = 'RUNNING' THEN w.error
                    ELSE 'BUDGET: budget.deadline '
                         || coalesce(w.workflow_definition -> 'budget' ->> 'deadline', '')
                         || ' exceeded: the run was due to end by ' || w.deadline_at::text
                         || ' (status ' || w.status
                         || coalesce(', parked on step ' || w.outstanding_step, '')
                         || '); paused (budget.onExceeded = pause)'
               END,
       updated_at = now(),
       change_kind = CASE WHEN w.status = 'RUNNING' THEN 'pause-request' ELSE 'budget' END,
       change_actor = 'sweeper',
       change_reason = 'budget.deadline '
                       || coalesce(w.workflow_definition -> 'budget' ->> 'deadline', '')
                       || ' exceeded (due by ' || w.deadline_at::text || ')'
 WHERE w.job_id = ANY (ARRAY(SELECT e.job_id
                               FROM workflow_run AS e
                              WHERE e.deadline_at IS NOT NULL AND e.deadline_at < now()
                                AND e.status IN ('QUEUED', 'RUNNING', 'WAITING')
                                AND e.control IS NULL
                                AND e.workflow_definition -> 'budget' ->> 'onExceeded' = 'pause'
                              ORDER BY e.deadline_at
                              LIMIT %(limit)s
                              FOR UPDATE SKIP LOCKED))
   AND w.deadline_at < now()
   AND w.status IN ('QUEUED', 'RUNNING', 'WAITING')
   AND w.control IS NULL
RETURNING w.job_id, w.workflow_name, w.status, w.attempt, w.error, w.outstanding_step,
          w.change_reason AS reason, now() AS tx_now

-- name: job_worker_pause
-- description: fenced (status, lease_owner, attempt, lease_token): the worker pauses its run, %(kind)s 'budget' (budget.maxCost spent with budget.onExceeded = pause) or 'loop' (a loop exhausted with onExhausted park): PAUSED (paused_from QUEUED), lease cleared, the error naming the budget or the loop; the transition log records that kind, actor worker:<id>; a pending cancel request still wins (the trigger).
UPDATE workflow_run
   SET status = 'PAUSED',
       paused_from = 'QUEUED',
       error = %(error)s,
       outstanding_step = NULL,
       lease_owner = NULL,
       lease_token = NULL,
       lease_until = NULL,
       updated_at = now(),
       change_kind = %(kind)s,
       change_actor = 'worker:' || %(owner)s,
       change_reason = %(error)s,
       change_step = nullif(%(step)s, '')
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
   AND lease_owner = %(owner)s AND attempt = %(attempt)s
   AND lease_token = %(token)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_budget_cost_pauses
-- description: how many times the run was paused by its budget.maxCost (each resume after one grants another maxCost; worker/budget.py).
SELECT count(*) AS pauses
  FROM workflow_run_transition
 WHERE job_id = %(job_id)s AND kind = 'budget' AND new_status = 'PAUSED'
   AND reason LIKE 'BUDGET: budget.maxCost%%'

-- fragment: parked_requeue
-- description: job_complete_parked's UPDATE without its RETURNING: append the parked step's entry %(entry)s and requeue (WAITING -> QUEUED at that outstanding step, attempt 0), recorded as complete-step by %(actor)s.
UPDATE workflow_run
   SET status = 'QUEUED',
       checkpoints = checkpoints || jsonb_build_array(workflow_checkpoint_stamp(%(entry)s::jsonb)),
       outstanding_step = NULL,
       attempt = 0,
       run_after = now(),
       updated_at = now(),
       change_kind = 'complete-step',
       change_actor = %(actor)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND outstanding_step = %(step)s

-- name: job_complete_parked
-- description: append the parked step's checkpoint and requeue (WAITING -> QUEUED, attempt reset to 0; the next claim's fresh lease_token keeps earlier leases dead).
-- include: parked_requeue
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_complete_parked_artifacts
-- description: job_complete_parked for an entry that asks for artifact rows (store/artifact_rows.py; migration 0027; a complete-step answer to a step declaring outputs, a receipt or validates): the same append and requeue, and in the same statement the rows %(rows)s upserted into workflow_artifact as job_checkpoint_artifacts does (a promoted or retracted state never changed), each change logged in workflow_artifact_transition with the caller as actor.
WITH moved AS (
-- include: parked_requeue
    RETURNING job_id, workflow_name, status, attempt, error
-- include: artifact_rows
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM logged) AS artifact_changes
  FROM moved

-- name: job_fail_parked
-- description: fail a parked job as a verdict (WAITING -> FAILED) with the error and completed_at.
UPDATE workflow_run
   SET status = 'FAILED',
       error = %(error)s,
       outstanding_step = NULL,
       completed_at = now(),
       updated_at = now(),
       change_kind = 'fail-step',
       change_actor = %(actor)s,
       change_reason = %(error)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND outstanding_step = %(step)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- ---------------------------------------------------------------------------------------------
-- jobs: operator control (the verbs); the trigger of migration 0002 records each change
-- ---------------------------------------------------------------------------------------------

-- name: job_control_cancel
-- description: cancel: QUEUED, WAITING, PAUSED -> CANCELLED now; RUNNING -> a cancel request in control (binding: the worker's next boundary write settles CANCELLED).
UPDATE workflow_run
   SET status = CASE WHEN status = 'RUNNING' THEN status ELSE 'CANCELLED' END,
       control = CASE WHEN status = 'RUNNING' THEN
                   jsonb_build_object('kind', 'cancel', 'actor', %(actor)s::text,
                                      'reason', %(reason)s::text, 'requestedAt', now())
                 END,
       error = CASE WHEN status = 'RUNNING' THEN error
                    ELSE 'CANCELLED by ' || %(actor)s::text || coalesce(': ' || %(reason)s::text, '')
               END,
       completed_at = CASE WHEN status = 'RUNNING' THEN completed_at ELSE now() END,
       outstanding_step = CASE WHEN status = 'RUNNING' THEN outstanding_step END,
       paused_from = NULL,
       updated_at = now(),
       change_kind = CASE WHEN status = 'RUNNING' THEN 'cancel-request' ELSE 'cancel' END,
       cancel_request = jsonb_build_object('actor', %(actor)s::text, 'reason', %(reason)s::text,
                                           'requestedAt', now(),
                                           'compensate', %(compensate)s::boolean),
       change_actor = %(actor)s,
       change_reason = %(reason)s
 WHERE job_id = %(job_id)s
   AND (status IN ('QUEUED', 'WAITING', 'PAUSED', 'RECOVERY_REQUIRED')
        OR (status = 'RUNNING' AND (control IS NULL OR control->>'kind' <> 'cancel')))
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_control_pause
-- description: pause: QUEUED, WAITING -> PAUSED now (paused_from remembers which); RUNNING without a pending request (or with only a preemption's yield request, which the operator's pause replaces) -> a pause request in control.
UPDATE workflow_run
   SET status = CASE WHEN status = 'RUNNING' THEN status ELSE 'PAUSED' END,
       paused_from = CASE WHEN status = 'RUNNING' THEN NULL ELSE status END,
       control = CASE WHEN status = 'RUNNING' THEN
                   jsonb_build_object('kind', 'pause', 'actor', %(actor)s::text,
                                      'reason', %(reason)s::text, 'requestedAt', now())
                 END,
       updated_at = now(),
       change_kind = CASE WHEN status = 'RUNNING' THEN 'pause-request' ELSE 'pause' END,
       change_actor = %(actor)s,
       change_reason = %(reason)s
 WHERE job_id = %(job_id)s
   AND (status IN ('QUEUED', 'WAITING')
        OR (status = 'RUNNING' AND (control IS NULL OR control->>'kind' = 'yield')))
RETURNING job_id, workflow_name, status, attempt, error, outstanding_step, now() AS tx_now

-- name: job_control_resume
-- description: resume: PAUSED -> WAITING (parked: same outstanding_step) or QUEUED with run_after = greatest(now(), at) and attempt 0.
UPDATE workflow_run
   SET status = coalesce(paused_from, 'QUEUED'),
       run_after = CASE WHEN coalesce(paused_from, 'QUEUED') = 'QUEUED'
                        THEN greatest(now(), coalesce(%(at)s::timestamptz, now()))
                        ELSE run_after END,
       attempt = CASE WHEN coalesce(paused_from, 'QUEUED') = 'QUEUED' THEN 0 ELSE attempt END,
       -- A deadline already past (the run was paused by it, budget.onExceeded = pause) gets a
       -- fresh window of budget.deadline from now; one still ahead is kept (it counts pauses).
       deadline_at = CASE WHEN deadline_at < now() THEN
                       now() + make_interval(secs => extract(epoch FROM upper(
                         workflow_definition -> 'budget' ->> 'deadline')::interval)::float8)
                     ELSE deadline_at END,
       paused_from = NULL,
       updated_at = now(),
       change_kind = 'resume',
       change_actor = %(actor)s,
       change_reason = %(reason)s
 WHERE job_id = %(job_id)s AND status = 'PAUSED'
RETURNING job_id, workflow_name, status, attempt, error, outstanding_step, run_after,
          run_after <= now() AS due, now() AS tx_now

-- name: job_control_withdraw_pause
-- description: resume of a RUNNING job with a pending pause request: the request is withdrawn (control cleared).
UPDATE workflow_run
   SET control = NULL,
       updated_at = now(),
       change_kind = 'pause-withdrawn',
       change_actor = %(actor)s,
       change_reason = %(reason)s
 WHERE job_id = %(job_id)s AND status = 'RUNNING' AND control->>'kind' = 'pause'
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_control_requeue
-- description: requeue: DEAD or FAILED -> QUEUED now, attempt 0, checkpoints kept (or replaced by %(checkpoints)s when given: a graph run drops its failed entries), error cleared (the history keeps it).
UPDATE workflow_run
   SET status = 'QUEUED',
       checkpoints = coalesce(%(checkpoints)s::jsonb, checkpoints),
       attempt = 0,
       run_after = now(),
       error = NULL,
       completed_at = NULL,
       outstanding_step = NULL,
       control = NULL,
       paused_from = NULL,
       updated_at = now(),
       change_kind = 'requeue',
       change_actor = %(actor)s,
       change_reason = %(reason)s
 WHERE job_id = %(job_id)s AND status IN ('DEAD', 'FAILED')
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_control_retry_step
-- description: retry-step: store the kept checkpoints (the caller drops the step's and, by its scope, its dependants') and the kept intents (the caller keeps every external step's intent whose effect nothing proves: it is not the retried step and has no checkpoint), the step's generation grown unless %(bump)s is false (an external step keeps its idempotency key), QUEUED now with attempt 0, result/verdict/error cleared; only if the row is still as read (status and history_seq).
UPDATE workflow_run
   SET status = 'QUEUED',
       checkpoints = %(checkpoints)s,
       attempt = 0,
       run_after = now(),
       result = NULL,
       verdict = NULL,
       error = NULL,
       completed_at = NULL,
       outstanding_step = NULL,
       control = NULL,
       paused_from = NULL,
       updated_at = now(),
       step_generations = CASE WHEN %(bump)s::boolean THEN
                            coalesce(step_generations, '{}'::jsonb)
                            || jsonb_build_object(%(step)s::text,
                                                  CASE WHEN jsonb_typeof(step_generations->%(step)s::text) = 'number'
                                                       THEN greatest(least((step_generations->>%(step)s::text)::numeric,
                                                                           2147483646), 0)::int
                                                       ELSE 0 END + 1)
                          ELSE step_generations END,
       effect_intents = %(intents)s::jsonb,
       change_kind = 'retry-step',
       change_actor = %(actor)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = %(status)s AND history_seq = %(history_seq)s
   AND status IN ('FAILED', 'DEAD', 'CANCELLED', 'PAUSED', 'COMPLETED')
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_stop
-- description: fenced (status, lease_owner, attempt, lease_token): a boundary write with no change of its own, so the trigger applies the pending control request (a job stopped before its step started).
UPDATE workflow_run
   SET updated_at = now(),
       change_kind = 'stop',
       change_actor = 'worker:' || %(owner)s
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
   AND lease_owner = %(owner)s AND attempt = %(attempt)s
   AND lease_token = %(token)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_history
-- description: the row's head (history_seq, history_head) and its transition log oldest first, in one snapshot; each row's hash checked against the previous stored row (hash_ok) and its place in the sequence (seq_ok). No row: unknown job; one row with seq NULL: no transitions. A time no reader can load (infinity, after year 9999: only a hand edit writes one) comes back NULL with hash_ok false.
WITH head AS (
    SELECT history_seq, history_head FROM workflow_run WHERE job_id = %(job_id)s
), log AS (
    SELECT t.seq, t.prev_status, t.new_status, t.kind, t.actor, t.reason, t.attempt, t.step,
           CASE WHEN readable.at THEN t.at END AS at, t.hash,
           CASE WHEN readable.at THEN
             t.hash = workflow_run_transition_hash(lag(t.hash) OVER w, t.job_id, t.seq,
                                                   t.prev_status, t.new_status, t.kind, t.actor,
                                                   t.reason, t.attempt, t.step, t.at)
           ELSE false END AS hash_ok,
           t.seq = row_number() OVER w AS seq_ok
      FROM workflow_run_transition AS t
     CROSS JOIN LATERAL (
         SELECT isfinite(t.at) AND t.at >= '0001-01-02 00:00:00+00'
                AND t.at < '9999-12-31 00:00:00+00' AS at
     ) AS readable
     WHERE t.job_id = %(job_id)s
    WINDOW w AS (ORDER BY t.seq)
)
SELECT head.history_seq, head.history_head, log.*
  FROM head LEFT JOIN log ON true
 ORDER BY log.seq

-- ---------------------------------------------------------------------------------------------
-- outbox
-- ---------------------------------------------------------------------------------------------

-- name: outbox_insert
-- description: one PENDING outbox row, created_at = the transaction's now() plus %(later)s microseconds (the job's events this transaction wrote before it; same tx as the job change).
INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key, created_at)
VALUES (%(event_id)s, %(event_type)s, %(payload)s, %(kafka_key)s,
        now() + %(later)s * interval '1 microsecond')

-- name: outbox_insert_notify
-- description: outbox_insert and pg_notify('protomolt_jobs') in one statement (an enqueue's event and wake-up; the notification is delivered only if the transaction commits).
WITH event AS (
    INSERT INTO workflow_run_events_outbox (event_id, event_type, payload, kafka_key, created_at)
    VALUES (%(event_id)s, %(event_type)s, %(payload)s, %(kafka_key)s,
            now() + %(later)s * interval '1 microsecond')
    RETURNING 1
)
SELECT pg_notify('protomolt_jobs', '') FROM event

-- name: outbox_claim
-- description: lease up to limit PENDING rows by seq, skipping locked, leased and later-per-key rows (each job's first PENDING row only): found among the first 8 x limit PENDING rows by seq; only when that prefix is full and yields nothing (its jobs' first rows leased or locked elsewhere, e.g. by a crashed relay) by a probe per row over every PENDING row.
WITH scanned AS (
    -- A prefix of the PENDING rows by seq holds every earlier row of each key it holds, so
    -- the first row per key here is that key's first PENDING row (no probe per row).
    SELECT p.ctid AS tid, p.kafka_key, p.seq
      FROM workflow_run_events_outbox AS p
     WHERE p.status = 'PENDING'
     ORDER BY p.seq
     LIMIT 8 * %(limit)s
), heads AS (
    SELECT DISTINCT ON (s.kafka_key) s.tid
      FROM scanned AS s
     ORDER BY s.kafka_key, s.seq
), prefix AS (
    -- Locked rows are skipped; a row changed since the scan is re-checked on its latest
    -- version (status, lease) before it is locked.
    SELECT o.ctid AS tid
      FROM workflow_run_events_outbox AS o
     WHERE o.ctid = ANY (ARRAY(SELECT h.tid FROM heads AS h))
       AND o.status = 'PENDING'
       AND (o.claimed_until IS NULL OR o.claimed_until < now())
     ORDER BY o.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), beyond AS (
    -- Only when the prefix is full and gave nothing: every job's first PENDING row past it,
    -- by a probe per row (a crashed relay's leases on the prefix's jobs must not stop the rest).
    SELECT o.ctid AS tid
      FROM workflow_run_events_outbox AS o
     WHERE NOT EXISTS (SELECT 1 FROM prefix)
       AND (SELECT count(*) FROM scanned) >= 8 * %(limit)s
       AND o.status = 'PENDING'
       AND (o.claimed_until IS NULL OR o.claimed_until < now())
       AND NOT EXISTS (SELECT 1
                         FROM workflow_run_events_outbox AS earlier
                        WHERE earlier.status = 'PENDING'
                          AND earlier.kafka_key = o.kafka_key
                          AND earlier.seq < o.seq)
     ORDER BY o.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), candidates AS (
    SELECT tid FROM prefix
    UNION ALL
    SELECT tid FROM beyond
)
UPDATE workflow_run_events_outbox AS o
   SET claimed_until = now() + make_interval(secs => %(claim_s)s)
 WHERE o.ctid = ANY (ARRAY(SELECT c.tid FROM candidates AS c))
   AND o.status = 'PENDING'
RETURNING o.event_id, o.seq, o.event_type, o.payload, o.kafka_key, o.attempts, o.status,
          o.created_at, o.published_at, o.last_error,
          o.workflow_name, o.attempt, o.status_after, o.step, o.verdict, o.error

-- name: outbox_mark_published
-- description: PENDING rows to PUBLISHED with published_at = now(); rows kept for ever.
UPDATE workflow_run_events_outbox
   SET status = 'PUBLISHED',
       published_at = now(),
       claimed_until = NULL
 WHERE event_id = ANY (%(event_ids)s::uuid[])
   AND status = 'PENDING'

-- name: outbox_mark_failed
-- description: one failed publish: attempts + 1, last_error, claim released; the 10th makes it FAILED.
UPDATE workflow_run_events_outbox
   SET attempts = attempts + 1,
       last_error = %(error)s,
       status = CASE WHEN attempts + 1 >= %(max_attempts)s THEN 'FAILED' ELSE 'PENDING' END,
       claimed_until = NULL
 WHERE event_id = %(event_id)s
   AND status = 'PENDING'
RETURNING event_id, seq, event_type, payload, kafka_key, attempts, status, created_at,
          published_at, last_error, workflow_name, attempt, status_after, step, verdict, error

-- name: outbox_for_job
-- description: every outbox row of one job (kafka_key), in seq order (reads, tests, operators).
SELECT event_id, seq, event_type, payload, kafka_key, attempts, status, created_at,
       published_at, last_error, workflow_name, attempt, status_after, step, verdict, error
  FROM workflow_run_events_outbox
 WHERE kafka_key = %(kafka_key)s
 ORDER BY seq

-- ---------------------------------------------------------------------------------------------
-- request-topic rejects
-- ---------------------------------------------------------------------------------------------

-- name: reject_insert
-- description: keep a request-topic record that could not be decoded or validated.
INSERT INTO workflow_run_rejects (topic, "partition", "offset", raw, reason)
VALUES (%(topic)s, %(partition)s, %(offset)s, %(raw)s, %(reason)s)
RETURNING id

-- ---------------------------------------------------------------------------------------------
-- metrics (the /metrics collector; cached by the caller for a few seconds)
-- ---------------------------------------------------------------------------------------------

-- name: metrics_run_counts
-- description: runs per status and queue, and the outbox rows still PENDING, in one read.
SELECT 'run' AS kind, status, queue, count(*) AS n
  FROM workflow_run
 GROUP BY status, queue
UNION ALL
SELECT 'outbox' AS kind, 'PENDING' AS status, NULL AS queue, count(*) AS n
  FROM workflow_run_events_outbox
 WHERE status = 'PENDING'

-- ---------------------------------------------------------------------------------------------
-- retention (the pruner): small batches, one short transaction each, never a live row
-- ---------------------------------------------------------------------------------------------

-- name: outbox_prune_published
-- description: delete up to %(limit)s PUBLISHED outbox rows published more than %(retention_s)s seconds ago (oldest first, SKIP LOCKED); never a PENDING or FAILED row, and only rows our store wrote (origin, migration 0013) unless %(foreign_rows)s.
WITH doomed AS (
    SELECT event_id
      FROM workflow_run_events_outbox
     WHERE status = 'PUBLISHED'
       AND published_at < now() - make_interval(secs => %(retention_s)s)
       AND (%(foreign_rows)s OR origin = 'protomolt-jobs')
     ORDER BY created_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM workflow_run_events_outbox AS o
 USING doomed AS d
 WHERE o.event_id = d.event_id
   AND o.status = 'PUBLISHED'

-- name: job_prune_terminal
-- description: delete up to %(limit)s terminal runs (COMPLETED, FAILED, DEAD) without a workflow retention (migration 0020; index idx_workflow_run_terminal_completed_node) completed more than %(retention_s)s seconds ago (oldest first, SKIP LOCKED); never a QUEUED, RUNNING or WAITING run, and only runs our store inserted (origin, migration 0013) unless %(foreign_rows)s.
WITH doomed AS (
    SELECT job_id
      FROM workflow_run
     WHERE status IN ('COMPLETED', 'FAILED', 'DEAD')
       AND retention IS NULL
       AND completed_at < now() - make_interval(secs => %(retention_s)s)
       AND (%(foreign_rows)s OR origin = 'protomolt-jobs')
     ORDER BY completed_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM workflow_run AS r
 USING doomed AS d
 WHERE r.job_id = d.job_id
   AND r.status IN ('COMPLETED', 'FAILED', 'DEAD')

-- name: artifact_bytes_doomed
-- description: up to %(limit)s artifact:// byte keys of deleted runs (workflow_artifact_bytes_doomed, migration 0027), oldest first, each with 'referenced': a kept artifact (workflow_artifact) or a run still stored (any status: a live run, or a finished one not yet pruned) names the same uri in a port of its entries; then its bytes stay.
SELECT d.uri,
       (EXISTS (SELECT 1 FROM workflow_artifact AS a WHERE a.uri = d.uri)
        OR EXISTS (SELECT 1
                     FROM workflow_run AS r
                    WHERE jsonb_path_exists(r.checkpoints,
                                            '$[*].artifacts[*] ? (@.uri == $u)',
                                            jsonb_build_object('u', d.uri)))) AS referenced
  FROM workflow_artifact_bytes_doomed AS d
 ORDER BY d.doomed_at, d.uri
 LIMIT %(limit)s

-- name: artifact_bytes_forget
-- description: drop the given byte keys from workflow_artifact_bytes_doomed (their bytes were deleted, were already missing, or are still referenced and stay).
DELETE FROM workflow_artifact_bytes_doomed
 WHERE uri = ANY(%(uris)s::text[])

-- name: artifact_kept
-- description: the workflow_artifact rows of a run (migration 0027: its ports, receipts and state changes; after the run's deletion, its promoted artifacts, detached), oldest first.
SELECT artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type, uri,
       state, detached, created_at
  FROM workflow_artifact
 WHERE job_id = %(job_id)s
 ORDER BY created_at, artifact_id

-- name: artifact_retract
-- description: retract one artifact (an operator's retract-artifact, migration 0027): its workflow_artifact row is upserted as 'retracted' (the row is made from the given fields when the artifact had none) and the change logged in workflow_artifact_transition with the caller as actor and the reason; an artifact already retracted is left as it is. One statement. 'changed': 1 when it was retracted now.
WITH prior AS (
    SELECT state FROM workflow_artifact WHERE artifact_id = %(artifact_id)s
), up AS (
    INSERT INTO workflow_artifact AS a
        (artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type, uri,
         state)
    VALUES (%(artifact_id)s, %(job_id)s, %(step)s, %(iteration)s, %(port)s, %(kind)s,
            %(sha256)s, %(size_bytes)s, %(media_type)s, %(uri)s, 'retracted')
    ON CONFLICT (artifact_id) DO UPDATE
       SET state = 'retracted'
     WHERE a.state <> 'retracted'
    RETURNING a.artifact_id
), logged AS (
    INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)
    SELECT artifact_id, %(actor)s, COALESCE((SELECT state FROM prior), %(current)s), 'retracted',
           %(reason)s
      FROM up
    RETURNING 1
)
SELECT (SELECT count(*) FROM logged) AS changed

-- name: artifact_promote
-- description: promote one verified artifact (an operator's promote-artifact, migration 0027): its workflow_artifact row becomes 'promoted' (made from the given fields when the artifact had none and %(current)s, its state derived from the entries, is 'verified'), only from 'verified', and the change is logged in workflow_artifact_transition with the caller as actor and the reason. One statement. 'changed': 1 when it was promoted now; 'before': the state it was found in.
WITH prior AS (
    SELECT state FROM workflow_artifact WHERE artifact_id = %(artifact_id)s::uuid
), up AS (
    INSERT INTO workflow_artifact AS a
        (artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type, uri,
         state)
    SELECT %(artifact_id)s::uuid, %(job_id)s::uuid, %(step)s::text, %(iteration)s::int,
           %(port)s::text, %(kind)s::text, %(sha256)s::text, %(size_bytes)s::bigint,
           %(media_type)s::text, %(uri)s::text, 'promoted'
     WHERE COALESCE((SELECT state FROM prior), %(current)s::text) = 'verified'
    ON CONFLICT (artifact_id) DO UPDATE
       SET state = 'promoted'
     WHERE a.state = 'verified'
    RETURNING a.artifact_id
), logged AS (
    INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)
    SELECT artifact_id, %(actor)s, 'verified', 'promoted', %(reason)s
      FROM up
    RETURNING 1
)
SELECT (SELECT count(*) FROM logged) AS changed,
       COALESCE((SELECT state FROM prior), %(current)s::text) AS before

-- name: artifact_transitions
-- description: the state changes of one artifact (workflow_artifact_transition, migration 0027), in order.
SELECT seq, at, actor, from_state, to_state, reason
  FROM workflow_artifact_transition
 WHERE artifact_id = %(artifact_id)s
 ORDER BY seq

-- name: outbox_pending_count
-- description: PENDING outbox rows, counted up to %(cap)s (index idx_workflow_run_events_outbox_pending); the pruner's backlog warning.
SELECT count(*) AS n
  FROM (SELECT 1
          FROM workflow_run_events_outbox
         WHERE status = 'PENDING'
         LIMIT %(cap)s) AS pending

-- name: job_statuses
-- description: the status columns of the given jobs (no definition, input, checkpoints or result): cheap progress of many jobs.
SELECT job_id, workflow_name, status, attempt, outstanding_step, error,
       created_at, updated_at, completed_at
  FROM workflow_run
 WHERE job_id = ANY(%(job_ids)s::uuid[])

-- name: job_compensate
-- description: fenced (status CANCELLED or FAILED, attempt, the step not yet checkpointed): append a compensation step's entry to a graph run cancelled or failed by its budget after it settled (graph workflows, #16).
UPDATE workflow_run
   SET checkpoints = checkpoints || jsonb_build_array(workflow_checkpoint_stamp(%(entry)s::jsonb)),
       updated_at = now(),
       change_kind = 'compensate',
       change_actor = 'worker:' || %(owner)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status IN ('CANCELLED', 'FAILED') AND attempt = %(attempt)s
   AND NOT checkpoints @> jsonb_build_array(jsonb_build_object('name', %(step)s::text))
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_prune_cancelled
-- description: delete up to %(limit)s CANCELLED runs without a workflow retention (migration 0020) cancelled more than %(retention_s)s seconds ago (oldest first, SKIP LOCKED; index idx_workflow_run_status_run_after); never a live or PAUSED run, and only runs our store inserted (origin, migration 0013) unless %(foreign_rows)s.
WITH doomed AS (
    SELECT job_id
      FROM workflow_run
     WHERE status = 'CANCELLED'
       AND retention IS NULL
       AND completed_at < now() - make_interval(secs => %(retention_s)s)
       AND (%(foreign_rows)s OR origin = 'protomolt-jobs')
     ORDER BY completed_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM workflow_run AS r
 USING doomed AS d
 WHERE r.job_id = d.job_id
   AND r.status = 'CANCELLED'

-- name: job_prune_retention
-- description: delete up to %(limit)s terminal runs whose workflow retention has ended (workflow_run_expires_at < now(), migration 0020; soonest expiry first, SKIP LOCKED; index idx_workflow_run_retention_expires), with their transition log (ON DELETE CASCADE) and their PUBLISHED outbox rows written while they ran (created_at from the run's created_at to its completed_at plus one second: the final event of a completion is stamped now() + 1 microsecond); never a live run, nor a PENDING or FAILED outbox row; only rows our store wrote (origin, migration 0013) unless %(foreign_rows)s.
WITH doomed AS (
    SELECT job_id
      FROM workflow_run
     WHERE retention IS NOT NULL
       AND status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')
       AND workflow_run_expires_at(completed_at, status, retention) < now()
       AND (%(foreign_rows)s OR origin = 'protomolt-jobs')
     ORDER BY workflow_run_expires_at(completed_at, status, retention)
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), runs AS (
    DELETE FROM workflow_run AS r
     USING doomed AS d
     WHERE r.job_id = d.job_id
       AND r.status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')
    RETURNING r.job_id, r.created_at, r.completed_at
), span AS (
    -- The batch's window: its runs' events were written from the earliest start to the
    -- latest end (a completion's last event is stamped now() + 1 microsecond).
    SELECT min(created_at) AS lo, max(completed_at) + interval '1 second' AS hi FROM runs
), events AS (
    -- One range scan of idx_workflow_run_events_outbox_status_created over the window,
    -- matched to the runs by key and by each run's own life.
    DELETE FROM workflow_run_events_outbox AS o
     USING span, runs
     WHERE o.status = 'PUBLISHED'
       AND o.created_at >= span.lo
       AND o.created_at <= span.hi
       AND o.kafka_key = runs.job_id::text
       AND o.created_at >= runs.created_at
       AND o.created_at <= runs.completed_at + interval '1 second'
       AND (%(foreign_rows)s OR o.origin = 'protomolt-jobs')
    RETURNING 1
)
SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM events) AS outbox_rows

-- ---------------------------------------------------------------------------------------------
-- Effects (migration 0006, issue #17)
-- ---------------------------------------------------------------------------------------------

-- name: job_intent
-- description: fenced (status, lease_owner, attempt, lease_token): record the intent of an external step before its call (a boundary write: a pending cancel or pause applies here, before the call).
UPDATE workflow_run
   SET effect_intents = coalesce(effect_intents, '{}'::jsonb)
                        || jsonb_build_object(%(step)s::text,
                                              %(intent)s::jsonb || jsonb_build_object('at', now())),
       updated_at = now(),
       change_kind = 'intent',
       change_actor = 'worker:' || %(owner)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
   AND lease_owner = %(owner)s AND attempt = %(attempt)s
   AND lease_token = %(token)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_recovery_required
-- description: fenced (status, lease_owner, attempt, lease_token): RECOVERY_REQUIRED naming the step (outstanding_step) and why (error), lease cleared.
UPDATE workflow_run
   SET status = 'RECOVERY_REQUIRED',
       outstanding_step = %(step)s,
       error = %(reason)s,
       lease_owner = NULL,
       lease_token = NULL,
       lease_until = NULL,
       updated_at = now(),
       change_kind = 'recovery-required',
       change_actor = 'worker:' || %(owner)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
   AND lease_owner = %(owner)s AND attempt = %(attempt)s
   AND lease_token = %(token)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- fragment: recovery_requeue
-- description: job_recover's UPDATE without its RETURNING: a RECOVERY_REQUIRED run at %(history_seq)s -> QUEUED with the caller's checkpoints and intents, recorded with %(kind)s and %(actor)s.
UPDATE workflow_run
   SET status = 'QUEUED',
       checkpoints = (SELECT coalesce(jsonb_agg(CASE WHEN e ? 'at' THEN e
                                                     ELSE workflow_checkpoint_stamp(e) END
                                                ORDER BY n), '[]'::jsonb)
                        FROM jsonb_array_elements(%(checkpoints)s::jsonb)
                             WITH ORDINALITY AS x (e, n)),
       effect_intents = %(intents)s::jsonb,
       attempt = 0,
       run_after = now(),
       error = NULL,
       outstanding_step = NULL,
       updated_at = now(),
       change_kind = %(kind)s,
       change_actor = %(actor)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'RECOVERY_REQUIRED'
   AND history_seq = %(history_seq)s

-- name: job_recover
-- description: reconcile-step / migrate-checkpoint: a RECOVERY_REQUIRED run at the history_seq the caller read -> QUEUED now, attempt 0, with the caller's checkpoints and intents (entries stamped with the database's time where fingerprinted), error and outstanding_step cleared; the change is recorded with its kind and actor.
-- include: recovery_requeue
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: job_recover_artifacts
-- description: job_recover for an operator's answer that asks for artifact rows (store/artifact_rows.py; migration 0027; reconcile-step done or migrate-checkpoint replace of a step declaring outputs, a receipt or validates): the same optimistic move to QUEUED with the caller's checkpoints and intents, and in the same statement the rows %(rows)s upserted into workflow_artifact as job_complete_parked_artifacts does (a promoted or retracted state never changed), each change logged in workflow_artifact_transition with the caller as actor; nothing is written when the row is no longer RECOVERY_REQUIRED at that history_seq.
WITH moved AS (
-- include: recovery_requeue
    RETURNING job_id, workflow_name, status, attempt, error
-- include: artifact_rows
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM logged) AS artifact_changes
  FROM moved

-- ---------------------------------------------------------------------------------------------
-- audit: refusals recorded in a run's transition log (store/audit.py)
-- ---------------------------------------------------------------------------------------------

-- name: transition_record_denied
-- description: a refused call naming a run: append a 'denied' transition (status unchanged; actor = the refused principal; reason names the verb and scope) to its hash chain and move the row's head (history_seq, history_head) under the row lock. Not a boundary write: change_kind stays NULL, so the trigger records nothing more and a pending control request is left for the worker. Once the same refusal (actor and reason) is repeat_burst times among the run's last 64 rows within repeat_s seconds, it is not appended again (repeated = true): a caller hammering a run does not grow its history. No row back: unknown job.
WITH target AS (
    SELECT r.job_id, r.status, r.attempt, r.history_seq + 1 AS seq, r.history_head, now() AS at,
           (
               SELECT count(*)
                 FROM workflow_run_transition t
                WHERE t.job_id = r.job_id
                  AND t.seq > r.history_seq - 64
                  AND t.kind = 'denied'
                  AND t.actor = %(actor)s::text
                  AND t.reason = %(reason)s::text
                  AND t.at > now() - make_interval(secs => %(repeat_s)s)
           ) >= %(repeat_burst)s AS repeated
      FROM workflow_run AS r
     WHERE r.job_id = %(job_id)s
       FOR UPDATE
), logged AS (
    INSERT INTO workflow_run_transition
        (job_id, seq, prev_status, new_status, kind, actor, reason, attempt, step, at, hash)
    SELECT job_id, seq, status, status, 'denied', %(actor)s::text, %(reason)s::text, attempt,
           NULL, at,
           workflow_run_transition_hash(history_head, job_id, seq, status, status, 'denied',
                                        %(actor)s::text, %(reason)s::text, attempt, NULL::text,
                                        at)
      FROM target
     WHERE NOT repeated
    RETURNING job_id, seq, hash
), moved AS (
    UPDATE workflow_run AS w
       SET history_seq = logged.seq, history_head = logged.hash
      FROM logged
     WHERE w.job_id = logged.job_id
    RETURNING w.job_id, w.history_seq
)
SELECT target.job_id, target.repeated, moved.history_seq
  FROM target LEFT JOIN moved USING (job_id)

-- ---------------------------------------------------------------------------------------------
-- approvals (migration 0014): the approval park and approve-step's votes under the row lock
-- ---------------------------------------------------------------------------------------------

-- name: job_park_approval
-- description: fenced (status, lease_owner, attempt, lease_token): WAITING on the approval step outstanding_step with wait_kind 'approval', wait_seq (this park's transition), its timers stamped with database time and wake_at the first of them, lease cleared, with its WAITING event (or the CANCELLED/PAUSED event of a pending request the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'WAITING',
           outstanding_step = %(step)s,
           wait_kind = 'approval',
           wait_seq = history_seq + 1,
           wait_timers = (SELECT jsonb_agg(t || jsonb_build_object(
                                     'at', now() + make_interval(secs => (t->>'afterS')::float8))
                                     ORDER BY (t->>'afterS')::float8)
                            FROM jsonb_array_elements(%(timers)s::jsonb) AS t),
           wake_at = now() + make_interval(secs => %(wake_s)s::float8),
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           updated_at = now(),
           change_kind = 'park',
           change_actor = 'worker:' || %(owner)s,
           change_reason = 'waiting for approval',
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'WAITING' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, %(step)s, NULL,
           CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: approval_votes
-- description: the votes on one opening (wait_seq) of an approval step of a run, oldest first (read under the run's row lock).
SELECT principal, decision, comment, at
  FROM workflow_approval_vote
 WHERE job_id = %(job_id)s AND step = %(step)s AND opened_seq = %(opened_seq)s
 ORDER BY at, principal

-- name: approval_voted_elsewhere
-- description: the first of the approval steps named in steps (distinctFrom) on which the principal voted in this run, if any.
SELECT step
  FROM workflow_approval_vote
 WHERE job_id = %(job_id)s AND step = ANY(%(steps)s) AND principal = %(principal)s
 ORDER BY step
 LIMIT 1

-- name: approval_vote_insert
-- description: one principal's vote on an approval step (one per principal, step and opening: a second vote inserts nothing and returns no row), and its 'vote' transition in the run's hash-chained log (status unchanged; the run's row is already locked by job_lock).
WITH vote AS (
    INSERT INTO workflow_approval_vote
        (job_id, step, opened_seq, principal, groups, decision, comment)
    VALUES (%(job_id)s, %(step)s, %(opened_seq)s, %(principal)s, %(groups)s, %(decision)s,
            %(comment)s)
    ON CONFLICT DO NOTHING
    RETURNING job_id
)
UPDATE workflow_run AS w
   SET change_kind = 'vote',
       change_actor = %(principal)s,
       change_reason = %(reason)s,
       change_step = %(step)s
  FROM vote
 WHERE w.job_id = vote.job_id
RETURNING w.job_id, w.history_seq

-- name: approval_decide
-- description: the decision of an approval step: append its checkpoint entry and requeue (WAITING -> QUEUED, wait_kind cleared, attempt reset to 0) with a 'decision' transition; the caller holds the row lock and writes the APPROVAL_DECIDED event.
UPDATE workflow_run
   SET status = 'QUEUED',
       checkpoints = checkpoints || jsonb_build_array(workflow_checkpoint_stamp(%(entry)s::jsonb)),
       outstanding_step = NULL,
       wait_kind = NULL,
       wake_at = NULL,
       wait_timers = NULL,
       attempt = 0,
       run_after = now(),
       updated_at = now(),
       change_kind = 'decision',
       change_actor = %(actor)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND outstanding_step = %(step)s
   AND wait_kind = 'approval'
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: approval_grant_decide
-- description: the decision of a step's grant gate (docs/approvals.md, Capabilities and grants): requeue (WAITING -> QUEUED, wait_kind cleared, attempt reset to 0) with a 'decision' transition, appending no checkpoint (the step has not run; the worker reads the decision back with grant_gate_decision); the caller holds the row lock and writes the APPROVAL_DECIDED event.
UPDATE workflow_run
   SET status = 'QUEUED',
       outstanding_step = NULL,
       wait_kind = NULL,
       wake_at = NULL,
       wait_timers = NULL,
       attempt = 0,
       run_after = now(),
       updated_at = now(),
       change_kind = 'decision',
       change_actor = %(actor)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND outstanding_step = %(step)s
   AND wait_kind = 'approval'
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: grant_gate_decision
-- description: the decision of a step's latest grant gate: the newest 'decision' transition of the step after its newest 'park' and after the run's newest operator re-run ('retry-step' of any step, 'requeue'), so an approval never carries over to a re-run an operator asked for, and not yet used by a checkpoint entry of the step (one that ran under it, grant.decisionId 'gate:<seq>', or failed by it, '(decision gate:<seq>)'), so one decision grants one run of the step, never a later iteration (none: the gate is not decided, or the step never parked since); index lookups on pk_workflow_run_transition's job_id prefix and the run's row.
SELECT d.seq, d.actor, d.reason
  FROM workflow_run_transition AS d
 WHERE d.job_id = %(job_id)s AND d.step = %(step)s AND d.kind = 'decision'
   AND d.seq > (SELECT coalesce(max(p.seq), 0)
                  FROM workflow_run_transition AS p
                 WHERE p.job_id = %(job_id)s
                   AND ((p.step = %(step)s AND p.kind = 'park')
                        OR p.kind IN ('retry-step', 'requeue')))
   AND NOT EXISTS (SELECT 1
                     FROM workflow_run AS w
                    CROSS JOIN LATERAL jsonb_array_elements(w.checkpoints) AS e (entry)
                    WHERE w.job_id = %(job_id)s
                      AND e.entry->>'name' = %(step)s
                      AND (e.entry->'grant'->>'decisionId' = 'gate:' || d.seq
                           OR e.entry->'failed'->>'message'
                              LIKE '%%(decision gate:' || d.seq || ')'))
 ORDER BY d.seq DESC
 LIMIT 1

-- name: job_submitted_groups
-- description: the groups recorded with a run at submit (NULL: none recorded); read by the worker only for a step that declares capabilities.
SELECT submitted_groups
  FROM workflow_run
 WHERE job_id = %(job_id)s

-- name: approval_votes_open
-- description: the votes on the current opening (the row's wait_seq) of an approval step of a run, oldest first (the dashboard's votes so far; none when the run does not wait on it).
SELECT v.principal, v.decision, v.comment, v.at
  FROM workflow_approval_vote AS v
  JOIN workflow_run AS w ON w.job_id = v.job_id AND v.opened_seq = w.wait_seq
 WHERE v.job_id = %(job_id)s AND v.step = %(step)s
 ORDER BY v.at, v.principal

-- name: approval_timers_due
-- description: WAITING approval runs whose wake_at has passed (idx_workflow_run_wake), oldest first, locked (SKIP LOCKED: sweepers in several processes share the work), with the indexes of their timers now due by the database clock.
SELECT w.job_id, w.workflow_name, w.status, w.attempt, w.outstanding_step, w.wait_seq,
       w.wait_timers::text AS wait_timers,
       (SELECT coalesce(jsonb_agg(t.i - 1 ORDER BY t.i), '[]'::jsonb)
          FROM jsonb_array_elements(w.wait_timers) WITH ORDINALITY AS t (v, i)
         WHERE NOT coalesce((t.v->>'fired')::boolean, false)
           AND (t.v->>'at')::timestamptz <= now())::text AS due,
       now() AS tx_now
  FROM workflow_run AS w
 WHERE w.wake_at <= now() AND w.status = 'WAITING' AND w.wait_kind = 'approval'
 ORDER BY w.wake_at
 LIMIT %(limit)s
   FOR UPDATE OF w SKIP LOCKED

-- name: approval_escalate
-- description: an approval step's escalation fired (the sweeper holds the row lock): store the timers with it marked fired, move wake_at to the next timer not fired, and record an 'escalate' transition (status unchanged).
UPDATE workflow_run
   SET wait_timers = %(timers)s::jsonb,
       wake_at = (SELECT min((t->>'at')::timestamptz)
                    FROM jsonb_array_elements(%(timers)s::jsonb) AS t
                   WHERE NOT coalesce((t->>'fired')::boolean, false)),
       updated_at = now(),
       change_kind = 'escalate',
       change_actor = 'sweeper',
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND wait_kind = 'approval'
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- name: approval_expire
-- description: an approval step expired with onExpire fail or pause (the sweeper holds the row lock): FAILED (error, completed_at) or PAUSED (paused_from WAITING, the step kept), timers cleared, an 'expire' transition.
UPDATE workflow_run
   SET status = %(status)s,
       error = CASE WHEN %(status)s::text = 'FAILED' THEN %(error)s ELSE error END,
       completed_at = CASE WHEN %(status)s::text = 'FAILED' THEN now() END,
       outstanding_step = CASE WHEN %(status)s::text = 'FAILED' THEN NULL ELSE outstanding_step END,
       paused_from = CASE WHEN %(status)s::text = 'PAUSED' THEN 'WAITING' END,
       wake_at = NULL,
       wait_timers = NULL,
       updated_at = now(),
       change_kind = 'expire',
       change_actor = 'sweeper',
       change_reason = %(error)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s AND status = 'WAITING' AND wait_kind = 'approval'
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- bounded loops (migration 0016): extend-loop and its read (the exhausted loop's pause is job_worker_pause)

-- name: job_loop_extensions
-- description: the re-runs extend-loop added to the run's loops ({loop step: n}; NULL when none).
SELECT loop_extensions::text AS loop_extensions
  FROM workflow_run
 WHERE job_id = %(job_id)s

-- name: job_loop_lock
-- description: the run's status, error, paused_from and loop extensions, its row locked (extend-loop).
SELECT status, error, paused_from, loop_extensions::text AS loop_extensions
  FROM workflow_run
 WHERE job_id = %(job_id)s
   FOR UPDATE

-- name: job_control_extend_loop
-- description: extend-loop: store the loop's raised extension; when requeue is true (the run is PAUSED because that loop exhausted) PAUSED -> QUEUED now with attempt 0 and the error cleared; a transition of kind 'extend-loop' with the actor and reason either way.
UPDATE workflow_run
   SET loop_extensions = coalesce(loop_extensions, '{}'::jsonb)
                         || jsonb_build_object(%(step)s::text, %(total)s::int),
       status = CASE WHEN %(requeue)s::boolean THEN 'QUEUED' ELSE status END,
       paused_from = CASE WHEN %(requeue)s::boolean THEN NULL ELSE paused_from END,
       error = CASE WHEN %(requeue)s::boolean THEN NULL ELSE error END,
       attempt = CASE WHEN %(requeue)s::boolean THEN 0 ELSE attempt END,
       run_after = CASE WHEN %(requeue)s::boolean THEN now() ELSE run_after END,
       updated_at = now(),
       change_kind = 'extend-loop',
       change_actor = %(actor)s,
       change_reason = %(reason)s,
       change_step = %(step)s
 WHERE job_id = %(job_id)s
RETURNING job_id, workflow_name, status, attempt, error, now() AS tx_now

-- ---------------------------------------------------------------------------------------------
-- progress (migration 0022; store/progress.py)
-- ---------------------------------------------------------------------------------------------

-- name: job_progress
-- description: fenced (status, lease_owner, attempt, lease_token): one progress report of a long step: extends lease_until to now() + lease_s (the report is the heartbeat) and upserts the (job_id, step, iteration) progress row from the same statement. When an operator request is pending and the step is not done, the update names its change ('progress'), so it is a boundary write and the trigger applies the request here (PAUSED or CANCELLED, lease cleared): control lands between chunks, with the report stored. With live = true (a ReportProgress from inside a running call, store/progress.py job_report_live) it is never a boundary write (the pending request is returned as control_kind for the service to act on), a report without a state keeps the stored one, and the fingerprints (adapter_version, input_sha256, definition_sha256, descriptor_sha256) are the ones its progress token carried (store/progress_token.py), or the stored ones when it carried none (definition_sha256 NULL: a token issued without them). A live report's fence is the token's mac (mac, bound: the SHA-256 of bound || ':' || the row's lease token), never a lease token it carries; a worker's own report (mac NULL) is fenced by lease_token. No event of its own.
WITH moved AS (
    UPDATE workflow_run
       SET lease_until = now() + make_interval(secs => %(lease_s)s),
           updated_at = now(),
           change_kind = CASE WHEN control IS NULL OR %(done)s OR %(live)s THEN NULL ELSE 'progress' END,
           change_actor = CASE WHEN control IS NULL OR %(done)s OR %(live)s THEN NULL
                               ELSE 'worker:' || %(owner)s END,
           change_step = CASE WHEN control IS NULL OR %(done)s OR %(live)s THEN NULL ELSE %(step)s END
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND CASE WHEN %(mac)s::text IS NULL THEN lease_token = %(token)s
                ELSE encode(sha256(convert_to(%(bound)s::text || ':' || lease_token::text, 'UTF8')),
                            'hex') = %(mac)s::text END
    RETURNING job_id, workflow_name, status, attempt, error, lease_until,
              control->>'kind' AS control_kind
), saved AS (
    INSERT INTO workflow_run_progress AS p
        (job_id, step, iteration, attempt, seq, percent, details, state, state_ref,
         adapter_version, input_sha256, definition_sha256, descriptor_sha256, done, updated_at)
    SELECT m.job_id, %(step)s, %(iteration)s, %(attempt)s, 1, %(percent)s, %(details)s,
           %(state)s::jsonb, %(state_ref)s, %(adapter_version)s, %(input_sha256)s,
           %(definition_sha256)s, %(descriptor_sha256)s, %(done)s, now()
      FROM moved AS m
    ON CONFLICT (job_id, step, iteration) DO UPDATE
       SET attempt = EXCLUDED.attempt, seq = p.seq + 1, percent = EXCLUDED.percent,
           details = EXCLUDED.details,
           state = CASE WHEN %(live)s AND EXCLUDED.state IS NULL THEN p.state ELSE EXCLUDED.state END,
           state_ref = CASE WHEN %(live)s AND EXCLUDED.state IS NULL THEN p.state_ref
                            ELSE EXCLUDED.state_ref END,
           adapter_version = CASE WHEN %(live)s AND EXCLUDED.definition_sha256 IS NULL
                                  THEN p.adapter_version ELSE EXCLUDED.adapter_version END,
           input_sha256 = CASE WHEN %(live)s AND EXCLUDED.definition_sha256 IS NULL
                               THEN p.input_sha256 ELSE EXCLUDED.input_sha256 END,
           definition_sha256 = CASE WHEN %(live)s AND EXCLUDED.definition_sha256 IS NULL
                                    THEN p.definition_sha256 ELSE EXCLUDED.definition_sha256 END,
           descriptor_sha256 = CASE WHEN %(live)s AND EXCLUDED.definition_sha256 IS NULL
                                    THEN p.descriptor_sha256 ELSE EXCLUDED.descriptor_sha256 END,
           done = EXCLUDED.done, updated_at = EXCLUDED.updated_at
    RETURNING seq
)
SELECT m.job_id, m.workflow_name, m.status, m.attempt, m.error, m.lease_until, m.control_kind,
       now() AS tx_now, (SELECT seq FROM saved) AS seq
  FROM moved AS m

-- name: job_progress_saved
-- description: read-only: the last progress report of one step of one run ((job_id, step, iteration)), the state a resumable step continues from.
SELECT step, iteration, attempt, seq, percent, details, state::text AS state, state_ref,
       adapter_version, input_sha256, definition_sha256, descriptor_sha256, done, updated_at
  FROM workflow_run_progress
 WHERE job_id = %(job_id)s AND step = %(step)s AND iteration = %(iteration)s

-- name: job_progress_accept
-- description: migrate-checkpoint keep of a progress-mismatch (store/control.py job_recover, same transaction): the step's unfinished progress rows forget their fingerprints (NULL: nothing to compare), so the step continues from the saved state under the current definition and the next report stamps the current fingerprints. Returns the rows changed.
UPDATE workflow_run_progress
   SET adapter_version = NULL, input_sha256 = NULL,
       definition_sha256 = NULL, descriptor_sha256 = NULL
 WHERE job_id = %(job_id)s AND step = %(step)s AND NOT done
RETURNING iteration

-- name: job_progress_drop
-- description: migrate-checkpoint discard of a progress-mismatch (store/control.py job_recover, same transaction): delete the step's unfinished progress rows, so the step starts again from zero. Returns the rows deleted.
DELETE FROM workflow_run_progress
 WHERE job_id = %(job_id)s AND step = %(step)s AND NOT done
RETURNING iteration

-- name: job_progress_current
-- description: read-only: the most recent unfinished progress report of a run (the step in flight; get-job, the dashboard), or no row.
SELECT step, iteration, attempt, seq, percent, details, adapter_version, done, updated_at
  FROM workflow_run_progress
 WHERE job_id = %(job_id)s AND NOT done
 ORDER BY updated_at DESC
 LIMIT 1

-- ---------------------------------------------------------------------------------------------
-- local times (store/local_times.py)
-- ---------------------------------------------------------------------------------------------

-- name: local_time_today
-- description: read-only: the calendar date in an IANA zone at an instant (the given one, else the database's now()), and that instant (resume-job's relative days: "today", "tomorrow", "next"). An unknown zone raises (22023).
SELECT (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE %(zone)s)::date AS today,
       coalesce(%(now)s::timestamptz, now()) AS now

-- name: local_time_resolve
-- description: read-only: the instants a local date-time (timestamp without zone) names in an IANA zone, by the database's time zone rules: local - offset for each UTC offset the zone has within a day either side, kept when it maps back to the same local time. No row with an instant: the clocks skip that time; two: they pass it twice (the caller takes the first). An unknown zone raises (22023).
WITH probes AS (
    SELECT (%(local)s::timestamp AT TIME ZONE 'UTC') + d * interval '1 day' AS p
      FROM generate_series(-1, 1) AS d
), offsets AS (
    SELECT DISTINCT (p AT TIME ZONE %(zone)s) - (p AT TIME ZONE 'UTC') AS off FROM probes
), candidates AS (
    SELECT (%(local)s::timestamp - off) AT TIME ZONE 'UTC' AS instant FROM offsets
)
SELECT instant
  FROM candidates
 WHERE (instant AT TIME ZONE %(zone)s) = %(local)s::timestamp
 ORDER BY instant

-- ---------------------------------------------------------------------------------------------
-- preemption (migration 0024; docs/long-steps.md "Preemption"): the sweeper's pass
-- ---------------------------------------------------------------------------------------------

-- name: job_preempt_lock
-- description: the preemption pass of one queue: lock the queue's limits row (the claim of a limited queue locks it too), so two sweepers never ask two runs to yield for one waiting run; no row when the queue has no max_running (nothing to preempt for).
SELECT queue, max_running
  FROM workflow_queue
 WHERE queue = %(queue)s AND max_running IS NOT NULL
   FOR UPDATE

-- name: job_preempt_request
-- description: the preemption pass of one queue (after job_preempt_lock, same transaction): when the queue is at its max_running with no yield pending, and its most urgent ready QUEUED run has been ready for after_s, ask the lowest-priority RUNNING run of the queue that is at least min_gap priority levels less urgent, has run min_run_s since its claim, and is inside a resumable step (an unfinished progress report of its current attempt) to yield: control = {kind: 'yield', actor, reason, for, requestedAt} and a 'yield-request' transition. Returns the run asked and the run it yields for, or no row.
WITH urgent AS (
    SELECT w.job_id, w.priority
      FROM workflow_run AS w
     WHERE w.status = 'QUEUED' AND w.queue = %(queue)s
       AND w.run_after <= now() - make_interval(secs => %(after_s)s)
     ORDER BY w.priority, w.fairness_pass, w.created_at, w.job_id
     LIMIT 1
), running AS (
    SELECT count(*) AS n,
           count(*) FILTER (WHERE r.control->>'kind' = 'yield') AS yielding
      FROM workflow_run AS r
     WHERE r.status = 'RUNNING' AND r.queue = %(queue)s
), victim AS (
    SELECT r.job_id
      FROM workflow_run AS r, urgent AS u, running AS c
     WHERE r.status = 'RUNNING' AND r.queue = %(queue)s AND r.control IS NULL
       AND c.n >= %(max_running)s AND c.yielding = 0
       AND r.priority - u.priority >= %(min_gap)s
       AND EXISTS (SELECT 1 FROM workflow_run_progress AS p
                    WHERE p.job_id = r.job_id AND p.attempt = r.attempt AND NOT p.done)
       AND coalesce((SELECT max(t.at) FROM workflow_run_transition AS t
                      WHERE t.job_id = r.job_id AND t.kind = 'claim'), '-infinity')
           <= now() - make_interval(secs => %(min_run_s)s)
     ORDER BY r.priority DESC, r.created_at DESC, r.job_id
     LIMIT 1
       FOR UPDATE OF r SKIP LOCKED
)
UPDATE workflow_run AS t
   SET control = jsonb_build_object(
           'kind', 'yield', 'actor', %(actor)s::text,
           'reason', 'preempted for job ' || u.job_id::text || ' (priority '
                     || u.priority::text || ')',
           'for', u.job_id::text, 'requestedAt', now()),
       change_kind = 'yield-request',
       change_actor = %(actor)s,
       change_reason = 'preempted for job ' || u.job_id::text || ' (priority '
                       || u.priority::text || ')'
  FROM victim AS v, urgent AS u
 WHERE t.job_id = v.job_id AND t.status = 'RUNNING' AND t.control IS NULL
RETURNING t.job_id, t.priority, u.job_id AS for_job_id, u.priority AS for_priority

-- ---------------------------------------------------------------------------------------------
-- input ownership (migration 0028): the input park and supply-input under the row lock
-- ---------------------------------------------------------------------------------------------

-- name: job_park_input
-- description: fenced (status, lease_owner, attempt, lease_token): WAITING on step outstanding_step with wait_kind 'input' (a step with onMissingInput "wait" needs input paths the run lacks), wait_seq this park's transition, lease cleared, the transition's reason naming the missing paths and their owners, with its WAITING event carrying the same text as verdict (or the CANCELLED/PAUSED event of a pending request the trigger applied); one statement.
WITH moved AS (
    UPDATE workflow_run
       SET status = 'WAITING',
           outstanding_step = %(step)s,
           wait_kind = 'input',
           wait_seq = history_seq + 1,
           wake_at = NULL,
           wait_timers = NULL,
           lease_owner = NULL,
           lease_token = NULL,
           lease_until = NULL,
           updated_at = now(),
           change_kind = 'park',
           change_actor = 'worker:' || %(owner)s,
           change_reason = %(reason)s,
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'RUNNING'
       AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND lease_token = %(token)s
    RETURNING job_id, workflow_name, status, attempt, error
), events AS (
    INSERT INTO workflow_run_events_outbox
        (event_id, event_type, kafka_key, created_at, workflow_name, attempt, status_after,
         step, verdict, error)
    SELECT gen_random_uuid(),
           CASE WHEN m.status IN ('CANCELLED', 'PAUSED') THEN m.status ELSE 'WAITING' END,
           m.job_id::text, now(), m.workflow_name, m.attempt, m.status, %(step)s,
           CASE WHEN m.status = 'WAITING' THEN %(reason)s END,
           CASE WHEN m.status = 'CANCELLED' THEN m.error END
      FROM moved AS m
    RETURNING 1
)
SELECT job_id, workflow_name, status, attempt, error, now() AS tx_now,
       (SELECT count(*) FROM events) AS events
  FROM moved

-- name: job_supply_input
-- description: supply-input: patch the run's input, append its workflow_input_revision row and requeue (WAITING with wait_kind 'input' -> QUEUED, wait_kind cleared, attempt reset to 0, run_after now()) with a 'supply-input' transition by the actor; the caller holds the row lock (job_lock) and writes the REQUEUED event. No row: the run is not waiting for input.
WITH moved AS (
    UPDATE workflow_run
       SET input = %(input)s::jsonb,
           status = 'QUEUED',
           outstanding_step = NULL,
           wait_kind = NULL,
           attempt = 0,
           run_after = now(),
           updated_at = now(),
           change_kind = 'supply-input',
           change_actor = %(actor)s,
           change_reason = %(reason)s,
           change_step = %(step)s
     WHERE job_id = %(job_id)s AND status = 'WAITING' AND wait_kind = 'input'
    RETURNING job_id, workflow_name, status, attempt, error, outstanding_step
), revision AS (
    INSERT INTO workflow_input_revision
        (job_id, path, old_sha256, new_sha256, old_value, new_value, actor, reason, step)
    SELECT m.job_id, %(path)s, %(old_sha256)s, %(new_sha256)s, %(old_value)s::jsonb,
           %(new_value)s::jsonb, %(actor)s, %(note)s, %(step)s
      FROM moved AS m
    RETURNING seq, at
)
SELECT m.job_id, m.workflow_name, m.status, m.attempt, m.error, now() AS tx_now,
       r.seq AS revision, r.at
  FROM moved AS m, revision AS r

-- name: input_revisions
-- description: a run's supply-input revisions, oldest first (index scan on the primary key's job_id prefix).
SELECT seq, path, old_sha256, new_sha256, old_value::text AS old_value,
       new_value::text AS new_value, actor, reason, step, at
  FROM workflow_input_revision
 WHERE job_id = %(job_id)s
 ORDER BY seq

-- name: queue_cap
-- description: a queue's fleet-wide limits, its rate limiter's next start (NULL while never moved: -infinity) and the runs RUNNING in it now (explain-job's account of a QUEUED run that is due); no row when the queue has no limit.
SELECT q.max_running, q.max_starts_per_second,
       CASE WHEN isfinite(q.next_start_at) THEN q.next_start_at END AS next_start_at,
       (SELECT count(*) FROM workflow_run AS w
         WHERE w.queue = q.queue AND w.status = 'RUNNING') AS running
  FROM workflow_queue AS q
 WHERE q.queue = %(queue)s
   AND (q.max_running IS NOT NULL OR q.max_starts_per_second IS NOT NULL)
