"""Where ingestion starts reading a retry-topic partition (PostgreSQL's offset, or Kafka's reset),
and how far behind the broker it is (the lag retry_monitor watches).

The next offset of every partition is stored in PostgreSQL with the rows (one transaction), and
the group's Kafka offset is committed after. PostgreSQL's is the source of truth when the partition
is the one it was taken from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, OFFSET_STORED, Consumer, TopicPartition

from retry_scheduler.coordinator import committed_offsets
from retry_scheduler.core.config import Settings
from retry_scheduler.db.store import Store
from retry_scheduler.loops.kafka import consumer_config
from retry_scheduler.loops.sources import topic_retention

#: How long to wait for the record that tells whether a partition is the one PostgreSQL's offset is of.
PROBE_S = 5.0


#: How the ingest marks the Kafka offsets it commits: with the database's identity after it.
COMMIT_MARK = "retry-scheduler db="


def commit_mark(database_identity: str) -> str:
    """The metadata of the ingest's Kafka offset commits: the database that stored their rows first."""
    return COMMIT_MARK + database_identity


def start_offset(
    stored: int | None, committed: int | None, committed_mark: str | None = None, mark: str = ""
) -> int:
    """Where to start reading a partition: PostgreSQL's offset (stored with the rows), when Kafka also
    knows the group's offset there.

    Without a Kafka offset the broker may be a new one, or the topic created again, whose offsets
    start over: PostgreSQL's would then skip records. So the partition is read from the group's
    reset position (``auto.offset.reset``, earliest) instead, and records stored already are skipped
    (``Queue.insert_rows``), unless the ingestor finds the partition is the one PostgreSQL's offset
    came from (Kafka only forgot the group's offsets): then it resumes from PostgreSQL's.

    Without PostgreSQL's offset, Kafka's is where to start, unless it bears this database's ``mark``
    (``committed_mark``, :func:`commit_mark`): then this database stored that partition's rows once and
    lost them (a replica promoted without the last commits, a restore), and the partition is read from
    its first record (``OFFSET_BEGINNING``), what Kafka's offset would skip included.
    """
    if stored is not None and committed is not None and committed >= 0:
        return stored
    if stored is None and committed is not None and committed >= 0 and mark and committed_mark == mark:
        return OFFSET_BEGINNING
    return OFFSET_STORED


def same_partition(
    consumer: Consumer, settings: Settings, store: Store, topic: str, partition: int, stored: int
) -> bool:
    """Whether the partition is the one PostgreSQL's offset ``stored`` was taken from.

    Kafka forgets a group's offsets after ``offsets.retention.minutes``; a topic created again
    starts its offsets over. The partition is the same when its record at ``stored - 1`` is the one
    ingested from there (same timestamp, the ingest's own duplicate key with the offset). When that
    row is gone (compacted), the partition must at least reach ``stored``.
    """
    last = stored - 1
    ingested = store.queue.ingested_record_timestamp(topic, partition, last)
    if ingested is None:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return high >= stored
    probe = Consumer({**consumer_config(settings), "group.id": f"{settings.consumer_group}-probe"})
    try:
        probe.assign([TopicPartition(topic, partition, last)])
        deadline = time.monotonic() + PROBE_S
        while time.monotonic() < deadline:
            msg = probe.poll(0.5)
            if msg is not None and msg.error() is None:
                # Out of range (fewer records now) resets to the start: another offset arrives.
                return msg.offset() == last and msg.timestamp()[1] == ingested
        return False
    finally:
        probe.close()


@dataclass(frozen=True)
class IngestLag:
    """Records on the retry topics that ingestion has not stored yet."""

    total: int
    by_topic: dict[str, int]
    #: Retry topics the broker does not have (yet): nothing to ingest there.
    missing_topics: tuple[str, ...] = ()
    #: Of each topic with records not ingested, how old the oldest of them is (its timestamp).
    oldest_unread_s: dict[str, float] = field(default_factory=dict)
    #: Each topic's ``retention.ms`` (None: kept for ever, or the broker did not tell).
    retention_ms: dict[str, int | None] = field(default_factory=dict)
    #: Records the broker removed (retention) before ingestion read them, by topic: retries lost.
    removed_unread: dict[str, int] = field(default_factory=dict)

    def retention_share(self) -> tuple[float, str] | None:
        """The largest share of its topic's retention the oldest record not ingested has used (1.0: it
        is as old as the retention, about to be removed unread), with that topic; None when no topic
        with records not ingested has a known retention."""
        shares = [
            (age_s * 1000 / retention, topic)
            for topic, age_s in self.oldest_unread_s.items()
            if (retention := self.retention_ms.get(topic))
        ]
        return max(shares) if shares else None


def ingest_lag(
    settings: Settings, stored: Mapping[tuple[str, int], int], timeout_s: float = 10.0
) -> IngestLag:
    """The records of every retry-topic partition past where ingestion stands: the broker's high
    watermark minus PostgreSQL's next offset (``stored``, the truth), else the group's Kafka offset,
    else the partition's first record (nothing of it ingested yet).

    Reads the broker's metadata and offsets only: it joins no group and moves no offset.
    Raises ``KafkaException`` when the broker cannot be asked.
    """
    consumer = Consumer({**consumer_config(settings), "group.id": settings.consumer_group})
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        partitions: list[TopicPartition] = []
        missing = []
        for topic in settings.retry_topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None:
                missing.append(topic)
                continue
            partitions += [TopicPartition(topic, p) for p in sorted(found.partitions)]
        unknown = [tp for tp in partitions if (tp.topic, tp.partition) not in stored]
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in (committed_offsets(consumer, unknown, timeout_s) if unknown else [])
        }
        by_topic: dict[str, int] = {}
        removed: dict[str, int] = {}
        unread: list[TopicPartition] = []
        for tp in partitions:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            at = stored.get((tp.topic, tp.partition), committed.get((tp.topic, tp.partition), -1))
            behind = max(0, high - max(at, low))
            by_topic[tp.topic] = by_topic.get(tp.topic, 0) + behind
            if 0 <= at < low:  # the ingest stood before the partition's start: removed unread
                removed[tp.topic] = removed.get(tp.topic, 0) + low - at
            if behind:
                unread.append(TopicPartition(tp.topic, tp.partition, max(at, low)))
        oldest = _oldest_unread(consumer, unread, timeout_s)
        retention = topic_retention(settings, sorted(oldest)) if oldest else {}
        return IngestLag(sum(by_topic.values()), by_topic, tuple(missing), oldest, retention, removed)
    finally:
        consumer.close()


def _oldest_unread(consumer: Consumer, starts: list[TopicPartition], timeout_s: float) -> dict[str, float]:
    """The age in seconds of the first record at each of ``starts``, the oldest of each topic (by the
    record's timestamp); a partition that gives no record within ``timeout_s`` is left out."""
    if not starts:
        return {}
    now = time.time()
    oldest: dict[str, float] = {}
    waiting = {(tp.topic, tp.partition) for tp in starts}
    consumer.assign(starts)
    try:
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(len(waiting) * 50, 0.2):
                where = (msg.topic() or "", msg.partition() or 0)
                if msg.error() is not None or where not in waiting:
                    continue
                waiting.discard(where)
                kind, stamp = msg.timestamp()
                if kind and stamp > 0:
                    oldest[where[0]] = max(oldest.get(where[0], 0.0), now - stamp / 1000)
    finally:
        consumer.unassign()
    return oldest
