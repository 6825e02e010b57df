-- Per-key ordering under faults (issue 29). A chain (the records of one key parked behind a failed
-- one, held_by) lets at most one of its jobs be due at a time: the database now enforces it. Before,
-- two transactions advancing one chain at once (the ingest storing a parked record, a publisher
-- marking the one before it) could each make a different job due, and the later offset could go first.
-- The advance now runs under a per-chain lock (sql/queries.sql: lock_chains) and checks that no job of
-- the chain is due; this index makes a second due job an error rather than a reordering.

-- Chains left with more than one due job by the old advance: all but the first in original order wait
-- again (the first goes; the next falls due once it is published).
UPDATE retry_jobs AS j SET due_at = '9999-12-31 00:00:00+00'
FROM (
    SELECT id, row_number() OVER (PARTITION BY held_by ORDER BY original_partition, original_offset, id) AS n
    FROM retry_jobs
    WHERE held_by IS NOT NULL AND status = 'pending' AND due_at < '9999-12-31 00:00:00+00'
) AS extra
WHERE j.id = extra.id AND extra.n > 1;

CREATE UNIQUE INDEX retry_jobs_chain_due_key ON retry_jobs (held_by)
    WHERE held_by IS NOT NULL AND status = 'pending' AND due_at < '9999-12-31 00:00:00+00';

-- The retry.id of the head whose death released a chain: published with its records
-- (retry.chain-state: dead:<retry.id>), so that the helper knows which of its heads died.
ALTER TABLE retry_released_holds ADD COLUMN dead_head text;

-- A released chain is forgotten once nothing waits in it (sql/queries.sql: forget_released_holds):
-- the table no longer grows with every chain there ever was.
CREATE INDEX retry_released_holds_released_at_idx ON retry_released_holds (released_at);
