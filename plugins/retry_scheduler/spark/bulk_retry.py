"""Bulk retry, the library of the PySpark job: re-publish a large filtered set of ``retry_jobs``.

The job's entry point is ``include/spark/bulk_retry.py`` (installed as
``retry_scheduler.spark.jobs.bulk_retry``); its docstring says how to run it. The driver counts
the selection (:mod:`retry_scheduler.spark.selection`), the executors read it over JDBC in id
ranges, hand it to their Python workers as Arrow batches (``mapInArrow``), and each partition
produces its rows and marks them published (:mod:`retry_scheduler.spark.bulk_publish`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from retry_scheduler.core.config import ConfigError
from retry_scheduler.db.bulk_retry import BulkAudit
from retry_scheduler.db.connection import StoreError
from retry_scheduler.db.selection import Selection, SelectionError, like_pattern
from retry_scheduler.spark.bulk_guard import guarded_run
from retry_scheduler.spark.bulk_options import Options, parse_args
from retry_scheduler.spark.bulk_publish import MARKED_SCHEMA, publish_batches
from retry_scheduler.spark.jdbc import JobArgumentError, fetch_rows, jdbc_target
from retry_scheduler.spark.progress import reporting
from retry_scheduler.spark.selection import (
    BulkRetryError,
    SelectionSummary,
    left_alone,
    read_selection,
    summarize,
)

log = logging.getLogger("retry_scheduler.bulk_retry")

__all__ = ["BulkRetryError", "Selection", "jdbc_target", "like_pattern", "main", "parse_args", "run"]

#: Largest Arrow batch of selected rows handed to a Python worker.
ARROW_BATCH_BYTES = 64 * 1024 * 1024


# --- connections -------------------------------------------------------------------------------


def missing_topics(bootstrap_servers: str, extra: Mapping[str, Any], topics: Iterable[str]) -> set[str]:
    """Destinations that do not exist; their jobs are counted failed rather than waited on."""
    admin = AdminClient({**extra, "bootstrap.servers": bootstrap_servers})
    try:
        known = set(admin.list_topics(timeout=15).topics)
    except KafkaException as exc:
        raise BulkRetryError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    return set(topics) - known


# --- driver ------------------------------------------------------------------------------------


def spark_session() -> SparkSession:
    """The job's SparkSession (the active one under spark-submit or a test), with Arrow batches bounded."""
    spark = SparkSession.getActiveSession() or SparkSession.builder.appName("retry_bulk_retry").getOrCreate()
    # A job carries up to RETRY_MAX_RECORD_BYTES (1 MiB by default) of key, value and headers: bound
    # each Arrow batch handed to the Python workers by its size too, not only by its 10 000 rows.
    spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", str(ARROW_BATCH_BYTES))
    return spark


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run a bulk retry; returns ``{"run_id", "selected", "published", "failed", "dry_run", "fetch_rows",
    "marking_s", "phases_s", "not_allowed", "paused_by_breaker", "rate_per_s", "rate_limited"}`` (``rate_per_s``: the pace
    asked, None when not paced; ``rate_limited``: the destinations paced at their lower rate limit).

    ``not_allowed`` counts, per destination, the matching jobs left alone because the destination
    rules refuse their destination, and ``paused_by_breaker`` those left to the publish loop because
    their destination's breaker is open (neither part of ``selected``).

    ``fetch_rows`` is the JDBC fetch size the read used and ``marking_s`` the seconds the executors'
    UPDATEs took, summed over partitions, while they went on producing (both None when nothing was
    read); ``phases_s`` is the wall time of each step.

    One run at a time (an advisory lock, not taken by a dry run), each audited in ``retry_dlq_audit``
    (:mod:`retry_scheduler.spark.bulk_guard`).
    """
    opts = parse_args(argv)
    jdbc_target(opts.database_url)  # validated before anything runs
    with guarded_run(
        opts.database_url,
        actor=opts.actor,
        source=opts.source,
        run_id=opts.run_id,
        dry_run=opts.dry_run,
        selection={"status": str(opts.selection.status), **opts.selection.as_dict()},
        rate_per_s=opts.rate_per_s,
    ) as start_audit:
        return _run(opts, start_audit)


@dataclass
class _Chosen:
    """What a run publishes: its selection (less the destinations left alone) and its summary."""

    selection: Selection
    summary: SelectionSummary
    #: Jobs left alone per destination: not allowed by the destination rules, or behind an open breaker.
    refused: dict[str, int]
    paused: dict[str, int]
    #: Destinations whose rate limit is below the run's pace: they go at their limit (jobs/s).
    limited: dict[str, float]

    @property
    def skipped(self) -> dict[str, int]:
        """Jobs left alone, by why (the audit's ``skipped``)."""
        return {"destination not allowed": sum(self.refused.values())} | (
            {"breaker open": sum(self.paused.values())} if self.paused else {}
        )


def _choose(opts: Options) -> _Chosen:
    """The run's selection, less the destinations the rules refuse or whose breaker is open."""
    sel = opts.selection
    summary = summarize(opts.database_url, sel)
    refused, paused = left_alone(opts.run_id, opts.database_url, summary, opts.deployment.destinations)
    if refused or paused:
        sel = replace(sel, excluded=tuple(sorted({**refused, **paused})))
        summary = summarize(opts.database_url, sel)
    rules = opts.deployment.policies.rules
    limited = {
        d: limit
        for d in summary.per_destination
        if (limit := rules(d).rate_limit) is not None and (opts.rate_per_s is None or limit < opts.rate_per_s)
    }
    return _Chosen(sel, summary, refused, paused, limited)


def _print_plan(opts: Options, chosen: _Chosen) -> None:
    """A dry run's answer: what would be re-published, per destination, and at what pace."""
    summary, limited = chosen.summary, chosen.limited
    pace = (
        ("paced only by the rate limits below" if limited else "not paced")
        if opts.rate_per_s is None
        else f"paced at {opts.rate_per_s:,g} jobs/s per destination: about "
        f"{max(summary.per_destination.values(), default=0) / opts.rate_per_s:,.0f} s"
    )
    print(f"dry run: {summary.count} {chosen.selection.status} jobs would be re-published ({pace})")
    for destination, count in summary.per_destination.items():
        note = f"  at most {limited[destination]:,g}/s (its rate limit)" if destination in limited else ""
        print(f"  {destination:<40} {count:>10}{note}")
    for destination, count in chosen.refused.items():
        print(f"  {destination:<40} {count:>10}  not allowed: left alone")
    for destination, count in chosen.paused.items():
        print(f"  {destination:<40} {count:>10}  its breaker is open: left alone")


def _publish(
    spark: SparkSession, opts: Options, chosen: _Chosen, missing: set[str]
) -> tuple[int, int, int, float]:
    """Read, produce and mark the selection, partition by partition, in one Spark action: nothing is
    produced twice. Returns (JDBC fetch size, jobs marked published, failed, seconds of marking)."""
    summary = chosen.summary
    sc = spark.sparkContext
    sc.setJobDescription(f"bulk retry {opts.run_id}")
    failed_count = sc.accumulator(0)
    fetchsize = opts.fetchsize or fetch_rows(summary.max_payload_bytes)
    log.info(
        "run %s reads %s rows per JDBC round trip (largest key + value + headers: %s bytes)",
        opts.run_id, fetchsize, summary.max_payload_bytes,
    )  # fmt: skip
    jobs = read_selection(
        spark, jdbc_target(opts.database_url), chosen.selection, summary, opts.partitions, fetchsize
    )
    deliveries = jobs.mapInArrow(
        partial(
            publish_batches,
            producer_conf=opts.producer_conf,
            missing=frozenset(missing),
            failed_count=failed_count,
            database_url=opts.database_url,
            mark_batch=opts.mark_batch,
            # librdkafka fails a record itself after delivery.timeout.ms: wait a little longer.
            flush_timeout_s=int(opts.producer_conf["delivery.timeout.ms"]) / 1000 + 5,
            # The run's pace, shared evenly by its partitions (with fewer cores than partitions, slower);
            # a destination's rate limit below it, shared the same way.
            rate_per_s=None if opts.rate_per_s is None else opts.rate_per_s / opts.partitions,
            rates={d: r / opts.partitions for d, r in chosen.limited.items()},
        ),
        MARKED_SCHEMA,
    )
    partitions = deliveries.collect()
    marked = sum(row.marked for row in partitions)
    return fetchsize, marked, int(failed_count.value), round(sum(row.mark_s for row in partitions), 3)


def _run(opts: Options, start_audit: Callable[[int, dict[str, int]], BulkAudit]) -> dict[str, Any]:
    phases: dict[str, float] = {}  # seconds per step, for profiling (bench/README.md)
    began = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal began
        phases[name] = round(time.perf_counter() - began, 3)
        began = time.perf_counter()

    chosen = _choose(opts)
    summary = chosen.summary
    result: dict[str, Any] = {
        "run_id": opts.run_id, "selected": summary.count, "published": 0, "failed": 0,
        "dry_run": opts.dry_run, "fetch_rows": None, "marking_s": None, "phases_s": phases,
        "rate_per_s": opts.rate_per_s, "not_allowed": chosen.refused, "paused_by_breaker": chosen.paused,
        "rate_limited": chosen.limited,
    }  # fmt: skip
    audit = start_audit(summary.count + sum(chosen.skipped.values()), chosen.skipped)
    lap("select")
    log.info(
        "run %s selected %s %s jobs in %s destinations (ids %s..%s)", opts.run_id, summary.count,
        chosen.selection.status, len(summary.per_destination), summary.min_id, summary.max_id,
    )  # fmt: skip
    if opts.dry_run or not summary.count:
        if opts.dry_run:
            _print_plan(opts, chosen)
        audit.finish(0)
        return result
    missing = missing_topics(opts.bootstrap_servers, opts.kafka_config, summary.per_destination)
    if missing:
        log.warning(
            "destination topics %s do not exist: their %s jobs will fail and stay %s",
            sorted(missing), sum(summary.per_destination[t] for t in missing), chosen.selection.status,
        )  # fmt: skip
    spark = spark_session()
    lap("spark_session")
    result["fetch_rows"], result["published"], result["failed"], result["marking_s"] = _publish(
        spark, opts, chosen, missing
    )
    lap("read_produce_mark")
    audit.finish(result["published"])
    log.info(
        "run %s: %s selected, %s published, %s failed (audit %s)",
        opts.run_id, result["selected"], result["published"], result["failed"], audit.audit_id,
    )  # fmt: skip
    return result


def run(argv: list[str] | None = None) -> int:
    """The job's command line: logging on stderr, the result as one JSON line on stdout.

    Exit status 0; 2 for invalid arguments or a database that cannot be used (one line on stderr).
    """
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        with reporting("bulk-retry"):
            outcome = main(argv)
    except (SelectionError, JobArgumentError, StoreError, ConfigError) as exc:
        print(f"bulk_retry: {exc}", file=sys.stderr)
        return 2
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print(json.dumps(outcome))
    return 0
