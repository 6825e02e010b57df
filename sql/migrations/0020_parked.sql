-- Records replayed from the dead letters RETRY_PARK_AFTER_REPLAYS times and dead again each time
-- (issue 33): dead as 'parked', which a replay leaves alone unless asked for it. NOT VALID, then
-- VALIDATE: the check of the existing rows does not hold the table's exclusive lock.
ALTER TABLE retry_jobs DROP CONSTRAINT retry_jobs_dead_reason_check;
ALTER TABLE retry_jobs ADD CONSTRAINT retry_jobs_dead_reason_check
    CHECK (dead_reason IN ('exhausted', 'expired', 'fatal', 'requested', 'invalid', 'adopted', 'parked')) NOT VALID;
ALTER TABLE retry_jobs VALIDATE CONSTRAINT retry_jobs_dead_reason_check;
