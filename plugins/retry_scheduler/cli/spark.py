"""The PySpark commands: ``bulk-retry`` and ``compact``, run with spark-submit."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from retry_scheduler.cli.args import DURATION_HELP, duration
from retry_scheduler.cli.progress import progress
from retry_scheduler.core.config import Settings


def _cmd_bulk_retry(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.spark.submit import BULK_RETRY_APP, bulk_retry_args, run_spark_submit

    if not args.dry_run:  # one line now, rather than a Spark job's failure in a page of JVM log
        from retry_scheduler.loops.kafka import require_reachable

        require_reachable(settings)

    from retry_scheduler.cli.selection_args import SELECTION_PARAMS

    params = {name: getattr(args, name, None) for name in SELECTION_PARAMS}
    params |= {"dry_run": args.dry_run, "mark_batch": args.mark_batch, "rate": args.rate}
    with progress("bulk-retry", unit="Spark tasks") as report:
        return run_spark_submit(
            BULK_RETRY_APP,
            bulk_retry_args(params, settings),
            settings,
            master=args.master,
            progress=report,
            show=_show(args.json, lambda result: bulk_retry_summary(result, args.status)),
        )


def _cmd_compact(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.spark.submit import COMPACT_APP, compact_args, run_spark_submit

    job_args = compact_args(
        older_than=args.older_than,
        archive=args.archive,
        dead_retention=args.dead_retention,
        dry_run=args.dry_run,
        delete_batch=args.delete_batch,
    )
    with progress("compact", unit="Spark tasks") as report:
        return run_spark_submit(
            COMPACT_APP,
            job_args,
            settings,
            master=args.master,
            progress=report,
            show=_show(args.json, compact_summary),
        )


def bulk_retry_summary(result: dict[str, Any], status: str = "dead") -> str:
    """What a bulk retry of ``status`` jobs did, in a sentence (``--json`` prints the whole result)."""
    if result.get("dry_run"):
        return f"dry run: {result.get('selected', 0):,} {status} jobs would be re-published (nothing changed)"
    failed = result.get("failed", 0)
    text = (
        f"published {result.get('published', 0):,} of {result.get('selected', 0):,} selected {status} jobs, "
        f"{failed:,} failed (run {result.get('run_id')})"
    )
    if result.get("rate_per_s"):
        text += f", paced at {result['rate_per_s']:,g} jobs/s per destination"
    if failed:
        text += "; run the same command again: the jobs not published are selected again"
    return text


def compact_summary(result: dict[str, Any]) -> str:
    """What a compaction did, in a sentence (``--json`` prints the whole result)."""
    if result.get("dry_run"):
        return (
            f"dry run: {result.get('selected', 0):,} processed jobs would be archived and deleted "
            "(nothing written, nothing deleted)"
        )
    return (
        f"archived {result.get('archived_new', 0):,} jobs ({result.get('already_archived', 0):,} were "
        f"already in the archive), deleted {result.get('deleted', 0):,} from PostgreSQL; manifest "
        f"{result.get('manifest')}"
    )


def _show(as_json: bool, summary: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], None]:
    def show(result: dict[str, Any]) -> None:
        print(json.dumps(result) if as_json else summary(result), flush=True)

    return show


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="the job's whole result as one JSON object (default: a sentence)"
    )


def _add_master(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        metavar="URL",
        help="where the job runs: local[*] (this machine, the default), spark://HOST:PORT (a standalone "
        "cluster, client mode), yarn, k8s://...; RETRY_SPARK_MASTER sets the default",
    )


def add_parsers(sub: Any) -> None:
    """Register ``bulk-retry`` and ``compact``."""
    from retry_scheduler.cli.selection_args import add_selection_arguments

    bulk = sub.add_parser(
        "bulk-retry",
        help="re-publish a large filtered set of jobs with PySpark (same job as the retry_bulk_replay DAG)",
        description="Select jobs with the filters of `retry-scheduler dlq` (same names, same meaning), dead "
        "or pending, and publish them back to their destinations with Spark (local mode unless --master). "
        "Try --dry-run first: it only counts.",
    )
    add_selection_arguments(bulk, status=True)
    bulk.add_argument("--dry-run", action="store_true", help="only count the selected jobs")
    bulk.add_argument(
        "--mark-batch",
        type=int,
        metavar="N",
        help="acknowledged jobs marked published per transaction (10000); after a crash, the jobs of "
        "batches not yet committed are published again by the next run, with the same retry.id",
    )
    bulk.add_argument(
        "--rate",
        metavar="N",
        help="publish at most N jobs of each destination per second, the job's partitions sharing it "
        "(default, or 0: as fast as it goes; a bulk retry is the fast path: dlq replay paces large "
        "replays by default)",
    )
    _add_json(bulk)
    _add_master(bulk)
    bulk.set_defaults(func=_cmd_bulk_retry)

    compact = sub.add_parser(
        "compact",
        help="archive processed jobs to Parquet and delete them (same job as the retry_compaction DAG)",
        description="Archive published jobs, and dead jobs past their retention, processed more than "
        "--older-than ago, to Parquet partitioned by day and destination; verify the archive, then delete "
        "those rows from PostgreSQL in bounded batches.",
    )
    compact.add_argument(
        "--older-than",
        type=duration,
        default="7d",
        metavar="DURATION",
        help=f"processed before now - this (7d): {DURATION_HELP}",
    )
    compact.add_argument("--archive", metavar="URI", help="local directory or Hadoop URI (RETRY_ARCHIVE_URI)")
    compact.add_argument(
        "--dead-retention",
        type=duration,
        default="30d",
        metavar="DURATION",
        help="keep dead jobs this long (30d)",
    )
    compact.add_argument("--dry-run", action="store_true", help="only count what would be archived")
    compact.add_argument(
        "--delete-batch", type=int, metavar="N", help="archived jobs deleted per transaction (50000)"
    )
    _add_json(compact)
    _add_master(compact)
    compact.set_defaults(func=_cmd_compact)
