-- Named queries of retry_monitor (retry_scheduler.ops.monitor, through retry_scheduler.db.store.Store).
-- The oldest overdue job and the publish lateness reuse oldest_overdue and lateness (queries.sql).

-- name: monitor_dead_recent
-- Jobs that went dead in the last window and are still dead (a replayed or purged job no longer
-- counts), per destination, busiest first; retry_jobs_dead_recent_idx keeps it cheap.
SELECT coalesce(destination, '(none)'), count(*)::bigint
FROM retry_jobs
WHERE status = 'dead' AND dead_at >= clock_timestamp() - %(window_s)s * interval '1 second'
GROUP BY destination
ORDER BY 2 DESC, 1;

-- name: monitor_stuck_delivery
-- The delivery that has waited longest: a pending job whose deliveries failed (waiting since its
-- due time), or a dead job not yet on its DLQ topic (since it died), with the broker's last error.
SELECT id, target, failures, last_error, waited_s
FROM (
    SELECT id, destination AS target, publish_failures AS failures, last_error,
           extract(epoch FROM clock_timestamp() - due_at)::float8 AS waited_s
    FROM retry_jobs WHERE status = 'pending' AND publish_failures > 0
    UNION ALL
    SELECT id, dlq_topic, publish_failures, last_error,
           extract(epoch FROM clock_timestamp() - dead_at)::float8
    FROM retry_jobs WHERE status = 'dead' AND dlq_published_at IS NULL
) AS stuck
ORDER BY waited_s DESC
LIMIT 1;

-- name: monitor_deliveries
-- Per topic: dead jobs not yet on their DLQ topic longer than the grace after they died (per DLQ
-- topic), and pending jobs whose last deliveries to their destination failed at least %(failures)s
-- times in a row (per destination), with the broker's last error of the job failing most. Only jobs
-- with a failed delivery or a DLQ delivery to do are read (the pending index, retry_jobs_dlq_todo_idx).
SELECT target,
       sum(undelivered)::bigint,
       sum(failing)::bigint,
       (array_agg(last_error ORDER BY failures DESC) FILTER (WHERE last_error IS NOT NULL))[1]
FROM (
    SELECT destination AS target, 0 AS undelivered, (publish_failures >= %(failures)s)::int AS failing,
           publish_failures AS failures, last_error
    FROM retry_jobs WHERE status = 'pending' AND publish_failures > 0
    UNION ALL
    SELECT dlq_topic, (dead_at < clock_timestamp() - %(grace_s)s * interval '1 second')::int, 0,
           publish_failures, last_error
    FROM retry_jobs WHERE status = 'dead' AND dlq_published_at IS NULL
) AS deliveries
GROUP BY target
HAVING sum(undelivered) > 0 OR sum(failing) > 0
ORDER BY sum(undelivered) + sum(failing) DESC, target;

-- name: monitor_now
SELECT clock_timestamp();

-- name: alert_ensure
-- One row per check, created on first use, so that alert_lock has a row to lock.
INSERT INTO retry_alerts (check_name)
SELECT unnest(%(checks)s::text[])
ON CONFLICT (check_name) DO NOTHING;

-- name: alert_lock
-- The incident state of the checks, locked until the run commits: an overlapping run waits here and
-- then sees the committed state, so an incident is announced once. "announced": a notification
-- went out after the incident started.
SELECT check_name, firing, since, coalesce(notified_at >= since, false)
FROM retry_alerts
WHERE check_name = ANY(%(checks)s::text[])
ORDER BY check_name
FOR UPDATE;

-- name: alert_update
UPDATE retry_alerts
SET firing = %(firing)s,
    since = %(since)s,
    value = %(value)s,
    threshold = %(threshold)s,
    message = %(message)s,
    notified_at = CASE WHEN %(notified)s THEN clock_timestamp() ELSE notified_at END,
    resolved_at = CASE WHEN %(resolved)s THEN clock_timestamp() ELSE resolved_at END,
    updated_at = clock_timestamp()
WHERE check_name = %(check)s;

-- name: monitor_share_letters
-- Letters of share groups' dead-letter topics (%(topics)s) stored in the last window, per source
-- topic (the letter's original topic): the largest age their source record had when it was read
-- (the store time less the record's own time: a copied letter's is its own, near 0) and the letters
-- kept without their record because it could not be read. The topics' rows come by their unique
-- key's leading column.
SELECT original_topic,
       coalesce(max(extract(epoch FROM created_at - first_seen_at)::float8)
                FILTER (WHERE destination IS NOT NULL), 0),
       count(*) FILTER (WHERE destination IS NULL AND dead_reason = 'adopted')::bigint
FROM retry_jobs_all
WHERE source_topic = ANY(%(topics)s::text[])
  AND created_at >= clock_timestamp() - %(window_s)s * interval '1 second'
  AND original_topic IS NOT NULL
GROUP BY original_topic
ORDER BY original_topic;

-- name: monitor_adopted_recent
-- Letters read from other tools' dead-letter topics (%(topics)s) in the last window, per topic.
SELECT source_topic, count(*)::bigint
FROM retry_jobs_all
WHERE source_topic = ANY(%(topics)s::text[])
  AND created_at >= clock_timestamp() - %(window_s)s * interval '1 second'
GROUP BY source_topic
ORDER BY source_topic;
