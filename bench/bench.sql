-- Named queries of the benchmark harness (bench.measure); each starts with a "-- name:" line.
-- They run only in the throwaway benchmark database, never in a deployment's retry database.

-- name: bench_truncate
TRUNCATE retry_jobs, retry_published_jobs RESTART IDENTITY;

-- name: bench_max_id
SELECT coalesce(max(id), 0) FROM retry_jobs_all;

-- name: bench_autovacuum
-- Whether the server vacuums tables by itself (the capacity report says so when it does not).
SHOW autovacuum;

-- name: bench_analyze
-- After a bulk load: the statistics autovacuum would gather within a minute (the steady state).
ANALYZE retry_jobs;

-- name: bench_analyze_pgqueuer
ANALYZE pgqueuer;

-- name: bench_create_copy_table
-- The COPY baseline of the ingest benchmark: same columns, defaults, constraints and indexes.
CREATE TABLE bench_copy (LIKE retry_jobs INCLUDING ALL);

-- name: bench_drop_copy_table
DROP TABLE IF EXISTS bench_copy;

-- name: bench_copy_count
SELECT count(*) FROM bench_copy;

-- name: bench_export_rows
-- The rows an ingest run stored, as the binary COPY stream of the columns ingest writes.
COPY (
    SELECT source_topic, source_partition, source_offset, source_timestamp_ms, destination,
           destination_partition, msg_key, msg_value, headers, attempt, policy, reason, error_class,
           consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
           due_at, status, dead_reason, dlq_topic, dead_at
    FROM retry_jobs_all WHERE id > %(after_id)s ORDER BY id
) TO STDOUT (FORMAT BINARY);

-- name: bench_copy_rows
COPY bench_copy (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination,
    destination_partition, msg_key, msg_value, headers, attempt, policy, reason, error_class,
    consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
    due_at, status, dead_reason, dlq_topic, dead_at
) FROM STDIN (FORMAT BINARY);

-- name: bench_naive_select
-- The naive poller of hand-made retry services: due rows, oldest first, a page at a time.
SELECT id, destination, destination_partition, msg_key, msg_value, headers, attempt, policy, reason,
       error_class, consumer_group, retry_id, original_topic, original_partition, original_offset,
       (extract(epoch FROM first_seen_at) * 1000)::bigint, dead_reason, dlq_topic
FROM retry_jobs
WHERE status = 'pending' AND due_at <= now()
ORDER BY due_at
LIMIT %(limit)s;

-- name: bench_fill_history
-- Processed history for the claim benchmark, source offsets %(first)s..%(last)s: published (85 percent,
-- in retry_published_jobs, as the mark leaves them), dead and already on the DLQ (10 percent), and
-- pending jobs due in the future (5 percent), spread over the last week.
WITH history AS (
    SELECT 'bench.history' AS source_topic, mod(g, 3)::integer AS source_partition, g AS source_offset,
           0 AS source_timestamp_ms, 'bench.orders-' || mod(g, 8) AS destination,
           convert_to('order-' || g, 'UTF8') AS msg_key, convert_to(repeat(md5(g::text), 3), 'UTF8') AS msg_value,
           mod(g, 4)::integer AS attempt, 'default' AS policy,
           CASE WHEN mod(g, 20) IN (1, 2) THEN 'TimeoutError: payment service did not answer within 30 s' END AS reason,
           CASE WHEN mod(g, 20) IN (1, 2) THEN 'TimeoutError' END AS error_class,
           'orders-service' AS consumer_group, md5(g::text) AS retry_id, 'bench.orders-' || mod(g, 8) AS original_topic,
           t.at AS first_seen_at, t.due AS due_at,
           (CASE mod(g, 20) WHEN 0 THEN 'pending' WHEN 1 THEN 'dead' WHEN 2 THEN 'dead' ELSE 'published' END)::retry_job_status AS status,
           CASE WHEN mod(g, 20) IN (1, 2) THEN 'exhausted' END AS dead_reason,
           'retry.dlq' AS dlq_topic,
           CASE WHEN mod(g, 20) > 2 THEN t.due + interval '10 milliseconds' END AS published_at,
           CASE WHEN mod(g, 20) IN (1, 2) THEN t.at END AS dead_at,
           CASE WHEN mod(g, 20) IN (1, 2) THEN t.at + interval '10 milliseconds' END AS dlq_published_at
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,
         LATERAL (
             SELECT now() - mod(g, 604800) * interval '1 second' AS at,
                    CASE WHEN mod(g, 20) = 0 THEN now() + interval '1 day' + mod(g, 3600) * interval '1 second'
                         ELSE now() - mod(g, 604800) * interval '1 second' + interval '10 seconds' END AS due
         ) AS t
), published AS (
    INSERT INTO retry_published_jobs (
        id, source_topic, source_partition, source_offset, source_timestamp_ms, destination, msg_key, msg_value,
        attempt, policy, reason, error_class, consumer_group, retry_id, original_topic, first_seen_at, due_at,
        status, dead_reason, dlq_topic, published_at, dead_at, dlq_published_at
    )
    SELECT nextval(pg_get_serial_sequence('retry_jobs', 'id')), source_topic, source_partition, source_offset,
           source_timestamp_ms, destination, msg_key, msg_value, attempt, policy, reason, error_class,
           consumer_group, retry_id, original_topic, first_seen_at, due_at, status, dead_reason, dlq_topic,
           published_at, dead_at, dlq_published_at
    FROM history WHERE status = 'published'
)
INSERT INTO retry_jobs (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination, msg_key, msg_value,
    attempt, policy, reason, error_class, consumer_group, retry_id, original_topic, first_seen_at, due_at,
    status, dead_reason, dlq_topic, published_at, dead_at, dlq_published_at
)
SELECT source_topic, source_partition, source_offset, source_timestamp_ms, destination, msg_key, msg_value,
       attempt, policy, reason, error_class, consumer_group, retry_id, original_topic, first_seen_at, due_at,
       status, dead_reason, dlq_topic, published_at, dead_at, dlq_published_at
FROM history WHERE status <> 'published';

-- name: bench_fill_due
-- The due backlog of the claim benchmark: %(count)s pending jobs due over the last minute.
INSERT INTO retry_jobs (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination, msg_key, msg_value,
    attempt, policy, consumer_group, retry_id, original_topic, first_seen_at, due_at, status, dlq_topic
)
SELECT 'bench.due', mod(g, 3)::integer, g, 0, 'bench.orders-' || mod(g, 8),
       convert_to('due-' || g, 'UTF8'), convert_to(repeat(md5(g::text), 3), 'UTF8'),
       1, 'default', 'orders-service', md5('due' || g), 'bench.orders-' || mod(g, 8),
       now() - interval '2 minutes', now() - interval '1 minute' + g * interval '1 microsecond',
       'pending', 'retry.dlq'
FROM generate_series(1::bigint, %(count)s::bigint) AS g;

-- name: bench_vacuum_analyze
VACUUM (ANALYZE) retry_jobs, retry_published_jobs;

-- name: bench_table_size
SELECT count(*), pg_total_relation_size('retry_jobs') + pg_total_relation_size('retry_published_jobs')
FROM retry_jobs_all;

-- name: bench_fill_dead
-- The PySpark benchmark: %(count)s dead jobs of one destination, already on the DLQ topic, read from
-- %(source)s (offsets 1 to count).
INSERT INTO retry_jobs (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination, msg_key, msg_value,
    attempt, policy, reason, error_class, consumer_group, retry_id, original_topic, original_partition,
    first_seen_at, due_at, status, dead_reason, dlq_topic, dead_at, dlq_published_at
)
SELECT %(source)s, mod(g, 3)::integer, g, 0, %(destination)s,
       convert_to('order-' || g, 'UTF8'), convert_to(repeat(md5(g::text), 8), 'UTF8'),
       4, 'default', 'TimeoutError: payment service did not answer within 30 s', 'TimeoutError',
       'orders-service', md5(g::text), %(destination)s, mod(g, 3)::integer,
       now() - interval '2 hours', now() - interval '1 hour', 'dead', 'exhausted', 'retry.dlq',
       now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1::bigint, %(count)s::bigint) AS g;

-- name: bench_id_bounds
SELECT coalesce(min(id), 0), coalesce(max(id), -1) FROM retry_jobs_all;

-- name: bench_floor_bulk_read
-- PostgreSQL's part of bulk retry, alone: the job's read of its share of the selection, the columns
-- of include/spark/bulk_retry.py (OUTGOING_COLUMNS), as one binary stream.
COPY (
    SELECT id, destination, destination_partition, msg_key, msg_value, headers, attempt, policy, reason,
           error_class, consumer_group, retry_id, original_topic, original_partition, original_offset,
           (extract(epoch FROM first_seen_at) * 1000)::bigint, dead_reason, dlq_topic
    FROM retry_jobs
    WHERE status = 'dead' AND destination = %(destination)s AND id BETWEEN %(low)s AND %(high)s
) TO STDOUT (FORMAT binary);

-- name: bench_floor_bulk_mark
-- ... and its marking, in one statement for the share (the job sends batches of ids and ack times).
WITH moved AS (DELETE FROM retry_jobs WHERE id BETWEEN %(low)s AND %(high)s RETURNING *)
INSERT INTO retry_published_jobs (
    id, source_topic, source_partition, source_offset, source_timestamp_ms, destination,
    destination_partition, msg_key, msg_value, headers, attempt, policy, reason, error_class,
    consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
    due_at, status, dead_reason, dlq_topic, lease_until, claimed_by, publish_failures,
    last_error, published_at, dead_at, dlq_published_at, created_at, updated_at, held_by
)
SELECT id, source_topic, source_partition, source_offset, source_timestamp_ms, destination,
       destination_partition, msg_key, msg_value, headers, attempt, policy, reason, error_class,
       consumer_group, retry_id, original_topic, original_partition, original_offset, first_seen_at,
       due_at, 'published', NULL, dlq_topic, NULL, claimed_by, publish_failures,
       last_error, now(), dead_at, dlq_published_at, created_at, now(), held_by
FROM moved;

-- name: bench_floor_compact_read
-- PostgreSQL's part of compaction, alone: the job's read of every column of its share of the selection.
COPY (SELECT * FROM retry_jobs_all WHERE id BETWEEN %(low)s AND %(high)s) TO STDOUT (FORMAT binary);

-- name: bench_floor_compact_delete
-- ... and its delete, in one statement for the share (the job deletes in bounded batches).
DELETE FROM retry_published_jobs WHERE id BETWEEN %(low)s AND %(high)s;

-- name: bench_lateness
-- Publish lateness (acknowledgement minus due time) of every retry of the lateness benchmark.
SELECT retry_lateness_s(published_at, due_at)
FROM retry_jobs_all WHERE destination = %(destination)s AND status = 'published';

-- name: bench_lateness_timeline
-- Lateness of a destination's published jobs second by second of their due time: how many fell due
-- in that second, their p99 and their worst (where a step's p99 comes from, and when).
SELECT floor(extract(epoch FROM due_at))::float8 AS due_second, count(*),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)),
       max(retry_lateness_s(published_at, due_at))
FROM retry_jobs_all WHERE destination = %(destination)s AND status = 'published'
GROUP BY 1 ORDER BY 1;

-- name: bench_lateness_slices
-- A destination's published jobs by slices of %(width)s s of due time from %(since)s (epoch s): the
-- slice's start (seconds from %(since)s), how many, their p99 lateness (whether lateness stays flat).
SELECT floor((extract(epoch FROM due_at) - %(since)s) / %(width)s)::float8 * %(width)s, count(*),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at))
FROM retry_jobs_all WHERE destination = %(destination)s AND status = 'published'
GROUP BY 1 ORDER BY 1;

-- name: bench_store_times
-- When a destination's jobs were stored (their ingest transactions' starts, epoch s), each once, in
-- order: a long time between two is a time the ingest stored nothing.
SELECT DISTINCT extract(epoch FROM created_at)::float8 FROM retry_jobs_all
WHERE destination = %(destination)s ORDER BY 1;

-- name: bench_task_times
-- (Airflow's metadata database) When the retry_scheduler DAG's tasks started and ended around a window:
-- a loop ends when the one that started after it takes over (the handover).
SELECT task_id, extract(epoch FROM start_date)::float8, extract(epoch FROM end_date)::float8
FROM task_instance
WHERE dag_id = 'retry_scheduler' AND start_date < to_timestamp(%(until)s)
  AND (end_date IS NULL OR end_date >= to_timestamp(%(since)s))
ORDER BY start_date;

-- name: bench_live_loops
-- The ingest and publish loops alive: each leaves retry_loops after its last round, and one killed
-- stops beating (retry_scheduler.loops.handover.ALIVE_S).
SELECT count(*) FROM retry_loops WHERE heartbeat_at > clock_timestamp() - interval '5 seconds';

-- name: bench_published_span
-- Seconds from the first to the last acknowledgement of a destination's published jobs.
SELECT extract(epoch FROM max(published_at) - min(published_at))::float8
FROM retry_jobs_all WHERE destination = %(destination)s AND status = 'published';

-- name: bench_table_state
-- retry_jobs' dead and live rows (the server's statistics), its size and its due index's, and the age
-- (in transactions) of the oldest snapshot any session holds: what a held snapshot keeps from VACUUM.
SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), pg_relation_size('retry_jobs'),
       pg_relation_size('retry_jobs_due_idx'),
       (SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL)
FROM pg_stat_user_tables AS s WHERE s.relname = 'retry_jobs';

-- name: bench_slow_statements
-- Statements of the benchmark's database running longer than %(over_s)s seconds, and sessions waiting
-- for a lock, besides the held snapshot's own (a window's stall says where it waited): the
-- application, its state (idle in transaction: a publisher waiting for the broker with its claim
-- locked), what it waits on, for how long, and the statement.
SELECT coalesce(nullif(a.application_name, ''), a.backend_type), a.state,
       coalesce(a.wait_event_type || ':' || a.wait_event, ''),
       round(extract(epoch FROM clock_timestamp() - a.query_start)::numeric, 1)::float8,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 120)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.state <> 'idle'
  AND a.query <> 'SELECT count(*) FROM retry_jobs'
  AND (clock_timestamp() - a.query_start > %(over_s)s * interval '1 second' OR a.wait_event_type = 'Lock')
ORDER BY a.query_start;

-- name: bench_pg_activity
-- PostgreSQL's cumulative work so far, for the soak's drift per 1 000 retries: the service database's
-- block reads and hits, rows read and written; retry_jobs' scans, autovacuum and autoanalyze runs; the
-- checkpoints and the buffers they wrote; the WAL written (records, full-page images, bytes); and each
-- table's rows read by sequential scans and fetched through indexes. Which of these grows per retry as
-- the run goes on says where a rising CPU per retry goes.
SELECT jsonb_build_object(
    'blocks read', d.blks_read, 'blocks hit', d.blks_hit, 'rows returned', d.tup_returned,
    'rows fetched', d.tup_fetched, 'rows inserted', d.tup_inserted, 'rows updated', d.tup_updated,
    'rows deleted', d.tup_deleted, 'commits', d.xact_commit,
    'retry_jobs seq scans', t.seq_scan, 'retry_jobs seq rows read', t.seq_tup_read,
    'retry_jobs index scans', t.idx_scan, 'retry_jobs index rows fetched', t.idx_tup_fetch,
    'retry_jobs HOT updates', t.n_tup_hot_upd, 'retry_jobs autovacuums', t.autovacuum_count,
    'retry_jobs autoanalyzes', t.autoanalyze_count,
    'checkpoints', b.checkpoints_timed + b.checkpoints_req, 'checkpoint buffers', b.buffers_checkpoint,
    'bgwriter buffers', b.buffers_clean, 'backend buffers written', b.buffers_backend,
    'WAL records', w.wal_records, 'WAL full-page images', w.wal_fpi, 'WAL bytes', w.wal_bytes)
    || (SELECT jsonb_object_agg(relname || ' seq rows read', seq_tup_read)
               || jsonb_object_agg(relname || ' index rows fetched', coalesce(idx_tup_fetch, 0))
        FROM pg_stat_user_tables)
FROM pg_stat_database AS d, pg_stat_user_tables AS t, pg_stat_bgwriter AS b, pg_stat_wal AS w
WHERE d.datname = current_database() AND t.relname = 'retry_jobs';

-- name: bench_published_due_between
-- A destination's published jobs due from %(since)s to %(until)s (epoch s), and the seconds from the
-- first one's due time to the last one's acknowledgement.
SELECT count(*), extract(epoch FROM max(published_at) - min(due_at))::float8
FROM retry_jobs_all
WHERE destination = %(destination)s AND status = 'published'
  AND due_at >= to_timestamp(%(since)s) AND due_at < to_timestamp(%(until)s);

-- name: bench_burst_summary
-- A destination's jobs: stored, published, early; the last one stored (epoch s, its ingest
-- transaction's start), the first and last due time, the last acknowledgement, the p99 and worst lateness.
SELECT count(*), count(*) FILTER (WHERE status = 'published'),
       count(*) FILTER (WHERE retry_lateness_s(published_at, due_at) < 0),
       extract(epoch FROM max(created_at))::float8,
       extract(epoch FROM min(due_at))::float8, extract(epoch FROM max(due_at))::float8,
       extract(epoch FROM max(published_at))::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)),
       max(retry_lateness_s(published_at, due_at))
FROM retry_jobs_all WHERE destination = %(destination)s;

-- name: bench_topic_stored
-- Records the service's ingest stored from %(topic)s so far: its next offsets summed (saved in the
-- transaction of the rows). O(partitions): the burst polls it while it is measured, and a count of
-- the stored rows would scan them all (a million) every half second on the two cores it measures.
SELECT coalesce(sum(next_offset), 0) FROM retry_ingest_offsets WHERE topic = %(topic)s;

-- name: bench_destination_waiting
-- Whether any job of a destination is still pending (one descent of the destination's due index).
SELECT EXISTS (SELECT 1 FROM retry_jobs WHERE destination = %(destination)s AND status = 'pending');

-- name: bench_lateness_between
-- A destination's published jobs due from %(since)s to %(until)s (epoch s): how many, their p99 and
-- worst lateness (due -> acknowledged), how many were early, and the p99 and worst of send -> stored
-- (the record's timestamp, first_seen_at for a first failure, to its ingest transaction's start).
SELECT count(*),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)),
       max(retry_lateness_s(published_at, due_at)),
       count(*) FILTER (WHERE retry_lateness_s(published_at, due_at) < 0),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM created_at - first_seen_at))::float8,
       max(extract(epoch FROM created_at - first_seen_at))::float8
FROM retry_jobs_all
WHERE destination = %(destination)s AND status = 'published'
  AND due_at >= to_timestamp(%(since)s) AND due_at < to_timestamp(%(until)s);

-- name: bench_stored_to_published
-- A destination's published jobs: how many, and the p50, p99 and worst of stored (their ingest
-- transaction's start) -> acknowledged; for jobs stored after their due time, the time they waited.
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8,
       max(extract(epoch FROM published_at - created_at))::float8,
       count(*) FILTER (WHERE due_at > created_at)
FROM retry_jobs_all
WHERE destination = %(destination)s AND status = 'published';

-- name: bench_stored_published_per_second
-- A destination's jobs second by second (epoch s): how many were stored (their ingest transaction
-- began) and how many acknowledged in it.
SELECT second, sum(stored)::bigint, sum(published)::bigint FROM (
    SELECT floor(extract(epoch FROM created_at))::float8 AS second, 1 AS stored, 0 AS published
    FROM retry_jobs_all WHERE destination = %(destination)s
    UNION ALL
    SELECT floor(extract(epoch FROM published_at))::float8, 0, 1
    FROM retry_jobs_all WHERE destination = %(destination)s AND status = 'published'
) AS events GROUP BY second ORDER BY second;

-- name: bench_published_after
-- A destination's jobs acknowledged after %(after)s (epoch s).
SELECT count(*) FROM retry_jobs_all
WHERE destination = %(destination)s AND status = 'published' AND published_at > to_timestamp(%(after)s);
