-- Throughput (issue 5): fewer writes per job on the ingest and publish paths.

-- 1. The ingest loop keeps the next offset of every retry-topic partition here, in the same
--    transaction as the rows it read. It resumes from these offsets, so a batch is never stored
--    twice and the rows can be copied straight into retry_jobs (no staging table, no ON CONFLICT).
--    The Kafka group offsets are still committed after each batch, for lag monitoring and as the
--    starting point of a partition this table does not know yet.
CREATE TABLE retry_ingest_offsets (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    next_offset    bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- 2. Every index costs each stored job one insertion, and each status change another (a status
--    change is never a HOT update: the partial indexes name the status). These three served no
--    query of the loops:
--    - retry_id: nothing looks jobs up by retry id;
--    - (destination, status): `status --destination` and bulk-retry filters read many rows anyway
--      (dead jobs by destination have their own partial index, from migration 0004);
--    - published_at: the monitor's lateness window and compaction's cutoff use a BRIN index
--      instead, which costs almost nothing to maintain (published rows are appended in time order).
DROP INDEX retry_jobs_retry_id_idx;
DROP INDEX retry_jobs_destination_status_idx;
DROP INDEX retry_jobs_published_at_idx;
CREATE INDEX retry_jobs_published_at_brin ON retry_jobs USING brin (published_at) WITH (pages_per_range = 16);

-- 3. The transition check fires only for a forbidden transition, decided by the trigger's WHEN
--    condition (no PL/pgSQL call per updated row). The statements that change a status set
--    updated_at themselves.
DROP TRIGGER retry_jobs_transition ON retry_jobs;
DROP FUNCTION retry_jobs_check_transition();

CREATE FUNCTION retry_jobs_refuse_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'retry job %: invalid status transition % -> %', OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
END;
$$;

-- Allowed: pending -> published | dead, dead -> pending (DLQ replay) | published (bulk replay).
CREATE TRIGGER retry_jobs_transition
    BEFORE UPDATE OF status ON retry_jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (
        (OLD.status = 'pending' AND NEW.status IN ('published', 'dead'))
        OR (OLD.status = 'dead' AND NEW.status IN ('pending', 'published'))
    ))
    EXECUTE FUNCTION retry_jobs_refuse_transition();
