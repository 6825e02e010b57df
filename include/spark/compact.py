"""Compaction: archive processed retry jobs to Parquet, then delete them from PostgreSQL.

The ``retry_compaction`` DAG runs it once a day for the UTC day of its data interval; by hand::

    spark-submit --jars /usr/share/java/postgresql.jar include/spark/compact.py \\
        --database-url postgresql://postgres@127.0.0.1:5432/retry_scheduler \\
        --archive /data/retry-archive --older-than 7d

Processed jobs are ``published`` ones (processed at ``published_at``) and ``dead`` ones older than the
dead retention (processed at ``dead_at``). A run selects them (``--older-than``: processed before
now minus that; ``--day D``: processed within the UTC day D), then:

1. in one statement, counts them by day and stages their ids in ``retry_compaction_archived``;
2. appends to ``<archive>/retry_jobs/day=YYYY-MM-DD/destination=TOPIC/`` only the rows whose id is not
   archived for that day yet (one read of every column), so a re-run after a crash archives nothing
   twice;
3. verifies that every staged job still selected (one replayed meanwhile is left alone) is now in
   the archive, and raises, deleting nothing, if one is not;
4. deletes the staged jobs still selected from ``retry_jobs`` in bounded id-range batches, each its
   own transaction (a job that no longer matches the selection, e.g. replayed from the DLQ
   meanwhile, is kept);
5. writes ``<archive>/_manifests/<run_id>.json`` with the counts.

The archive keeps every column of ``retry_jobs`` (``status`` as text). A null destination is archived
under ``destination=__none__``: the default allowlist lets no destination start with ``_``. Timestamps
are Parquet ``TIMESTAMP_MICROS`` (UTC instants). One run at a time: a second one fails fast on an
advisory lock rather than racing the first to the same day partitions.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

# Plain spark-submit from a checkout: the retry_scheduler package lives in plugins/ (on a cluster it is
# pip-installed and this directory does not exist).
_PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
if _PLUGINS.is_dir() and str(_PLUGINS) not in sys.path:
    sys.path.insert(0, str(_PLUGINS))

from retry_scheduler.core.durations import parse_duration_ms  # noqa: E402
from retry_scheduler.db.connection import StoreError, connect  # noqa: E402
from retry_scheduler.spark.jdbc import PAYLOAD_BYTES_SQL, JdbcTarget, fetch_rows, jdbc_target  # noqa: E402

log = logging.getLogger("retry_scheduler.compact")

#: Every column of retry_jobs, in table order. A migration adding one must add it here too (checked).
COLUMNS: tuple[str, ...] = (
    "id", "source_topic", "source_partition", "source_offset", "source_timestamp_ms", "destination",
    "destination_partition", "msg_key", "msg_value", "headers", "attempt", "policy", "reason", "error_class",
    "consumer_group", "retry_id", "original_topic", "original_partition", "original_offset", "first_seen_at",
    "due_at", "status", "dead_reason", "dlq_topic", "lease_until", "claimed_by", "publish_failures",
    "last_error", "published_at", "dead_at", "dlq_published_at", "created_at", "updated_at",
)  # fmt: skip
PARTITION_COLUMNS = ("day", "destination")
NONE_DESTINATION = "__none__"
STAGING_TABLE = "retry_compaction_archived"
#: What the run reads back from the archive: ids, with the partition columns typed as strings.
ARCHIVED_ID_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("day", StringType()),
        StructField("destination", StringType()),
    ]
)
_LOCK = (7311, "retry_compaction")
_MAX_DURATION_MS = 36_500 * 86_400_000
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Airflow run ids ("scheduled__2025-01-01T00:00:00+00:00") are fine; the manifest name is sanitised.
_RUN_ID = re.compile(r"^[\w.:+@-]{1,200}$")


class CompactionError(RuntimeError):
    """A compaction run cannot go on safely; the message says what to check."""


class ArchiveVerificationError(CompactionError):
    """Selected jobs are missing from the archive after the write; nothing was deleted."""


@dataclass(frozen=True)
class Window:
    """The processed jobs a run takes: ``[from, before)`` on ``published_at`` and on ``dead_at``."""

    published_from: datetime | None
    published_before: datetime
    dead_from: datetime | None
    dead_before: datetime

    def predicate(self) -> sql.Composed:
        """The WHERE clause; every value in it is a datetime rendered by psycopg as a timestamptz literal."""
        return sql.SQL("(status = 'published' AND {}) OR (status = 'dead' AND {})").format(
            _range("published_at", self.published_from, self.published_before),
            _range("dead_at", self.dead_from, self.dead_before),
        )


def _range(column: str, start: datetime | None, end: datetime) -> sql.Composable:
    parts = [sql.SQL("{} < {}").format(sql.Identifier(column), sql.Literal(end))]
    if start is not None:
        parts.insert(0, sql.SQL("{} >= {}").format(sql.Identifier(column), sql.Literal(start)))
    return sql.SQL(" AND ").join(parts)


def selection_window(
    now: datetime, *, older_than_ms: int | None, day: date | None, dead_retention_ms: int
) -> Window:
    """Published jobs processed before the cutoff (or within ``day``, UTC); dead ones also past retention."""
    dead_cutoff = now - timedelta(milliseconds=dead_retention_ms)
    if day is not None:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        return Window(start, end, start, min(end, dead_cutoff))
    if older_than_ms is None:
        raise CompactionError("a compaction needs --older-than or --day")
    cutoff = now - timedelta(milliseconds=older_than_ms)
    return Window(None, cutoff, None, min(cutoff, dead_cutoff))


def archive_uri(archive: str) -> str:
    """The archive as a URI: a plain path is local (``file://``), never the cluster's default file system."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", archive):
        return archive.rstrip("/")
    return "file://" + str(Path(archive).expanduser().resolve())


def _local_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    # Hadoop does not percent-decode paths either: the same string names the same file for both.
    return Path(parts.path) if parts.scheme == "file" else None


# --- pure transforms ------------------------------------------------------------------------------


def processed_at(status: Column, published_at: Column, dead_at: Column) -> Column:
    """When a job was processed: published at its publication, dead at its death."""
    return F.when(status == "published", published_at).when(status == "dead", dead_at)


def with_partition_columns(jobs: DataFrame) -> DataFrame:
    """Add ``day`` (UTC date of the processed time, ``YYYY-MM-DD``); name null destinations ``__none__``.

    The day is computed from epoch seconds, so it is the UTC day whatever the session time zone.
    """
    processed = processed_at(F.col("status"), F.col("published_at"), F.col("dead_at"))
    epoch_day = F.floor(F.unix_seconds(processed) / 86_400).cast("int")
    return jobs.withColumn(
        "destination", F.coalesce(F.col("destination"), F.lit(NONE_DESTINATION))
    ).withColumn("day", F.date_from_unix_date(epoch_day).cast("string"))


def missing_from_archive(selection: DataFrame, archived: DataFrame) -> DataFrame:
    """Rows of ``selection`` whose id is not among ``archived``'s ids (the rows still to write)."""
    return selection.join(archived.select("id"), on="id", how="left_anti").select(*selection.columns)


def found_in_archive(selection: DataFrame, archived: DataFrame) -> DataFrame:
    """Ids of ``selection`` that are among ``archived``'s ids, each once."""
    return selection.select("id").join(archived.select("id"), on="id", how="left_semi")


# --- archive I/O ----------------------------------------------------------------------------------


def _hadoop_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "compaction needs a classic (not Spark Connect) session"
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def path_exists(spark: SparkSession, uri: str) -> bool:
    path, fs = _hadoop_path(spark, uri)
    return bool(fs.exists(path))


def write_text_hadoop(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small file through the Hadoop file system of ``uri`` (s3a://, hdfs://, abfs://, ...)."""
    path, fs = _hadoop_path(spark, uri)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def read_archived_ids(spark: SparkSession, root: str, days: Sequence[str]) -> DataFrame | None:
    """Ids archived under ``root`` for ``days`` (only those day partitions are listed and read); None if none."""
    paths = [f"{root}/day={day}" for day in days]
    present = [p for p in paths if path_exists(spark, p)]
    if not present:
        return None
    return spark.read.schema(ARCHIVED_ID_SCHEMA).option("basePath", root).parquet(*present).select("id")


@contextmanager
def _sql_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    previous = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def write_archive(rows: DataFrame, root: str) -> None:
    """Append ``rows`` (with their ``day`` and ``destination`` columns) to the archive under ``root``."""
    # Standard Parquet timestamps rather than Spark's legacy INT96, for any reader of the archive.
    with _sql_conf(rows.sparkSession, "spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"):
        rows.write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(root)


def write_manifest(spark: SparkSession, archive: str, report: dict[str, Any]) -> str:
    """Write ``<archive>/_manifests/<run_id>.json``; returns its URI."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", report["run_id"]) + ".json"
    uri = f"{archive}/_manifests/{name}"
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    local = _local_path(uri)
    if local is None:
        write_text_hadoop(spark, uri, text)
    else:
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.partial")
        partial.write_text(text)
        partial.replace(local)
    return uri


# --- PostgreSQL -----------------------------------------------------------------------------------


def _check_columns(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = 'retry_jobs'"
    ).fetchall()
    found = {row[0] for row in rows}
    if not found:
        raise CompactionError("the database has no retry_jobs table: run `retry-scheduler db migrate` first")
    if found != set(COLUMNS):
        raise CompactionError(
            f"retry_jobs has columns {sorted(found - set(COLUMNS))} the archive does not know and lacks "
            f"{sorted(set(COLUMNS) - found)}: update COLUMNS in include/spark/compact.py before compacting"
        )


def _take_lock(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", _LOCK).fetchone()
    if not (row and row[0]):
        raise CompactionError("another compaction run is in progress; run again when it has finished")


def read_selection(
    spark: SparkSession,
    jdbc: JdbcTarget,
    conn: psycopg.Connection[Any],
    window: Window,
    bounds: tuple[int, int],
    partitions: int,
    fetchsize: int,
) -> DataFrame:
    """The selected jobs, read over JDBC in ``partitions`` id ranges, ``fetchsize`` rows per round trip."""
    columns = sql.SQL(", ").join(
        sql.SQL("status::text AS status") if c == "status" else sql.Identifier(c) for c in COLUMNS
    )
    table = sql.SQL("(SELECT {} FROM retry_jobs WHERE {}) AS compaction_selection").format(
        columns, window.predicate()
    )
    return (
        spark.read.format("jdbc")
        .options(**jdbc.options())
        .option("dbtable", table.as_string(conn))
        .option("partitionColumn", "id")
        .option("lowerBound", str(bounds[0]))
        .option("upperBound", str(bounds[1]))
        .option("numPartitions", str(partitions))
        .option("fetchsize", str(fetchsize))
        .load()
    )


#: The UTC day (``YYYY-MM-DD``) a job was processed, as ``with_partition_columns`` computes it.
_DAY_SQL = "to_char(CASE status WHEN 'published' THEN published_at ELSE dead_at END AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


@dataclass(frozen=True)
class Selection:
    """What a run selected, counted in PostgreSQL: jobs per processed day, id bounds, largest payload."""

    days: dict[str, int]
    low: int | None
    high: int | None
    max_payload: int | None

    @property
    def count(self) -> int:
        return sum(self.days.values())


def select_and_stage(conn: psycopg.Connection[Any], window: Window, run_id: str | None) -> Selection:
    """Count the selected jobs by day and, with a ``run_id``, stage their ids, in one statement.

    The staged ids are the only ones a run may delete; a retried run (same id) starts afresh.
    """
    selected = sql.SQL("SELECT id, {} AS day, {} AS payload FROM retry_jobs WHERE {}").format(
        sql.SQL(_DAY_SQL), sql.SQL(PAYLOAD_BYTES_SQL), window.predicate()
    )
    summary = sql.SQL(
        "SELECT day, count(*), min(id), max(id), max(payload) FROM selected GROUP BY day ORDER BY day"
    )
    if run_id is None:
        query = sql.SQL("WITH selected AS ({}) {}").format(selected, summary)
    else:
        conn.execute("DELETE FROM retry_compaction_archived WHERE run_id = %s", (run_id,))
        query = sql.SQL(
            "WITH selected AS MATERIALIZED ({}), staged AS"
            " (INSERT INTO retry_compaction_archived (run_id, id) SELECT {}, id FROM selected) {}"
        ).format(selected, sql.Literal(run_id), summary)
    rows = conn.execute(query).fetchall()
    return Selection(
        days={day: count for day, count, *_rest in rows},
        low=min((row[2] for row in rows), default=None),
        high=max((row[3] for row in rows), default=None),
        max_payload=max((row[4] for row in rows), default=None),
    )


def read_staged_ids(
    spark: SparkSession, jdbc: JdbcTarget, conn: psycopg.Connection[Any], run_id: str
) -> DataFrame:
    """The ids the run staged, over JDBC (only read to tell a lost row from one that joined the selection)."""
    table = sql.SQL("(SELECT id FROM retry_compaction_archived WHERE run_id = {}) AS staged").format(
        sql.Literal(run_id)
    )
    return spark.read.format("jdbc").options(**jdbc.options()).option("dbtable", table.as_string(conn)).load()


def delete_archived(
    conn: psycopg.Connection[Any],
    database_url: str,
    run_id: str,
    window: Window,
    batch: int,
    *,
    workers: int = 1,
) -> int:
    """Delete the run's staged jobs from retry_jobs, ``batch`` ids at a time, each batch committed alone.

    Only once the verification found every staged job still selected in the archive. A job that no
    longer matches the selection (e.g. replayed since) is kept. With ``workers`` > 1 that many
    connections delete disjoint id ranges side by side; the first error stops them all and is raised
    (the batches already committed stay deleted, the next run deletes the rest).
    """
    row = conn.execute(
        "SELECT min(id), max(id), count(*) FROM retry_compaction_archived WHERE run_id = %s", (run_id,)
    ).fetchone()
    if row is None or row[0] is None:
        return 0
    low, high, staged = row
    query = sql.SQL(
        "DELETE FROM retry_jobs WHERE id IN"
        " (SELECT id FROM retry_compaction_archived WHERE run_id = %s AND id BETWEEN %s AND %s) AND ({})"
    ).format(window.predicate())
    ranges = [(start, min(start + batch - 1, high)) for start in range(low, high + 1, batch)]
    deleted, done, lock, failed = 0, 0, threading.Lock(), threading.Event()

    def delete(on: psycopg.Connection[Any], share: Sequence[tuple[int, int]]) -> None:
        nonlocal deleted, done
        for start, end in share:
            if failed.is_set():
                return
            with on.transaction():
                count = on.execute(query, (run_id, start, end)).rowcount
            with lock:
                deleted, done = deleted + count, done + 1
                log.info(
                    "deleted %s of %s archived jobs (%s of %s id ranges)", deleted, staged, done, len(ranges)
                )

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


def _clear_staging(conn: psycopg.Connection[Any], run_id: str) -> None:
    try:
        conn.execute("DELETE FROM retry_compaction_archived WHERE run_id = %s", (run_id,))
    except psycopg.Error as exc:  # scratch rows in an unlogged table: not worth masking the real outcome
        log.warning("could not clear %s for run %s: %s", STAGING_TABLE, run_id, exc)


# --- the run --------------------------------------------------------------------------------------


def compact(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """Archive, verify, delete; returns the counts (also written as the run's manifest)."""
    started = datetime.now(UTC)
    run_id: str = args.run_id or f"compact__{started:%Y%m%dT%H%M%SZ}_{uuid.uuid4().hex[:8]}"
    window = selection_window(
        started, older_than_ms=args.older_than, day=args.day, dead_retention_ms=args.dead_retention
    )
    archive = archive_uri(args.archive)
    root = f"{archive}/retry_jobs"
    jdbc = jdbc_target(args.database_url)
    report: dict[str, Any] = {
        "run_id": run_id,
        "archive": archive,
        "day": args.day.isoformat() if args.day else None,
        "cutoff": None if args.day else window.published_before.isoformat(),
        "dead_before": window.dead_before.isoformat(),
        "dry_run": args.dry_run,
        "selected": 0,
        "already_archived": 0,
        "archived_new": 0,
        "deleted": 0,
        "days": [],
        "fetch_rows": None,
        "started_at": started.isoformat(),
    }
    with connect(args.database_url, autocommit=True) as conn:
        if not args.dry_run:
            _take_lock(conn)  # a session lock: freed when this connection closes, even if the driver dies
        _check_columns(conn)
        began = time.perf_counter()
        try:
            selection = select_and_stage(conn, window, None if args.dry_run else run_id)
            phases: dict[str, float] = report.setdefault("phases_s", {})  # seconds per step, for profiling
            phases["select_and_stage"] = round(time.perf_counter() - began, 3)
            # As many rows per JDBC round trip as fit 64 MiB: a row may carry up to 1 MiB of payload.
            report["fetch_rows"] = fetchsize = fetch_rows(selection.max_payload)
            report.update(selected=selection.count, days=sorted(selection.days))
            log.info(
                "compaction %s: %s processed jobs selected (%s), %s rows per JDBC round trip",
                run_id, selection.count, _describe(report), fetchsize,
            )  # fmt: skip
            if selection.count:
                assert selection.low is not None and selection.high is not None
                bounds = (selection.low, selection.high)

                def read() -> DataFrame:
                    return with_partition_columns(
                        read_selection(spark, jdbc, conn, window, bounds, args.partitions, fetchsize)
                    )

                _archive_and_delete(spark, conn, jdbc, args, run_id, window, root, read, report)
        finally:
            if not args.dry_run:
                _clear_staging(conn, run_id)
    report["finished_at"] = datetime.now(UTC).isoformat()
    if args.dry_run:
        log.info("dry run: nothing written, nothing deleted: %s", report)
        report["manifest"] = None
        return report
    report["manifest"] = write_manifest(spark, archive, report)
    log.info(
        "compaction %s: selected %s, archived %s new (%s already), deleted %s, days %s; manifest %s",
        run_id, report["selected"], report["archived_new"], report["already_archived"], report["deleted"],
        report["days"], report["manifest"],
    )  # fmt: skip
    return report


def _describe(report: dict[str, Any]) -> str:
    if report["day"]:
        return f"day {report['day']}, dead before {report['dead_before']}"
    return f"processed before {report['cutoff']}, dead before {report['dead_before']}"


def _archive_and_delete(
    spark: SparkSession,
    conn: psycopg.Connection[Any],
    jdbc: JdbcTarget,
    args: argparse.Namespace,
    run_id: str,
    window: Window,
    root: str,
    read: Callable[[], DataFrame],
    report: dict[str, Any],
) -> None:
    """Archive, verify and delete the staged selection; ``read()`` reads the selection afresh over JDBC.

    The archive is written from one read of every column (no copy of the rows is kept in Spark) and
    verified against a fresh read of the ids still selected. What is deleted is what was staged, is
    still selected and is in the archive: a job that left the selection meanwhile (replayed from the
    DLQ) is kept, one that joined it (processed during the run with an earlier time) is left for the
    next run, and a staged one still selected but not in the archive stops the run before anything
    is deleted.
    """
    phases: dict[str, float] = report["phases_s"]
    began = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal began
        phases[name] = round(time.perf_counter() - began, 3)
        began = time.perf_counter()

    selected, days = report["selected"], report["days"]
    existing = read_archived_ids(spark, root, days)
    # Ids are read from PostgreSQL for this only when the days already have an archive (a re-run).
    already = 0 if existing is None else found_in_archive(read().select("id"), existing).count()
    report.update(already_archived=already, archived_new=selected - already)
    lap("count_archived")
    if args.dry_run:
        return
    if selected > already:
        rows = read()
        write_archive(rows if existing is None else missing_from_archive(rows, existing), root)
    lap("write_archive")
    # Fresh reads: the jobs still selected, and the archive (a DataFrame's file listing is fixed when
    # it is created).
    still_selected = read().select("id").persist(StorageLevel.MEMORY_AND_DISK)
    try:
        archived = read_archived_ids(spark, root, days)
        if archived is None:
            raise ArchiveVerificationError(
                f"no archive for days {days} at {root} after the write; nothing was deleted. Check the "
                "archive's file system, then run the compaction again."
            )
        found = found_in_archive(still_selected, archived).count()
        still = still_selected.count()
        if found != still:
            # Staged by this run, still selected, and not in the archive: lost by the write.
            ours = still_selected.join(read_staged_ids(spark, jdbc, conn, run_id), on="id", how="left_semi")
            lost = missing_from_archive(ours, archived).count()
            if lost:
                raise ArchiveVerificationError(
                    f"{lost} of {selected} selected jobs are not in the archive at {root} after the write; "
                    "nothing was deleted. Check the archive's file system, then run the compaction again."
                )
            log.info(
                "%s jobs processed during the run with an earlier time are left for the next run",
                still - found,
            )
    finally:
        still_selected.unpersist()
    lap("verify")
    report["deleted"] = delete_archived(
        conn, args.database_url, run_id, window, args.delete_batch, workers=args.delete_workers
    )
    lap("delete")
    if report["deleted"] < found:
        log.warning(
            "%s archived jobs were kept in retry_jobs: they left the selection during the run, or joined it "
            "after it was staged (the next run deletes those)",
            found - report["deleted"],
        )


# --- command line ---------------------------------------------------------------------------------


def _duration(text: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if ms > _MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"duration {text!r} is longer than 100 years")
    return ms


def _day(text: str) -> date:
    try:
        if not _DAY.match(text):
            raise ValueError
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"day {text!r} is not a date like 2025-01-31") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _run_id(text: str) -> str:
    if not _RUN_ID.match(text):
        raise argparse.ArgumentTypeError(
            f"run id {text!r} must be 1-200 letters, digits or . _ - : + @ (Airflow run ids are fine)"
        )
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compact.py",
        description="Archive processed retry jobs to Parquet, then delete them from PostgreSQL.",
    )
    parser.add_argument("--database-url", required=True, help="postgresql://user:password@host:port/db")
    parser.add_argument(
        "--archive", required=True, help="local path or Hadoop URI (file://, s3a://, hdfs://...)"
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--older-than", type=_duration, help="processed longer ago than this (default 7d)")
    when.add_argument("--day", type=_day, help="processed within this UTC day (YYYY-MM-DD)")
    parser.add_argument(
        "--dead-retention", type=_duration, default="30d", help="keep dead jobs this long (default 30d)"
    )
    parser.add_argument(
        "--delete-batch", type=_positive_int, default=50_000, help="ids per delete transaction"
    )
    parser.add_argument(
        "--delete-workers",
        type=_positive_int,
        default=2,
        help="connections deleting side by side (default 2)",
    )
    parser.add_argument("--partitions", type=_positive_int, default=8, help="parallel JDBC reads (default 8)")
    parser.add_argument("--run-id", type=_run_id, help="default: compact__<UTC time>_<random>")
    parser.add_argument("--dry-run", action="store_true", help="count and report; write and delete nothing")
    args = parser.parse_args(argv)
    if args.day is None and args.older_than is None:
        args.older_than = _duration("7d")
    return args


def _log_to_stderr() -> None:
    """Progress to stderr under spark-submit; inside Airflow or pytest the host's logging is left alone."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run one compaction with command-line arguments; returns its counts."""
    args = parse_args(argv)
    _log_to_stderr()
    spark = SparkSession.getActiveSession() or SparkSession.builder.appName("retry-compaction").getOrCreate()
    return compact(spark, args)


if __name__ == "__main__":
    try:
        result = main()
    except ArchiveVerificationError:
        raise  # nothing was deleted; the traceback shows where the archive and the selection differ
    except (CompactionError, StoreError) as exc:
        # Cannot start (no schema, another run in progress, PostgreSQL unreachable): say why, exit 2.
        print(f"compact: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print(json.dumps(result, sort_keys=True))
