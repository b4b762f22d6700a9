-- 0027: artifacts kept beyond their run, and the byte keys the pruner deletes (issue 29;
-- DESIGN.md section 24; docs/artifacts.md).
--
-- A run's artifacts live in its checkpoint entries (workflow/artifacts.py): each entry is its
-- step's response artifact (sha256, sizeBytes, inputs), with its declared output ports
-- ("artifacts": [{port, kind, uri, sha256, ...}]), its receipt and what it validated or
-- consumed. A workflow without artifact keys writes nothing here: it costs the statements it
-- cost before.
--
--   * workflow_artifact: a row per artifact with something beyond its entry: a declared port,
--     a declared receipt, an artifact a validator verified or a publication step promoted.
--     Written by the checkpoint's own statement (job_checkpoint_artifacts, store/queries.sql),
--     with the artifact_id the read verbs give it. No foreign key to the run (a promoted
--     artifact outlives it, detached; none blocks deleting a run): the trigger below deletes
--     the others with the run.
--   * workflow_artifact_transition: every state change (actor, reason, at): draft, verified
--     ('worker:<owner>', "validated by step ..."), promoted ("published by step ..."), and the
--     pruner's keeping of a promoted artifact when its run is deleted.
--   * workflow_artifact_bytes_doomed: the artifact:// byte keys of deleted runs that no kept
--     artifact references; the pruner's byte pass deletes them through the ArtifactStore
--     unless a live run references them, and a key already missing counts as pruned.
--   * workflow_artifact_on_run_delete(): BEFORE DELETE on workflow_run, only for a run whose
--     entries asked for artifact rows (WHEN clause), in the pruner's own DELETE statement.
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
    -- the run's artifact rows: promoted ones are kept, detached; the others go with the run
    WITH kept AS (
        UPDATE workflow_artifact
           SET detached = true
         WHERE job_id = OLD.job_id AND state = 'promoted' AND NOT detached
        RETURNING artifact_id
    )
    INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)
    SELECT artifact_id, 'pruner', 'promoted', 'promoted',
           'run deleted; promoted artifact kept (detached)'
      FROM kept;
    DELETE FROM workflow_artifact WHERE job_id = OLD.job_id AND state <> 'promoted';
    -- the byte keys of its ports nobody promoted wait for the pruner's byte pass
    WITH ports AS (
        SELECT e->>'name' AS step, a->>'port' AS port, a->>'sha256' AS sha256, a->>'uri' AS uri
          FROM jsonb_array_elements(OLD.checkpoints) AS e,
               jsonb_array_elements(CASE WHEN jsonb_typeof(e->'artifacts') = 'array'
                                         THEN e->'artifacts' ELSE '[]'::jsonb END) AS a
         WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(a) = 'object'
    )
    INSERT INTO workflow_artifact_bytes_doomed (uri, job_id)
    SELECT DISTINCT p.uri, OLD.job_id
      FROM ports AS p
     WHERE p.uri LIKE 'artifact://%'
       AND NOT EXISTS (SELECT 1 FROM workflow_artifact AS k
                        WHERE k.job_id = OLD.job_id AND k.state = 'promoted'
                          AND k.step = p.step AND k.port = p.port AND k.sha256 = p.sha256)
    ON CONFLICT (uri) DO NOTHING;
    RETURN OLD;
END
$$;

CREATE TRIGGER workflow_artifact_on_run_delete
    BEFORE DELETE ON workflow_run
    FOR EACH ROW
    WHEN (jsonb_path_exists(OLD.checkpoints,
          '$[*] ? (exists(@.artifacts) || exists(@.validated) || exists(@.consumed) || exists(@.receipt.evidence))'))
    EXECUTE FUNCTION workflow_artifact_on_run_delete();
