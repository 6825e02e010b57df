-- A watched replay (issue 33): a canary slice first, then the rest in waves, each watched for the
-- records that come back (fail again) before the next goes; it stops by itself when too many do.
-- Audited with the operation: how it was watched (canary, verdict window, stop share), how many of its
-- records were published and came back, and why it stopped (null: it did not).
ALTER TABLE retry_dlq_audit
    ADD COLUMN IF NOT EXISTS watch     jsonb,
    ADD COLUMN IF NOT EXISTS published bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS came_back bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS stopped   text;
