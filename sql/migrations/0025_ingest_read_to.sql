-- The ingest's read-ahead (RETRY_INGEST_READ_AHEAD_MS): a worker stores the records due soon first and
-- lets those due later wait in its memory. A partition's next_offset stays its lowest record not
-- stored; read_to is the offset it was read up to. A loop that resumes reads the records in between
-- again, through the staging path, which skips those stored already (Store.insert_rows).
ALTER TABLE retry_ingest_offsets ADD COLUMN IF NOT EXISTS read_to bigint;
