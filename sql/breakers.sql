-- Destinations' breakers (BREAKERS in the policies module, migration 0024,
-- retry_scheduler.loops.breakers). A row is locked in destination order only, by one statement per
-- transaction (as pace_destinations): the publish rounds, the ingest and the breaker tick never deadlock.

-- name: breaker_states
-- The round's view of its destinations' breakers (no lock: the state changes only in the tick).
SELECT destination, breaker, probe_job FROM retry_destinations
WHERE destination = ANY(%(destinations)s::text[]) AND breaker <> 'closed';

-- name: breaker_pause
-- A round's claimed jobs of destinations whose breaker is open, paused: pending still, with their attempts,
-- due 9999-12-30 (never claimed) until the breaker lets them go; their own due time is kept in
-- retry_breaker_holds. Locked by the round's claim (see mark_published: no status test).
WITH paused AS (
    INSERT INTO retry_breaker_holds (id, destination, due_at)
    SELECT j.id, j.destination, j.due_at
    FROM retry_jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
UPDATE retry_jobs AS j SET due_at = %(breaker_due)s
FROM paused WHERE j.id = paused.id;

-- name: breaker_let_go
-- Up to %(limit)s of the jobs a destination's breaker paused, the oldest due first: due again at their
-- own due time (past, mostly: claimed at once). A job no longer paused there (dead since, by hand) only
-- leaves the table.
WITH gone AS (
    DELETE FROM retry_breaker_holds AS h
    WHERE h.id IN (
        SELECT id FROM retry_breaker_holds WHERE destination = %(destination)s
        ORDER BY due_at, id LIMIT %(limit)s
    )
    RETURNING h.id, h.due_at
)
UPDATE retry_jobs AS j SET due_at = gone.due_at
FROM gone
WHERE j.id = gone.id AND j.status = 'pending' AND j.due_at = %(breaker_due)s
RETURNING j.id, j.retry_id;

-- name: breaker_lock
-- The tick: the breakers' rows of %(destinations)s, locked, with what it weighs besides them: the
-- probe's acknowledgement time (published) and last delivery error, and whether it paused jobs.
SELECT d.destination, d.breaker, d.breaker_since, d.breaker_reason, d.breaker_by, d.breaker_trips, d.window_at,
       d.sent, d.failed, d.came_back, d.prev_sent, d.prev_failed, d.prev_came_back,
       d.probe_job, d.probe_retry_id, d.probe_at, d.probe_came_back,
       (SELECT p.published_at FROM retry_published_jobs AS p WHERE p.id = d.probe_job),
       (SELECT j.last_error FROM retry_jobs AS j WHERE j.id = d.probe_job AND j.publish_failures > 0),
       EXISTS (SELECT 1 FROM retry_breaker_holds AS h WHERE h.destination = d.destination)
FROM retry_destinations AS d
WHERE d.destination = ANY(%(destinations)s::text[])
ORDER BY d.destination
FOR UPDATE OF d;

-- name: breaker_save
UPDATE retry_destinations
SET breaker = %(state)s, breaker_since = %(since)s, breaker_reason = %(reason)s, breaker_by = %(by)s,
    breaker_trips = %(trips)s,
    window_at = %(window_at)s, sent = %(sent)s, failed = %(failed)s, came_back = %(came_back)s,
    prev_sent = %(prev_sent)s, prev_failed = %(prev_failed)s, prev_came_back = %(prev_came_back)s,
    probe_job = %(probe_job)s, probe_retry_id = %(probe_retry_id)s, probe_at = %(probe_at)s,
    probe_came_back = %(probe_came_back)s
WHERE destination = %(destination)s;

-- name: breaker_count_sent
-- After a round: the records it sent to destinations with a breaker, and the deliveries that failed.
WITH c AS (
    SELECT * FROM unnest(%(destinations)s::text[], %(sent)s::int[], %(failed)s::int[]) AS c(destination, sent, failed)
), locked AS (
    SELECT d.destination FROM retry_destinations AS d JOIN c USING (destination)
    ORDER BY d.destination FOR UPDATE OF d
)
UPDATE retry_destinations AS d
SET sent = d.sent + c.sent, failed = d.failed + c.failed
FROM c JOIN locked USING (destination)
WHERE d.destination = c.destination;

-- name: breaker_count_back
-- The ingest: records come back from destinations with a breaker (stored with an attempt above 0:
-- published by the service and failed again by their consumer), by retry.id; one of them the probe's
-- marks the probe come back.
WITH c AS (
    SELECT destination, count(*)::int AS n, array_agg(retry_id) AS ids
    FROM unnest(%(destinations)s::text[], %(retry_ids)s::text[]) AS c(destination, retry_id)
    GROUP BY destination
), locked AS (
    SELECT d.destination FROM retry_destinations AS d JOIN c USING (destination)
    ORDER BY d.destination FOR UPDATE OF d
)
UPDATE retry_destinations AS d
SET came_back = d.came_back + c.n,
    probe_came_back = d.probe_came_back OR coalesce(d.probe_retry_id = ANY(c.ids), false)
FROM c JOIN locked USING (destination)
WHERE d.destination = c.destination;

-- name: breaker_list
-- Every breaker not closed, or with jobs still paused, or of %(destinations)s: its state, since when and
-- why, how often it opened, the jobs it paused and the oldest one's wait, the probe.
SELECT d.destination, d.breaker, d.breaker_since, d.breaker_reason, d.breaker_by, d.breaker_trips,
       coalesce(h.paused, 0), extract(epoch FROM clock_timestamp() - h.oldest)::float8,
       d.probe_retry_id, d.probe_at, d.sent, d.failed, d.came_back
FROM retry_destinations AS d
LEFT JOIN (
    SELECT destination, count(*) AS paused, min(held_at) AS oldest FROM retry_breaker_holds GROUP BY destination
) AS h USING (destination)
WHERE d.breaker <> 'closed' OR h.paused > 0 OR d.destination = ANY(%(destinations)s::text[])
ORDER BY d.destination;

-- name: breaker_paused_destinations
-- The destinations some of whose jobs a breaker paused (one index probe per destination).
SELECT d.destination FROM retry_destinations AS d
WHERE EXISTS (SELECT 1 FROM retry_breaker_holds AS h WHERE h.destination = d.destination)
ORDER BY d.destination;

-- name: breaker_set
-- An operator's `breakers open|close`: the state set by hand (the tick lets the paused jobs of a closed
-- breaker go; one opened by hand stays open until closed by hand); the counts start again.
UPDATE retry_destinations
SET breaker = %(state)s, breaker_since = clock_timestamp(), breaker_reason = %(reason)s,
    breaker_by = CASE WHEN %(state)s = 'open' THEN %(by)s END,
    breaker_trips = breaker_trips + CASE WHEN %(state)s = 'open' THEN 1 ELSE 0 END,
    window_at = clock_timestamp(), sent = 0, failed = 0, came_back = 0, prev_sent = 0, prev_failed = 0,
    prev_came_back = 0, probe_job = NULL, probe_retry_id = NULL, probe_at = NULL, probe_came_back = false
WHERE destination = ANY(%(destinations)s::text[])
RETURNING destination;
