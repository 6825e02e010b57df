-- Ingest and publish loops currently alive, with heartbeats. A loop whose time is up keeps
-- going until a newer loop of its kind is alive (or its grace runs out), so a late Airflow run
-- never leaves the retry topics unread or due jobs unpublished.

CREATE TABLE retry_loops (
    worker       text PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('ingest', 'publish')),
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
