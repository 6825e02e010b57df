"""Compaction: archive processed retry jobs to Parquet, then delete them from PostgreSQL.

The ``retry_compaction`` DAG runs it once a day for the UTC day of its data interval; by hand::

    RETRY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/retry_scheduler \\
    spark-submit --jars /usr/share/java/postgresql.jar include/spark/compact.py \\
        --archive /data/retry-archive --older-than 7d

The database comes from ``RETRY_DATABASE_URL`` or from ``--connection-file`` (what the DAG and
``retry-scheduler compact`` pass), never from the command line, where every user could read a password.

Processed jobs are ``published`` ones (processed at ``published_at``) and ``dead`` ones past the
dead retention whose record is on their DLQ topic (processed at ``dead_at``; a dead job not yet
there is never taken). A run selects them (``--older-than``: processed before now minus that;
``--day D``: published within the UTC day D, and dead ones whose retention ended by D's end), then:

1. in one statement, counts them by day and stages their ids in ``retry_compaction_archived``;
2. appends to ``<archive>/retry_jobs/day=YYYY-MM-DD/destination=TOPIC/`` only the rows whose id is not
   archived for that day yet (one read of every column), so a re-run after a crash archives nothing
   twice;
3. fsyncs the files and directories of those days (a local archive), then verifies that every
   staged job still selected (one replayed meanwhile is left alone) is now in the archive, and
   raises, deleting nothing, if one is not;
4. deletes the staged jobs still selected from ``retry_jobs`` in bounded id-range batches, each its
   own transaction (a job that no longer matches the selection, e.g. replayed from the DLQ
   meanwhile, is kept);
5. writes ``<archive>/_manifests/<run_id>.json`` with the counts.

The archive keeps every column of ``retry_jobs`` (``status`` as text). A null destination is archived
under ``destination=__none__``: no allowed destination starts with ``_``. Timestamps
are Parquet ``TIMESTAMP_MICROS`` (UTC instants). One run at a time: a second one fails fast on an
advisory lock rather than racing the first to the same day partitions.
"""

from __future__ import annotations

import sys

try:
    from retry_scheduler.spark.compaction import run
except ImportError as exc:  # pragma: no cover - depends on how the job is launched
    raise SystemExit(
        f"compact cannot import {exc.name} in {sys.executable}: run it with the Python that has "
        "kafka-retry-scheduler installed, e.g. PYSPARK_PYTHON=.venv/bin/python spark-submit ..."
    ) from exc

if __name__ == "__main__":
    sys.exit(run())
