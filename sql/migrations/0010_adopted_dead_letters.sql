-- Dead letters adopted from other tools' dead-letter topics (Spring Kafka, Kafka Connect;
-- retry_scheduler.core.adopt): stored dead with the reason 'adopted'. NOT VALID, then VALIDATE: the
-- check of the existing rows does not hold the table's exclusive lock.
ALTER TABLE retry_jobs DROP CONSTRAINT retry_jobs_dead_reason_check;
ALTER TABLE retry_jobs ADD CONSTRAINT retry_jobs_dead_reason_check
    CHECK (dead_reason IN ('exhausted', 'expired', 'fatal', 'requested', 'invalid', 'adopted')) NOT VALID;
ALTER TABLE retry_jobs VALIDATE CONSTRAINT retry_jobs_dead_reason_check;
