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
The acknowledged deliveries go to the staging table ``retry_bulk_delivered``; one set-based
UPDATE then marks exactly those jobs published. A crash before that marks nothing: the jobs are
still dead/pending, so a re-run re-publishes at most them, with the same ``retry.id`` and
``retry.attempt``. A re-run with the crashed run's ``--run-id`` first marks what that attempt had
already recorded as acknowledged, and so publishes only the rest.

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
import operator
import os
import re
import struct
import sys
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
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql import functions as F

    from retry_scheduler.config import Settings
    from retry_scheduler.headers import Header
    from retry_scheduler.jobs import OutgoingRow, Status, destination_headers
    from retry_scheduler.kafka import producer_config
    from retry_scheduler.sparkjobs import (
        PAYLOAD_BYTES_SQL,
        JdbcTarget,
        JobArgumentError,
        fetch_rows,
        jdbc_target,
    )
    from retry_scheduler.store import connect, like_pattern
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

#: Kafka's own rule for topic names; destinations are inlined into the JDBC query, so only these pass.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SELECTABLE = (Status.DEAD, Status.PENDING)
STAGING_TABLE = "retry_bulk_delivered"

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
STAGED_SQL: LiteralString = "SELECT count(*) FROM retry_bulk_delivered WHERE run_id = %s"
#: ``dead_reason`` is cleared because the schema requires it exactly on dead jobs
#: (``retry_jobs_dead_has_reason``); ``dead_at`` still says when the job died.
MARK_DELIVERED_SQL: LiteralString = (
    "UPDATE retry_jobs AS j "
    "SET status = 'published', published_at = to_timestamp(d.acked_ms / 1000.0), lease_until = NULL, "
    "dead_reason = NULL, updated_at = now() "
    "FROM retry_bulk_delivered AS d "
    "WHERE d.run_id = %s AND j.id = d.id AND j.status IN ('dead', 'pending')"
)
DELETE_STAGED_SQL: LiteralString = "DELETE FROM retry_bulk_delivered WHERE run_id = %s"

DELIVERY_SCHEMA = "id long, acked_ms long"
DELIVERY_COLUMNS = ["id", "acked_ms"]
#: Largest Arrow batch of selected rows handed to a Python worker.
ARROW_BATCH_BYTES = 64 * 1024 * 1024


class BulkRetryError(ValueError):
    """A bulk retry cannot start: a filter, URL or setting is invalid or unreachable; the message says which."""


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


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray | memoryview) else value


_OUTGOING_FIELDS = operator.itemgetter(*OutgoingRow._fields)


def to_message(row: Row | Mapping[str, Any]) -> OutgoingMessage:
    """A row of the selection (columns named like OutgoingRow's fields) as the record to produce.

    Arrow batches (the job's path) hand ``bytea`` columns over as ``bytes``; ``Row`` objects read
    over JDBC, as ``bytearray``: both give the same record.
    """
    data = row.asDict() if isinstance(row, Row) else row
    job = OutgoingRow._make(_OUTGOING_FIELDS(data))
    if not job.destination:
        raise ValueError("job has no destination")
    return OutgoingMessage(
        job.id, job.destination, job.destination_partition, _plain(job.key), _plain(job.value),
        destination_headers(job),
    )  # fmt: skip


def publish_partition(
    rows: Iterable[Row | Mapping[str, Any]],
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

    def delivered(job_id: int) -> Callable[[KafkaError | None, Message], None]:
        def callback(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                acked.append((job_id, int(clock() * 1000)))
            else:
                fail(f"delivery failed: {err.str()}")

        return callback

    for row in rows:
        try:
            msg = to_message(row)
        except (ValueError, TypeError, struct.error) as exc:
            fail(f"cannot build the record: {exc}")
            continue
        if msg.topic in missing:
            fail(f"topic {msg.topic} does not exist")
            continue
        kwargs: dict[str, Any] = {"key": msg.key, "value": msg.value, "headers": msg.headers}
        if msg.partition is not None:
            kwargs["partition"] = msg.partition
        while True:
            try:
                producer.produce(msg.topic, on_delivery=delivered(msg.job_id), **kwargs)
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


def publish_batches(
    batches: Iterable[pa.RecordBatch], *, ack_batch: int = 10_000, **publish: Any
) -> Iterator[pa.RecordBatch]:
    """:func:`publish_partition` over Arrow: rows come in as record batches, acks go out as batches
    of up to ``ack_batch`` ``(id, acked_ms)`` rows (``DELIVERY_SCHEMA``), for ``DataFrame.mapInArrow``.

    Arrow hands each partition to Python in columnar batches, which is several times cheaper than
    pickling every row into a ``Row`` object (see bench/README.md).
    """
    import pyarrow as pa  # the Python workers' import, like confluent-kafka's (see publish_partition)

    def as_batch(ids: list[int], acked_ms: list[int]) -> pa.RecordBatch:
        arrays = [pa.array(ids, pa.int64()), pa.array(acked_ms, pa.int64())]
        return pa.RecordBatch.from_arrays(arrays, names=DELIVERY_COLUMNS)

    rows = (row for batch in batches for row in batch.to_pylist())
    ids: list[int] = []
    acked_ms: list[int] = []
    for job_id, at_ms in publish_partition(rows, **publish):
        ids.append(job_id)
        acked_ms.append(at_ms)
        if len(ids) >= ack_batch:
            yield as_batch(ids, acked_ms)
            ids, acked_ms = [], []
    if ids:
        yield as_batch(ids, acked_ms)


def staging_frame(deliveries: DataFrame, run_id: str) -> DataFrame:
    """Acknowledged deliveries ``(id, acked_ms)`` as rows of ``retry_bulk_delivered``."""
    return deliveries.select(
        F.lit(run_id).alias("run_id"),
        F.col("id").cast("long").alias("id"),
        F.col("acked_ms").cast("long").alias("acked_ms"),
    )


# --- driver ------------------------------------------------------------------------------------


def staged(database_url: str, run_id: str) -> int:
    with connect(database_url) as conn:
        row = conn.execute(STAGED_SQL, (run_id,)).fetchone()
    return int(row[0]) if row else 0


def mark_delivered(database_url: str, run_id: str) -> int:
    """Mark the jobs of a run's acknowledged deliveries published, in one statement; clear the run's staging."""
    with connect(database_url) as conn, conn.transaction():
        marked = conn.execute(MARK_DELIVERED_SQL, (run_id,)).rowcount
        conn.execute(DELETE_STAGED_SQL, (run_id,))
    return marked


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


def write_staging(frame: DataFrame, jdbc: JdbcTarget) -> None:
    writer = frame.write.format("jdbc").options(**jdbc.options()).option("dbtable", STAGING_TABLE)
    # pgjdbc sends each batch of 10 000 rows as a few multi-row INSERTs instead of one per row.
    writer.option("batchsize", "10000").option("reWriteBatchedInserts", "true").mode("append").save()


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
        "--run-id", help="name of this run (default: a new uuid); reuse it to resume a crashed run"
    )
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
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run a bulk retry; returns ``{"run_id", "selected", "published", "failed", "dry_run", "fetch_rows"}``.

    ``fetch_rows`` is the JDBC fetch size the read used (None when nothing was read).
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
        "phases_s": phases,
    }
    began = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal began
        phases[name] = round(time.perf_counter() - began, 3)
        began = time.perf_counter()

    jdbc = jdbc_target(opts.database_url)  # validated before anything runs
    if not opts.dry_run and staged(opts.database_url, opts.run_id):
        resumed = mark_delivered(opts.database_url, opts.run_id)
        result["published"] += resumed
        log.info("run %s resumed: marked %s jobs its previous attempt had delivered", opts.run_id, resumed)

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
            # librdkafka fails a record itself after delivery.timeout.ms: wait a little longer.
            flush_timeout_s=int(opts.producer_conf["delivery.timeout.ms"]) / 1000 + 5,
        ),
        DELIVERY_SCHEMA,
    )
    # One action: read, produce and record the acks pass by partition, so nothing is produced twice.
    write_staging(staging_frame(deliveries, opts.run_id), jdbc)
    lap("read_produce_stage")
    log.info("run %s delivered its selection; %s deliveries failed; marking", opts.run_id, failed_count.value)
    marked = mark_delivered(opts.database_url, opts.run_id)
    lap("mark")
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
    except (BulkRetryError, JobArgumentError) as exc:
        print(f"bulk_retry: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print(json.dumps(outcome))
    # Failed jobs are left unchanged: a non-zero exit lets the orchestrator retry the run.
    sys.exit(1 if outcome["failed"] else 0)
