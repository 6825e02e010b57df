"""Ingest: consume retry topics in batches, store jobs in PostgreSQL, then commit offsets.

At-least-once: an offset is committed only after its rows are committed; a crash in between
re-reads the batch, and the unique source offset makes the second insert a no-op.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import OFFSET_STORED, Consumer, KafkaError, Message, TopicPartition

from retry_scheduler import faults, protocol
from retry_scheduler.config import Settings
from retry_scheduler.handover import LoopTenure
from retry_scheduler.headers import Header, InvalidRecordError, Limits, parse_headers
from retry_scheduler.jobs import Job, Status
from retry_scheduler.kafka import TopicManager, make_consumer
from retry_scheduler.policy import PolicyRegistry, UnknownPolicyError
from retry_scheduler.store import IngestLock, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """The parts of a consumed Kafka record the scheduler uses."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = ()

    @classmethod
    def from_message(cls, msg: Message) -> Record:
        ts_type, ts = msg.timestamp()
        return cls(
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            timestamp_ms=ts if ts_type != 0 and ts > 0 else None,
            key=msg.key(),
            value=msg.value(),
            headers=cast(Sequence[Header], msg.headers() or ()),
        )

    @property
    def size(self) -> int:
        head = sum(len(k) + len(v or b"") for k, v in self.headers)
        return len(self.key or b"") + len(self.value or b"") + head


def limits_for(settings: Settings, registry: PolicyRegistry) -> Limits:
    return Limits(
        destination_allowlist=re.compile(settings.destination_allowlist),
        # Publishing to a retry or DLQ topic would loop or hide the record.
        forbidden_destinations=frozenset(settings.retry_topics) | frozenset(registry.dlq_topics),
        max_headers=settings.max_headers,
        max_header_value_bytes=settings.max_header_value_bytes,
        max_reason_chars=settings.max_reason_chars,
    )


def _raw_retry_id(headers: Sequence[Header]) -> str | None:
    for name, value in headers:
        if name == protocol.ID and value:
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
            return text if 0 < len(text) <= 200 else None
    return None


def job_from_record(
    record: Record,
    *,
    settings: Settings,
    registry: PolicyRegistry,
    limits: Limits,
    now_ms: int,
) -> Job:
    """Turn one consumed record into a job: pending with a due time, or dead with a reason."""
    seen_ms = record.timestamp_ms or now_ms
    try:
        if record.size > settings.max_record_bytes:
            raise InvalidRecordError(
                f"record is {record.size} bytes, more than the {settings.max_record_bytes} allowed"
            )
        parsed = parse_headers(record.headers, limits)
        try:
            policy = registry.resolve(parsed.policy, parsed.destination)
        except UnknownPolicyError as exc:
            raise InvalidRecordError(str(exc)) from None
    except InvalidRecordError as exc:
        default = registry.resolve(None, None)
        return Job(
            source_topic=record.topic, source_partition=record.partition, source_offset=record.offset,
            source_timestamp_ms=record.timestamp_ms or 0, destination=None, destination_partition=None, key=record.key, value=record.value,
            headers=tuple(record.headers), attempt=0, policy=default.name, reason=str(exc),
            error_class=None, consumer_group=None,
            retry_id=_raw_retry_id(record.headers) or str(uuid.uuid4()),
            original_topic=None, original_partition=None, original_offset=None,
            original_timestamp_ms=seen_ms, due_ms=now_ms, status=Status.DEAD,
            dead_reason=protocol.DEAD_INVALID, dlq_topic=default.dlq_topic,
        )  # fmt: skip

    retry_id = parsed.retry_id or str(uuid.uuid4())
    first_seen = parsed.original_timestamp_ms or seen_ms
    at_ms = parsed.at_ms
    topic_delay = settings.delay_topics.get(record.topic)
    if at_ms is None and topic_delay is not None:
        at_ms = seen_ms + topic_delay
    decision = policy.decide(
        attempt=parsed.attempt,
        first_seen_ms=first_seen,
        base_ms=seen_ms,
        now_ms=now_ms,
        retry_id=retry_id,
        error_class=parsed.error_class,
        at_ms=at_ms,
        send_to_dlq=parsed.send_to_dlq,
    )
    return Job(
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        source_timestamp_ms=record.timestamp_ms or 0,
        destination=parsed.destination,
        destination_partition=parsed.destination_partition,
        key=record.key,
        value=record.value,
        headers=parsed.passthrough,
        attempt=parsed.attempt,
        policy=policy.name,
        reason=parsed.reason,
        error_class=parsed.error_class,
        consumer_group=parsed.group,
        retry_id=retry_id,
        # A record that names no origin came from its destination.
        original_topic=parsed.original_topic or parsed.destination,
        original_partition=parsed.original_partition,
        original_offset=parsed.original_offset,
        original_timestamp_ms=first_seen,
        due_ms=decision.due_ms,
        status=Status.DEAD if decision.is_dead else Status.PENDING,
        dead_reason=decision.dead_reason,
        dlq_topic=policy.dlq_topic,
    )


@dataclass
class IngestCounts:
    """What one ingest run did; logged and returned to Airflow as XCom."""

    consumed: int = 0
    stored: int = 0
    duplicates: int = 0
    pending: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    batches: int = 0

    def add(self, other: IngestCounts) -> None:
        self.consumed += other.consumed
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.pending += other.pending
        self.dead.update(other.dead)
        self.batches += other.batches

    def as_dict(self) -> dict[str, Any]:
        return {
            "consumed": self.consumed,
            "stored": self.stored,
            "duplicates": self.duplicates,
            "pending": self.pending,
            "dead": dict(self.dead),
            "batches": self.batches,
        }


class IngestBusyError(RuntimeError):
    """Another ingest loop holds the retry topics; this one got no turn in time."""


class Ingestor:
    """Consumes the retry topics and stores their records as jobs.

    One ingest loop at a time owns the retry topics: it holds a PostgreSQL advisory lock and
    assigns itself every partition, reading from the group's committed offsets. Overlapping
    Airflow runs hand over when the lock is released, in well under a second, where a
    consumer-group rebalance would stall ingestion for seconds.
    """

    def __init__(
        self,
        settings: Settings,
        registry: PolicyRegistry,
        store: Store,
        consumer: Consumer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.store = store
        self.limits = limits_for(settings, registry)
        self.clock = clock
        if consumer is None:
            # Our own retry topics are created when missing, whatever the destination setting.
            TopicManager(settings).ensure(settings.retry_topics, create=True)
            consumer = make_consumer(settings)
        self.consumer = consumer
        self._lock: IngestLock | None = None
        self._assigned: set[tuple[str, int]] = set()
        self._refreshed_at = 0.0

    def acquire(self, timeout_s: float, on_wait: Callable[[], None] = lambda: None) -> bool:
        """Wait up to ``timeout_s`` for the ingest lock, then take every retry-topic partition."""
        if self._lock is None:
            lock = IngestLock(self.settings.database_url, self.settings.consumer_group)
            if not lock.acquire(timeout_s, on_wait):
                lock.release()
                return False
            self._lock = lock
            self._refresh_assignment()
        return True

    def _refresh_assignment(self) -> None:
        """Assign partitions not assigned yet (new topics or partitions), from the committed offsets."""
        self._refreshed_at = time.monotonic()
        topics = self.consumer.list_topics(timeout=10).topics
        current = {
            (topic, p)
            for topic in self.settings.retry_topics
            if topic in topics
            for p in topics[topic].partitions
        }
        new = sorted(current - self._assigned)
        if new:
            self.consumer.incremental_assign([TopicPartition(t, p, OFFSET_STORED) for t, p in new])
            self._assigned |= set(new)
            log.info(
                "ingesting %s partitions of %s", len(self._assigned), ", ".join(self.settings.retry_topics)
            )

    def close(self) -> None:
        # Offsets are committed after every batch; releasing the lock hands over to the next loop.
        self.consumer.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def ingest_batch(self, timeout_s: float = 0.2) -> IngestCounts:
        """Consume up to one batch, store it, then commit its offsets."""
        if self._lock is None and not self.acquire(30):
            raise IngestBusyError("another ingest loop holds the retry topics (lock held for 30 s)")
        if time.monotonic() - self._refreshed_at > 10:
            self._refresh_assignment()
        messages = self.consumer.consume(self.settings.ingest_batch, timeout_s)
        counts = IngestCounts()
        records: list[Record] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error on %s [%s]: %s", msg.topic(), msg.partition(), err)
                continue
            records.append(Record.from_message(msg))
        if not records:
            return counts
        now_ms = int(self.clock() * 1000)
        jobs = [
            job_from_record(
                r, settings=self.settings, registry=self.registry, limits=self.limits, now_ms=now_ms
            )
            for r in records
        ]
        faults.checkpoint("ingest.consumed")
        stored = self.store.insert_jobs(jobs)
        counts.consumed, counts.stored, counts.batches = len(jobs), len(stored), 1
        counts.duplicates = counts.consumed - counts.stored
        counts.pending = stored.count(None)
        counts.dead.update(reason for reason in stored if reason)
        for job in jobs:
            if job.dead_reason == protocol.DEAD_INVALID:
                log.warning(
                    "invalid record %s[%s]@%s is dead: %s",
                    job.source_topic, job.source_partition, job.source_offset, job.reason,
                )  # fmt: skip
        faults.checkpoint("ingest.stored")
        self._commit(records)
        return counts

    def _commit(self, records: Sequence[Record]) -> None:
        next_offsets: dict[tuple[str, int], int] = {}
        for r in records:
            key = (r.topic, r.partition)
            next_offsets[key] = max(next_offsets.get(key, 0), r.offset + 1)
        offsets = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # a rebalance may revoke the partitions first
            # Safe: the rows are committed and re-reading them is ignored as duplicates.
            log.warning("offset commit failed (records will be re-read and ignored): %s", exc)

    def run(
        self, duration_s: float, should_stop: Callable[[], bool] = lambda: False, grace_s: float | None = None
    ) -> IngestCounts:
        """Ingest for ``duration_s`` (then until a newer loop takes over, within the grace); returns totals."""
        total = IngestCounts()
        grace = self.settings.loop_grace_ms / 1000 if grace_s is None else grace_s
        tenure = LoopTenure(self.store, "ingest", duration_s, grace)
        try:
            if not self.acquire(tenure.remaining_s(), on_wait=tenure.beat):
                log.info("another ingest loop held the retry topics all along: nothing to do")
                return total
            while tenure.go_on() and not should_stop():
                batch = self.ingest_batch(timeout_s=0.2)
                if batch.consumed:
                    log.info(
                        "ingested %s records: %s stored, %s duplicates, %s pending, dead %s",
                        batch.consumed, batch.stored, batch.duplicates, batch.pending, dict(batch.dead),
                    )  # fmt: skip
                total.add(batch)
        finally:
            tenure.finish()
        return total
