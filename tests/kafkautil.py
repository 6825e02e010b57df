"""Small helpers for tests that talk to the broker (Apache Kafka 4.4 of the dev tooling)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from bench import chaos
from bench.chaos import create_topics

__all__ = ["QUICK_JOIN", "Seen", "configure_group", "consume", "create_topics", "produce"]

#: For a consumer group's members in tests where the application's configuration is not the point:
#: a member killed -9 (no LeaveGroup) holds its partitions until the session times out, 45 s at
#: librdkafka's default and 6 s at this one. Our own loops use the same.
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


def consume(bootstrap: str, topics: Sequence[str], expected: int, timeout_s: float = 30) -> list[Seen]:
    """Read every partition of ``topics`` from the beginning until ``expected`` records arrived.

    Waits ``timeout_s`` at most and then returns what it has; reads a little longer after
    reaching ``expected`` so that unexpected extra records are caught too. A consumer error
    (other than reaching the end of a partition) fails the caller's test with its text, so a
    record the client could not read is never mistaken for a record that was never sent.
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
                TopicPartition(t, p, OFFSET_BEGINNING)
                for t in topics
                if t in meta
                for p in meta[t].partitions
            ]
            if all(t in meta and meta[t].partitions for t in topics):
                break
            time.sleep(0.3)  # a topic the scheduler has not created yet
        consumer.assign(parts)
        grace: float | None = None
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.3):
                if err := msg.error():
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {err}")
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


def configure_group(bootstrap: str, group: str, **settings: str) -> None:
    """Set a group's own configuration (IncrementalAlterConfigs on the GROUP resource): a share group's
    ``share.auto.offset.reset`` and dead-letter settings, a KIP-848 group's session and heartbeat.
    Keyword names stand for the dotted ones (``share_auto_offset_reset``)."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [
        ConfigEntry(name.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=15)
