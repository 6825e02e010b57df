-- A requester who approves their own replay is refused (nothing is sent): the dry run's audit row
-- says so, naming who tried, instead of reading approved.
ALTER TABLE retry_dlq_audit DROP CONSTRAINT IF EXISTS retry_dlq_audit_approval_check;
ALTER TABLE retry_dlq_audit
    ADD CONSTRAINT retry_dlq_audit_approval_check CHECK (approval IN ('approved', 'rejected', 'refused'));
