"""The benchmark's environment: a throwaway database and broker, sizes, results, workload builders."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import urllib.parse
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from bench.jobs import Job, insert_jobs
from bench.queries import bq
from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import OutgoingRow, Status
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.db.connection import connect, redact_url
from retry_scheduler.db.queue import Queue
from retry_scheduler.db.readings import Readings
from retry_scheduler.db.schema import migrate
from retry_scheduler.db.store import Store
from retry_scheduler.dev.procs import free_port

log = logging.getLogger(__name__)

#: Every measurement the harness knows, in the order it runs them.
MEASUREMENTS = (
    "ingest",
    "publish",
    "claim",
    "spark",
    "lateness",
    "capacity",
    "held_snapshot",
    "burst",
    "soak",
    "ordered",
    "fairness",
    "handover",
)
#: Partitions of every benchmark topic: a multiple of the ingest worker processes (2), as a deployment
#: would choose, so that each worker has an equal share.
PARTITIONS = 6
#: A realistic failed record: a ~250-byte JSON order, a key, and the headers the SDK sets.
VALUE = (
    b'{"order_id": "%08d", "customer": "c-4711", "currency": "EUR", "amount": 129.90, '
    b'"items": [{"sku": "SKU-1001", "qty": 2}, {"sku": "SKU-2002", "qty": 1}], '
    b'"shipping": {"country": "DE", "zip": "10115", "method": "express"}, "note": "%s"}'
)
#: Jobs of the benchmarks never expire on their own: a policy without max_age.
BENCH_POLICIES = PolicyRegistry.of([Policy("default", delays=["1h"], max_attempts=10)])
#: The benchmark's destinations (bench.<measurement>-<tag>), allowed as a deployment would allow its own.
BENCH_DESTINATIONS = r"bench\.[A-Za-z0-9._-]+"


_DROP_DB = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
_CREATE_DB = sql.SQL("CREATE DATABASE {}")


class BenchError(RuntimeError):
    """A benchmark could not run (broker, database or a measurement failed); the message says why."""


@dataclass
class Result:
    """One measurement: the report's figures it produced, their baselines, sizes and notes."""

    name: str
    figures: dict[str, float | int | None] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Why the figures are missing (None when measured).
    skipped: str | None = None
    #: Raw samples for the plots (e.g. every lateness), not written to report.json.
    samples: dict[str, list[float]] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None


# -- environment: a throwaway database and a broker ---------------------------------------------------


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` (a ``postgresql://`` URL or a libpq key=value string)."""
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, ""))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, dbname=dbname)


class BenchEnv:
    """A migrated throwaway database on the configured server and a broker, for one benchmark run."""

    def __init__(
        self,
        settings: Settings,
        db_name: str = "retry_bench",
        bootstrap: str | None = None,
        keep_db: bool = False,
        work_dir: Path | None = None,
        share_stack: bool = False,
    ) -> None:
        self.base = settings
        self.db_name = db_name
        self.admin_url = with_database(settings.database_url, "postgres")
        self.url = with_database(settings.database_url, db_name)
        self.bootstrap = bootstrap
        self.keep_db = keep_db
        #: The stacks' Airflow homes and every process's log. One made here is removed at the end
        #: of a run that raised nothing, unless ``keep_db``; otherwise it stays and is named.
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="retry-bench-"))
        self._own_work_dir = work_dir is None
        self.tag = uuid.uuid4().hex[:6]
        self._broker: Any = None
        #: Whether the broker is this environment's own (the dev tooling's), not a user's cluster.
        self.owns_broker = False
        #: One dev stack for every measurement that runs under the scheduler (see
        #: ``bench.capacity.live_stack``), stopped with ``stacks`` before the broker.
        self.share_stack = share_stack
        self.shared_stack: Any = None
        self.stacks = contextlib.ExitStack()
        #: Where the report is written (a measurement keeps there what explains a miss), if anywhere.
        self.report_dir: Path | None = None

    def __enter__(self) -> BenchEnv:
        try:
            self._create_database()
            migrate(self.url)
            if self.bootstrap is None:
                from retry_scheduler.dev.broker import start_broker

                port = free_port()
                self._broker = start_broker(
                    port, "127.0.0.1", self.work_dir / "kafka.log", say=lambda m: log.info("%s", m)
                )
                self.bootstrap = f"127.0.0.1:{port}"
                self.owns_broker = True
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close_stacks()
        finally:
            self._stop(*exc)

    def close_stacks(self) -> None:
        """Stop the shared dev stack, if one was started (the next measurement that shares starts another)."""
        try:
            self.stacks.close()
        finally:
            self.shared_stack = None
            self.stacks = contextlib.ExitStack()

    def _stop(self, *exc: object) -> None:
        if self._broker is not None:
            self._broker.terminate()
            try:
                self._broker.wait(10)
            except Exception:
                self._broker.kill()
            self._broker = None
        if not self.keep_db:
            with contextlib.suppress(Exception), connect(self.admin_url, autocommit=True) as conn:
                conn.execute(_DROP_DB.format(sql.Identifier(self.db_name)))
        if self._own_work_dir and self.work_dir.exists():
            if self.keep_db or (exc and exc[0] is not None):
                log.info("the stacks' Airflow homes and logs are kept in %s", self.work_dir)
            else:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _create_database(self) -> None:
        with connect(self.admin_url, autocommit=True) as conn:
            conn.execute(_DROP_DB.format(sql.Identifier(self.db_name)))
            conn.execute(_CREATE_DB.format(sql.Identifier(self.db_name)))
        log.info("created the benchmark database %s", redact_url(self.url))

    @contextlib.contextmanager
    def extra_database(self, suffix: str) -> Iterator[str]:
        """A second migrated throwaway database on the same server, dropped afterwards."""
        name = f"{self.db_name}_{suffix}"
        with connect(self.admin_url, autocommit=True) as conn:
            conn.execute(_DROP_DB.format(sql.Identifier(name)))
            conn.execute(_CREATE_DB.format(sql.Identifier(name)))
        url = with_database(self.url, name)
        try:
            migrate(url)
            yield url
        finally:
            with contextlib.suppress(Exception), connect(self.admin_url, autocommit=True) as conn:
                conn.execute(_DROP_DB.format(sql.Identifier(name)))

    @contextlib.contextmanager
    def dropped_afterwards(self, name: str) -> Iterator[None]:
        """Drop database ``name`` (made by someone else, e.g. Airflow's metadata) when the block ends."""
        try:
            yield
        finally:
            with contextlib.suppress(Exception), connect(self.admin_url, autocommit=True) as conn:
                conn.execute(_DROP_DB.format(sql.Identifier(name)))

    def settings(self, name: str, **changes: Any) -> Settings:
        """Service settings for one measurement: its own retry topic and consumer group."""
        assert self.bootstrap is not None
        return self.base.with_overrides(
            database_url=self.url,
            kafka={"bootstrap.servers": self.bootstrap},
            retry_topic=f"retry-bench-{self.tag}-{name}",
            delay_topics={},
            consumer_group=f"bench-{self.tag}-{name}",
            create_topics=True,
            **{"destination_allowlist": BENCH_DESTINATIONS, **changes},
        )

    def create_topics(self, topics: Sequence[str], partitions: int = PARTITIONS) -> None:
        assert self.bootstrap is not None
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
            future.result(15)

    def sql(self, name: str, params: dict[str, Any] | None = None, *, fetch: bool = False) -> list[Any]:
        """Run one named query of ``bench/bench.sql`` in its own transaction."""
        with connect(self.url, autocommit=True) as conn:
            cur = conn.execute(bq(name), params)
            return cur.fetchall() if fetch else []

    def job_counts(self, destination: str | None = None) -> dict[str, int]:
        """``destination``'s jobs (or all) by status, as ``retry-scheduler status`` counts them."""
        # A plain connection, as the other waits' reads: polled every second while a window is measured.
        with connect(self.url, autocommit=True) as conn:
            return Readings(conn).counts(destination)

    def count_records(self, topic: str, expected: int, timeout_s: float = 60) -> int:
        """Read ``topic`` from the beginning and count its records (until ``expected`` and idle for 1 s).

        Counted by reading rather than from the high watermarks, which are not record counts (an
        idempotent or transactional producer's control records take offsets too).
        """
        assert self.bootstrap is not None
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-count-{self.tag}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        seen = 0
        try:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            # From offset 0 (a new topic), not OFFSET_BEGINNING: see bench.chaos.read_topics.
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            deadline = time.monotonic() + timeout_s
            idle_since = time.monotonic()
            while time.monotonic() < deadline:
                batch = [m for m in consumer.consume(10_000, 0.2) if m.error() is None]
                seen += len(batch)
                if batch:
                    idle_since = time.monotonic()
                elif seen >= expected and time.monotonic() - idle_since > 1.0:
                    break
        finally:
            consumer.close()
        return seen


# -- timing wrappers around the real components ------------------------------------------------------


class TimedQueue(Queue):
    """The service's queue, adding up the seconds spent in each database operation."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__(conn)
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - began

    def claim_due(self, limit: int, floor: datetime | None = None) -> list[OutgoingRow]:
        with self._timed("claim_due"):
            return super().claim_due(limit, floor)

    def claim_dead(self, limit: int, lease_ms: int, worker: str) -> list[OutgoingRow]:
        with self._timed("claim_dead"):
            return super().claim_dead(limit, lease_ms, worker)

    def mark_published(self, acked: Sequence[tuple[int, int]]) -> int:
        with self._timed("mark_published"):
            return super().mark_published(acked)


class TimedStore(Store):
    """The service's Store, its queue timed (:class:`TimedQueue`: ``queue.seconds``)."""

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self.queue: TimedQueue = TimedQueue(self.conn)


def per_second(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def ratio(value: float, baseline: float) -> float:
    """``value / baseline`` to four significant digits (a small ratio keeps its precision)."""
    return float(f"{value / baseline:.4g}")


# -- the records and jobs of the benchmarks ----------------------------------------------------------


def retry_record(i: int, destination: str, at_ms: int | None) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers of a failed record as the SDK sends it to a retry topic; without
    ``retry.at`` when ``at_ms`` is None (a delay topic's record: due the topic's delay after it was sent)."""
    headers = [
        (protocol.DESTINATION, destination.encode()),
        (protocol.ORIGINAL_TOPIC, destination.encode()),
        (protocol.ORIGINAL_PARTITION, str(i % PARTITIONS).encode()),
        (protocol.ORIGINAL_OFFSET, str(i).encode()),
        (protocol.ATTEMPT, str(i % 4).encode()),
        (protocol.AT, str(at_ms).encode()),
        (protocol.REASON, b"TimeoutError: payment service did not answer within 30 s"),
        (protocol.ERROR_CLASS, b"TimeoutError"),
        (protocol.GROUP, b"orders-service"),
        ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ]
    if at_ms is None:
        headers = [h for h in headers if h[0] != protocol.AT]
    return f"order-{i}".encode(), VALUE % (i, b"x" * 40), headers


def due_job(i: int, source_topic: str, destination: str, due_ms: int) -> Job:
    """A pending job due at ``due_ms``, with the columns an ingested record would have."""
    _key, value, headers = retry_record(i, destination, due_ms)
    return Job(
        source_topic=source_topic, source_partition=i % PARTITIONS, source_offset=i,
        source_timestamp_ms=due_ms - 60_000, destination=destination, destination_partition=i % PARTITIONS,
        key=f"order-{i}".encode(), value=value, headers=(headers[-1],), attempt=i % 4, policy="default",
        reason="TimeoutError: payment service did not answer within 30 s", error_class="TimeoutError",
        consumer_group="orders-service", retry_id=str(uuid.uuid4()), original_topic=destination,
        original_partition=i % PARTITIONS, original_offset=i, original_timestamp_ms=due_ms - 60_000,
        due_ms=due_ms, status=Status.PENDING, dead_reason=None, dlq_topic="retry.dlq",
    )  # fmt: skip


def insert_due_jobs(url: str, count: int, source_topic: str, destination: str) -> float:
    """Store ``count`` jobs due a second ago with the service's own insert; returns the seconds taken."""
    began = time.perf_counter()
    due_ms = int(time.time() * 1000) - 1000
    with Store(url) as store:
        for start in range(0, count, 5000):
            insert_jobs(
                store,
                [
                    due_job(i, source_topic, destination, due_ms)
                    for i in range(start, min(count, start + 5000))
                ],
            )
    return time.perf_counter() - began


def produce_records(
    bootstrap: str, topic: str, n: int, destination: str, at_ms: int | None, first: int = 0,
    due_in_ms: int = -1, rate: float | None = None,
) -> float:  # fmt: skip
    """Produce ``n`` retry records (numbered from ``first``) as fast as one producer can, or at most
    ``rate`` a second (paced each thousand); returns the seconds taken. ``at_ms`` None: no
    ``retry.at`` (a delay topic's); ``due_in_ms`` >= 0: each due that long after sent."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "enable.idempotence": True,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    began = time.perf_counter()
    for i in range(first, first + n):
        at = at_ms if due_in_ms < 0 else int(time.time() * 1000) + due_in_ms
        key, value, headers = retry_record(i, destination, at)
        while True:
            try:
                producer.produce(
                    topic, key=key, value=value, headers=cast(Any, headers), on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
            ahead = (i - first) / rate - (time.perf_counter() - began) if rate else 0.0
            if ahead > 0:
                time.sleep(ahead)
    if producer.flush(120) or errors:
        raise BenchError(f"producing the retry records failed: {errors[:3] or 'not acknowledged in 120 s'}")
    return time.perf_counter() - began


# -- ingest -------------------------------------------------------------------------------------------
