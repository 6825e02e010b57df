"""Bulk retry, the library of the PySpark job: re-publish a large filtered set of ``retry_jobs``.

The job's entry point is ``include/spark/bulk_retry.py`` (installed as
``retry_scheduler.spark.jobs.bulk_retry``); its docstring says how to run it. The driver counts
the selection (:mod:`retry_scheduler.spark.selection`), the executors read it over JDBC in id
ranges, hand it to their Python workers as Arrow batches (``mapInArrow``), and each partition
produces its rows with one idempotent producer, with exactly the headers of the normal publish
path, while a thread of its worker marks the acknowledged jobs published.

Executors import this module by name: they need the package installed (docs/guide/spark.md says how
on a cluster).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from retry_scheduler.core import faults
from retry_scheduler.core.config import ConfigError
from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import REPLAYED, OutgoingRow, destination_headers
from retry_scheduler.db.bulk_retry import BulkAudit, mark_batch, marking_connection
from retry_scheduler.db.connection import StoreError
from retry_scheduler.db.selection import Selection, SelectionError, like_pattern
from retry_scheduler.spark.bulk_guard import guarded_run
from retry_scheduler.spark.bulk_options import MARK_BATCH, Options, parse_args
from retry_scheduler.spark.jdbc import JobArgumentError, fetch_rows, jdbc_target
from retry_scheduler.spark.progress import reporting
from retry_scheduler.spark.selection import BulkRetryError, left_alone, read_selection, summarize

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message
    from pyspark import Accumulator

log = logging.getLogger("retry_scheduler.bulk_retry")

__all__ = ["BulkRetryError", "Selection", "jdbc_target", "like_pattern", "main", "parse_args", "run"]

#: What each partition hands back to the driver: how many of its jobs it marked published, and the
#: seconds its UPDATEs took (while it went on producing).
MARKED_SCHEMA = "marked long, mark_s double"
#: Largest Arrow batch of selected rows handed to a Python worker.
ARROW_BATCH_BYTES = 64 * 1024 * 1024


class MarkingError(RuntimeError):
    """A partition could not mark acknowledged jobs published: those jobs stay as they were."""


# --- connections -------------------------------------------------------------------------------


def missing_topics(bootstrap_servers: str, extra: Mapping[str, Any], topics: Iterable[str]) -> set[str]:
    """Destinations that do not exist; their jobs are counted failed rather than waited on."""
    admin = AdminClient({**extra, "bootstrap.servers": bootstrap_servers})
    try:
        known = set(admin.list_topics(timeout=15).topics)
    except KafkaException as exc:
        raise BulkRetryError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    return set(topics) - known


# --- executors ---------------------------------------------------------------------------------


class OutgoingMessage(NamedTuple):
    """One record to produce, exactly as the publish loop would send it."""

    job_id: int
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]


#: The fields of a row of the selection (selection.OUTGOING_COLUMNS): OutgoingRow's, but the due time
#: where a publisher's next claim may start and a held job's chain state, which a bulk retry has no
#: use for (it selects dead jobs, and pending ones not held).
SELECTION_FIELDS = tuple(name for name in OutgoingRow._fields if name not in ("due_at", "chain_state"))


def outgoing_rows(batch: pa.RecordBatch) -> Iterator[OutgoingRow]:
    """The rows of an Arrow batch of the selection, built column by column (``bytea`` as ``bytes``).

    About 0.6 us per row of ``bytea`` and text columns here, against 2.1-2.4 us for ``batch.to_pylist()``,
    which builds a dict per row.
    """
    columns = [batch.column(name).to_pylist() for name in SELECTION_FIELDS]
    return itertools.starmap(OutgoingRow, zip(*columns, strict=True))


def to_message(job: OutgoingRow) -> OutgoingMessage:
    """The record to produce for a job of the selection, exactly as the publish loop would send it."""
    if not job.destination:
        raise ValueError("job has no destination")
    # A dead job replayed: sent as `dlq replay` sends it.
    headers = destination_headers(job._replace(chain_state=REPLAYED) if job.dead_reason is not None else job)
    return OutgoingMessage(job.id, job.destination, job.destination_partition, job.key, job.value, headers)


def publish_partition(
    rows: Iterable[OutgoingRow],
    *,
    producer_conf: Mapping[str, Any],
    missing: frozenset[str],
    failed_count: Accumulator[int],
    flush_timeout_s: float,
    clock: Callable[[], float] = time.time,
    rate_per_s: float | None = None,
    rates: Mapping[str, float] | None = None,
) -> Iterator[tuple[int, int]]:
    """Produce one partition of the selection; yield ``(job id, ack time in ms)`` per acknowledged record.

    Acks are yielded as they arrive, so the partition is never held in memory; the producer is
    flushed before the partition ends. Failed deliveries are counted and their jobs left as they are.
    ``rate_per_s``: this partition's share of the run's pace: the n-th record of a destination is
    produced no sooner than n / rate seconds after its first was acknowledged, each at its turn or,
    when the producer comes back late from waiting, just after (never a burst to catch up: the next
    turn is still 1 / rate after the late one's). ``rates``: the destinations paced otherwise (their
    rate limits), records per second each.
    """
    # Imported here: confluent-kafka's classes claim the module "cimpl", which cloudpickle cannot
    # import on the worker, so a global reference would be shipped by value and break.
    from confluent_kafka import KafkaException, Producer

    if not logging.getLogger().handlers:  # a Python worker: nobody configured logging
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    producer = Producer(dict(producer_conf))
    acked: deque[tuple[int, int]] = deque()
    errors: dict[str, int] = {}
    produced = 0
    gap_s = 1.0 / rate_per_s if rate_per_s else None
    gaps = {topic: 1.0 / rate for topic, rate in (rates or {}).items() if rate}
    next_turn: dict[str, float] = {}  # paced: when each destination's next record may go

    def fail(error: str) -> None:
        errors[error] = errors.get(error, 0) + 1

    def delivered(job_id: int, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            acked.append((job_id, int(clock() * 1000)))
        else:
            fail(f"delivery failed: {err.str()}")

    for row in rows:
        try:
            msg = to_message(row)
        except (ValueError, TypeError, struct.error) as exc:
            fail(f"cannot build the record: {exc}")
            continue
        if msg.topic in missing:
            fail(f"topic {msg.topic} does not exist")
            continue
        gap = gaps.get(msg.topic, gap_s)
        first_of_topic = gap is not None and msg.topic not in next_turn
        if gap is not None:  # paced: this destination's next record waits its turn
            now = time.monotonic()
            turn = max(next_turn.get(msg.topic, now), now)
            while (wait := turn - time.monotonic()) > 0:
                producer.poll(min(wait, 0.1))
                while acked:
                    yield acked.popleft()
            next_turn[msg.topic] = turn + gap
        kwargs: dict[str, Any] = {"headers": msg.headers, "on_delivery": partial(delivered, msg.job_id)}
        if msg.partition is not None:
            kwargs["partition"] = msg.partition
        while True:
            try:
                producer.produce(msg.topic, msg.value, msg.key, **kwargs)
                produced += 1
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain
            except KafkaException as exc:
                fail(f"produce failed: {exc}")
                break
        if first_of_topic:
            # Paced, a destination's first record is acknowledged before its turns start: records
            # queued while the producer connects (its id, the topic's metadata) would go out at once.
            producer.flush(flush_timeout_s)
            next_turn[msg.topic] = time.monotonic() + (gap or 0.0)
        producer.poll(0)
        while acked:
            yield acked.popleft()
    unacknowledged = producer.flush(flush_timeout_s)
    while acked:
        yield acked.popleft()
    if unacknowledged:
        errors["no acknowledgement before the flush timeout"] = unacknowledged
    failed = sum(errors.values())
    failed_count.add(failed)
    log.info("partition done: %s produced, %s failed", produced, failed)
    if errors:
        log.warning("partition failures (jobs left unchanged): %s", errors)


def _array_literal(values: list[int]) -> str:
    """PostgreSQL's text form of an integer array: far cheaper to build than adapting each int."""
    return "{" + ",".join(map(str, values)) + "}"


class Marker:
    """Marks a partition's acknowledged jobs published, a batch per transaction, on its own
    connection and thread, while the partition goes on producing.

    PostgreSQL writes the new row versions while Python builds and produces records, instead of
    after them. Each batch commits on its own: a crash loses only the batches not yet committed,
    whose jobs stay dead (or pending) for the next run to re-publish.
    """

    def __init__(self, database_url: str) -> None:
        self._conn = marking_connection(database_url)
        # Two batches in hand at most: a stalled database slows producing instead of filling memory.
        self._queue: queue.Queue[tuple[str, str, int] | None] = queue.Queue(maxsize=2)
        self._error: MarkingError | None = None
        self.marked = 0
        self.seconds = 0.0  # spent in the UPDATEs
        self._thread = threading.Thread(target=self._run, name="bulk-retry-marker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is not None:
                continue  # keep draining: the partition raises the error at its next submit or close
            ids, acked_ms, count = batch
            began = time.perf_counter()
            try:
                self.marked += mark_batch(self._conn, ids, acked_ms)
            except Exception as exc:  # handed to the partition's thread, which raises it
                self._error = MarkingError(
                    f"marking {count} acknowledged jobs published failed ({type(exc).__name__}: "
                    f"{str(exc).strip()}); they stay as they were and the next run publishes them "
                    "again with the same retry.id and retry.attempt"
                )
                self._error.__cause__ = exc
            self.seconds += time.perf_counter() - began

    def submit(self, ids: list[int], acked_ms: list[int]) -> None:
        """Queue a batch of acknowledged jobs (ids and ack times in ms) to be marked published."""
        if self._error is not None:
            raise self._error
        self._queue.put((_array_literal(ids), _array_literal(acked_ms), len(ids)))

    def close(self) -> int:
        """Wait for the batches in hand; return how many jobs were marked, or raise the marking's error."""
        self._queue.put(None)
        self._thread.join()
        self._conn.close()
        if self._error is not None:
            raise self._error
        return self.marked


def publish_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    database_url: str,
    mark_batch: int = MARK_BATCH,
    **publish: Any,
) -> Iterator[pa.RecordBatch]:
    """:func:`publish_partition` over Arrow, marking the acknowledged jobs published as it goes.

    For ``DataFrame.mapInArrow``: the selection comes in as record batches (several times cheaper
    than pickling every row into a ``Row``, see bench/README.md); a :class:`Marker` marks every
    ``mark_batch`` acknowledged jobs; one row goes out: how many were marked and the seconds the
    marking took (``MARKED_SCHEMA``).
    """
    import pyarrow as pa  # the Python workers' import, like confluent-kafka's (see publish_partition)

    marker = Marker(database_url)
    rows = (row for batch in batches for row in outgoing_rows(batch))
    ids: list[int] = []
    acked_ms: list[int] = []
    try:
        for job_id, at_ms in publish_partition(rows, **publish):
            ids.append(job_id)
            acked_ms.append(at_ms)
            if len(ids) >= mark_batch:
                marker.submit(ids, acked_ms)
                ids, acked_ms = [], []
                faults.checkpoint("bulk_retry.acked")  # chaos: the job dies, this batch maybe unmarked
        if ids:
            marker.submit(ids, acked_ms)
    finally:
        marked = marker.close()  # also on an error: what was acknowledged and queued gets marked
    schema = pa.schema([("marked", pa.int64()), ("mark_s", pa.float64())])  # MARKED_SCHEMA
    yield pa.RecordBatch.from_pydict({"marked": [marked], "mark_s": [marker.seconds]}, schema=schema)


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
    "marking_s", "phases_s", "not_allowed", "rate_per_s", "rate_limited"}`` (``rate_per_s``: the pace
    asked, None when not paced; ``rate_limited``: the destinations paced at their lower rate limit).

    ``not_allowed`` counts, per destination, the matching jobs left alone because the destination
    rules refuse their destination (not part of ``selected``).

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


def _run(opts: Options, start_audit: Callable[[int, dict[str, int]], BulkAudit]) -> dict[str, Any]:
    sel = opts.selection
    phases: dict[str, float] = {}  # seconds per step, for profiling (bench/README.md)
    result: dict[str, Any] = {
        "run_id": opts.run_id,
        "selected": 0,
        "published": 0,
        "failed": 0,
        "dry_run": opts.dry_run,
        "fetch_rows": None,
        "marking_s": None,
        "phases_s": phases,
        "rate_per_s": opts.rate_per_s,
    }
    began = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal began
        phases[name] = round(time.perf_counter() - began, 3)
        began = time.perf_counter()

    jdbc = jdbc_target(opts.database_url)

    summary = summarize(opts.database_url, sel)
    refused, held = left_alone(opts.run_id, opts.database_url, summary, opts.deployment.destinations)
    if refused or held:
        sel = replace(sel, excluded=tuple(sorted({**refused, **held})))
        summary = summarize(opts.database_url, sel)
    result["not_allowed"] = refused
    result["held_by_breaker"] = held
    result["selected"] = summary.count
    # Destinations whose rate limit is below the run's pace go at their limit.
    rules = opts.deployment.policies.rules
    limited = {
        d: limit
        for d in summary.per_destination
        if (limit := rules(d).rate_limit) is not None and (opts.rate_per_s is None or limit < opts.rate_per_s)
    }
    result["rate_limited"] = limited
    skipped = {"destination not allowed": sum(refused.values())} | (
        {"breaker open": sum(held.values())} if held else {}
    )
    audit = start_audit(summary.count + sum(skipped.values()), skipped)
    lap("select")
    log.info(
        "run %s selected %s %s jobs in %s destinations (ids %s..%s)",
        opts.run_id, summary.count, sel.status, len(summary.per_destination), summary.min_id, summary.max_id,
    )  # fmt: skip
    if opts.dry_run:
        pace = (
            ("paced only by the rate limits below" if limited else "not paced")
            if opts.rate_per_s is None
            else f"paced at {opts.rate_per_s:,g} jobs/s per destination: about "
            f"{max(summary.per_destination.values(), default=0) / opts.rate_per_s:,.0f} s"
        )
        print(f"dry run: {summary.count} {sel.status} jobs would be re-published ({pace})")
        for destination, count in summary.per_destination.items():
            note = f"  at most {limited[destination]:,g}/s (its rate limit)" if destination in limited else ""
            print(f"  {destination:<40} {count:>10}{note}")
        for destination, count in refused.items():
            print(f"  {destination:<40} {count:>10}  not allowed: left alone")
        for destination, count in held.items():
            print(f"  {destination:<40} {count:>10}  its breaker is open: left alone")
        audit.finish(0)
        return result
    if not summary.count:
        audit.finish(0)
        return result

    missing = missing_topics(opts.bootstrap_servers, opts.kafka_config, summary.per_destination)
    if missing:
        log.warning(
            "destination topics %s do not exist: their %s jobs will fail and stay %s",
            sorted(missing), sum(summary.per_destination[t] for t in missing), sel.status,
        )  # fmt: skip

    spark = spark_session()
    lap("spark_session")
    sc = spark.sparkContext
    sc.setJobDescription(f"bulk retry {opts.run_id}")
    failed_count = sc.accumulator(0)
    result["fetch_rows"] = fetchsize = opts.fetchsize or fetch_rows(summary.max_payload_bytes)
    log.info(
        "run %s reads %s rows per JDBC round trip (largest key + value + headers: %s bytes)",
        opts.run_id, fetchsize, summary.max_payload_bytes,
    )  # fmt: skip
    jobs = read_selection(spark, jdbc, sel, summary, opts.partitions, fetchsize)
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
            rates={d: r / opts.partitions for d, r in limited.items()},
        ),
        MARKED_SCHEMA,
    )
    # One action: read, produce and mark pass by partition, so nothing is produced twice.
    partitions = deliveries.collect()
    lap("read_produce_mark")
    marked = sum(row.marked for row in partitions)
    result["marking_s"] = round(sum(row.mark_s for row in partitions), 3)
    result["published"] += marked
    result["failed"] = int(failed_count.value)
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
