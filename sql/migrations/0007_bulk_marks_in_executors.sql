-- Bulk retry marks acknowledged jobs published from its executors, a batch per transaction, while
-- it produces (include/spark/bulk_retry.py): the staging table of acknowledged deliveries and the
-- resume of a crashed run through it are gone. Deliveries that a crashed run had staged were
-- acknowledged by the broker: mark them first, as resuming that run would have, then drop the table.
UPDATE retry_jobs AS j
SET status = 'published', published_at = to_timestamp(d.acked_ms / 1000.0), lease_until = NULL,
    dead_reason = NULL, updated_at = now()
FROM retry_bulk_delivered AS d
WHERE j.id = d.id AND j.status IN ('dead', 'pending');

DROP TABLE retry_bulk_delivered;
