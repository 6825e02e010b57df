"""Bulk retry: re-publish a large filtered set of ``retry_jobs`` to their destinations (PySpark).

For example every dead job of a destination after its outage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[2]' \\
        --jars /usr/share/java/postgresql.jar include/spark/bulk_retry.py \\
        --database-url postgresql://postgres@127.0.0.1:5432/retry_scheduler \\
        --bootstrap-servers localhost:9092 --destination orders --dry-run

The driver counts the selection with one small parameterised query (per destination, with the
lowest and highest id), then the executors read it over JDBC in parallel id ranges, hand it to
their Python workers as Arrow batches (``mapInArrow``), and each partition produces its rows with
one idempotent producer (``acks=all``), with exactly the headers
of the normal publish path (``retry.attempt`` raised, ``retry.id`` kept, the rest byte for byte).
While a partition produces, a thread of its worker marks the acknowledged jobs published, a
``--mark-batch`` of them per transaction (one ``UPDATE`` each, on the worker's own connection), so
PostgreSQL writes the new row versions while Python builds records. Only acknowledged jobs are
marked. A crash leaves the jobs of the batches not yet committed dead (or pending): a re-run
selects only those and re-publishes them, with the same ``retry.id`` and ``retry.attempt``
(at-least-once; at most a few batches per running partition are published twice).

Python: pip's spark-submit finds Spark, and runs the driver, with ``python3`` from PATH unless
``PYSPARK_PYTHON`` (or ``--conf spark.pyspark.python=...``) names another: activate the venv or set
it as above; the driver needs confluent-kafka and psycopg. Spark merges the Python driver's stderr
(progress, counts) into its stdout; the last line is the result as JSON. Exit status: 0, 1 when
some deliveries failed (those jobs are left as they were: run again), 2 for invalid arguments.

Executors must import ``retry_scheduler``. In local mode the repository's ``plugins/`` directory
is put on the workers' PYTHONPATH (and the venv has it installed). On a cluster ship it:
``--py-files retry_scheduler.zip`` (``cd plugins && zip -r ../retry_scheduler.zip retry_scheduler``,
i.e. ``spark.submit.pyFiles``), or ``--conf spark.executorEnv.PYTHONPATH=/opt/project/plugins``
where the project is mounted, and ``--conf spark.jars.packages=org.postgresql:postgresql:42.7.4``
instead of ``--jars``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import re
import struct
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString, NamedTuple

# The job file is run by path (spark-submit), not as part of the package: make the repository's
# package importable on the driver.
PLUGINS_DIR = Path(__file__).resolve().parents[2] / "plugins"
if PLUGINS_DIR.is_dir() and str(PLUGINS_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGINS_DIR))

try:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from psycopg import sql
    from pyspark.sql import DataFrame, SparkSession

    from retry_scheduler.core.config import Settings
    from retry_scheduler.core.headers import Header
    from retry_scheduler.core.jobs import OutgoingRow, Status, destination_headers

    # destinations are inlined into the JDBC query: only Kafka's topic names pass
    from retry_scheduler.core.protocol import TOPIC_NAME
    from retry_scheduler.db.connection import StoreError, connect, require_migrated
    from retry_scheduler.db.store import like_pattern
    from retry_scheduler.loops.kafka import producer_config
    from retry_scheduler.spark.jdbc import (
        PAYLOAD_BYTES_SQL,
        JdbcTarget,
        JobArgumentError,
        fetch_rows,
        jdbc_target,
    )
except ImportError as exc:  # pragma: no cover - depends on how the job is launched
    raise SystemExit(
        f"bulk_retry cannot import {exc.name} in {sys.executable}: run it with the project's Python, "
        "e.g. PYSPARK_PYTHON=.venv/bin/python spark-submit ... (or --conf spark.pyspark.python=...)"
    ) from exc

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message
    from pyspark import Accumulator

log = logging.getLogger("retry_scheduler.bulk_retry")

RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SELECTABLE = (Status.DEAD, Status.PENDING)

#: The columns an OutgoingRow is built from, named like its fields (same as the claim queries).
OUTGOING_COLUMNS: LiteralString = (
    "id, destination, destination_partition, msg_key AS key, msg_value AS value, headers, attempt, "
    "policy, reason, error_class, consumer_group, retry_id, original_topic, original_partition, "
    "original_offset, (extract(epoch FROM first_seen_at) * 1000)::bigint AS original_timestamp_ms, "
    "dead_reason, dlq_topic"
)
SUMMARY_SQL: LiteralString = (
    "SELECT destination, count(*), min(id), max(id), max(payload_bytes) FROM ({inner}) AS selection "
    "GROUP BY destination ORDER BY destination"
)
SELECT_IDS_SQL: LiteralString = (
    f"SELECT id, destination, {PAYLOAD_BYTES_SQL} AS payload_bytes FROM retry_jobs WHERE {{where}}"
)
SELECT_FIRST_IDS_SQL: LiteralString = SELECT_IDS_SQL + " ORDER BY id LIMIT %(limit)s"
#: Marks one batch of acknowledged jobs published: the ids and ack times come as two arrays.
#: ``dead_reason`` is cleared because the schema requires it exactly on dead jobs
#: (``retry_jobs_dead_has_reason``); ``dead_at`` still says when the job died.
MARK_BATCH_SQL: LiteralString = (
    "UPDATE retry_jobs AS j "
    "SET status = 'published', published_at = to_timestamp(d.acked_ms / 1000.0), lease_until = NULL, "
    "dead_reason = NULL, updated_at = now() "
    "FROM unnest(%s::bigint[], %s::bigint[]) AS d(id, acked_ms) "
    "WHERE j.id = d.id AND j.status IN ('dead', 'pending')"
)
#: What each partition hands back to the driver: how many of its jobs it marked published, and the
#: seconds its UPDATEs took (while it went on producing).
MARKED_SCHEMA = "marked long, mark_s double"
#: Acknowledged jobs marked published per transaction, by default.
MARK_BATCH = 10_000
#: Largest Arrow batch of selected rows handed to a Python worker.
ARROW_BATCH_BYTES = 64 * 1024 * 1024


class BulkRetryError(ValueError):
    """A bulk retry cannot start: a filter, URL or setting is invalid or unreachable; the message says which."""


class MarkingError(RuntimeError):
    """A partition could not mark acknowledged jobs published: those jobs stay as they were."""


# --- selection ---------------------------------------------------------------------------------


def sql_literal(value: object) -> str:
    """Render a value generated by :class:`Selection` as a SQL literal, for JDBC options.

    JDBC options cannot take bind parameters. Strings become ``E''`` literals (backslashes and
    quotes doubled), which read the same whatever ``standard_conforming_strings`` says.
    """
    if isinstance(value, bool):
        raise TypeError("booleans are not selection values")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, datetime):
        rendered = value.astimezone(UTC).isoformat()
        if not re.fullmatch(r"[0-9T:.+-]+", rendered):  # belt and braces: it is our own rendering
            raise ValueError(f"unexpected timestamp rendering {rendered!r}")
        return f"'{rendered}'"
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("NUL characters cannot be part of a filter")
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
    raise TypeError(f"cannot render {type(value).__name__} as a SQL literal")


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def inline(fragment: str, params: Mapping[str, object]) -> str:
    """Replace the ``%(name)s`` placeholders of a fixed fragment with literals of ``params``."""
    return _PLACEHOLDER.sub(lambda m: sql_literal(params[m.group(1)]), fragment)


def parse_timestamp(raw: str, name: str) -> datetime:
    """An ISO-8601 timestamp; one without a zone is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise BulkRetryError(
            f"{name} {raw!r} is not an ISO-8601 timestamp, e.g. 2026-01-31T12:00:00Z"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Selection:
    """Which jobs to re-publish. Every value is validated here: the JDBC query inlines them."""

    status: Status = Status.DEAD
    destination: str | None = None
    #: Glob on ``error_class``: ``*`` matches anything, every other character itself.
    error_class: str | None = None
    #: ``created_at`` window: ``since <= created_at < until``.
    since: datetime | None = None
    until: datetime | None = None
    #: Only the first ``limit`` jobs by id.
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.status not in SELECTABLE:
            raise BulkRetryError(f"--status must be one of {', '.join(SELECTABLE)}, not {self.status!r}")
        if self.destination is not None and not TOPIC_NAME.fullmatch(self.destination):
            raise BulkRetryError(
                f"--destination {self.destination!r} is not a topic name ([A-Za-z0-9._-], 1-249 characters)"
            )
        if self.error_class is not None and (
            not self.error_class or len(self.error_class) > 1000 or not self.error_class.isprintable()
        ):
            raise BulkRetryError("--error-class must be 1-1000 printable characters")
        for name, value in (("--since", self.since), ("--until", self.until)):
            if value is not None and value.tzinfo is None:
                raise BulkRetryError(f"{name} needs a time zone")
        if self.since and self.until and self.since >= self.until:
            raise BulkRetryError("--since must be earlier than --until")
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise BulkRetryError("--limit must be a positive integer")

    def conditions(self) -> tuple[list[LiteralString], dict[str, object]]:
        """The WHERE clause as fixed fragments with ``%(name)s`` placeholders, and their values."""
        fragments: list[LiteralString] = [
            # A job without a destination has nowhere to go back to (its record is on the DLQ).
            "destination IS NOT NULL",
            "status = %(status)s::retry_job_status",
        ]
        params: dict[str, object] = {"status": self.status.value}
        if self.status is Status.PENDING:
            # A pending job backing off after a failed delivery is left to the publish loop. One the
            # publish loop is sending at this moment may go out twice, with the same retry.id and
            # attempt (at-least-once); the mark then finds it published already.
            fragments.append("(lease_until IS NULL OR lease_until < now())")
        if self.destination is not None:
            fragments.append("destination = %(destination)s")
            params["destination"] = self.destination
        if self.error_class is not None:
            fragments.append("error_class LIKE %(error_class)s ESCAPE '!'")
            params["error_class"] = like_pattern(self.error_class)
        if self.since is not None:
            fragments.append("created_at >= %(since)s::timestamptz")
            params["since"] = self.since
        if self.until is not None:
            fragments.append("created_at < %(until)s::timestamptz")
            params["until"] = self.until
        return fragments, params

    def summary_query(self) -> tuple[sql.Composed, dict[str, object]]:
        """Count per destination (with min and max id) of the selection, parameterised for psycopg."""
        fragments, params = self.conditions()
        where = sql.SQL(" AND ").join(sql.SQL(f) for f in fragments)
        if self.limit is None:
            inner = sql.SQL(SELECT_IDS_SQL).format(where=where)
        else:
            inner = sql.SQL(SELECT_FIRST_IDS_SQL).format(where=where)
            params["limit"] = self.limit
        return sql.SQL(SUMMARY_SQL).format(inner=inner), params

    def jdbc_table(self, min_id: int, max_id: int) -> str:
        """The selection as a ``dbtable`` subquery with bound literals, held to the counted id range.

        The id range makes the read see what the driver counted (``--limit`` included) and not the
        jobs ingested since.
        """
        fragments, params = self.conditions()
        fragments += ["id >= %(min_id)s", "id <= %(max_id)s"]
        params |= {"min_id": int(min_id), "max_id": int(max_id)}
        where = " AND ".join(inline(f, params) for f in fragments)
        return f"(SELECT {OUTGOING_COLUMNS} FROM retry_jobs WHERE {where}) AS bulk_retry_selection"


@dataclass(frozen=True)
class SelectionSummary:
    per_destination: dict[str, int]
    min_id: int | None
    max_id: int | None
    #: The largest key + value + headers of the selection, in bytes: sizes the JDBC fetches.
    max_payload_bytes: int = 0

    @property
    def count(self) -> int:
        return sum(self.per_destination.values())


def summarize(database_url: str, selection: Selection) -> SelectionSummary:
    query, params = selection.summary_query()
    with connect(database_url) as conn:
        require_migrated(conn, database_url)
        rows = conn.execute(query, params).fetchall()
    return SelectionSummary(
        per_destination={r[0]: int(r[1]) for r in rows},
        min_id=min((int(r[2]) for r in rows), default=None),
        max_id=max((int(r[3]) for r in rows), default=None),
        max_payload_bytes=max((int(r[4] or 0) for r in rows), default=0),
    )


# --- connections -------------------------------------------------------------------------------


def producer_settings(bootstrap_servers: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The normal publish path's producer settings (idempotent, ``acks=all``), batching a little more."""
    kafka = {"linger.ms": 20, **extra, "bootstrap.servers": bootstrap_servers}
    return producer_config(Settings(kafka=kafka))


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


def outgoing_rows(batch: pa.RecordBatch) -> Iterator[OutgoingRow]:
    """The rows of an Arrow batch of the selection, built column by column (``bytea`` as ``bytes``).

    About 0.6 us per row of ``bytea`` and text columns here, against 2.1-2.4 us for ``batch.to_pylist()``,
    which builds a dict per row.
    """
    columns = [batch.column(name).to_pylist() for name in OutgoingRow._fields]
    return map(OutgoingRow._make, zip(*columns, strict=True))


def to_message(job: OutgoingRow) -> OutgoingMessage:
    """The record to produce for a job of the selection, exactly as the publish loop would send it."""
    if not job.destination:
        raise ValueError("job has no destination")
    return OutgoingMessage(
        job.id, job.destination, job.destination_partition, job.key, job.value, destination_headers(job)
    )


def publish_partition(
    rows: Iterable[OutgoingRow],
    *,
    producer_conf: Mapping[str, Any],
    missing: frozenset[str],
    failed_count: Accumulator[int],
    flush_timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> Iterator[tuple[int, int]]:
    """Produce one partition of the selection; yield ``(job id, ack time in ms)`` per acknowledged record.

    Acks are yielded as they arrive, so the partition is never held in memory; the producer is
    flushed before the partition ends. Failed deliveries are counted and their jobs left as they are.
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
        self._conn = connect(database_url, autocommit=True)
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
                self.marked += self._conn.execute(MARK_BATCH_SQL, (ids, acked_ms)).rowcount
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
        if ids:
            marker.submit(ids, acked_ms)
    finally:
        marked = marker.close()  # also on an error: what was acknowledged and queued gets marked
    schema = pa.schema([("marked", pa.int64()), ("mark_s", pa.float64())])  # MARKED_SCHEMA
    yield pa.RecordBatch.from_pydict({"marked": [marked], "mark_s": [marker.seconds]}, schema=schema)


# --- driver ------------------------------------------------------------------------------------


def read_selection(
    spark: SparkSession,
    jdbc: JdbcTarget,
    selection: Selection,
    summary: SelectionSummary,
    partitions: int,
    fetchsize: int,
) -> DataFrame:
    """The selected jobs, read over JDBC in ``partitions`` id ranges, ``fetchsize`` rows per round trip."""
    assert summary.min_id is not None and summary.max_id is not None
    reader = spark.read.format("jdbc").options(**jdbc.options())
    try:
        return (
            reader.option("dbtable", selection.jdbc_table(summary.min_id, summary.max_id))
            .option("partitionColumn", "id")
            .option("lowerBound", str(summary.min_id))
            .option("upperBound", str(summary.max_id + 1))
            .option("numPartitions", str(max(1, min(partitions, summary.count))))
            .option("fetchsize", str(fetchsize))
            .load()
        )
    except Exception as exc:
        if "org.postgresql.Driver" in str(exc) or "No suitable driver" in str(exc):
            raise BulkRetryError(
                "the PostgreSQL JDBC driver is not on Spark's classpath: pass "
                "--jars /usr/share/java/postgresql.jar (Debian libpostgresql-jdbc-java) or "
                "--conf spark.jars.packages=org.postgresql:postgresql:42.7.4"
            ) from exc
        raise


def _session() -> SparkSession:
    spark = SparkSession.getActiveSession() or SparkSession.builder.appName("retry_bulk_retry").getOrCreate()
    # A job carries up to RETRY_MAX_RECORD_BYTES (1 MiB by default) of key, value and headers: bound
    # each Arrow batch handed to the Python workers by its size too, not only by its 10 000 rows.
    spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", str(ARROW_BATCH_BYTES))
    sc = spark.sparkContext
    if (sc.master or "").startswith("local"):
        # Python workers are separate processes: give them the repository's package too. On a
        # cluster, ship it instead (see the module docstring).
        paths = [p for p in sc.environment.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(PLUGINS_DIR) not in paths:
            sc.environment["PYTHONPATH"] = os.pathsep.join([*paths, str(PLUGINS_DIR)])
    if __name__ != "__main__":
        # Imported (tests, a DAG task): ship this file's functions by value, since the workers
        # cannot import it by name.
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return spark


@dataclass(frozen=True)
class Options:
    database_url: str
    bootstrap_servers: str
    selection: Selection
    dry_run: bool
    partitions: int
    fetchsize: int | None
    kafka_config: dict[str, Any]
    producer_conf: dict[str, Any]
    run_id: str
    mark_batch: int = MARK_BATCH


def _positive(name: str, top: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {raw!r}") from None
        if not 1 <= value <= top:
            raise argparse.ArgumentTypeError(f"{name} must be between 1 and {top}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="bulk_retry.py", description="Re-publish a filtered set of retry jobs to their destinations."
    )
    parser.add_argument("--database-url", required=True, help="libpq URL of the retry database")
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka bootstrap servers, host:port")
    parser.add_argument("--destination", help="only jobs of this destination topic")
    parser.add_argument("--status", choices=[s.value for s in SELECTABLE], default=Status.DEAD.value)
    parser.add_argument("--error-class", help="glob on the error class, * matches anything")
    parser.add_argument("--since", help="jobs created at or after this ISO-8601 time (UTC without zone)")
    parser.add_argument("--until", help="jobs created before this ISO-8601 time (UTC without zone)")
    parser.add_argument("--limit", type=_positive("--limit", 2**62), help="only the first N jobs by id")
    parser.add_argument("--dry-run", action="store_true", help="count per destination, publish nothing")
    parser.add_argument("--partitions", type=_positive("--partitions", 10_000), default=8)
    parser.add_argument(
        "--fetchsize",
        type=_positive("--fetchsize", 1_000_000),
        help="rows per JDBC round trip (default: up to 10000, fewer for large records, 64 MiB at most)",
    )
    parser.add_argument("--kafka-config", default="{}", help="extra librdkafka settings as a JSON object")
    parser.add_argument(
        "--mark-batch",
        type=_positive("--mark-batch", 1_000_000),
        default=MARK_BATCH,
        help=f"acknowledged jobs marked published per transaction (default: {MARK_BATCH}); after a crash "
        "at most a few batches per running partition are published again",
    )
    parser.add_argument("--run-id", help="name of this run, in its logs and result (default: a new uuid)")
    args = parser.parse_args(argv)
    try:
        kafka_config = json.loads(args.kafka_config)
    except json.JSONDecodeError as exc:
        raise BulkRetryError(f"--kafka-config is not JSON: {exc}") from None
    if not isinstance(kafka_config, dict) or not all(
        isinstance(v, str | int | float | bool) for v in kafka_config.values()
    ):
        raise BulkRetryError(
            '--kafka-config must be a JSON object of settings, e.g. {"security.protocol": "SSL"}'
        )
    run_id = args.run_id or str(uuid.uuid4())
    if not RUN_ID.fullmatch(run_id):
        raise BulkRetryError("--run-id must be 1-128 characters of [A-Za-z0-9._:-]")
    selection = Selection(
        status=Status(args.status),
        destination=args.destination,
        error_class=args.error_class,
        since=parse_timestamp(args.since, "--since") if args.since else None,
        until=parse_timestamp(args.until, "--until") if args.until else None,
        limit=args.limit,
    )
    return Options(
        database_url=args.database_url,
        bootstrap_servers=args.bootstrap_servers,
        selection=selection,
        dry_run=args.dry_run,
        partitions=args.partitions,
        fetchsize=args.fetchsize,
        kafka_config=kafka_config,
        producer_conf=producer_settings(args.bootstrap_servers, kafka_config),
        run_id=run_id,
        mark_batch=args.mark_batch,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run a bulk retry; returns ``{"run_id", "selected", "published", "failed", "dry_run", "fetch_rows",
    "marking_s", "phases_s"}``.

    ``fetch_rows`` is the JDBC fetch size the read used and ``marking_s`` the seconds the executors'
    UPDATEs took, summed over partitions, while they went on producing (both None when nothing was
    read); ``phases_s`` is the wall time of each step.
    """
    opts = parse_args(argv)
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
    }
    began = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal began
        phases[name] = round(time.perf_counter() - began, 3)
        began = time.perf_counter()

    jdbc = jdbc_target(opts.database_url)  # validated before anything runs

    summary = summarize(opts.database_url, sel)
    result["selected"] = summary.count
    lap("select")
    log.info(
        "run %s selected %s %s jobs in %s destinations (ids %s..%s)",
        opts.run_id, summary.count, sel.status, len(summary.per_destination), summary.min_id, summary.max_id,
    )  # fmt: skip
    if opts.dry_run:
        print(f"dry run: {summary.count} {sel.status} jobs would be re-published")
        for destination, count in summary.per_destination.items():
            print(f"  {destination:<40} {count:>10}")
        return result
    if not summary.count:
        return result

    missing = missing_topics(opts.bootstrap_servers, opts.kafka_config, summary.per_destination)
    if missing:
        log.warning(
            "destination topics %s do not exist: their %s jobs will fail and stay %s",
            sorted(missing), sum(summary.per_destination[t] for t in missing), sel.status,
        )  # fmt: skip

    spark = _session()
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
    log.info(
        "run %s: %s selected, %s published, %s failed",
        opts.run_id, result["selected"], result["published"], result["failed"],
    )  # fmt: skip
    return result


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        outcome = main()
    except (BulkRetryError, JobArgumentError, StoreError) as exc:
        print(f"bulk_retry: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print(json.dumps(outcome))
    # Failed jobs are left unchanged: a non-zero exit lets the orchestrator retry the run.
    sys.exit(1 if outcome["failed"] else 0)
