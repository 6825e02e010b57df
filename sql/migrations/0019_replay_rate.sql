-- A replay may be paced (issue 33): at most rate_per_s jobs of each destination fall due per second
-- (null: not paced, every job due at once). Audited with the operation.
ALTER TABLE retry_dlq_audit ADD COLUMN IF NOT EXISTS rate_per_s double precision;
