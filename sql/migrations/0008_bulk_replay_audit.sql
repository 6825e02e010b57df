-- Bulk replays (the retry_bulk_replay DAG, retry-scheduler bulk-retry) are audited like DLQ replays:
-- one row per run, dry runs included, with who asked, the filter, how many matched and were published.
ALTER TABLE retry_dlq_audit DROP CONSTRAINT retry_dlq_audit_action_check;
ALTER TABLE retry_dlq_audit ADD CONSTRAINT retry_dlq_audit_action_check
    CHECK (action IN ('replay', 'purge', 'bulk_replay'));
