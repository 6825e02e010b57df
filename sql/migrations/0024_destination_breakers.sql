-- A breaker per destination (BREAKERS in the policies module, issue 33): when the deliveries to a
-- destination fail, or the records published to it come back to the retry topics (failing again on
-- their next attempt), past a share the policies set, its due jobs are held without spending their
-- attempts until one probe record, sent after a cool-down, stays away.
--
-- A destination's row keeps its breaker: its state (closed, open, probing), since when and why, and
-- the counts of two windows (the current one since window_at, and the one before), added to by the
-- publish loop (records sent, deliveries failed) and the ingest (records come back). A probe is the
-- held job let out in the probing state (probe_job, its retry.id, when it was let out); the ingest
-- marks probe_came_back when that retry.id comes back.
ALTER TABLE retry_destinations
    ADD COLUMN IF NOT EXISTS breaker          text        NOT NULL DEFAULT 'closed'
        CHECK (breaker IN ('closed', 'open', 'probing')),
    ADD COLUMN IF NOT EXISTS breaker_since    timestamptz,
    ADD COLUMN IF NOT EXISTS breaker_reason   text,
    -- who opened it by hand (`breakers open`): it then stays open, without a probe, until closed by hand
    ADD COLUMN IF NOT EXISTS breaker_by       text,
    ADD COLUMN IF NOT EXISTS breaker_trips    integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS window_at        timestamptz,
    ADD COLUMN IF NOT EXISTS sent             integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS failed           integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS came_back        integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS prev_sent        integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS prev_failed      integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS prev_came_back   integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS probe_job        bigint,
    ADD COLUMN IF NOT EXISTS probe_retry_id   text,
    ADD COLUMN IF NOT EXISTS probe_at         timestamptz,
    ADD COLUMN IF NOT EXISTS probe_came_back  boolean     NOT NULL DEFAULT false;

-- The jobs a breaker holds: pending, their due time moved to 9999-12-30 (never claimed; not the
-- 9999-12-31 of ordered mode's held chains), their own due time kept here until the breaker lets them
-- go (oldest first). Holding and letting go each change the job and this table in one statement.
CREATE TABLE IF NOT EXISTS retry_breaker_holds (
    id          bigint      PRIMARY KEY,
    destination text        NOT NULL,
    due_at      timestamptz NOT NULL,
    held_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS retry_breaker_holds_destination_idx ON retry_breaker_holds (destination, due_at, id);
