"""Compaction's PostgreSQL side: the window a run takes (its WHERE clause, also the JDBC read's),
the lock, the days recorded, the staging of the selected ids, the batched deletes, the VACUUM.
The Spark job is :mod:`retry_scheduler.spark.compaction`; its JDBC reads
:mod:`retry_scheduler.spark.compaction_reads`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from retry_scheduler.core import faults
from retry_scheduler.db.connection import connect
from retry_scheduler.db.schema import q
from retry_scheduler.db.selection import PAYLOAD_BYTES_SQL

log = logging.getLogger("retry_scheduler.compact")

#: Every column of retry_jobs, in table order. A migration adding one must add it here too (checked).
COLUMNS: tuple[str, ...] = (
    "id", "source_topic", "source_partition", "source_offset", "source_timestamp_ms", "destination",
    "destination_partition", "msg_key", "msg_value", "headers", "attempt", "policy", "reason", "error_class",
    "consumer_group", "retry_id", "original_topic", "original_partition", "original_offset", "first_seen_at",
    "due_at", "status", "dead_reason", "dlq_topic", "lease_until", "claimed_by", "publish_failures",
    "last_error", "published_at", "dead_at", "dlq_published_at", "created_at", "updated_at", "held_by",
)  # fmt: skip
STAGING_TABLE = "retry_compaction_archived"


class CompactionError(RuntimeError):
    """A compaction run cannot go on safely; the message says what to check."""


class ArchiveVerificationError(CompactionError):
    """Selected jobs are missing from the archive after the write; nothing was deleted."""


@dataclass(frozen=True)
class Window:
    """The processed jobs a run takes: ``[from, before)`` on ``published_at`` and on ``dead_at``.

    A dead job is taken only once its record is on its DLQ topic (``dlq_published_at``): until then
    PostgreSQL holds its only copy. With ``late_marks`` (a daily run), also the published jobs before
    ``published_from`` whose UTC day a run has selected already (``retry_compaction_days``): marked
    published after that run had started, they would otherwise stay in PostgreSQL for ever.
    """

    published_from: datetime | None
    published_before: datetime
    dead_from: datetime | None
    dead_before: datetime
    late_marks: bool = False

    def predicate(self) -> sql.Composed:
        """The WHERE clause; every value in it is a datetime rendered by psycopg as a timestamptz literal."""
        published = _range("published_at", self.published_from, self.published_before)
        if self.late_marks and self.published_from is not None:
            published = sql.SQL(
                "({} OR {} AND (published_at AT TIME ZONE 'UTC')::date IN (SELECT day FROM retry_compaction_days))"
            ).format(published, _range("published_at", None, self.published_from))
        return sql.SQL(
            "(status = 'published' AND {}) OR (status = 'dead' AND dlq_published_at IS NOT NULL AND {})"
        ).format(published, _range("dead_at", self.dead_from, self.dead_before))


def _range(column: str, start: datetime | None, end: datetime) -> sql.Composable:
    parts = [sql.SQL("{} < {}").format(sql.Identifier(column), sql.Literal(end))]
    if start is not None:
        parts.insert(0, sql.SQL("{} >= {}").format(sql.Identifier(column), sql.Literal(start)))
    return sql.SQL(" AND ").join(parts)


def selection_window(
    now: datetime, *, older_than_ms: int | None, day: date | None, dead_retention_ms: int
) -> Window:
    """The jobs a run takes: published ones, and dead ones past their retention.

    With ``older_than_ms``: published before ``now`` minus that, dead before that and past the
    retention. With ``day`` (the daily DAG run, UTC): published within the day, and dead ones whose
    retention ended by the day's end (``dead_at < end - retention``, no lower bound). So every dead
    job is taken by the first daily run after its retention ends, whichever days ran before, and
    the run of a day that is still within the retention of every dead job takes none. A job marked
    published after its own day's run had started (a late acknowledgement, a bulk replay's batch) is
    taken by the next daily run (``late_marks``); the published jobs of a day no run has selected are
    left to that day's run (a backfill archives exactly its days). Each row is archived under the day
    of its own time, whichever run took it. A dead job
    is never taken later than its retention: ``dead_before`` is also capped at ``now`` minus it.
    """
    dead_cutoff = now - timedelta(milliseconds=dead_retention_ms)
    if day is not None:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        dead_before = min(end - timedelta(milliseconds=dead_retention_ms), dead_cutoff)
        return Window(start, end, None, dead_before, late_marks=True)
    if older_than_ms is None:
        raise CompactionError("a compaction needs --older-than or --day")
    cutoff = now - timedelta(milliseconds=older_than_ms)
    return Window(None, cutoff, None, min(cutoff, dead_cutoff))


#: The tables compaction takes jobs from: the pending and dead ones, and the published ones (migration
#: 0014); read together as the view retry_jobs_all.
TABLES = ("retry_jobs", "retry_published_jobs")


def check_columns(conn: psycopg.Connection[Any]) -> None:
    for table in TABLES:
        rows = conn.execute(q("compaction_columns"), {"table": table}).fetchall()
        found = {row[0] for row in rows}
        if not found:
            raise CompactionError(
                f"the database has no {table} table: run `retry-scheduler db migrate` first"
            )
        if found != set(COLUMNS):
            raise CompactionError(
                f"{table} has columns {sorted(found - set(COLUMNS))} the archive does not know and lacks "
                f"{sorted(set(COLUMNS) - found)}: update COLUMNS in retry_scheduler/db/compaction.py "
                "before compacting"
            )


def record_day(conn: psycopg.Connection[Any], day: date) -> None:
    """Record that a run selects for ``day`` (before it selects): the published jobs of that day left
    in PostgreSQL after it are late marks, for the next daily run."""
    conn.execute(q("compaction_record_day"), {"day": day})


def take_lock(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(q("compaction_lock")).fetchone()
    if not (row and row[0]):
        raise CompactionError("another compaction run is in progress; run again when it has finished")


#: The UTC day (``YYYY-MM-DD``) a job was processed, as ``with_partition_columns`` computes it.
_DAY_SQL = "to_char(CASE status WHEN 'published' THEN published_at ELSE dead_at END AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


@dataclass(frozen=True)
class CompactionSummary:
    """What a run selected, counted in PostgreSQL: jobs per processed day, id bounds, largest payload."""

    days: dict[str, int]
    low: int | None
    high: int | None
    max_payload: int | None

    @property
    def count(self) -> int:
        return sum(self.days.values())


def select_and_stage(conn: psycopg.Connection[Any], window: Window, run_id: str | None) -> CompactionSummary:
    """Count the selected jobs by day and, with a ``run_id``, stage their ids, in one statement.

    The staged ids are the only ones a run may delete; a retried run (same id) starts afresh. Call it
    holding the compaction lock (:func:`take_lock`): staging clears what earlier runs left.
    """
    selected = sql.SQL("SELECT id, {} AS day, {} AS payload FROM retry_jobs_all WHERE {}").format(
        sql.SQL(_DAY_SQL), sql.SQL(PAYLOAD_BYTES_SQL), window.predicate()
    )
    summary = sql.SQL(
        "SELECT day, count(*), min(id), max(id), max(payload) FROM selected GROUP BY day ORDER BY day"
    )
    if run_id is None:
        query = sql.SQL("WITH selected AS ({}) {}").format(selected, summary)
    else:
        # Every run's staged ids, not only this one's: the caller holds the compaction lock, so what is
        # there was left by a run that died (killed before it could clear its own).
        conn.execute(q("compaction_unstage_all"))
        query = sql.SQL(
            "WITH selected AS MATERIALIZED ({}), staged AS"
            " (INSERT INTO retry_compaction_archived (run_id, id) SELECT {}, id FROM selected) {}"
        ).format(selected, sql.Literal(run_id), summary)
    rows = conn.execute(query).fetchall()
    return CompactionSummary(
        days={day: count for day, count, *_rest in rows},
        low=min((row[2] for row in rows), default=None),
        high=max((row[3] for row in rows), default=None),
        max_payload=max((row[4] for row in rows), default=None),
    )


def delete_archived(
    conn: psycopg.Connection[Any],
    database_url: str,
    run_id: str,
    window: Window,
    batch: int,
    *,
    workers: int = 1,
) -> int:
    """Delete the run's staged jobs from retry_jobs and retry_published_jobs, ``batch`` ids at a time, each batch committed alone.

    Only once the verification found every staged job still selected in the archive. A job that no
    longer matches the selection (e.g. replayed since) is kept. With ``workers`` > 1 that many
    connections delete disjoint id ranges side by side; the first error stops them all and is raised
    (the batches already committed stay deleted, the next run deletes the rest).
    """
    row = conn.execute(q("compaction_staged_bounds"), {"run": run_id}).fetchone()
    if row is None or row[0] is None:
        return 0
    low, high, staged = row
    # One statement for both tables; each deletes only what is still selected.
    staged_ids = "(SELECT id FROM retry_compaction_archived WHERE run_id = %(run)s AND id BETWEEN %(start)s AND %(end)s)"
    query = sql.SQL(
        "WITH pending_or_dead AS (DELETE FROM retry_jobs WHERE id IN {staged} AND ({where}) RETURNING 1),"
        " published AS (DELETE FROM retry_published_jobs WHERE id IN {staged} AND ({where}) RETURNING 1)"
        " SELECT (SELECT count(*) FROM pending_or_dead) + (SELECT count(*) FROM published)"
    ).format(staged=sql.SQL(staged_ids), where=window.predicate())
    ranges = [(start, min(start + batch - 1, high)) for start in range(low, high + 1, batch)]
    deleted, done, lock, failed = 0, 0, threading.Lock(), threading.Event()

    def delete(on: psycopg.Connection[Any], share: Sequence[tuple[int, int]]) -> None:
        nonlocal deleted, done
        for start, end in share:
            if failed.is_set():
                return
            with on.transaction():
                row = on.execute(query, {"run": run_id, "start": start, "end": end}).fetchone()
                count = int(row[0]) if row else 0
            with lock:
                deleted, done = deleted + count, done + 1
                log.info(
                    "deleted %s of %s archived jobs (%s of %s id ranges)", deleted, staged, done, len(ranges)
                )
            faults.checkpoint("compaction.deleted")  # chaos: the job dies between two delete batches

    if workers <= 1 or len(ranges) == 1:
        delete(conn, ranges)
        return deleted

    def worker(share: Sequence[tuple[int, int]]) -> None:
        try:
            with connect(database_url, autocommit=True) as own:
                delete(own, share)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compaction-delete") as pool:
        futures = [pool.submit(worker, ranges[i::workers]) for i in range(min(workers, len(ranges)))]
    for future in futures:
        future.result()  # the first error, if any
    return deleted


def vacuum_published(database_url: str) -> bool:
    """VACUUM retry_published_jobs after a run deleted from it, where the server's autovacuum is off:
    nothing else makes the space of the deleted rows reusable, and the table would only grow. The
    publish loop vacuums retry_jobs itself (db/vacuum.py); retry_published_jobs is only appended to
    between compactions. Returns whether it ran; a failure is logged, never raised (the run is done)."""
    try:
        with connect(database_url, autocommit=True, statement_timeout=0) as conn:
            row = conn.execute(q("autovacuum_on")).fetchone()
            if row and row[0]:
                return False
            began = time.monotonic()
            conn.execute(q("vacuum_published"))
    except psycopg.Error as exc:
        log.warning("VACUUM retry_published_jobs failed: %s: %s", type(exc).__name__, exc)
        return False
    log.info(
        "VACUUM retry_published_jobs took %.1f s (the server's autovacuum is off)", time.monotonic() - began
    )
    return True


def clear_staging(conn: psycopg.Connection[Any], run_id: str) -> None:
    try:
        conn.execute(q("compaction_unstage"), {"run": run_id})
    except psycopg.Error as exc:  # scratch rows in an unlogged table: not worth masking the real outcome
        log.warning("could not clear %s for run %s: %s", STAGING_TABLE, run_id, exc)


def window_table(conn: psycopg.Connection[Any], window: Window) -> str:
    """The window's jobs as a JDBC ``dbtable`` subquery (its values rendered as literals)."""
    columns = sql.SQL(", ").join(
        sql.SQL("status::text AS status") if c == "status" else sql.Identifier(c) for c in COLUMNS
    )
    table = sql.SQL("(SELECT {} FROM retry_jobs_all WHERE {}) AS compaction_selection").format(
        columns, window.predicate()
    )
    return table.as_string(conn)


def staged_table(conn: psycopg.Connection[Any], run_id: str) -> str:
    """The ids the run staged, as a JDBC ``dbtable`` subquery."""
    table = sql.SQL("(SELECT id FROM retry_compaction_archived WHERE run_id = {}) AS staged").format(
        sql.Literal(run_id)
    )
    return table.as_string(conn)
