-- Fair publishing (issue 28's burst, issue 33): a destination with a million due jobs must not delay
-- another destination's few. The publish loop claims the oldest due jobs first (retry_jobs_due_idx);
-- while that claim is behind (a backlog), it also claims, for every other destination it knows of, that
-- destination's oldest due jobs (a lane: Publisher.claim_lanes), through this index: one descent per
-- destination, however large the backlog of the others.
CREATE INDEX retry_jobs_destination_due_idx ON retry_jobs (destination, due_at) WHERE status = 'pending';

-- The destinations jobs were stored for: the ingest adds one the first time a process stores a job
-- for it (nothing is written for destinations it knows), so that a destination whose first job arrives
-- during another's backlog has a lane too. Rows are only added (a destination no longer used costs
-- each backlog round one index descent that finds nothing).
CREATE TABLE retry_destinations (
    destination   text        PRIMARY KEY,
    first_seen_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO retry_destinations (destination)
SELECT DISTINCT destination FROM retry_jobs WHERE destination IS NOT NULL
ON CONFLICT DO NOTHING;
