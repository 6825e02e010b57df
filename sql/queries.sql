-- Named queries used by retry_scheduler.db.store; each starts with a "-- name:" line.
-- Python passes parameters; it never formats SQL.

-- name: copy_jobs
-- The ingest loop's write: new jobs straight into retry_jobs (columns: retry_scheduler.core.jobs.COPY_COLUMNS).
COPY retry_jobs (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination, destination_partition,
    msg_key, msg_value, headers, attempt, policy, reason, error_class, consumer_group, retry_id,
    original_topic, original_partition, original_offset, first_seen_at, due_at, status, dead_reason,
    dlq_topic, dead_at, held_by
) FROM STDIN (FORMAT BINARY);

-- name: save_ingest_offsets
-- In the transaction of the rows: the next offset to read from each partition of the batch.
INSERT INTO retry_ingest_offsets (consumer_group, topic, partition, next_offset)
SELECT %(group)s, t, p, o
FROM unnest(%(topics)s::text[], %(partitions)s::integer[], %(offsets)s::bigint[]) AS x(t, p, o)
ON CONFLICT (consumer_group, topic, partition)
DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = clock_timestamp();

-- name: ingested_record_timestamp
-- The timestamp of the record stored from this offset of a retry topic, if its row is still here.
SELECT source_timestamp_ms FROM retry_jobs_all
WHERE source_topic = %(topic)s AND source_partition = %(partition)s AND source_offset = %(offset)s
LIMIT 1;

-- name: database_identity
-- The database's own id (migration 0027), the mark of the ingest's Kafka offset commits.
SELECT id::text FROM retry_database_identity;

-- name: ingest_offsets
SELECT topic, partition, next_offset FROM retry_ingest_offsets WHERE consumer_group = %(group)s;

-- name: ingest_offsets_of
-- The next offsets stored of these partitions (Store._maybe_stored), in the batch's transaction.
SELECT o.topic, o.partition, o.next_offset
FROM unnest(%(topics)s::text[], %(partitions)s::integer[]) AS k(topic, partition)
JOIN retry_ingest_offsets AS o
  ON o.consumer_group = %(group)s AND o.topic = k.topic AND o.partition = k.partition;

-- name: create_stage
-- Only when a batch holds records stored already (read again from Kafka's offsets): the batch goes
-- through this table, and the records stored already are skipped.
CREATE TEMP TABLE IF NOT EXISTS retry_jobs_stage (
    source_topic text, source_partition integer, source_offset bigint, source_timestamp_ms bigint,
    destination text, destination_partition integer,
    msg_key bytea, msg_value bytea, headers bytea,
    attempt integer, policy text, reason text, error_class text, consumer_group text, retry_id text,
    original_topic text, original_partition integer, original_offset bigint,
    first_seen_at timestamptz, due_at timestamptz, status retry_job_status, dead_reason text, dlq_topic text,
    dead_at timestamptz, held_by text
) ON COMMIT DELETE ROWS;

-- name: copy_stage
COPY retry_jobs_stage FROM STDIN (FORMAT BINARY);

-- name: insert_from_stage
-- Returns the dead reason (NULL: pending) of each row actually stored. A record stored already is
-- skipped whether its job is still in retry_jobs (the unique source key) or was published since.
INSERT INTO retry_jobs (
    source_topic, source_partition, source_offset, source_timestamp_ms, destination, destination_partition,
    msg_key, msg_value, headers, attempt, policy, reason, error_class, consumer_group, retry_id,
    original_topic, original_partition, original_offset, first_seen_at, due_at, status, dead_reason,
    dlq_topic, dead_at, held_by
)
SELECT * FROM retry_jobs_stage AS s
WHERE NOT EXISTS (
    SELECT 1 FROM retry_published_jobs AS p
    WHERE p.source_topic = s.source_topic AND p.source_partition = s.source_partition
      AND p.source_offset = s.source_offset AND p.source_timestamp_ms = s.source_timestamp_ms
)
ON CONFLICT (source_topic, source_partition, source_offset, source_timestamp_ms) DO NOTHING
RETURNING dead_reason;

-- name: claim_due
-- Lock due rows nobody else holds, for the caller's transaction; nothing is written. The publisher
-- produces them and marks the acknowledged ones published before it commits. If it dies first, its
-- session ends, the locks go with it and the jobs are due again at once (at-least-once). Here
-- lease_until is only the backoff of a failed delivery.
-- statement_timestamp() is stable, so "due_at <=" bounds the scan of retry_jobs_due_idx: it stops
-- at the first job not yet due however many are pending later (clock_timestamp(), volatile, was a
-- filter: every claim read every future job). Nothing is early: the statement starts before any
-- row it returns is produced. Store.claim_due also pins the plan to that index (see there).
-- %(floor)s, where the publisher knows nothing is left to claim below it ('-infinity' for a sweep,
-- which claims every due job however old), is where the scan starts: the entries of jobs published
-- since the oldest snapshot any session holds cannot be marked dead, and a scan from the index's
-- head walks every one of them (Publisher.claim_floor).
SELECT id, destination, destination_partition, msg_key, msg_value, headers, attempt,
       policy, reason, error_class, consumer_group, retry_id, original_topic,
       original_partition, original_offset, (extract(epoch FROM first_seen_at) * 1000)::bigint,
       dead_reason, dlq_topic, held_by, due_at,
       CASE WHEN held_by IS NOT NULL THEN (SELECT why || coalesce(':' || head, '') FROM retry_released_holds WHERE blocker = held_by AND why <> 'blocked')
            WHEN dead_at IS NOT NULL THEN 'replayed' END
FROM retry_jobs
WHERE status = 'pending'
  AND due_at >= %(floor)s::timestamptz
  AND due_at <= statement_timestamp()
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
ORDER BY due_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: claim_lanes
-- Fair publishing (Publisher.claim_lanes): while claim_due is behind, up to %(quota)s of the oldest due
-- jobs of each destination in %(destinations)s, each from its own floor (see claim_due), through
-- retry_jobs_destination_due_idx: one descent per destination, however many jobs of other destinations
-- are due before them. Locks only, as claim_due (same transaction, same pinned plan).
SELECT j.*
FROM unnest(%(destinations)s::text[], %(floors)s::timestamptz[]) AS d(destination, floor)
CROSS JOIN LATERAL (
    SELECT id, destination, destination_partition, msg_key, msg_value, headers, attempt,
           policy, reason, error_class, consumer_group, retry_id, original_topic,
           original_partition, original_offset, (extract(epoch FROM first_seen_at) * 1000)::bigint,
           dead_reason, dlq_topic, held_by, due_at,
           CASE WHEN held_by IS NOT NULL
                THEN (SELECT why || coalesce(':' || head, '') FROM retry_released_holds WHERE blocker = held_by AND why <> 'blocked')
                WHEN dead_at IS NOT NULL THEN 'replayed' END
    FROM retry_jobs
    WHERE status = 'pending'
      AND destination = d.destination
      AND due_at >= d.floor
      AND due_at <= statement_timestamp()
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY due_at
    LIMIT %(quota)s
    FOR UPDATE SKIP LOCKED
) AS j;

-- name: pace_destinations
-- Rate limits (migration 0022): of the %(counts)s jobs of each rate-limited destination a round claimed,
-- how many it may publish now (n), and from when the rest are due, 1 / rate seconds apart. A destination
-- idle for a while may send %(burst_s)s seconds' worth at once, then one record every 1 / rate seconds.
-- Its row stays locked until the round's transaction ends (locked in name order: publishers never
-- deadlock); a round that dies leaves the slots as they were.
WITH asked AS (
    SELECT * FROM unnest(%(destinations)s::text[], %(counts)s::int[], %(rates)s::float8[]) AS a(destination, k, rate)
), cur AS (
    SELECT d.destination, a.k, a.rate, d.deferred_until, clock_timestamp() AS now,
           greatest(coalesce(d.next_slot, '-infinity'::timestamptz),
                    clock_timestamp() - make_interval(secs => %(burst_s)s::float8)) AS start
    FROM retry_destinations AS d JOIN asked AS a USING (destination)
    ORDER BY d.destination
    FOR UPDATE OF d
), plan AS (
    SELECT destination, k, rate, deferred_until, start,
           least(k, greatest(0, floor(extract(epoch FROM now - start)::float8 * rate)::int + 1)) AS n
    FROM cur
), slots AS (
    SELECT destination, k, rate, n, start + make_interval(secs => n / rate) AS next_slot,
           greatest(coalesce(deferred_until, '-infinity'::timestamptz), start + make_interval(secs => n / rate))
               AS defer_from
    FROM plan
)
UPDATE retry_destinations AS d
SET next_slot = s.next_slot,
    deferred_until = CASE WHEN s.k > s.n THEN s.defer_from + make_interval(secs => (s.k - s.n) / s.rate)
                          ELSE d.deferred_until END
FROM slots AS s
WHERE d.destination = s.destination
RETURNING d.destination, s.n, s.defer_from;

-- name: defer_jobs
-- A rate-limited destination's jobs put off to their slots (pace_destinations): due later, never
-- earlier; locked by the round's claim (see mark_published: no status test).
UPDATE retry_jobs AS j
SET due_at = greatest(j.due_at, d.due_at)
FROM unnest(%(ids)s::bigint[], %(due)s::timestamptz[]) AS d(id, due_at)
WHERE j.id = d.id;

-- name: known_destinations
SELECT destination FROM retry_destinations ORDER BY destination;

-- name: register_destinations
INSERT INTO retry_destinations (destination)
SELECT unnest(%(destinations)s::text[])
ON CONFLICT DO NOTHING;

-- name: claim_dead
-- Dead jobs whose record is not yet on the DLQ topic.
WITH todo AS (
    SELECT id FROM retry_jobs
    WHERE status = 'dead' AND dlq_published_at IS NULL
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE retry_jobs AS j
SET lease_until = clock_timestamp() + %(lease_ms)s * interval '1 millisecond', claimed_by = %(worker)s
FROM todo
WHERE j.id = todo.id
RETURNING j.id, j.destination, j.destination_partition, j.msg_key, j.msg_value, j.headers, j.attempt,
          j.policy, j.reason, j.error_class, j.consumer_group, j.retry_id, j.original_topic,
          j.original_partition, j.original_offset, (extract(epoch FROM j.first_seen_at) * 1000)::bigint,
          j.dead_reason, j.dlq_topic, j.held_by;

-- name: mark_published
-- Only after the broker acknowledged: published_at is the acknowledgement time. The jobs move to
-- retry_published_jobs (migration 0014): retry_jobs keeps only pending and dead jobs. In the
-- transaction whose claim_due locked these pending jobs, so no status test: with one (status =
-- 'pending') the planner may walk every pending job through retry_jobs_due_idx, whose predicate it
-- matches, and join each to the ids, where statistics taken when none was pending call that one row:
-- 212 s to mark 300 jobs with 830 000 pending (a Spark bulk retry beside the loop stopped it).
-- Without it, each id is looked up in the primary key whatever the statistics (with claim_plan_reset's
-- joins). The Spark bulk retry's executors mark its dead (or pending) jobs with it too: a job moved
-- already (published by another run or the loop) is not found, and counted by neither.
-- dead_reason is cleared (retry_jobs_dead_has_reason allows one only on dead jobs); dead_at stays.
WITH moved AS (
    DELETE FROM retry_jobs AS j
    USING unnest(%(ids)s::bigint[], %(acked_ms)s::bigint[]) AS d(id, acked_ms)
    WHERE j.id = d.id
    RETURNING j.*, d.acked_ms
)
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
       last_error, to_timestamp(acked_ms / 1000.0), dead_at, dlq_published_at, created_at, now(), held_by
FROM moved
-- A job stored twice from one record, whose twin was published already, has just been published
-- again (a duplicate with the same retry.id, as at-least-once allows): it leaves retry_jobs and its
-- twin's row stays (and is the one counted). Refused, it would roll back every round of its publisher,
-- and publishing would stop. The clause costs about 2 us a job (0.54 s against 0.46 s for 40 000 jobs
-- in rounds of 2 000, under a held snapshot), about a hundredth of PostgreSQL's work per retry: kept rather
-- than a savepoint and a second try on a unique violation, which would be one more path to test.
ON CONFLICT (source_topic, source_partition, source_offset, source_timestamp_ms) DO NOTHING;

-- name: mark_dlq_published
-- Still dead (not replayed or purged since its lease): tested as dead_reason IS NOT NULL, which the
-- retry_jobs_dead_has_reason constraint makes the same, and which no partial index's predicate
-- matches: with status = 'dead' the planner may walk every dead job through one of the dead-letter
-- indexes and join each to the ids (see mark_published), when statistics were taken with none dead.
UPDATE retry_jobs AS j
SET dlq_published_at = to_timestamp(d.acked_ms / 1000.0), lease_until = NULL
FROM unnest(%(ids)s::bigint[], %(acked_ms)s::bigint[]) AS d(id, acked_ms)
WHERE j.id = d.id AND j.dead_reason IS NOT NULL;

-- name: mark_failed
-- A failed delivery keeps the job, claimable again after a backoff that doubles with each failure:
-- 1 s, 2 s, 4 s ... up to a minute. last_error keeps the broker's error; retry_monitor alerts on a
-- delivery failing for long (stuck_delivery). Returns each job's due time and the seconds until its
-- backoff ends: the publisher's claims start below it then (ClaimFloors.come_back).
UPDATE retry_jobs AS j
SET publish_failures = j.publish_failures + 1,
    last_error = d.error,
    lease_until = clock_timestamp()
        + least(60000, 500 * power(2, least(j.publish_failures + 1, 7))) * interval '1 millisecond'
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS d(id, error)
WHERE j.id = d.id
RETURNING j.id, j.due_at, extract(epoch FROM j.lease_until - clock_timestamp())::float8;

-- name: mark_invalid
-- Publishing showed the headers unusable (a partition the destination does not have): dead, not retried
-- forever; the publish loop then sends it to the DLQ. The application's own reason is kept after ours.
UPDATE retry_jobs AS j
SET status = 'dead', dead_reason = 'invalid', dead_at = now(), lease_until = NULL, updated_at = now(),
    reason = d.reason || coalesce('; the record had failed with: ' || j.reason, '')
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS d(id, reason)
WHERE j.id = d.id;  -- locked by the claim: no status test (see mark_published)

-- name: claim_plan
-- The claim's plan must not depend on statistics: a table analyzed when few jobs were pending
-- (or never) gets a bitmap scan of every pending job and a sort, 30x slower on 200 000 due jobs
-- than walking retry_jobs_due_idx in order, just when a backlog arrives. For the claim only.
-- It returns the values it replaces (for claim_plan_reset), and when it ran: every pending job due
-- by then was open to the claim that follows.
SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan'),
       current_setting('enable_sort'), statement_timestamp(),
       set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true);

-- name: claim_plan_reset
-- Back to what they were before claim_plan, for the rest of the publisher's transaction (its updates
-- by id). (Read from pg_settings, the values took 1.6 ms a claim, more than the claim itself.)
-- And no hash or merge join for the rest of it: the marks join their ids (unnest) to retry_jobs, and
-- with statistics taken when few jobs were pending (autovacuum off, or not yet come round) the
-- planner hashed every pending job for each mark instead of looking each id up in the primary key:
-- 1.5-2 s to mark 300 jobs with a million pending, so that a backlog (a burst, a Spark job beside
-- the loop, an outage's end) made every round slower the larger it grew, and the loop never caught up.
SELECT set_config('enable_seqscan', %(seqscan)s, true), set_config('enable_bitmapscan', %(bitmapscan)s, true),
       set_config('enable_sort', %(sort)s, true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true);

-- name: next_due
SELECT min(due_at) - clock_timestamp() FROM retry_jobs WHERE status = 'pending';

-- name: next_due_after
-- The same after a claim that was not full: every pending job due by its start (%(after)s) was
-- claimed, is another publisher's, or waits out a backoff (the poll interval wakes the publisher for
-- those). The scan of retry_jobs_due_idx starts there instead of at the oldest entry: the jobs
-- published since the last VACUUM keep their entries in the index, at its head, and an index-only
-- scan walks every one of them (45 ms per read at 2 000 retries/s, autovacuum off: the loop's
-- largest cost in PostgreSQL).
-- An index scan, not an index-only one (the id is read too): it marks the entries of published jobs
-- that it finds dead, and the next read skips them.
SELECT due_at - clock_timestamp(), id FROM retry_jobs WHERE status = 'pending' AND due_at > %(after)s
ORDER BY due_at LIMIT 1;

-- name: status_counts
-- Jobs by status, of %(destination)s or all, and of the keys matching %(key_like)s (a bytea LIKE
-- pattern; the demo's run) or all: the figure status, the benchmark and the demo read.
SELECT status::text, count(*) FROM retry_jobs_all
WHERE (%(destination)s::text IS NULL OR destination = %(destination)s)
  AND (%(key_like)s::bytea IS NULL OR msg_key LIKE %(key_like)s::bytea)
GROUP BY status;

-- name: waiting_count
-- Pending jobs waiting in their key's chain (ordered mode, held_by), not yet let out: how many, in how many
-- chains, how long the oldest has waited (seconds since it was stored); then the chains whose head the
-- scheduler no longer has (stuck: see waiting_chains) and how long the oldest record of those has waited.
WITH c AS (
    SELECT held_by AS chain, count(*) AS held, min(created_at) AS since
    FROM retry_jobs
    WHERE held_by IS NOT NULL AND status = 'pending' AND due_at = %(held_due)s
      AND (%(destination)s::text IS NULL OR destination = %(destination)s)
    GROUP BY held_by
), s AS (
    SELECT c.*, (r.why IS NULL OR r.why = 'blocked') AND NOT EXISTS (
        SELECT 1 FROM retry_jobs AS h
        WHERE h.retry_id = coalesce(r.head, c.chain) AND h.status = 'pending' AND h.held_by IS NULL
    ) AS stuck
    FROM c LEFT JOIN retry_released_holds AS r ON r.blocker = c.chain
)
SELECT coalesce(sum(held), 0), count(*), extract(epoch FROM clock_timestamp() - min(since))::float8,
       count(*) FILTER (WHERE stuck),
       extract(epoch FROM clock_timestamp() - min(since) FILTER (WHERE stuck))::float8
FROM s;

-- name: waiting_chains
-- Ordered mode's chains with jobs waiting (%(chains)s, or all; only the stuck ones with %(stuck)s), the longest
-- waiting first: the chain; its key, the destination and the consumer group (of its first held job);
-- how many jobs wait in it, since when (seconds), the oldest first-seen time (epoch ms) and the policy
-- of its first held job; its state (blocked: waiting for its head; released or dead: going out; none:
-- no state, waiting) and head; and whether that head's retry is pending here. A chain waiting whose
-- head is not pending is stuck as far as the scheduler can tell: the head was published and its
-- consumer has not released it yet (not running, or not handling that topic), or the head is lost.
WITH c AS (
    SELECT held_by AS chain, count(*) AS held, min(created_at) AS since,
           min(first_seen_at) AS first_seen,
           (array_agg(ARRAY[destination, consumer_group, policy] ORDER BY original_partition, original_offset, id))[1:1] AS about,
           (array_agg(msg_key ORDER BY original_partition, original_offset, id))[1] AS msg_key
    FROM retry_jobs
    WHERE held_by IS NOT NULL AND status = 'pending' AND due_at = %(held_due)s
      AND (%(chains)s::text[] IS NULL OR held_by = ANY(%(chains)s::text[]))
    GROUP BY held_by
), s AS (
    SELECT c.*, r.why, r.head, EXISTS (
        SELECT 1 FROM retry_jobs AS h
        WHERE h.retry_id = coalesce(r.head, c.chain) AND h.status = 'pending' AND h.held_by IS NULL
    ) AS head_pending
    FROM c LEFT JOIN retry_released_holds AS r ON r.blocker = c.chain
)
SELECT chain, about[1][1], msg_key, about[1][2], held, extract(epoch FROM clock_timestamp() - since)::float8,
       (extract(epoch FROM first_seen) * 1000)::bigint, about[1][3], why, head, head_pending
FROM s
WHERE NOT %(stuck)s OR ((why IS NULL OR why = 'blocked') AND NOT head_pending)
ORDER BY since, chain
LIMIT %(limit)s;

-- name: give_up_heads
-- An operator's `chains release`, or a held record past its policy's max_age: the pending retries of
-- the heads these chains wait for go dead, to their DLQ topic like any dead job, so that none comes
-- back after its chain went on without it.
-- 'requested' for an operator, 'expired' for max_age; the why goes before the record's own reason.
UPDATE retry_jobs
SET status = 'dead', dead_reason = %(dead_reason)s, dead_at = clock_timestamp(), lease_until = NULL,
    updated_at = clock_timestamp(), reason = %(why)s || coalesce('; the record had failed with: ' || reason, '')
WHERE retry_id = ANY(%(heads)s::text[]) AND status = 'pending' AND held_by IS NULL
RETURNING retry_id;

-- name: chains_audit
-- `chains release`: who released which chains (retry_dlq_audit, action release_chains), in the
-- transaction that releases them.
INSERT INTO retry_dlq_audit (action, dry_run, actor, source, filter, matched, affected, skipped, finished_at)
VALUES ('release_chains', false, %(actor)s, %(source)s, %(filter)s, %(matched)s, %(affected)s, %(skipped)s,
        clock_timestamp());

-- name: dead_by_reason
-- Dead jobs by reason, of %(destination)s or all, and of the keys matching %(key_like)s or all (as
-- status_counts): the figure status, the demo and the benchmark read.
SELECT dead_reason, count(*) FROM retry_jobs
WHERE status = 'dead' AND (%(destination)s::text IS NULL OR destination = %(destination)s)
  AND (%(key_like)s::bytea IS NULL OR msg_key LIKE %(key_like)s::bytea)
GROUP BY dead_reason;

-- name: oldest_overdue
SELECT id, destination, due_at, extract(epoch FROM clock_timestamp() - due_at)::float8
FROM retry_jobs
WHERE status = 'pending' AND due_at <= statement_timestamp()
  AND (%(destination)s::text IS NULL OR destination = %(destination)s)
ORDER BY due_at
LIMIT 1;

-- name: vacuum_need
-- Whether autovacuum covers retry_jobs (on for the server, not turned off for the table), its dead
-- and live rows (the server's statistics), and the oldest snapshot a session of this database holds
-- (its xmin, as text; NULL where this role may not see it; other databases' do not limit its
-- VACUUM): the publish loop vacuums the table itself where autovacuum does not (db/vacuum.py).
SELECT current_setting('autovacuum')::boolean
       AND coalesce((SELECT option_value::boolean FROM pg_class AS c, pg_options_to_table(c.reloptions)
                     WHERE c.oid = 'retry_jobs'::regclass AND option_name = 'autovacuum_enabled'), true),
       coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), (
           SELECT backend_xmin::text FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
             AND pid <> pg_backend_pid() AND datname = current_database()
           ORDER BY age(backend_xmin) DESC LIMIT 1
       )
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables ON relid = 'retry_jobs'::regclass;

-- name: vacuum_state
-- Whether autovacuum runs on this server, and retry_jobs' dead rows (what claims walk until vacuumed).
SELECT current_setting('autovacuum')::boolean, coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0),
       greatest(last_vacuum, last_autovacuum)
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables ON relname = 'retry_jobs' AND schemaname = current_schema();

-- name: backlog_due
-- Jobs due now and not yet published, counted on the due index up to a cap (a gauge, read often).
SELECT count(*) FROM (
    SELECT 1 FROM retry_jobs
    WHERE status = 'pending' AND due_at <= statement_timestamp()
    LIMIT 100000
) AS due;

-- name: lateness_plan
-- The lateness read below must walk retry_published_jobs_published_at_brin, whatever the statistics say: its
-- bound is not a constant, so the planner guessed a third of the table and read all of it (1.2 s on
-- 3.5 million rows, with two parallel workers, every publish task's end and every metrics snapshot;
-- growing with the table). And no parallel workers for a reading. Returns the values it replaces.
SELECT current_setting('enable_seqscan'), current_setting('max_parallel_workers_per_gather'),
       set_config('enable_seqscan', 'off', true), set_config('max_parallel_workers_per_gather', '0', true);

-- name: lateness_plan_reset
SELECT set_config('enable_seqscan', %(seqscan)s, true),
       set_config('max_parallel_workers_per_gather', %(workers)s, true);

-- name: summarize_published_wait
-- For summarize_published: at most this long behind a VACUUM (or another summarization) of the table,
-- which summarizes the new ranges itself when it ends.
SET LOCAL lock_timeout = '100ms';

-- name: summarize_published
-- The published_at BRIN index's page ranges filled since the last summarization, summarized now.
-- Only VACUUM does this otherwise, and a BRIN scan reads every heap page of a range not yet summarized:
-- with autovacuum off, or while a held snapshot holds every VACUUM back, each lateness read below read
-- every page written since the last VACUUM, more at each read. Each range is summarized once.
SELECT brin_summarize_new_values('retry_published_jobs_published_at_brin'::regclass);

-- name: lateness
-- Publish lateness (acknowledged minus due) of the jobs published in the last window.
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)),
       max(retry_lateness_s(published_at, due_at)),
       count(*) FILTER (WHERE retry_lateness_s(published_at, due_at) < 0)
FROM retry_published_jobs
WHERE published_at >= statement_timestamp() - %(window_s)s * interval '1 second'
  AND (%(destination)s::text IS NULL OR destination = %(destination)s);

-- name: demo_outcome
-- The demo's workload (its keys match %(key_like)s, its run's tag): how many of its dead jobs are on
-- their DLQ topic, and the publish lateness of each one published (its counts are status_counts' and
-- dead_by_reason's).
SELECT count(*) FILTER (WHERE status = 'dead' AND dlq_published_at IS NOT NULL),
       array_agg(retry_lateness_s(published_at, due_at) ORDER BY retry_lateness_s(published_at, due_at))
           FILTER (WHERE status = 'published')
FROM retry_jobs_all WHERE msg_key LIKE %(key_like)s::bytea;

-- name: loop_heartbeat
INSERT INTO retry_loops (worker, kind) VALUES (%(worker)s, %(kind)s)
ON CONFLICT (worker) DO UPDATE SET heartbeat_at = clock_timestamp()
RETURNING started_at;

-- name: loop_relieved
-- Is a loop of the same kind that started after this one alive?
SELECT EXISTS (
    SELECT 1 FROM retry_loops
    WHERE kind = %(kind)s AND worker <> %(worker)s AND started_at > %(started_at)s
      AND heartbeat_at > clock_timestamp() - %(alive_s)s * interval '1 second'
);

-- name: loop_claim_state
-- A publish loop's floor and next sweep (migration 0013), for the loop that relieves it.
UPDATE retry_loops
SET claim_floor = %(floor)s, sweep_due_at = clock_timestamp() + %(sweep_in_s)s * interval '1 second'
WHERE worker = %(worker)s;

-- name: loop_claim_state_alive
-- The lowest floor and the soonest sweep of the publish loops alive (none: both NULL).
SELECT min(claim_floor), extract(epoch FROM min(sweep_due_at) - clock_timestamp())::float8
FROM retry_loops
WHERE kind = 'publish' AND claim_floor IS NOT NULL
  AND heartbeat_at > clock_timestamp() - %(alive_s)s * interval '1 second';

-- name: loop_finish
DELETE FROM retry_loops
WHERE worker = %(worker)s OR heartbeat_at < clock_timestamp() - interval '1 hour';

-- name: mark_adopted_delivered
-- Records of adopted dead-letter topics (core/adopt.py) are on a dead-letter topic already: the jobs
-- stored from them in this transaction count as delivered there, so the publish loop never sends
-- them to a DLQ topic again. Reads the partial index of dead jobs not yet delivered.
UPDATE retry_jobs SET dlq_published_at = dead_at
WHERE status = 'dead' AND dlq_published_at IS NULL AND source_topic = ANY(%(topics)s::text[]);

-- name: set_chain_states
-- Ordered mode: the newest state each chain's records in a batch tell (Store._settle_holds). A chain
-- whose head was handled (the helper's release record, or a record it parks while the chain flows:
-- 'released') or died ('dead') goes on; one whose head's retry is pending ('blocked') waits for it,
-- whatever was released before: its records may not pass the head.
-- head: the retry.id of the head the chain waits for (blocked) or that died (dead), published with the
-- chain's records in the second case (retry.chain-state: dead:<retry.id>) so that the helper knows
-- which of its heads it was.
-- A release of a chain nothing is held in (the helper releases every head it handled) is kept only as
-- the absence of a row: the records parked after it say themselves that their chain flows. A dead
-- chain's row is kept even so: the helper may not know yet that its head died.
WITH s AS (
    SELECT *, state = 'released' AND NOT EXISTS (
        SELECT 1 FROM retry_jobs WHERE held_by = s.chain AND status = 'pending'
    ) AS empty
    FROM unnest(%(chains)s::text[], %(states)s::text[], %(heads)s::text[]) AS s(chain, state, head)
), withdrawn AS (
    DELETE FROM retry_released_holds AS r USING s WHERE r.blocker = s.chain AND s.empty
)
INSERT INTO retry_released_holds (blocker, why, head)
SELECT chain, state, head FROM s WHERE NOT empty
ON CONFLICT (blocker) DO UPDATE SET why = EXCLUDED.why, head = EXCLUDED.head, released_at = now();

-- name: release_dead_blockers
-- 0.4.0's chains, named by their blocker's retry.id: blockers that are dead (dead-lettered, and not
-- pending again after a replay) release their held jobs in order rather than hold them for ever. Asked
-- for the retry.ids of a batch's dead jobs and the chains its held jobs name. The first test reads only
-- the small index of held jobs, so a batch of dead jobs nothing waits behind costs one probe each.
INSERT INTO retry_released_holds (blocker, why, head)
SELECT DISTINCT b, 'dead', b FROM unnest(%(blockers)s::text[]) AS b
WHERE EXISTS (SELECT 1 FROM retry_jobs WHERE held_by = b AND status = 'pending')
  AND EXISTS (SELECT 1 FROM retry_jobs WHERE retry_id = b AND status = 'dead')
  AND NOT EXISTS (SELECT 1 FROM retry_jobs WHERE retry_id = b AND status = 'pending' AND held_by IS NULL)
ON CONFLICT (blocker) DO NOTHING;

-- name: lock_chains
-- One transaction at a time advances a chain (the ingest's, a publisher's): a lock per stripe of 64
-- (a batch may name thousands of chains; the server's lock table holds a few thousand locks in all),
-- only for chains with held jobs, taken in one statement, in order, until the transaction ends, so
-- two never wait for each other.
SELECT pg_advisory_xact_lock(1913, stripe)
FROM (
    SELECT DISTINCT hashtext(b) & 63 AS stripe
    FROM unnest(%(blockers)s::text[]) AS b
    WHERE EXISTS (SELECT 1 FROM retry_jobs WHERE held_by = b AND status = 'pending')
    ORDER BY 1
) AS stripes;

-- name: advance_holds
-- For each released chain of these with no held job on its way (due, not yet published), the first of
-- its held jobs in original order falls due now: one at a time, so a chain stays in order however
-- many publishers run (retry_jobs_chain_due_key, migration 0017, makes two due at once impossible).
-- Called, under lock_chains, when a chain is released, a held job is stored, and one is published.
UPDATE retry_jobs AS j SET due_at = clock_timestamp()
FROM (
    SELECT DISTINCT ON (h.held_by) h.id, h.held_by
    FROM retry_jobs AS h JOIN retry_released_holds AS r ON r.blocker = h.held_by AND r.why <> 'blocked'
    WHERE h.held_by = ANY(%(blockers)s::text[]) AND h.status = 'pending'
    ORDER BY h.held_by, h.original_partition, h.original_offset, h.id
) AS nxt
WHERE j.id = nxt.id AND j.due_at = %(held_due)s
  AND NOT EXISTS (
      SELECT 1 FROM retry_jobs AS d
      WHERE d.held_by = nxt.held_by AND d.status = 'pending' AND d.due_at <> %(held_due)s
  )
RETURNING j.held_by;

-- name: forget_released_holds
-- A released chain nothing waits in any more is forgotten after %(keep_s)s seconds: the helper's parks
-- behind a chain that flows say so themselves (retry.chain-state), and a chain whose head died keeps
-- its row that long for the records its key still sends behind it.
-- A chain still waiting for a pending head (a long backoff) keeps its row whatever its age.
DELETE FROM retry_released_holds AS r
WHERE r.released_at < now() - %(keep_s)s * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM retry_jobs WHERE held_by = r.blocker AND status = 'pending')
  AND NOT (r.why = 'blocked' AND EXISTS (SELECT 1 FROM retry_jobs WHERE retry_id = r.head AND status = 'pending'));

-- name: notify_overdue
-- In the transaction that stores jobs already past their due time: the publishers' claims start below
-- the earliest (retry_scheduler.db.overdue). Delivered when the transaction commits, or never.
SELECT pg_notify(%(channel)s, %(due_ms)s);

-- name: listen_overdue
-- A publisher's connection hears of jobs stored past their due time (retry_scheduler.db.overdue.CHANNEL).
LISTEN retry_overdue;

-- name: bulk_replay_lock
-- One Spark bulk replay at a time: a session-level advisory lock held for the whole run (freed when
-- its connection closes, even if the driver dies); false when another run holds it.
SELECT pg_try_advisory_lock(7311, hashtext('retry_bulk_replay'));

-- name: compaction_columns
-- The columns of a table compaction archives (each must be one the archive knows).
SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = %(table)s;

-- name: compaction_record_day
-- A run selects for this UTC day: the published jobs of that day left after it are late marks.
INSERT INTO retry_compaction_days (day) VALUES (%(day)s) ON CONFLICT (day) DO NOTHING;

-- name: compaction_lock
-- One compaction run at a time: a session-level advisory lock for the run; false when another holds it.
SELECT pg_try_advisory_lock(7311, hashtext('retry_compaction'));

-- name: compaction_unstage_all
-- Every run's staged ids: under the compaction lock, what is there was left by a run that died.
DELETE FROM retry_compaction_archived;

-- name: compaction_unstage
DELETE FROM retry_compaction_archived WHERE run_id = %(run)s;

-- name: compaction_staged_bounds
SELECT min(id), max(id), count(*) FROM retry_compaction_archived WHERE run_id = %(run)s;

-- name: autovacuum_on
SELECT current_setting('autovacuum')::boolean;

-- name: vacuum_published
-- After compaction deleted from retry_published_jobs, where the server's autovacuum is off.
VACUUM (SKIP_LOCKED, TRUNCATE false) retry_published_jobs;
