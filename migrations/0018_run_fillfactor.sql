-- 0018: room on each heap page of workflow_run for the updates of a running job (issue 33).
--
-- A three-step job updates its run row four times (claim, two checkpoints, the completion
-- with the last checkpoint). The claim and the completion change status, which several
-- indexes key or filter on, so they can never be HOT; the checkpoints change only columns no
-- index reads (checkpoints, updated_at, the change_* and history columns), so they are HOT
-- (no index entry written in any of the 13 indexes) whenever the new row version fits on the
-- page of the old one. A run row is about 1.7 KB (definition, input and checkpoints inline),
-- so at the default fillfactor 100 a page holds four rows and no room: measured on
-- `python -m bench floor` (pgbench, the store's exact statements) 35-39 % of updates were
-- HOT. With fillfactor 50 new rows fill half a page and the checkpoints stay on it:
-- 50 % HOT, every update that can be HOT is (docs/benchmarks.md, issue 33). The price is
-- heap size: about 1.6x the heap bytes per job before pruning removes old runs.
--
-- Only pages filled from now on keep the room; an existing table's full pages stay full
-- until the run pruner empties them (no rewrite here: VACUUM FULL would lock the table).
-- Append-only: never edit this file once merged.

ALTER TABLE workflow_run SET (fillfactor = 50);
