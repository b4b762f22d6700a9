-- 0009: the job's trace context (observability, #19).
--
-- trace_context holds the W3C traceparent of the span that started the job's trace (written by
-- the insert when tracing is on); every segment, in any process, is a child of it, so all the
-- attempts of a job form one trace. NULL when the job was submitted with tracing off (the
-- worker then derives a context from the job id). Existing rows stay untouched.
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run ADD COLUMN trace_context TEXT;
