-- Re-evaluation of dead invalid jobs (issue 30, `dlq replay --reevaluate`): a job stored invalid because
-- of the configuration (a destination not yet allowed, a policy not yet deployed) is read again against
-- the current policies once they are fixed. Audited like a replay, under an action of its own.
ALTER TABLE retry_dlq_audit DROP CONSTRAINT retry_dlq_audit_action_check;
ALTER TABLE retry_dlq_audit ADD CONSTRAINT retry_dlq_audit_action_check
    CHECK (action IN ('replay', 'purge', 'bulk_replay', 'reevaluate'));
