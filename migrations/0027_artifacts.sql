-- 0027: artifacts kept beyond their run, and the byte keys the pruner deletes (issue 29;
-- DESIGN.md section 24; docs/artifacts.md).
--
-- A run's artifacts live in its checkpoint entries (workflow/artifacts.py): each entry is its
-- step's response artifact (sha256, sizeBytes, inputs), with its declared output ports
-- ("artifacts": [{port, kind, uri, sha256, ...}]), its receipt and what it consumed. Nothing
-- here is written while a run runs: a workflow costs the statements it cost before.
--
--   * workflow_artifact: an artifact that outlives its run. The run-deletion trigger below
--     keeps every PROMOTED port (a publication step consumed it) of a deleted run here,
--     detached from the run (job_id kept, no foreign key: a kept artifact never blocks
--     deleting its run), with the same artifact_id the read verbs give it.
--   * workflow_artifact_transition: every state change of a kept artifact (actor, reason, at):
--     the 'kept' change the deletion writes ('promoted' -> 'promoted', actor 'pruner').
--   * workflow_artifact_bytes_doomed: the artifact:// byte keys of deleted runs that no kept
--     artifact references; the pruner's byte pass deletes them through the ArtifactStore
--     unless a live run references them, and a key already missing counts as pruned.
--   * workflow_artifact_on_run_delete(): BEFORE DELETE on workflow_run, only for a run whose
--     entries declare ports (WHEN clause), in the pruner's own DELETE statement.
--
-- Append-only: never edit this file once merged.

CREATE TABLE workflow_artifact (
    artifact_id UUID PRIMARY KEY,
    job_id      UUID NOT NULL,
    step        TEXT NOT NULL,
    iteration   INT NOT NULL DEFAULT 0,
    port        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    sha256      TEXT,
    size_bytes  BIGINT,
    media_type  TEXT,
    uri         TEXT,
    state       TEXT NOT NULL CHECK (state IN ('draft', 'verified', 'promoted', 'retracted',
                                              'pruned')),
    detached    BOOLEAN NOT NULL DEFAULT false,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX idx_workflow_artifact_job ON workflow_artifact (job_id);
CREATE INDEX idx_workflow_artifact_uri ON workflow_artifact (uri) WHERE uri IS NOT NULL;

CREATE TABLE workflow_artifact_transition (
    artifact_id UUID NOT NULL REFERENCES workflow_artifact ON DELETE CASCADE,
    seq         BIGSERIAL,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor       TEXT NOT NULL,
    from_state  TEXT,
    to_state    TEXT NOT NULL,
    reason      TEXT,
    PRIMARY KEY (artifact_id, seq)
);

CREATE TABLE workflow_artifact_bytes_doomed (
    uri       TEXT PRIMARY KEY,
    job_id    UUID NOT NULL,
    doomed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION workflow_artifact_on_run_delete() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    WITH ports AS (
        SELECT e->>'name' AS step,
               COALESCE((e->>'iteration')::int, 0) AS iteration,
               COALESCE((e->>'attempt')::int, 0) AS attempt,
               a->>'port' AS port,
               COALESCE(a->>'kind', 'file') AS kind,
               a->>'sha256' AS sha256,
               a->>'uri' AS uri,
               a->>'mediaType' AS media_type,
               CASE WHEN jsonb_typeof(a->'sizeBytes') = 'number'
                    THEN (a->>'sizeBytes')::bigint END AS size_bytes
          FROM jsonb_array_elements(OLD.checkpoints) AS e,
               jsonb_array_elements(CASE WHEN jsonb_typeof(e->'artifacts') = 'array'
                                         THEN e->'artifacts' ELSE '[]'::jsonb END) AS a
         WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(a) = 'object'
    ), consumed AS (
        SELECT c->>'ref' AS ref, c->>'sha256' AS sha256
          FROM jsonb_array_elements(OLD.checkpoints) AS e,
               jsonb_array_elements(CASE WHEN jsonb_typeof(e->'consumed') = 'array'
                                         THEN e->'consumed' ELSE '[]'::jsonb END) AS c
         WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(c) = 'object'
           AND NOT (e ? 'failed')
    ), kept AS (
        INSERT INTO workflow_artifact
            (artifact_id, job_id, step, iteration, port, kind, sha256, size_bytes, media_type,
             uri, state, detached)
        SELECT DISTINCT ON (p.step, p.iteration, p.port, p.attempt, p.sha256)
               (substr(replace(OLD.job_id::text, '-', ''), 1, 16)
                || substr(encode(sha256(convert_to(
                       p.step || '/' || p.iteration || '/' || p.port || '/' || p.attempt
                       || '/' || p.sha256, 'UTF8')), 'hex'), 1, 16))::uuid,
               OLD.job_id, p.step, p.iteration, p.port, p.kind, p.sha256, p.size_bytes,
               p.media_type, p.uri, 'promoted', true
          FROM ports AS p
          JOIN consumed AS c ON c.ref = p.step || '.' || p.port AND c.sha256 = p.sha256
        ON CONFLICT (artifact_id) DO UPDATE SET detached = true
        RETURNING artifact_id
    ), logged AS (
        INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)
        SELECT artifact_id, 'pruner', 'promoted', 'promoted',
               'run deleted; promoted artifact kept (detached)'
          FROM kept
        RETURNING 1
    )
    INSERT INTO workflow_artifact_bytes_doomed (uri, job_id)
    SELECT DISTINCT p.uri, OLD.job_id
      FROM ports AS p
     WHERE p.uri LIKE 'artifact://%'
       AND NOT EXISTS (SELECT 1 FROM consumed AS c
                        WHERE c.ref = p.step || '.' || p.port AND c.sha256 = p.sha256)
    ON CONFLICT (uri) DO NOTHING;
    RETURN OLD;
END
$$;

CREATE TRIGGER workflow_artifact_on_run_delete
    BEFORE DELETE ON workflow_run
    FOR EACH ROW
    WHEN (jsonb_path_exists(OLD.checkpoints, '$[*].artifacts'))
    EXECUTE FUNCTION workflow_artifact_on_run_delete();
