-- The approval gate (issue 33): a dlq_replay run that would replay more than
-- RETRY_REPLAY_APPROVAL_ABOVE dead jobs waits for a second person in Airflow. Its dry run's audit row
-- keeps the decision (approved, rejected) and who took it; the replay's own row, who approved it.
ALTER TABLE retry_dlq_audit
    ADD COLUMN IF NOT EXISTS approval    text CHECK (approval IN ('approved', 'rejected')),
    ADD COLUMN IF NOT EXISTS approved_by text;
