"""Adopting other tools' dead-letter topics, on the real broker and PostgreSQL: records as Spring Kafka's
``DeadLetterPublishingRecoverer`` and Kafka Connect's ``DeadLetterQueueReporter`` write them become dead
jobs (reason ``adopted``) that are never sent to a DLQ topic again and are replayed to their original
topic like the service's own."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator

import pytest

from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.db.selection import Selection, writer_topics
from retry_scheduler.ops.browse import list_dead
from retry_scheduler.ops.dlq import Operation, run_action
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import consume, create_topics, produce

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

    deployment = loop.allowing(orders, payments)
    adopted = Selection(dead_reason="adopted")
    replay = Operation(action="replay", selection=adopted, actor="ann", source="cli", dry_run=False)
    replayed = run_action(loop.settings.database_url, replay, deployment=deployment)
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
    for wrong in ("orders.DLT=camel", "orders.DLT=share:later", "orders.DLT=:retry"):
        with pytest.raises(
            ConfigError,
            match="must look like TOPIC=FORMAT or TOPIC=FORMAT:retry with FORMAT one of spring, connect, streams, share",
        ):
            Settings.from_env({"RETRY_ADOPT_TOPICS": wrong})
    assert Settings.from_env(
        {"RETRY_ADOPT_TOPICS": "orders.DLT=spring, c.dlq=connect,s.dlq=streams, w.dlq = share : retry"}
    ).adopt_topics == {"orders.DLT": "spring", "c.dlq": "connect", "s.dlq": "streams", "w.dlq": "share:retry"}


def test_a_long_exception_message_is_cut_saying_so() -> None:
    from retry_scheduler.core.adopt import adopt

    found = adopt(
        "connect",
        [("__connect.errors.topic", b"orders"), ("__connect.errors.exception.message", b"x" * 5000)],
        max_reason_chars=2000,
    )

    assert found.reason is not None and len(found.reason) == 2000
    assert found.reason.startswith("xxx") and not found.reason.endswith("xxx")  # the cut is marked


# -- Kafka Streams' and share groups' dead letters ----------------------------------------------------


def streams(
    prefix: str, key: bytes, message: bytes | None = b"Size of data received by IntegerDeserializer is not 4"
) -> dict:
    """A record as Kafka Streams 4.2 writes it to ``errors.deadletterqueue.topic.name``
    (``ExceptionHandlerUtils.buildDeadLetterQueueRecord``, KIP-1034): the failed record's key, value and
    own headers, then six headers, each a ``StringSerializer`` value (UTF-8; null for a null message)
    and the partition and offset as ``String.valueOf``. This record failed in Streams once before: its
    own headers carry an older letter's ``__streams.errors.*``, which the newer ones (last) override."""
    headers: list[tuple[str, bytes | None]] = [
        ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("__streams.errors.exception", b"java.lang.IllegalStateException"),
        ("__streams.errors.topic", f"{prefix}-old".encode()),
        ("__streams.errors.exception", b"org.apache.kafka.common.errors.SerializationException"),
        ("__streams.errors.message", message),
        ("__streams.errors.stacktrace", STACKTRACE),
        ("__streams.errors.topic", f"{prefix}-clicks".encode()),
        ("__streams.errors.partition", b"1"),
        ("__streams.errors.offset", b"73"),
    ]
    return {"key": key, "value": b"\x00\x00\x01", "headers": headers}


def share(
    prefix: str, topic: str, partition: int, offset: int, *, copied: dict | None = None, count: int = 5
) -> dict:
    """A record as the broker writes it to a share group's dead-letter topic (KIP-1191, Kafka 4.4): six
    headers, each ``String.getBytes(UTF_8)`` (partition ``Integer.toString``, offset ``Long.toString``,
    delivery count ``Short.toString``), none of the source record's headers, and its key and value only
    with ``errors.deadletterqueue.copy.record.enable`` (``copied``); else no key and no value."""
    headers = [
        ("__dlq.errors.topic", topic.encode()),
        ("__dlq.errors.partition", str(partition).encode()),
        ("__dlq.errors.offset", str(offset).encode()),
        ("__dlq.errors.group", f"{prefix}-workers".encode()),
        ("__dlq.errors.delivery.count", str(count).encode()),
        ("__dlq.errors.message", b"Offset delivery count exceeded the threshold."),
    ]
    return {"key": (copied or {}).get("key"), "value": (copied or {}).get("value"), "headers": headers}


def test_streams_and_share_group_letters_become_dead_jobs_and_pointers_are_read_from_their_source(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    clicks_dlq, work_dlq = f"{topic_prefix}-clicks.dlq", f"{topic_prefix}-work.dlq"
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix, adopt_topics={clicks_dlq: "streams", work_dlq: "share"}
    )
    clicks, work, gone, dlq = (f"{topic_prefix}-{t}" for t in ("clicks", "work", "gone", "dlq"))
    create_topics(loop.bootstrap, [clicks_dlq, work_dlq, clicks, work, gone, dlq], partitions=3)
    # The source records of the share group's letters.
    loop.send(
        [{"key": f"w-{i}".encode(), "value": f'{{"job": {i}}}'.encode(),
          "headers": [("tenant", b"acme"), ("attempt-note", None)]} for i in range(5)],
        topic=work,
    )  # fmt: skip
    seen = consume(loop.bootstrap, [work], expected=5)
    where = {s.key: (s.partition, s.offset) for s in seen}
    w1_partition, w1_offset = where[b"w-1"]
    w3_partition, w3_offset = where[b"w-3"]
    loop.send(
        [streams(topic_prefix, b"c-1"), streams(topic_prefix, b"c-null", message=None)], topic=clicks_dlq
    )
    loop.send(
        [
            share(topic_prefix, work, w1_partition, w1_offset),  # pointer only: read back from work
            share(topic_prefix, work, w3_partition, w3_offset, copied={"key": b"w-3", "value": b"copied"}),
            share(topic_prefix, gone, 0, 12),  # its topic deleted since
            share(topic_prefix, work, w1_partition, w1_offset + 1000),  # past the partition's end
            # hostile: an offset that is no offset, and no key or value to send instead
            {
                **share(topic_prefix, work, 0, 0),
                "headers": [*share(topic_prefix, work, 0, 0)["headers"], ("__dlq.errors.offset", b"-1")],
            },
            # hostile: pointing at a topic no record may go to (the service's own retry topic): never read,
            # or whoever may write the dead-letter topic could copy any topic the service can read
            share(topic_prefix, loop.settings.retry_topic, 0, 0),
        ],
        topic=work_dlq,
    )
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": loop.bootstrap})
    admin.delete_topics([gone])[gone].result(timeout=15)

    counts = loop.ingest(8)
    loop.publish(3)

    assert counts.consumed == 8
    assert (counts.adopted, counts.letters_unreadable) == (
        {"streams": 2, "share": 6},
        4,
    )  # the metrics' counts
    rows = loop.rows(f"source_topic IN ('{clicks_dlq}', '{work_dlq}')")
    assert len(rows) == 8
    by_key = {bytes(r["msg_key"]): r for r in rows if r["msg_key"] is not None}
    c1, c_null = by_key[b"c-1"], by_key[b"c-null"]
    assert (c1["status"], c1["dead_reason"], c1["destination"], c1["destination_partition"]) == (
        "dead", "adopted", clicks, 1,
    )  # fmt: skip
    assert (c1["original_topic"], c1["original_partition"], c1["original_offset"]) == (clicks, 1, 73)
    assert c1["error_class"] == "org.apache.kafka.common.errors.SerializationException"  # the last one
    assert c1["reason"] == "Size of data received by IntegerDeserializer is not 4"
    assert (c1["consumer_group"], c1["attempt"]) == (None, 0)
    assert c_null["dead_reason"] == "adopted" and c_null["reason"] is None

    pointer = by_key[b"w-1"]  # completed from the source record
    assert (pointer["status"], pointer["dead_reason"], pointer["destination"]) == ("dead", "adopted", work)
    assert bytes(pointer["msg_value"]) == b'{"job": 1}'
    assert (pointer["original_partition"], pointer["original_offset"]) == (w1_partition, w1_offset)
    assert (pointer["consumer_group"], pointer["attempt"]) == (f"{topic_prefix}-workers", 4)  # 5 deliveries
    assert pointer["reason"] == "Offset delivery count exceeded the threshold."
    copied = by_key[b"w-3"]
    # A copy that is not the record at that offset (the topic made again, say): the copy is the record,
    # without the headers of another (a copy that is the record gets them: test_share_groups.py).
    assert bytes(copied["msg_value"]) == b"copied" and b"tenant" not in bytes(copied["headers"])
    lost = [r for r in rows if r["msg_key"] is None]
    assert len(lost) == 4
    for row in lost:  # kept, dead, with no destination: nothing to replay in its place
        assert (row["status"], row["dead_reason"], row["destination"]) == ("dead", "adopted", None)
        assert "cannot be read" in row["reason"] and "holds no key, value or headers" in row["reason"]
    assert sum("names no valid partition and offset" in r["reason"] for r in lost) == 1
    [own] = [r for r in lost if r["original_topic"] == loop.settings.retry_topic]
    assert "not read: " in own["reason"] and "service" in own["reason"]
    deleted = next(r for r in lost if r["original_topic"] == gone)
    assert f"topic {gone} has no partition 0: deleted" in deleted["reason"]
    past_end = next(r for r in lost if r["original_topic"] == work and r["original_offset"] is not None)
    assert "no record at that offset" in past_end["reason"]
    assert all(r["dlq_published_at"] is not None for r in rows)
    assert consume(loop.bootstrap, [dlq], expected=0, timeout_s=3) == []

    # who wrote each letter, in the list and as its filter (as `dlq list --written-by` does)
    page = list_dead(loop.settings.database_url, Selection(), settings=loop.settings)
    assert {j.written_by for j in page.jobs} == {"streams", "share"}
    streams_only = Selection(source_topics=writer_topics("streams", loop.settings))
    assert {j.source_topic for j in list_dead(loop.settings.database_url, streams_only).jobs} == {clicks_dlq}
    with pytest.raises(ValueError, match="no topic of RETRY_ADOPT_TOPICS has the format connect"):
        writer_topics("connect", loop.settings)

    deployment = loop.allowing(clicks, work, gone)
    adopted = Selection(dead_reason="adopted")
    replay = Operation(action="replay", selection=adopted, actor="ann", source="cli", dry_run=False)
    replayed = run_action(loop.settings.database_url, replay, deployment=deployment)
    loop.publish(3)

    assert replayed.affected == 4  # the two letters whose record is lost stay dead
    back = {s.key: s for s in consume(loop.bootstrap, [clicks], expected=2)}
    assert sorted(back) == [b"c-1", b"c-null"] and back[b"c-1"].partition == 1
    assert back[b"c-1"].header("traceparent") is not None
    again = [s for s in consume(loop.bootstrap, [work], expected=7) if s.key in (b"w-1", b"w-3")]
    replayed_w1 = [
        s for s in again if s.key == b"w-1" and s.headers and any(k == p.ATTEMPT for k, _ in s.headers)
    ]
    assert len(replayed_w1) == 1
    w1 = replayed_w1[0]
    assert w1.value == b'{"job": 1}' and w1.partition == w1_partition
    assert w1.header("tenant") == "acme"  # the source record's own headers, then the letter's
    assert w1.header("__dlq.errors.group") == f"{topic_prefix}-workers"
    assert w1.header(p.ATTEMPT) == "5"


def test_share_group_letters_adopted_for_retry_come_back_to_their_topic_when_due(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    work_dlq = f"{topic_prefix}-work.dlq"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={work_dlq: "share:retry"})
    work, dlq = f"{topic_prefix}-work", f"{topic_prefix}-dlq"
    create_topics(loop.bootstrap, [work_dlq, work, dlq], partitions=3)
    loop.send([{"key": b"r-1", "value": b"first try", "headers": [("tenant", b"acme")]}], topic=work)
    (source,) = consume(loop.bootstrap, [work], expected=1)
    sent = time.time()
    loop.send(
        [
            share(topic_prefix, work, source.partition, source.offset, count=1),  # pointer: retried
            # copied, delivered three times: 2 retries made, the policy's 2 attempts exhausted
            share(topic_prefix, work, 0, 5, copied={"key": b"r-2", "value": b"again"}, count=3),
        ],
        topic=work_dlq,
    )

    counts = loop.ingest(2)
    rows = {bytes(r["msg_key"]): r for r in loop.rows(f"source_topic = '{work_dlq}'")}
    retried, exhausted = rows[b"r-1"], rows[b"r-2"]
    # the test's default policy: one retry after 1 s, two attempts
    assert (retried["status"], retried["attempt"], retried["destination"]) == ("pending", 0, work)
    assert (exhausted["status"], exhausted["dead_reason"], exhausted["attempt"]) == ("dead", "exhausted", 2)
    assert exhausted["dlq_topic"] == work_dlq  # it stays where it is, on its dead-letter topic
    loop.publish(4)

    assert counts.consumed == 2
    back = [s for s in consume(loop.bootstrap, [work], expected=2) if s.header(p.ATTEMPT) is not None]
    assert len(back) == 1 and back[0].key == b"r-1" and back[0].value == b"first try"
    assert back[0].partition == source.partition and back[0].header("tenant") == "acme"
    assert back[0].header(p.ATTEMPT) == "1"
    published = loop.rows(f"source_topic = '{work_dlq}' AND status = 'published'")
    assert len(published) == 1
    assert published[0]["published_at"].timestamp() >= published[0]["due_at"].timestamp()  # never early
    assert published[0]["due_at"].timestamp() >= sent + 1.0 - 0.5  # 1 s after it was read, not at once
    assert consume(loop.bootstrap, [dlq], expected=0, timeout_s=3) == []  # the exhausted one is not resent


def test_a_pointer_to_a_record_removed_by_retention_is_kept_saying_so_with_the_topic_s_retention(
    bootstrap_servers: str, database_url: str, topic_prefix: str
) -> None:
    """The source partition's first 100 records are gone (removed by the broker, as retention does:
    DeleteRecords moves the log start offset the same way); the letter points at offset 41."""
    import time

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.core.records import RowBuilder
    from retry_scheduler.loops.sources import SourceReader

    work_dlq, work = f"{topic_prefix}-work.dlq", f"{topic_prefix}-work"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={work_dlq: "share"})
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    admin.create_topics([NewTopic(work, 1, 1, config={"retention.ms": "604800000"})])[work].result(timeout=15)
    produce(bootstrap_servers, work, [{"key": b"k%d" % i, "value": b"v"} for i in range(150)], partition=0)
    [deleted] = admin.delete_records([TopicPartition(work, 0, 100)]).values()
    assert deleted.result(timeout=15).low_watermark == 100  # the partition's new log start offset

    settings = loop.settings
    limits = Deployment.load(settings).limits
    now_ms = int(time.time() * 1000)
    row = RowBuilder(Deployment(settings, loop.registry), limits).row(
        work_dlq, 0, 7, now_ms, None, None, share(topic_prefix, work, 0, 41)["headers"], now_ms
    )
    reader = SourceReader(settings, [work_dlq], limits.destinations.refusal)

    [kept] = reader.complete([row], now_ms, 2000)

    assert (kept.status, kept.dead_reason, kept.destination, kept.msg_value) == (
        "dead",
        "adopted",
        None,
        None,
    )
    assert (kept.original_topic, kept.original_offset) == (work, 41)
    assert (
        f"its record {work}[0]@41 cannot be read (the partition starts at offset 100: removed by retention "
        "(retention.ms=604800000))"
    ) in kept.reason
    assert reader.lost == 1


@pytest.mark.parametrize("max_attempts", [3, 5])
def test_a_record_that_always_fails_in_streams_dies_by_its_policy_when_adopted_for_retry(
    database_url: str, bootstrap_servers: str, topic_prefix: str, max_attempts: int
) -> None:
    """Kafka Streams copies the failed record's headers, ours included, into its letter: each letter
    counts the ``retry.attempt`` the record came back with (issue 60's defect: each started the policy
    over at attempt 0, and a record that always fails came back every delay for ever). The letters are
    built here as ``streams()`` describes; the record goes round through the real loops and broker."""
    work, letters = f"{topic_prefix}-clicks", f"{topic_prefix}-clicks.dlq"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={letters: "streams:retry"})
    loop = dataclasses.replace(
        loop, registry=PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=max_attempts)])
    )
    create_topics(loop.bootstrap, [work, letters], partitions=2)  # the first letter names partition 1
    record = streams(topic_prefix, b"always")  # its first failure: none of our headers yet
    for n in range(max_attempts + 1):
        loop.send([record], topic=letters)
        loop.ingest(1)
        newest = loop.rows(f"source_topic = '{letters}'")[-1]
        if newest["status"] == "dead":
            break
        loop.publish(3)
        back = [s for s in consume(loop.bootstrap, [work], expected=n + 1) if s.key == b"always"][-1]
        assert back.header(p.ATTEMPT) == str(n + 1)  # once: the copied one is not passed through again
        failed_again = [
            ("__streams.errors.exception", b"java.lang.IllegalStateException"),
            ("__streams.errors.message", b"still failing"),
            ("__streams.errors.topic", work.encode()),
            ("__streams.errors.partition", str(back.partition).encode()),
            ("__streams.errors.offset", str(back.offset).encode()),
        ]
        record = {"key": back.key, "value": back.value, "headers": [*back.headers, *failed_again]}
    rows = loop.rows(f"source_topic = '{letters}'")
    assert [r["attempt"] for r in rows] == list(range(max_attempts + 1)), rows
    assert [r["status"] for r in rows] == ["published"] * max_attempts + ["dead"]
    assert (rows[-1]["dead_reason"], rows[-1]["dlq_topic"]) == ("exhausted", letters)  # kept where it is
    assert len({r["retry_id"] for r in rows}) == 1  # one retry, followed through each letter
