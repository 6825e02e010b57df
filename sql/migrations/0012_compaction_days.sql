-- The UTC days a daily compaction run (retry_compaction, `compact --day`) has selected for. A job marked
-- published after its day's run had started (a late acknowledgement, a bulk replay's batch) is taken
-- by a later day's run: such a run also takes the published jobs of every day in this table.
CREATE TABLE retry_compaction_days (
    day        date        PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now()
);
