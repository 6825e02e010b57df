-- Publish lateness, defined once: the seconds from a job's due time to the broker's acknowledgement
-- of its publish (negative: published early, which the service never does). The status, the metrics,
-- the monitor (the named query lateness), the demo and the benchmark all read it here. A SQL
-- function this simple is inlined into each query that calls it, so it costs nothing and keeps
-- every index the query could use.
CREATE OR REPLACE FUNCTION retry_lateness_s(published_at timestamptz, due_at timestamptz)
    RETURNS float8
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT extract(epoch FROM published_at - due_at)::float8';
