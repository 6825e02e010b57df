"""The service's readings (lateness for the metrics, the run summary, status and the monitor) stay
cheap however many jobs were published: they read the published_at BRIN index, never the whole table."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg

from bench.env import due_job
from bench.jobs import insert_jobs
from retry_scheduler.db.store import Store
from tests.jobrows import publish


def _published(database_url: str, count: int) -> None:
    """``count`` jobs published over the last two hours, a tenth of them in the last minute."""
    now_ms = int(time.time() * 1000)
    with Store(database_url) as store:
        insert_jobs(
            store, [due_job(i, "reads.retry", "reads.orders", now_ms - 7_200_000) for i in range(count)]
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        publish(conn, "true", at=datetime.now(UTC))
        conn.execute(
            "UPDATE retry_published_jobs SET "
            "published_at = clock_timestamp() - CASE WHEN id % 10 = 0 THEN (id % 50) * interval '1 second' "
            "ELSE interval '1 hour' + (id % 3600) * interval '1 second' END"
        )


def test_the_lateness_read_never_reads_the_whole_table(database_url: str) -> None:
    # No ANALYZE since the rows came (autovacuum off, or not yet round): the planner has no statistics
    # and, for a bound it cannot compute when it plans, guessed a third of the table: a seq scan.
    _published(database_url, 20_000)
    plan_settings = (
        "SELECT current_setting('enable_seqscan'), current_setting('max_parallel_workers_per_gather')"
    )
    with Store(database_url) as store, store.conn.transaction():
        before = store.conn.execute(plan_settings).fetchone()
        late = store.readings.lateness(60)
        (seq_scans, index_scans) = store.conn.execute(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
            "WHERE relname = 'retry_published_jobs'"
        ).fetchone()  # type: ignore[misc]
        after = store.conn.execute(plan_settings).fetchone()
    assert late.count == 2_000  # the tenth published in the last minute
    assert seq_scans == 0 and index_scans >= 1, (seq_scans, index_scans)
    # The plan settings are back for whatever the connection's transaction does next (a claim).
    assert after == before, (before, after)
