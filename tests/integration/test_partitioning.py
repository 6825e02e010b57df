"""Retries go back to the partition a Java producer would choose for their key, uncompressed.

Services written in Java (and kafkajs' default partitioner) place a keyed record on
``toPositive(murmur2(key)) % partitions``; librdkafka's default (CRC32) would scatter a key's retries
to other partitions than its first delivery. The hashes below are the Java client's own
(``org.apache.kafka.common.utils.Utils.murmur2``), as other projects check theirs against it.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from retry_scheduler.core import protocol as p
from tests.integration.test_loop import Loop, hdr
from tests.kafkautil import create_topics

#: Utils.murmur2(key.getBytes(UTF_8)) of the Java client.
JAVA_MURMUR2 = {
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
}
PARTITIONS = 7


def java_partition(key: str) -> int:
    return (JAVA_MURMUR2[key] & 0x7FFFFFFF) % PARTITIONS


def test_a_retry_without_a_partition_goes_where_the_java_client_puts_its_key(loop: Loop) -> None:
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=1)
    create_topics(loop.bootstrap, [loop.dest], partitions=PARTITIONS)
    expected = {key: java_partition(key) for key in JAVA_MURMUR2}
    assert len(set(expected.values())) > 2  # the keys spread: the check can tell partitioners apart
    loop.send(
        [
            {"key": key.encode(), "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
            for key in expected
        ]
    )
    assert loop.ingest(expected=len(expected)).stored == len(expected)
    loop.publish(seconds=4)

    consumer = Consumer(
        {"bootstrap.servers": loop.bootstrap, "group.id": f"{loop.dest}-check", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(loop.dest, n, 0) for n in range(PARTITIONS)])
    found: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(found) < len(expected) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        found[msg.key().decode()] = msg.partition()
        assert dict(msg.headers() or []).get(p.ATTEMPT) == b"1"
    consumer.close()
    assert found == expected
