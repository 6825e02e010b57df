"""Topics of a trial: creating them, sending the workload, reading every record back."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.chaos.common import DONE_SQL, ChaosError, Header

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def retry(self) -> str:
        return f"{self.prefix}-retry"

    @property
    def dest(self) -> str:
        return f"{self.prefix}-orders"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}-dlq"

    @property
    def all(self) -> list[str]:
        return [self.retry, self.dest, self.dlq]


@dataclass(frozen=True)
class Seen:
    """A record as a consumer of a topic sees it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]

    def header(self, name: str) -> str | None:
        """The header's value as text; None when absent, null, repeated or not UTF-8."""
        values = [v for k, v in self.headers if k == name]
        if len(values) != 1 or values[0] is None:
            return None
        try:
            return values[0].decode()
        except UnicodeDecodeError:
            return None


#: Topics where the hostile corpus can arrive at all. Kafka 4 refuses by default a record timestamped
#: more than an hour ahead (``message.timestamp.after.max.ms``; brokers before 4.0 took any) and a
#: batch over 1 MiB (``max.message.bytes``): a cluster whose topics allow them delivers such records
#: to the service, which must cope.
PERMISSIVE_TOPIC_CONFIG = {
    "message.timestamp.after.max.ms": str(2**63 - 1),
    "max.message.bytes": str(16 * 1024 * 1024),
}


def create_topics(
    bootstrap: str, topics: Iterable[str], partitions: int = 3, config: dict[str, str] | None = None
) -> None:
    """Create ``topics`` with the broker's default replication (one replica on the dev broker, three
    with ``min.insync.replicas`` 2 on a dev cluster)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    new = [NewTopic(t, partitions, -1, config=config or {}) for t in topics]
    for future in admin.create_topics(new).values():
        future.result(15)


def delete_topics(bootstrap: str, topics: Iterable[str]) -> None:
    """Free the broker's memory; a broker that cannot delete topics only costs memory."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.delete_topics(list(topics)).values():
        with contextlib.suppress(Exception):
            future.result(15)


def send(
    bootstrap: str, topic: str, records: Sequence[dict[str, Any]], chunks: int = 1, gap_s: float = 0
) -> None:
    """Produce ``records`` (key, value, headers, optionally timestamp) in ``chunks`` spaced by ``gap_s``;
    wait for every ack."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            # The corpus holds records over RETRY_MAX_RECORD_BYTES: the broker must get them.
            "message.max.bytes": 16 * 1024 * 1024,
            "log_level": 3,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    size = max(1, -(-len(records) // max(1, chunks)))
    for start in range(0, len(records), size):
        if start and gap_s:
            time.sleep(gap_s)
        for rec in records[start : start + size]:
            while True:
                try:
                    producer.produce(
                        topic,
                        key=rec["key"],
                        value=rec["value"],
                        headers=rec["headers"],
                        timestamp=rec.get("timestamp", 0),
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    # The broker may be frozen by the trial's fault meanwhile: be patient.
    if producer.flush(120) or errors:
        raise ChaosError(f"the workload could not be sent to {topic}: {errors[:3] or 'flush timed out'}")


def read_topics(
    bootstrap: str, topics: Sequence[str], idle_s: float = 1.0, timeout_s: float = 60
) -> dict[str, list[Seen]]:
    """Every record of ``topics``, once nothing is being written to them any more.

    Reads from the beginning until every partition reported its end and nothing new came for
    ``idle_s``: a partition's end is where the consumer reported it, after the last write.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-audit-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    seen: dict[str, list[Seen]] = {topic: [] for topic in topics}
    try:
        meta = consumer.list_topics(timeout=10).topics
        parts = [
            TopicPartition(t, part, OFFSET_BEGINNING)
            for t in topics
            if t in meta
            for part in meta[t].partitions
        ]
        consumer.assign(parts)
        open_parts = {(tp.topic, tp.partition) for tp in parts}
        deadline, last_record = time.monotonic() + timeout_s, time.monotonic()
        while open_parts or time.monotonic() - last_record < idle_s:
            if time.monotonic() > deadline:
                raise ChaosError(f"reading {', '.join(topics)} timed out; unfinished: {sorted(open_parts)}")
            for msg in consumer.consume(1000, 0.2):
                topic, part = msg.topic() or "", msg.partition() or 0
                if (err := msg.error()) is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise ChaosError(f"reading {topic}: {err}")
                    open_parts.discard((topic, part))
                    continue
                headers = cast(list[Header], msg.headers() or [])
                seen[topic].append(
                    Seen(topic, part, msg.offset() or 0, msg.timestamp()[1], msg.key(), msg.value(), headers)
                )
                last_record = time.monotonic()
    finally:
        consumer.close()
    return seen


def wait_done(
    database_url: str, expected: int, timeout_s: float, ready: Callable[[], bool] = lambda: True
) -> bool:
    """Wait until ``expected`` jobs exist and each is published or dead and on its DLQ topic."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(database_url, connect_timeout=3) as conn:
                row = conn.execute(DONE_SQL).fetchone()
            if row and row[0] >= expected and row[1] == row[0] and ready():
                return True
        except psycopg.Error:
            pass  # PostgreSQL is being restarted
        time.sleep(0.3)
    return False
