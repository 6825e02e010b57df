-- retry_jobs is a queue: rows are inserted, updated (pending -> published) and deleted (compaction)
-- all day. With PostgreSQL's default autovacuum thresholds (vacuum once 20 % of the table is dead)
-- hundreds of thousands of dead entries pile up at the head of the due index, which every claim and
-- every "next due" read walks: claims went from milliseconds to 100 ms and more under a sustained
-- load (bench/README.md, capacity). Vacuum the table at 1 % dead (at least 10 000 rows), after 5 %
-- inserted, and analyze it at 2 %. These only act where autovacuum runs (the server's
-- `autovacuum = on`, PostgreSQL's default): `retry-scheduler status` says when it does not.
ALTER TABLE retry_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
