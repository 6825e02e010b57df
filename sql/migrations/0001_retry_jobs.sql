-- Retry jobs: one row per failed record consumed from a retry topic.
-- Never edit an applied migration: add the next number instead.

CREATE TYPE retry_job_status AS ENUM ('pending', 'published', 'dead');

CREATE TABLE retry_jobs (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- where the failure was read from: unique, so re-reading a retry topic stores nothing twice.
    -- The record timestamp is part of the identity: a topic deleted and created again (or a
    -- memory-only dev broker restarted) reuses offsets, and those records must not be taken
    -- for duplicates of the old ones.
    source_topic          text        NOT NULL,
    source_partition      integer     NOT NULL,
    source_offset         bigint      NOT NULL,
    source_timestamp_ms   bigint      NOT NULL,
    destination           text,
    destination_partition integer,
    msg_key               bytea,
    msg_value             bytea,
    -- pass-through headers, packed in order with repeats and nulls (retry_scheduler.jobs.encode_headers)
    headers               bytea,
    attempt               integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    policy                text        NOT NULL,
    reason                text,
    error_class           text,
    consumer_group        text,
    retry_id              text        NOT NULL,
    original_topic        text,
    original_partition    integer,
    original_offset       bigint,
    first_seen_at         timestamptz NOT NULL,
    due_at                timestamptz NOT NULL,
    status                retry_job_status NOT NULL,
    dead_reason           text CHECK (dead_reason IN ('exhausted', 'expired', 'fatal', 'requested', 'invalid')),
    dlq_topic             text        NOT NULL,
    -- claim lease: a job claimed but not marked within the lease is claimable again
    lease_until           timestamptz,
    claimed_by            text,
    publish_failures      integer     NOT NULL DEFAULT 0,
    last_error            text,
    published_at          timestamptz,
    dead_at               timestamptz,
    dlq_published_at      timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT retry_jobs_source_key UNIQUE (source_topic, source_partition, source_offset, source_timestamp_ms),
    CONSTRAINT retry_jobs_dead_has_reason CHECK ((status = 'dead') = (dead_reason IS NOT NULL))
);

-- The due scan walks only pending rows in due order: its cost follows the due backlog,
-- not the size of the table.
CREATE INDEX retry_jobs_due_idx ON retry_jobs (due_at) WHERE status = 'pending';
-- Dead jobs not yet on their DLQ topic.
CREATE INDEX retry_jobs_dlq_todo_idx ON retry_jobs (id) WHERE status = 'dead' AND dlq_published_at IS NULL;
CREATE INDEX retry_jobs_destination_status_idx ON retry_jobs (destination, status);
CREATE INDEX retry_jobs_retry_id_idx ON retry_jobs (retry_id);
CREATE INDEX retry_jobs_published_at_idx ON retry_jobs (published_at) WHERE status = 'published';

-- Checked status transitions: pending -> published | dead, dead -> pending (replay).
CREATE FUNCTION retry_jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
        (OLD.status = 'pending' AND NEW.status IN ('published', 'dead'))
        OR (OLD.status = 'dead' AND NEW.status = 'pending')
    ) THEN
        RAISE EXCEPTION 'retry job %: invalid status transition % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE TRIGGER retry_jobs_transition
    BEFORE UPDATE OF status ON retry_jobs
    FOR EACH ROW EXECUTE FUNCTION retry_jobs_check_transition();
