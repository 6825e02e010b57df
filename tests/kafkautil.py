"""Small helpers for tests that talk to the embedded broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench import chaos
from bench.chaos import create_topics

__all__ = ["QUICK_JOIN", "Seen", "consume", "create_topics", "produce"]

#: For a consumer group's members in tests where the application's configuration is not the point:
#: the embedded broker holds a group's join for half the session timeout (23 s at librdkafka's
#: default of 45 s, 3 s at this one), on each join and rebalance. Our own loops use the same.
QUICK_JOIN = {"session.timeout.ms": 6000}


class Seen(chaos.Seen):
    """A record as a consumer of a destination or DLQ topic sees it; ``header`` is strict for tests."""

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        assert len(values) <= 1, f"header {name} appears {len(values)} times"
        return None if not values or values[0] is None else values[0].decode()


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[dict],
    partition: int | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    """Produce ``records`` (dicts with key, value, headers) and wait for every ack; ``config`` adds
    to the producer's configuration."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **(config or {})})
    errors: list[object] = []
    for rec in records:
        kwargs = {"key": rec.get("key"), "value": rec.get("value"), "headers": rec.get("headers", [])}
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, on_delivery=lambda err, _m: errors.append(err) if err else None, **kwargs)
    assert producer.flush(15) == 0
    assert not errors, errors


NUDGE_HEADER = "test.nudge"
NUDGE_AFTER_S = 4.0


def _nudge(bootstrap: str, parts: Sequence[TopicPartition]) -> None:
    """Write a marker record to each partition, which moves a lagging high watermark forward."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for tp in parts:
        producer.produce(tp.topic, value=b"", partition=tp.partition, headers=[(NUDGE_HEADER, b"1")])
    producer.flush(10)


def consume(bootstrap: str, topics: Sequence[str], expected: int, timeout_s: float = 30) -> list[Seen]:
    """Read every partition of ``topics`` from the beginning until ``expected`` records arrived.

    Waits ``timeout_s`` at most and then returns what it has; reads a little longer after
    reaching ``expected`` so that unexpected extra records are caught too. A consumer error
    (other than reaching the end of a partition) fails the caller's test with its text, so a
    record the client could not read is never mistaken for a record that was never sent.

    The embedded broker (Tansu, memory storage) can leave a partition's high watermark behind
    its last write when producers write to that partition at the same time; the records past it
    stay invisible until the next write. When records are missing and none arrived for a few
    seconds, a marker record (header ``test.nudge``) is written to each partition to move the
    watermark, and markers are left out of what is returned.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    seen: list[Seen] = []
    errors: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        parts: list[TopicPartition] = []
        while time.monotonic() < deadline:
            meta = consumer.list_topics(timeout=5).topics
            parts = [
                # From offset 0 (test topics are new), not OFFSET_BEGINNING: the embedded broker has
                # been seen to answer a log start offset above records it still serves.
                TopicPartition(t, p, 0)
                for t in topics
                if t in meta
                for p in meta[t].partitions
            ]
            if all(t in meta and meta[t].partitions for t in topics):
                break
            time.sleep(0.3)  # a topic the scheduler has not created yet
        consumer.assign(parts)
        grace: float | None = None
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            if len(seen) < expected and time.monotonic() - last_progress > NUDGE_AFTER_S:
                _nudge(bootstrap, parts)
                last_progress = time.monotonic()
            for msg in consumer.consume(500, 0.3):
                if err := msg.error():
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {err}")
                    continue
                last_progress = time.monotonic()
                if any(k == NUDGE_HEADER for k, _ in msg.headers() or []):
                    continue
                seen.append(
                    Seen(
                        msg.topic() or "",
                        msg.partition() or 0,
                        msg.offset() or 0,
                        msg.timestamp()[1],
                        msg.key(),
                        msg.value(),
                        list(msg.headers() or []),
                    )
                )
            if len(seen) >= expected:
                grace = grace or time.monotonic() + 1.0
                if time.monotonic() > grace:
                    break
    finally:
        consumer.close()
    assert not errors, f"the consumer reported errors after {len(seen)} records: {errors}"
    return seen
