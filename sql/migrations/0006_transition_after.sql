-- Throughput (issue 5): the transition check no longer locks each row it looks at.
--
-- A BEFORE ROW trigger makes PostgreSQL fetch and lock the old row version before it calls the
-- trigger, whether or not the WHEN condition then lets it fire: one more lock (and one more WAL
-- record) for every job a statement publishes, kills or replays. An AFTER ROW trigger gets the old
-- and new rows from the update itself and, with its WHEN condition false, queues nothing.
-- A forbidden transition still fails the statement, with the same error, at the statement's end.
DROP TRIGGER retry_jobs_transition ON retry_jobs;

-- Allowed: pending -> published | dead, dead -> pending (DLQ replay) | published (bulk replay).
CREATE TRIGGER retry_jobs_transition
    AFTER UPDATE OF status ON retry_jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (
        (OLD.status = 'pending' AND NEW.status IN ('published', 'dead'))
        OR (OLD.status = 'dead' AND NEW.status IN ('pending', 'published'))
    ))
    EXECUTE FUNCTION retry_jobs_refuse_transition();
