-- Per-key ordering (retry_scheduler.consumer, ordered mode): a record parked behind the retry of an
-- earlier record of its key is stored pending with held_by = that record's retry.id and the held due
-- time (9999-12-31, never claimed). When the blocker's chain is released (the consumer's release
-- record, or the blocker died), its held jobs fall due one at a time in their original order: the
-- next only once the one before it was published (sql/queries.sql: advance_holds).
ALTER TABLE retry_jobs ADD COLUMN held_by text;

-- The held jobs of a blocker in original order; only pending held jobs are in it, so it stays small.
CREATE INDEX retry_jobs_held_idx ON retry_jobs (held_by, original_partition, original_offset, id)
    WHERE held_by IS NOT NULL AND status = 'pending';

-- Blockers whose chain is released: a record parked behind one of these later is released at once.
CREATE TABLE retry_released_holds (
    blocker     text        PRIMARY KEY,
    released_at timestamptz NOT NULL DEFAULT now(),
    -- why: 'released' (the consumer handled the blocker) or 'dead' (the blocker was dead-lettered)
    why         text        NOT NULL CHECK (why IN ('released', 'dead'))
);
