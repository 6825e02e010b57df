"""The source records of share groups' dead letters, read back from their topics at ingest.

The broker's dead-letter queue for a share group (KIP-1191) copies the failed record's key and value
only with ``errors.deadletterqueue.copy.record.enable``, and never its headers; without that setting
(the default) a letter is a pointer: ``__dlq.errors.topic``, ``.partition`` and ``.offset``, no key,
no value. The ingest loop reads the record from its topic while it still exists
(:class:`SourceReader`), and the job holds its key, value, headers (the record's own, then the
letter's) and timestamp: what a replay publishes is the record as it was, byte for byte. A copied
letter whose record can no longer be read, or whose pointer now finds another key or value there
(the topic made again), keeps its copy (key and value, without headers).

A record that no longer exists (its topic deleted, its offset below the partition's start: removed by
retention, or above its end: the topic made again) cannot be completed: the job is kept dead
(``adopted``, a letter from a ``:retry`` topic too) with no destination, so that no replay publishes
an empty record in its place, and its reason says what was lost and, where the broker tells, the
topic's ``retention.ms``. A record that cannot be read for another reason (no right to read the topic,
the broker not answering in time) is kept the same way, its reason naming the error: ingestion never
stops for a letter.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource

from retry_scheduler.core import protocol
from retry_scheduler.core.adopt import SHARE, source_format, topics_of
from retry_scheduler.core.config import Settings
from retry_scheduler.core.headers import Header, truncate_reason
from retry_scheduler.core.jobs import CopyRow, encode_headers, pg_time
from retry_scheduler.core.records import MIN_TRUSTED_MS
from retry_scheduler.loops.kafka import admin_client, consumer_config

log = logging.getLogger(__name__)

#: How long a read of one partition's letters may take before they are kept without their bytes.
READ_TIMEOUT_S = 10.0
#: How long a read goes on after the partition's end was reported, for a record still to come.
END_GRACE_S = 1.0
#: A read that hears nothing at all for this long is past the partition's end: Kafka answers such a
#: fetch with an error (offset out of range), some Kafka-protocol brokers with nothing.
SILENT_S = 5.0


@dataclass(frozen=True)
class Source:
    """A source record as read back from its topic."""

    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp_ms: int | None


def pointer_only(row: CopyRow) -> bool:
    """Whether a letter's row holds no record to send (no key, no value) for a destination."""
    return row.msg_key is None and row.msg_value is None and row.destination is not None


def copied(row: CopyRow) -> bool:
    """Whether a letter's row holds the record's key or value (copied into the letter) but, as the
    broker writes it, none of the record's headers, and points at the record for them."""
    return not pointer_only(row) and row.destination is not None and row.original_offset is not None


class SourceReader:
    """Completes pointer-only letters of the adopted topics ``topics`` from their source topics, with a
    consumer of its own (assigned, never subscribed: it joins no group and commits nothing)."""

    def __init__(
        self,
        settings: Settings,
        topics: Sequence[str],
        refusal: Callable[[str], str | None] = lambda _t: None,
    ) -> None:
        self.settings = settings
        self.topics = frozenset(topics)
        #: Why a topic may not be read for a letter (the deployment's destination rules), or None.
        self.refusal = refusal
        self._consumer: Consumer | None = None
        self._retention: dict[str, int | None] = {}
        #: Letters completed and kept without their record so far.
        self.completed = self.lost = 0

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def complete(
        self,
        rows: list[CopyRow],
        now_ms: int,
        max_reason_chars: int,
        then: Callable[[CopyRow, int], CopyRow] = lambda row, _now_ms: row,
    ) -> list[CopyRow]:
        """``rows`` with each pointer-only letter of :attr:`topics` completed from its source record, or
        kept dead without a destination when that record cannot be read (the reason says why). Each
        completed row is passed through ``then(row, now_ms)`` (the ingest schedules a ``:retry`` letter
        again, now that its record's headers are known: :meth:`~retry_scheduler.core.records.RowBuilder.recount`)."""
        wanted: dict[tuple[str, int], list[int]] = defaultdict(list)
        pointless: list[int] = []
        for i, row in enumerate(rows):
            if row.source_topic not in self.topics:
                continue
            if pointer_only(row) or copied(row):
                if row.original_partition is None or row.original_offset is None:
                    if pointer_only(row):
                        pointless.append(i)
                else:
                    wanted[(row.destination or "", row.original_partition)].append(i)
        if not wanted and not pointless:
            return rows
        rows = list(rows)
        for i in pointless:
            why = "the letter names no valid partition and offset to read it from"
            rows[i] = self._lost(rows[i], why, now_ms, max_reason_chars)
            self.lost += 1
        for (topic, partition), indexes in wanted.items():
            offsets = {rows[i].original_offset or 0 for i in indexes}
            # A letter's pointer is the writer's word: only a topic records may be replayed to is read,
            # or whoever may write to the dead-letter topic could copy any topic the service reads.
            refused = self.refusal(topic)
            found: dict[int, Source] = {}
            if refused is not None:
                missing = dict.fromkeys(offsets, f"not read: {refused}")
            else:
                found, missing = self._read(topic, partition, offsets)
            for i in indexes:
                row = rows[i]
                source = found.get(row.original_offset or 0)
                if (
                    source is not None
                    and copied(row)
                    and (source.key, source.value) != (row.msg_key, row.msg_value)
                ):
                    # Another record at that offset (the topic made again): the letter's copy is the
                    # record; it is kept without headers.
                    log.info(
                        "the dead letter %s[%s]@%s holds a copy that is not the record now at %s[%s]@%s: "
                        "kept with the copy", row.source_topic, row.source_partition, row.source_offset,
                        topic, partition, row.original_offset,
                    )  # fmt: skip
                elif source is not None:
                    rows[i] = then(self._completed(row, source, now_ms), now_ms)
                    self.completed += 1
                elif copied(row):  # the letter's copy is sent, without the headers it never had
                    log.info(
                        "the dead letter %s[%s]@%s holds a copy of %s[%s]@%s, whose headers cannot be "
                        "read (%s): kept with the copy", row.source_topic, row.source_partition,
                        row.source_offset, topic, partition, row.original_offset,
                        missing.get(row.original_offset or 0, "not found"),
                    )  # fmt: skip
                else:
                    why = missing.get(row.original_offset or 0, "it was not found")
                    rows[i] = self._lost(row, why, now_ms, max_reason_chars)
                    self.lost += 1
                    log.warning(
                        "the dead letter %s[%s]@%s points to %s[%s]@%s, which cannot be read (%s): kept "
                        "without its record", row.source_topic, row.source_partition, row.source_offset,
                        topic, partition, row.original_offset, why,
                    )  # fmt: skip
        return rows

    def _completed(self, row: CopyRow, source: Source, now_ms: int) -> CopyRow:
        first_seen = row.first_seen_at
        if source.timestamp_ms is not None and MIN_TRUSTED_MS <= source.timestamp_ms <= now_ms:
            first_seen = pg_time(source.timestamp_ms)
        return row._replace(
            msg_key=source.key,
            msg_value=source.value,
            # the record's own headers, then the letter's (as Kafka Streams orders them)
            headers=encode_headers(source.headers) + row.headers,
            first_seen_at=first_seen,
        )

    def _lost(self, row: CopyRow, why: str, now_ms: int, max_reason_chars: int) -> CopyRow:
        now = pg_time(now_ms)
        reason = (
            f"{row.reason or 'dead letter'}; its record {row.destination}[{row.original_partition}]@"
            f"{row.original_offset} cannot be read ({why}): the letter holds no key, value or headers of it "
            "and is kept without a destination"
        )
        return row._replace(
            destination=None,
            destination_partition=None,
            reason=truncate_reason(reason, max_reason_chars),
            status="dead",
            dead_reason=protocol.DEAD_ADOPTED,
            dlq_topic=row.source_topic,
            due_at=row.due_at if row.dead_at is not None else now,
            dead_at=row.dead_at if row.dead_at is not None else now,
        )

    def _read(
        self, topic: str, partition: int, offsets: set[int]
    ) -> tuple[dict[int, Source], dict[int, str]]:
        """The records at ``offsets`` of one partition, and why each one not found is missing."""
        consumer = self._consumer_for_reads()
        tp = TopicPartition(topic, partition)
        try:
            low, _high = consumer.get_watermark_offsets(tp, timeout=READ_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in (
                KafkaError._UNKNOWN_PARTITION,
                KafkaError._UNKNOWN_TOPIC,
                KafkaError.UNKNOWN_TOPIC_OR_PART,
            ):
                return {}, dict.fromkeys(offsets, f"topic {topic} has no partition {partition}: deleted")
            return {}, dict.fromkeys(offsets, f"{error}")
        missing: dict[int, str] = {}
        for offset in offsets:
            if offset < low:
                retention = self._retention_of(topic)
                missing[offset] = f"the partition starts at offset {low}: removed by retention" + (
                    f" (retention.ms={retention})" if retention else ""
                )
        readable = sorted(offsets - set(missing))
        if not readable:
            return {}, missing
        found, looked = self._fetch(consumer, topic, partition, readable)
        for offset in readable:
            if offset not in found:
                missing[offset] = (
                    "no record at that offset (compacted away, or the topic was made again)"
                    if looked
                    else f"not read within {READ_TIMEOUT_S:.0f} s"
                )
        return found, missing

    def _fetch(
        self, consumer: Consumer, topic: str, partition: int, offsets: list[int]
    ) -> tuple[dict[int, Source], bool]:
        """The records at ``offsets`` (ascending) of one partition: each read from its own offset (no
        scan between letters far apart), with those met on the way. Also whether every offset was
        looked for within :data:`READ_TIMEOUT_S`."""
        wanted = set(offsets)
        found: dict[int, Source] = {}
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            for target in offsets:
                if target in found:
                    continue
                if time.monotonic() >= deadline:
                    return found, False
                consumer.assign([TopicPartition(topic, partition, target)])
                end_seen_at: float | None = None
                heard_at = time.monotonic()
                while time.monotonic() < deadline:
                    reached = False
                    messages = consumer.consume(500, 0.2)
                    if messages:
                        heard_at = time.monotonic()
                    elif time.monotonic() - heard_at > SILENT_S:
                        break  # past the partition's end on a broker that says nothing there
                    for msg in messages:
                        error = msg.error()
                        if error is not None:
                            if error.code() == KafkaError._AUTO_OFFSET_RESET:  # out of the partition's range
                                reached = True
                            elif error.code() == KafkaError._PARTITION_EOF and end_seen_at is None:
                                end_seen_at = time.monotonic()
                            continue
                        end_seen_at = None
                        offset = msg.offset() or 0
                        if offset in wanted:
                            found[offset] = _source(msg)
                        reached = reached or offset >= target
                    # The end of the partition, and nothing more for a while: some brokers report
                    # their end (high watermark) late, so the end alone does not prove a record missing.
                    ended = end_seen_at is not None and time.monotonic() - end_seen_at > END_GRACE_S
                    if reached or ended:
                        break
                else:
                    return found, False
        finally:
            consumer.unassign()
        return found, True

    def _consumer_for_reads(self) -> Consumer:
        if self._consumer is None:
            config: dict[str, Any] = {
                **consumer_config(self.settings),
                # a group of its own that it never joins nor commits to: librdkafka wants one named
                "group.id": f"{self.settings.consumer_group}.sources.{uuid.uuid4().hex[:8]}",
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            }
            self._consumer = Consumer(config)
        return self._consumer

    def _retention_of(self, topic: str) -> int | None:
        """The topic's ``retention.ms`` as the broker tells it; None when it does not, or for ever."""
        if topic not in self._retention:
            self._retention.update(topic_retention(self.settings, [topic]))
        return self._retention[topic]


def _source(msg: Any) -> Source:
    ts_type, ts = msg.timestamp()
    try:
        headers = cast(list[Header], list(msg.headers() or ()))
    except Exception:  # a header name that is not UTF-8: the record without them
        headers = []
    return Source(msg.key(), msg.value(), headers, ts if ts_type and ts > 0 else None)


def topic_retention(settings: Settings, topics: Sequence[str]) -> dict[str, int | None]:
    """Each topic's ``retention.ms`` as the broker tells it: None when it does not (no such topic, no
    right to describe it, no answer in 5 s) or keeps records for ever (-1)."""
    found: dict[str, int | None] = dict.fromkeys(topics)
    if not topics:
        return found
    try:
        resources = {topic: ConfigResource("topic", topic) for topic in topics}
        admin = admin_client(settings)  # kept until the answers came: a client destroyed cancels them
        futures = admin.describe_configs(list(resources.values()))
    except Exception:
        return found
    for topic, resource in resources.items():
        try:
            entry = futures[resource].result(timeout=5).get("retention.ms")
            value = int(entry.value) if entry is not None and entry.value is not None else None
        except Exception:
            value = None
        found[topic] = value if value is not None and value > 0 else None
    return found


def share_topics(settings: Settings) -> list[str]:
    """The adopted topics a share group's broker writes its letters to (``FORMAT`` ``share``)."""
    return topics_of(SHARE, settings.adopt_topics)


@dataclass(frozen=True)
class LetterReading:
    """Share groups' letters of the last window, as ``retry_monitor`` judges them."""

    #: Letters kept without their source record (it could not be read).
    unreadable: int = 0
    #: The largest share of its topic's ``retention.ms`` a letter's source record had used when it was
    #: read (1.0: as old as the retention); None when no letter was read or no retention is known.
    retention_share: float | None = None
    #: The source topic of that letter, its record's age then, and the topic's retention.
    topic: str | None = None
    age_s: float = 0.0
    retention_ms: int | None = None
    #: Letters read from every adopted topic in the window, by the format of its topic (the writer).
    by_writer: Mapping[str, int] = field(default_factory=dict)


def read_letters(settings: Settings, store: Any, window_s: int = 3600) -> LetterReading:
    """The letters read from adopted topics in the last ``window_s``, and the share groups' ones judged
    (``store``: a ``db.store.Store``)."""
    by_writer: Counter[str] = Counter()
    for topic, count in store.readings.adopted_recent(sorted(settings.adopt_topics), window_s).items():
        by_writer[source_format(settings.adopt_topics[topic])] += count
    rows = store.readings.share_letters(share_topics(settings), window_s)
    nearest = LetterReading(unreadable=sum(lost for _topic, _age, lost in rows), by_writer=dict(by_writer))
    retention = topic_retention(settings, [topic for topic, _age, _lost in rows]) if rows else {}
    for topic, age_s, _lost in rows:
        kept_ms = retention.get(topic)
        if kept_ms and (nearest.retention_share is None or age_s * 1000 / kept_ms > nearest.retention_share):
            nearest = replace(
                nearest,
                retention_share=age_s * 1000 / kept_ms,
                topic=topic,
                age_s=age_s,
                retention_ms=kept_ms,
            )
    return nearest
