"""Compaction, the library of the PySpark job: archive processed retry jobs to Parquet, then delete them.

The job's entry point is ``include/spark/compact.py`` (installed as
``retry_scheduler.spark.jobs.compact``); its docstring says how to run it and what a run does. The
PostgreSQL side is :mod:`retry_scheduler.db.compaction`; the transforms here are pure
functions of DataFrames.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from typing import Any

import psycopg
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from retry_scheduler.core import faults
from retry_scheduler.core.config import ConfigError
from retry_scheduler.core.durations import parse_duration_ms
from retry_scheduler.db.compaction import (
    ArchiveVerificationError,
    CompactionError,
    Window,
    check_columns,
    clear_staging,
    delete_archived,
    record_day,
    select_and_stage,
    selection_window,
    take_lock,
    vacuum_published,
)
from retry_scheduler.db.connection import StoreError, connect
from retry_scheduler.spark.archive_io import (
    archive_files,
    check_written,
    compare_digests,
    read_archived_ids,
    recorded_digests,
    sync_archive,
    write_archive,
    write_manifest,
)
from retry_scheduler.spark.compaction_reads import (
    DAY_PATTERN,
    MAX_DURATION_MS,
    NONE_DESTINATION,
    RUN_ID_PATTERN,
    archive_uri,
    read_staged_ids,
    read_window,
)
from retry_scheduler.spark.connection_file import add_connection_options, job_settings
from retry_scheduler.spark.jdbc import JdbcTarget, fetch_rows, jdbc_target
from retry_scheduler.spark.progress import reporting

log = logging.getLogger("retry_scheduler.compact")

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
    report = _new_report(args, run_id, archive, window, started)
    with connect(args.database_url, autocommit=True) as conn:
        if not args.dry_run:
            take_lock(conn)  # a session lock: freed when this connection closes, even if the driver dies
        check_columns(conn)
        if args.day is not None and not args.dry_run:
            record_day(conn, args.day)
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

                # The run archives exactly what it staged: the staged ids are read once and joined in
                # Spark (broadcast to every task while they are few), so PostgreSQL only scans id
                # ranges of retry_jobs instead of probing the staging table for every row.
                kept, staged = (
                    (None, None) if args.dry_run else staged_ids(spark, jdbc, conn, run_id, selection.count)
                )

                def read() -> DataFrame:
                    rows = read_window(spark, jdbc, conn, window, bounds, args.partitions, fetchsize)
                    if staged is not None:
                        rows = rows.join(staged, on="id", how="left_semi")
                    return with_partition_columns(rows)

                try:
                    _archive_and_delete(spark, conn, args, run_id, window, root, read, staged, report)
                finally:
                    if kept is not None:
                        kept.unpersist()
        finally:
            if not args.dry_run:
                clear_staging(conn, run_id)
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


def _new_report(
    args: argparse.Namespace, run_id: str, archive: str, window: Window, started: datetime
) -> dict[str, Any]:
    """A run's report before it selects anything (its manifest, once written)."""
    return {
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
        "files_synced": 0,
        "files": [],
        "days": [],
        "fetch_rows": None,
        "started_at": started.isoformat(),
    }


def _describe(report: dict[str, Any]) -> str:
    if report["day"]:
        return f"day {report['day']}, dead before {report['dead_before']}"
    return f"processed before {report['cutoff']}, dead before {report['dead_before']}"


def _archive_and_delete(
    spark: SparkSession,
    conn: psycopg.Connection[Any],
    args: argparse.Namespace,
    run_id: str,
    window: Window,
    root: str,
    read: Callable[[], DataFrame],
    staged: DataFrame | None,
    report: dict[str, Any],
) -> None:
    """Archive, verify and delete the staged selection; ``read()`` reads it afresh over JDBC.

    ``read()`` returns the jobs this run staged (``staged``, None on a dry run) that are still selected. The archive is written from
    one read of every column (no copy of the rows is kept in Spark), synced, and the files written
    are read back and checked against the staging (:func:`check_written`); then every job still
    selected must be found in the archive by id. What is deleted is what was staged, is still
    selected and is in the archive: a job that left the selection meanwhile (replayed from the DLQ)
    is kept, one that joined it (processed during the run with an earlier time) is left for the
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
    before = archive_files(spark, root, days)
    if selected > already:
        rows = read()
        write_archive(rows if existing is None else missing_from_archive(rows, existing), root)
    lap("write_archive")
    report["files_synced"] = sync_archive(root, days)  # durable before it is verified and relied on
    lap("sync_archive")
    written = sorted(archive_files(spark, root, days) - before)
    assert staged is not None  # only a dry run has no staging, and it returned before the write
    report["files"] = check_written(spark, staged, written, existing, root)
    lap("check_files")
    found = _verify_archived(spark, read, root, days, selected)
    # Every file of these days that a manifest lists (earlier runs', and this run's own) still holds the
    # rows and ids it recorded: archived rows are never relied on, nor more deleted, on a changed archive.
    recorded = recorded_digests(spark, report["archive"], days)
    recorded.update({d["file"]: ("this run", d) for d in report["files"]})
    compare_digests(spark, root, recorded)
    report["files_compared"] = len(recorded)
    lap("verify")
    faults.checkpoint("compaction.archived")  # chaos: the job dies with the archive written, nothing deleted
    report["deleted"] = delete_archived(
        conn, args.database_url, run_id, window, args.delete_batch, workers=args.delete_workers
    )
    lap("delete")
    if report["deleted"]:
        report["vacuumed"] = vacuum_published(args.database_url)
        lap("vacuum")
    if report["deleted"] < found:
        log.warning(
            "%s archived jobs were kept in PostgreSQL: they left the selection during the run, or joined it "
            "after it was staged (the next run deletes those)",
            found - report["deleted"],
        )


def _verify_archived(
    spark: SparkSession, read: Callable[[], DataFrame], root: str, days: list[str], selected: int
) -> int:
    """How many of the jobs still selected (``read()``, afresh) the archive holds (read afresh too);
    :class:`ArchiveVerificationError` unless it holds every one of them."""
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
            # Staged by this run (read() reads nothing else), still selected, and not in the archive.
            raise ArchiveVerificationError(
                f"{still - found} of {selected} selected jobs are not in the archive at {root} after the "
                "write; nothing was deleted. Check the archive's file system, then run the compaction again."
            )
    finally:
        still_selected.unpersist()
    return found


#: Up to this many staged ids are broadcast to the tasks (about 16 bytes each in the hash table);
#: a larger selection is joined by shuffling the ids instead.
BROADCAST_STAGED_IDS = 2_000_000


def staged_ids(
    spark: SparkSession, jdbc: JdbcTarget, conn: psycopg.Connection[Any], run_id: str, count: int
) -> tuple[DataFrame, DataFrame]:
    """The ids the run staged, read once and kept (for the write, the verification and the file check).

    Returns the kept frame (to unpersist) and the one to join with (broadcast while they are few).
    """
    ids = read_staged_ids(spark, jdbc, conn, run_id).persist(StorageLevel.MEMORY_AND_DISK)
    return ids, (F.broadcast(ids) if count <= BROADCAST_STAGED_IDS else ids)


# --- command line ---------------------------------------------------------------------------------


def _duration(text: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if ms > MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"duration {text!r} is longer than 100 years")
    return ms


def _day(text: str) -> date:
    try:
        if not DAY_PATTERN.match(text):
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
    if not RUN_ID_PATTERN.match(text):
        raise argparse.ArgumentTypeError(
            f"run id {text!r} must be 1-200 letters, digits or . _ - : + @ (Airflow run ids are fine)"
        )
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compact.py",
        description="Archive processed retry jobs to Parquet, then delete them from PostgreSQL.",
    )
    add_connection_options(parser, kafka=False)
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
    args.database_url = job_settings(args).database_url
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


def run(argv: list[str] | None = None) -> int:
    """The job's command line: the counts as one JSON line on stdout; exit 2 when it cannot start."""
    try:
        with reporting("compact"):
            result = main(argv)
    except ArchiveVerificationError:
        raise  # nothing was deleted; the traceback shows where the archive and the selection differ
    except (CompactionError, StoreError, ConfigError) as exc:
        # Cannot start (no schema, another run in progress, PostgreSQL unreachable): say why, exit 2.
        print(f"compact: {exc}", file=sys.stderr)
        return 2
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print(json.dumps(result, sort_keys=True))
    return 0
