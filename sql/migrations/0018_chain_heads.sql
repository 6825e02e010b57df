-- Held chains an operator can see and act on (issue 29). A chain whose head's retry is pending keeps a
-- row ('blocked', with that head's retry.id) instead of none, so that `chains list`, `status`, the
-- metrics and retry_monitor can tell a chain waiting for a head the scheduler still has from one whose
-- head is gone (published and never released by its consumer, or dead and forgotten), and so that
-- `chains release` and the policy's max_age can release a chain as if its head died, naming that head.
ALTER TABLE retry_released_holds RENAME COLUMN dead_head TO head;
ALTER TABLE retry_released_holds DROP CONSTRAINT retry_released_holds_why_check;
ALTER TABLE retry_released_holds ADD CONSTRAINT retry_released_holds_why_check
    CHECK (why IN ('released', 'dead', 'blocked'));

-- `chains release` is audited like a replay, under an action of its own (max_age's releases are not:
-- the policy did them, and the publish loop logs them).
ALTER TABLE retry_dlq_audit DROP CONSTRAINT retry_dlq_audit_action_check;
ALTER TABLE retry_dlq_audit ADD CONSTRAINT retry_dlq_audit_action_check
    CHECK (action IN ('replay', 'purge', 'bulk_replay', 'reevaluate', 'release_chains'));
