-- Bulk retry and compaction (PySpark jobs in include/spark/).

-- Jobs a bulk-retry run got acknowledged by the broker, written by the executors and applied
-- with one set-based UPDATE; unlogged: it is scratch space, rebuilt by a re-run.
CREATE UNLOGGED TABLE retry_bulk_delivered (
    run_id   text   NOT NULL,
    id       bigint NOT NULL,
    acked_ms bigint NOT NULL
);
CREATE INDEX retry_bulk_delivered_run_idx ON retry_bulk_delivered (run_id, id);

-- Jobs a compaction run verified in the Parquet archive, deleted from retry_jobs in bounded batches.
CREATE UNLOGGED TABLE retry_compaction_archived (
    run_id text   NOT NULL,
    id     bigint NOT NULL
);
CREATE INDEX retry_compaction_archived_run_idx ON retry_compaction_archived (run_id, id);

-- A bulk replay publishes dead jobs straight back to their destination: dead -> published.
CREATE OR REPLACE FUNCTION retry_jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
        (OLD.status = 'pending' AND NEW.status IN ('published', 'dead'))
        OR (OLD.status = 'dead' AND NEW.status IN ('pending', 'published'))
    ) THEN
        RAISE EXCEPTION 'retry job %: invalid status transition % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;
