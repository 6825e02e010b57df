-- Where a publish loop's claims start in the due index (its floor: every job due before it was
-- claimed, or another publisher's, when it claimed) and when its next sweep from the index's head is
-- due, recorded every few seconds for the loop that relieves it. While a snapshot is held, every job
-- published since keeps its entry at the index's head, and a new loop's first claim from the head
-- walked them all (two seconds of lateness at each Airflow task's start, beside a Spark bulk retry);
-- it starts from its predecessor's floor instead, and sweeps when its predecessor would have.
ALTER TABLE retry_loops ADD COLUMN claim_floor timestamptz, ADD COLUMN sweep_due_at timestamptz;
