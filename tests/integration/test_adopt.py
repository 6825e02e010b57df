"""Adopting other tools' dead-letter topics, on the real broker and PostgreSQL: records as Spring Kafka's
``DeadLetterPublishingRecoverer`` and Kafka Connect's ``DeadLetterQueueReporter`` write them become dead
jobs (reason ``adopted``) that are never sent to a DLQ topic again and are replayed to their original
topic like the service's own."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pytest

from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.ops.dlq import DlqFilter, run_action
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration

STACKTRACE = ("\tat org.example.OrdersListener.onMessage(OrdersListener.java:42)\n" * 400).encode()


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(
        database_url,
        bootstrap_servers,
        topic_prefix,
        adopt_topics={f"{topic_prefix}-orders.DLT": "spring", f"{topic_prefix}-connect.dlq": "connect"},
    )


def spring(prefix: str, key: bytes, **overrides: bytes | None) -> dict:
    """A record as Spring Kafka's DeadLetterPublishingRecoverer publishes it (binary ints, UTF-8 texts)."""
    headers = {
        "kafka_dlt-original-topic": f"{prefix}-orders".encode(),
        "kafka_dlt-original-partition": struct.pack(">i", 2),
        "kafka_dlt-original-offset": struct.pack(">q", 41),
        "kafka_dlt-original-timestamp": struct.pack(">q", int(time.time() * 1000) - 60_000),
        "kafka_dlt-original-timestamp-type": b"CreateTime",
        "kafka_dlt-original-consumer-group": b"orders-app",
        "kafka_dlt-exception-fqcn": b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        "kafka_dlt-exception-cause-fqcn": b"java.net.SocketTimeoutException",
        "kafka_dlt-exception-message": b"Listener method threw exception: Read timed out",
        "kafka_dlt-exception-stacktrace": STACKTRACE,
        "__TypeId__": b"com.example.Order",
        **overrides,
    }
    return {
        "key": key,
        "value": b'{"order": 1}',
        "headers": [(k, v) for k, v in headers.items() if v is not None],
    }


def connect(prefix: str, key: bytes) -> dict:
    """A record as Kafka Connect's dead-letter queue reporter writes it (context headers on: strings)."""
    headers = {
        "__connect.errors.topic": f"{prefix}-payments".encode(),
        "__connect.errors.partition": b"0",
        "__connect.errors.offset": b"17",
        "__connect.errors.connector.name": b"jdbc-sink",
        "__connect.errors.task.id": b"0",
        "__connect.errors.stage": b"VALUE_CONVERTER",
        "__connect.errors.class.name": b"org.apache.kafka.connect.json.JsonConverter",
        "__connect.errors.exception.class.name": b"org.apache.kafka.connect.errors.DataException",
        "__connect.errors.exception.message": b"Converting byte[] to Kafka Connect data failed due to serialization error",
    }
    return {"key": key, "value": b"not json", "headers": list(headers.items())}


def test_spring_and_connect_dead_letters_become_dead_jobs_replayed_to_their_original_topic(
    loop: Loop, topic_prefix: str
) -> None:
    spring_topic, connect_topic = sorted(loop.settings.adopt_topics)[1], sorted(loop.settings.adopt_topics)[0]
    orders, payments, dlq = f"{topic_prefix}-orders", f"{topic_prefix}-payments", f"{topic_prefix}-dlq"
    create_topics(loop.bootstrap, [spring_topic, connect_topic, orders, payments, dlq], partitions=3)
    loop.send([spring(topic_prefix, b"o-1")], topic=spring_topic)
    loop.send(
        [
            # hostile: no original topic (nowhere to replay to), and a partition of 3 bytes
            spring(topic_prefix, b"o-nowhere", **{"kafka_dlt-original-topic": None}),
            spring(topic_prefix, b"o-odd", **{"kafka_dlt-original-partition": b"\x00\x00\x02"}),
        ],
        topic=spring_topic,
    )
    loop.send([connect(topic_prefix, b"p-1")], topic=connect_topic)

    counts = loop.ingest(4)
    loop.publish(3)  # a dead job is sent to its DLQ topic here, unless it came from one

    assert counts.consumed == 4
    rows = {bytes(r["msg_key"]): r for r in loop.rows()}
    o1, odd, nowhere, p1 = rows[b"o-1"], rows[b"o-odd"], rows[b"o-nowhere"], rows[b"p-1"]
    assert (o1["status"], o1["dead_reason"], o1["destination"], o1["original_topic"]) == (
        "dead", "adopted", orders, orders,
    )  # fmt: skip
    assert (o1["original_partition"], o1["original_offset"], o1["destination_partition"]) == (2, 41, 2)
    # the listener's exception, not Spring's wrapper, which the reason keeps
    assert o1["error_class"] == "java.net.SocketTimeoutException"
    assert (o1["reason"], o1["consumer_group"]) == (
        "Listener method threw exception: Read timed out "
        "(in org.springframework.kafka.listener.ListenerExecutionFailedException)",
        "orders-app",
    )
    assert o1["dlq_topic"] == spring_topic and o1["dlq_published_at"] is not None
    assert (
        odd["dead_reason"] == "adopted" and odd["original_partition"] is None
    )  # the malformed header left out
    assert nowhere["dead_reason"] == "invalid"
    assert nowhere["reason"].startswith(
        "a spring dead letter must name its original topic in header kafka_dlt-"
    )
    assert (p1["dead_reason"], p1["destination"], p1["original_partition"], p1["original_offset"]) == (
        "adopted", payments, 0, 17,
    )  # fmt: skip
    assert p1["error_class"] == "org.apache.kafka.connect.errors.DataException"
    assert (p1["consumer_group"], p1["dlq_topic"]) == ("jdbc-sink", connect_topic)
    # nothing was published to a DLQ topic: every one of them is on one already
    assert all(r["dlq_published_at"] is not None for r in rows.values())
    assert consume(loop.bootstrap, [dlq], expected=0, timeout_s=3) == []

    destinations = Destinations.of([orders, payments], own_topics=[loop.settings.retry_topic, dlq])
    replayed = run_action(
        loop.settings.database_url, "replay", DlqFilter(dead_reason="adopted"), actor="ann", source="cli",
        dry_run=False, destinations=destinations,
    )  # fmt: skip
    loop.publish(3)

    assert replayed.affected == 3
    back = {s.key: s for s in consume(loop.bootstrap, [orders, payments], expected=3)}
    assert sorted(back) == [b"o-1", b"o-odd", b"p-1"]
    assert back[b"o-1"].value == b'{"order": 1}' and back[b"p-1"].value == b"not json"
    assert back[b"o-1"].header(p.ATTEMPT) == "1"
    # the tool's own headers come along, byte for byte
    assert back[b"o-1"].header("kafka_dlt-exception-stacktrace") == STACKTRACE.decode()
    assert back[b"p-1"].header("__connect.errors.connector.name") == "jdbc-sink"
    assert back[b"o-1"].partition == 2  # where it failed


def test_a_retry_topic_cannot_be_adopted(database_url: str) -> None:
    with pytest.raises(ConfigError, match="RETRY_ADOPT_TOPICS names retry, a retry topic of this service"):
        Settings(database_url=database_url, adopt_topics={"retry": "spring"})
    with pytest.raises(ConfigError, match="must look like TOPIC=FORMAT with FORMAT one of spring, connect"):
        Settings.from_env({"RETRY_ADOPT_TOPICS": "orders.DLT=camel"})
    assert Settings.from_env({"RETRY_ADOPT_TOPICS": "orders.DLT=spring, c.dlq=connect"}).adopt_topics == {
        "orders.DLT": "spring",
        "c.dlq": "connect",
    }


def test_a_long_exception_message_is_cut_saying_so() -> None:
    from retry_scheduler.core.adopt import adopt

    found = adopt(
        "connect",
        [("__connect.errors.topic", b"orders"), ("__connect.errors.exception.message", b"x" * 5000)],
        max_reason_chars=2000,
    )

    assert found.reason is not None and len(found.reason) == 2000
    assert found.reason.startswith("xxx") and not found.reason.endswith("xxx")  # the cut is marked
