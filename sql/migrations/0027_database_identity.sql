-- The retry database's identity: one random id, made once. A replica has the same (it is data), a
-- new database another. The ingest commits its Kafka offsets marked with it; a partition whose
-- Kafka offset bears this database's mark while the database holds no offset of it lost the
-- commits that stored it (a promoted replica that lacked the last ones, a restore): the ingest
-- then reads the partition from its start rather than from Kafka's offset, which would skip them.
CREATE TABLE IF NOT EXISTS retry_database_identity (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO retry_database_identity DEFAULT VALUES ON CONFLICT DO NOTHING;
