-- Dead-letter operations (retry_scheduler.ops.dlq, through retry_scheduler.db.dead_letters): browse, replay, purge, audit.
-- {where} is a Selection's filter (retry_scheduler.db.selection): fixed fragments with parameters, ANDed;
-- it always starts with status = 'dead'.

-- name: dlq_page
-- Newest first; keyset pagination on (dead_at, id) so page 1 000 costs what page 1 costs.
SELECT id, dead_at, destination, dead_reason, error_class, left(reason, 300), attempt, policy, retry_id,
       dlq_topic, dlq_published_at, first_seen_at, octet_length(msg_value), source_topic
FROM retry_jobs
WHERE {where}
  AND (%(after_at)s::timestamptz IS NULL OR (dead_at, id) < (%(after_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY dead_at DESC, id DESC
LIMIT %(page_size)s;

-- name: dlq_count
-- Counting a million rows on every page view would make the page slow: count up to a cap.
SELECT count(*) FROM (SELECT 1 FROM retry_jobs WHERE {where} LIMIT %(cap)s) AS capped;

-- name: dlq_facets
-- Dead jobs by destination and reason (the filter menus), from the partial index.
SELECT coalesce(destination, ''), dead_reason, count(*)
FROM retry_jobs WHERE status = 'dead'
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: dlq_job
SELECT id, status::text, source_topic, source_partition, source_offset, source_timestamp_ms, destination,
       destination_partition, msg_key, msg_value, headers, attempt, policy, reason, error_class,
       consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
       due_at, dead_reason, dead_at, dlq_topic, dlq_published_at, published_at, publish_failures,
       last_error, lease_until
FROM retry_jobs_all WHERE id = %(id)s;

-- name: dlq_plan_destinations
-- The destinations a replay of the filter would publish to (oldest first, up to the limit) and how
-- many jobs each: checked against the destination rules before anything is replayed, and the
-- replay's pace worked out.
SELECT destination, count(*)
FROM (
    SELECT destination, dead_reason FROM retry_jobs WHERE {where} ORDER BY id LIMIT %(limit)s
) AS selected
WHERE destination IS NOT NULL AND dead_reason <> 'invalid' AND (dead_reason <> 'parked' OR %(with_parked)s)
GROUP BY destination;

-- name: dlq_plan
-- What a replay or purge of the filter would do: the jobs it selects (oldest first, up to the
-- limit) and why some of them would be left alone (%(refused)s: destinations no longer allowed;
-- parked jobs, unless %(with_parked)s: the filter asked for them).
SELECT count(*),
       count(*) FILTER (WHERE destination IS NULL OR dead_reason = 'invalid'),
       count(*) FILTER (WHERE dlq_published_at IS NULL),
       count(*) FILTER (WHERE lease_until >= clock_timestamp()),
       count(*) FILTER (WHERE destination = ANY(%(refused)s::text[]) AND dead_reason <> 'invalid'
                          AND (lease_until IS NULL OR lease_until < clock_timestamp())),
       count(*) FILTER (WHERE dead_reason = 'parked' AND NOT %(with_parked)s AND destination IS NOT NULL
                          AND NOT (destination = ANY(%(refused)s::text[]))
                          AND (lease_until IS NULL OR lease_until < clock_timestamp()))
FROM (
    SELECT destination, dead_reason, dlq_published_at, lease_until FROM retry_jobs
    WHERE {where} ORDER BY id LIMIT %(limit)s
) AS selected;

-- name: dlq_replay_batch
-- Make a batch of dead jobs due; the publish loop sends them to their destination with attempt + 1
-- (attempt reset to 0 first when asked). Invalid jobs have no usable destination, jobs of a
-- destination no longer allowed (%(refused)s) stay dead, so do parked jobs unless the filter asked for
-- them (%(with_parked)s), and a job being sent to the DLQ topic right now (leased) is left for the next try. Unpaced (%(rate)s null) every job is due now; paced, the
-- n-th job of a destination (counting %(sent)s, the jobs of each replayed by earlier batches) is due
-- (n - 1) / rate seconds after %(start)s, and never before now. %(rates)s: the destinations whose
-- rate limit (RATE_LIMITS) is below the replay's pace, and theirs.
WITH picked AS (
    SELECT id, destination FROM retry_jobs
    WHERE {where} AND id > %(after_id)s
      AND destination IS NOT NULL AND dead_reason <> 'invalid'
      AND (dead_reason <> 'parked' OR %(with_parked)s)
      AND NOT (destination = ANY(%(refused)s::text[]))
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), rated AS (
    SELECT id, destination, coalesce((%(rates)s::jsonb ->> destination)::float8, %(rate)s::float8) AS rate
    FROM picked
), paced AS (
    SELECT id,
           CASE WHEN rate IS NULL THEN clock_timestamp()
                ELSE greatest(statement_timestamp(),
                    coalesce(%(start)s::timestamptz, statement_timestamp()) + make_interval(secs =>
                        (coalesce((%(sent)s::jsonb ->> destination)::bigint, 0)
                         + row_number() OVER (PARTITION BY destination ORDER BY id) - 1) / rate))
           END AS due_at
    FROM rated
)
UPDATE retry_jobs AS j
SET status = 'pending', dead_reason = NULL, due_at = paced.due_at,
    attempt = CASE WHEN %(reset_attempts)s THEN 0 ELSE j.attempt END,
    lease_until = NULL, claimed_by = NULL, publish_failures = 0, last_error = NULL, updated_at = now()
FROM paced
WHERE j.id = paced.id
RETURNING j.id, j.destination, statement_timestamp(), j.retry_id;

-- name: dlq_purge_batch
-- Delete a batch of dead jobs whose record is safely on the DLQ topic; a job not yet published
-- there exists nowhere else and is kept.
WITH picked AS (
    SELECT id FROM retry_jobs
    WHERE {where} AND id > %(after_id)s AND dlq_published_at IS NOT NULL
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM retry_jobs AS j USING picked WHERE j.id = picked.id
RETURNING j.id;

-- name: dlq_replayable_ids
-- The ids a watched replay sends, oldest first (up to the limit), fixed before its first wave: what
-- dlq_replay_batch would replay of the filter (a job leased right now is left out with the rest).
SELECT array_agg(id ORDER BY id) FROM (
    SELECT id FROM retry_jobs
    WHERE {where}
      AND destination IS NOT NULL AND dead_reason <> 'invalid'
      AND (dead_reason <> 'parked' OR %(with_parked)s)
      AND NOT (destination = ANY(%(refused)s::text[]))
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY id LIMIT %(limit)s
) AS selected;

-- name: watch_mark
-- Where a wave's watch starts: any record stored after this (a larger id) was stored after the wave
-- was made due, so it can be a record of the wave that came back.
SELECT coalesce(max(id), 0) FROM retry_jobs_all;

-- name: watch_wave
-- A wave's jobs: how many are still pending (not yet published), how many were published, and when
-- the last was published and is due (both tables' primary keys; a wave is at most a batch of ids).
SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'published'),
       max(published_at), max(due_at) FILTER (WHERE status = 'pending'), clock_timestamp()
FROM retry_jobs_all WHERE id = ANY(%(ids)s::bigint[]);

-- name: watch_came_back
-- The records of a wave that came back: stored since its mark (a range of the primary keys: only
-- what was stored while the wave was watched) with a retry id of the wave, pending, dead or published
-- again since. Each counts once, however often it came back.
SELECT count(DISTINCT retry_id) FROM retry_jobs_all
WHERE id > %(mark)s AND retry_id = ANY(%(retry_ids)s::text[]);

-- name: watch_progress
UPDATE retry_dlq_audit SET published = %(published)s, came_back = %(came_back)s, stopped = %(stopped)s
WHERE id = %(audit_id)s;

-- name: dlq_selected_ids
-- The ids a limited replay or purge may touch (oldest first), fixed before the batches start.
SELECT array_agg(id ORDER BY id) FROM (
    SELECT id FROM retry_jobs WHERE {where} ORDER BY id LIMIT %(limit)s
) AS selected;

-- name: dlq_audit_start
INSERT INTO retry_dlq_audit (action, dry_run, actor, source, run_id, filter, reset_attempts, matched, skipped,
                             rate_per_s, watch, approval, approved_by)
VALUES (%(action)s, %(dry_run)s, %(actor)s, %(source)s, %(run_id)s, %(filter)s, %(reset_attempts)s,
        %(matched)s, %(skipped)s, %(rate_per_s)s, %(watch)s, CASE WHEN %(approved_by)s::text IS NOT NULL THEN 'approved' END,
        %(approved_by)s)
RETURNING id;

-- name: dlq_audit_approval
-- The approval gate's decision on the dry run a dlq_replay run showed its approver.
UPDATE retry_dlq_audit SET approval = %(approval)s, approved_by = %(approved_by)s WHERE id = %(audit_id)s;

-- name: dlq_audit_progress
UPDATE retry_dlq_audit SET affected = affected + %(affected)s WHERE id = %(audit_id)s;

-- name: dlq_audit_counted
-- A re-evaluation's count, known at its end (it reads its selection batch by batch).
UPDATE retry_dlq_audit SET matched = %(matched)s, skipped = %(skipped)s WHERE id = %(audit_id)s;

-- name: dlq_audit_finish
UPDATE retry_dlq_audit SET finished_at = clock_timestamp() WHERE id = %(audit_id)s
RETURNING affected;

-- name: dlq_audit_recent
SELECT id, at, action, dry_run, actor, source, run_id, filter, reset_attempts, matched, affected, skipped,
       rate_per_s, watch, published, came_back, stopped, approval, approved_by, finished_at
FROM retry_dlq_audit ORDER BY at DESC, id DESC LIMIT %(limit)s;

-- name: dlq_audit_of_run
-- What an Airflow run replayed: its latest audit row of that action (a retried task writes another).
SELECT id, at, action, dry_run, actor, source, run_id, filter, reset_attempts, matched, affected, skipped,
       rate_per_s, watch, published, came_back, stopped, approval, approved_by, finished_at
FROM retry_dlq_audit WHERE run_id = %(run_id)s AND action = %(action)s
ORDER BY id DESC LIMIT 1;

-- name: reevaluate_batch
-- The next batch of dead invalid jobs of the filter, as stored (their record as it came): what
-- re-evaluation reads (then locks with reevaluate_lock, unless it is a dry run); a job being sent to
-- the DLQ topic right now (leased) is left for the next try.
SELECT id, source_topic, source_partition, source_offset, source_timestamp_ms, msg_key, msg_value, headers
FROM retry_jobs
WHERE {where} AND id > %(after_id)s AND status = 'dead' AND dead_reason = 'invalid'
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
ORDER BY id
LIMIT %(batch)s;

-- name: reevaluate_count
-- How many dead invalid jobs of the filter a re-evaluation would read: the most it can make
-- pending (the Dead letters page hands a larger one to a dlq_replay run).
SELECT count(*) FROM retry_jobs WHERE {where} AND status = 'dead' AND dead_reason = 'invalid';

-- name: reevaluate_lock
SELECT id FROM retry_jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'dead' AND dead_reason = 'invalid'
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
FOR UPDATE SKIP LOCKED;

-- name: reevaluate_pending
-- Jobs that pass now: pending with what the current configuration makes of their record (its bytes
-- unchanged; the headers as any pending job keeps them, the retry.* ones parsed into columns).
UPDATE retry_jobs AS j
SET status = 'pending', dead_reason = NULL, dead_at = NULL,
    destination = r.destination, destination_partition = r.destination_partition, headers = r.headers,
    attempt = r.attempt, policy = r.policy, reason = r.reason, error_class = r.error_class,
    consumer_group = r.consumer_group, retry_id = r.retry_id, original_topic = r.original_topic,
    original_partition = r.original_partition, original_offset = r.original_offset,
    first_seen_at = r.first_seen_at, due_at = greatest(r.due_at, clock_timestamp()), dlq_topic = r.dlq_topic,
    lease_until = NULL, claimed_by = NULL, publish_failures = 0, last_error = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(destinations)s::text[], %(destination_partitions)s::int[],
            %(headers)s::bytea[], %(attempts)s::int[], %(policies)s::text[], %(reasons)s::text[],
            %(error_classes)s::text[], %(groups)s::text[], %(retry_ids)s::text[], %(original_topics)s::text[],
            %(original_partitions)s::int[], %(original_offsets)s::bigint[], %(first_seen)s::timestamptz[],
            %(due)s::timestamptz[], %(dlq_topics)s::text[])
     AS r(id, destination, destination_partition, headers, attempt, policy, reason, error_class,
          consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
          due_at, dlq_topic)
WHERE j.id = r.id
RETURNING j.id;

-- name: reevaluate_dead
-- Jobs that still do not pass: dead with what the current configuration says of them.
UPDATE retry_jobs AS j
SET dead_reason = r.dead_reason, reason = r.reason, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(dead_reasons)s::text[], %(reasons)s::text[]) AS r(id, dead_reason, reason)
WHERE j.id = r.id;
