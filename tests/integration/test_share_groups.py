"""Share groups for real (KIP-932, KIP-1191) on the Apache Kafka 4.4 broker: a ``ShareConsumer`` of
confluent-kafka hands failed records to the retry topic with ``RetryClient.retry_shared``, and a share
group with the broker's dead-letter topic gets its letters written by the broker itself, which the
scheduler adopts (``=share`` and ``=share:retry``), completes from their source and replays."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Message, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.client import RetryClient, RetryDeliveryError
from retry_scheduler.core import protocol as p
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import Operation, run_action
from tests.integration.test_loop import new_loop
from tests.kafkautil import configure_group, consume, create_topics, produce

pytestmark = pytest.mark.integration


def share_consumer(bootstrap: str, group: str, topics: list[str]) -> ShareConsumer:
    consumer = ShareConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"}
    )
    consumer.subscribe(topics)
    return consumer


def poll_for(consumer: ShareConsumer, want: Any, timeout_s: float = 60) -> Message:
    """Poll until a record for which ``want(record)`` holds; every other record is acknowledged ACCEPT.
    (The tests' polls that use it have one record each: a poll's records are all acknowledged before
    the next poll.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for msg in consumer.poll(1.0) or []:
            if msg.error():
                continue
            if want(msg):
                return msg
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
    raise AssertionError(f"no such record within {timeout_s} s")


def test_a_share_consumer_hands_a_failed_record_to_retry_and_it_comes_back_after_its_delay(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """A real ``ShareConsumer`` releases a record once (the group delivers it again at once, as share
    groups do); a hand-over that cannot reach the retry topic acknowledges it RELEASE (delivered a third
    time); then ``retry_shared`` hands it over: acknowledged ACCEPT, on the retry topic with
    ``retry.attempt`` 2 (two redeliveries by the group), and back on its topic after the policy's delay,
    where the group reads it with ``retry.attempt`` 3; the original is never delivered again."""
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    work, group = f"{topic_prefix}-work", f"{topic_prefix}-workers"
    create_topics(bootstrap_servers, [work, loop.settings.retry_topic], partitions=1)
    configure_group(bootstrap_servers, group, share_auto_offset_reset="earliest")
    produce(
        bootstrap_servers, work, [{"key": b"job-1", "value": b"payload", "headers": [("tenant", b"acme")]}]
    )
    client = RetryClient(
        {"bootstrap.servers": bootstrap_servers}, retry_topic=loop.settings.retry_topic, group=group
    )
    unreachable = RetryClient({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500}, timeout_s=3)
    consumer = share_consumer(bootstrap_servers, group, [work])
    try:
        first = poll_for(consumer, lambda m: m.key() == b"job-1")
        assert first.delivery_count() == 1
        consumer.acknowledge(first, AcknowledgeType.RELEASE)  # failed in place: the group delivers it again
        consumer.commit_sync()
        second = poll_for(consumer, lambda m: m.key() == b"job-1")
        assert (second.offset(), second.delivery_count()) == (first.offset(), 2)
        with pytest.raises(RetryDeliveryError):
            unreachable.retry_shared(consumer, second, TimeoutError("downstream timed out"))
        consumer.commit_sync()  # acknowledged RELEASE: delivered again
        third = poll_for(consumer, lambda m: m.key() == b"job-1")
        assert (third.offset(), third.delivery_count()) == (first.offset(), 3)

        handed = time.time()
        # the test deployment's "backoff" policy: 3 attempts, 1 s doubling (the third waits 4 s)
        retry_id = client.retry_shared(
            consumer, third, TimeoutError("downstream timed out"), policy="backoff"
        )
        consumer.commit_sync()

        [sent] = consume(bootstrap_servers, [loop.settings.retry_topic], 1)
        assert sent.header(p.ATTEMPT) == "2" and sent.header(p.ID) == retry_id  # two redeliveries counted
        assert sent.header(p.ORIGINAL_TOPIC) == work and sent.header(p.ORIGINAL_OFFSET) == str(first.offset())
        loop.ingest(1)
        loop.publish(8)

        back = poll_for(consumer, lambda m: m.key() == b"job-1")
        consumer.acknowledge(back, AcknowledgeType.ACCEPT)
        consumer.commit_sync()
        assert back.offset() > first.offset() and back.delivery_count() == 1  # a new record, not the old one
        headers = dict(back.headers() or [])
        assert back.value() == b"payload" and headers["tenant"] == b"acme"
        assert headers[p.ATTEMPT] == b"3" and headers[p.ID] == retry_id.encode()
        [row] = loop.rows("status = 'published'")
        assert row["published_at"] >= row["due_at"]  # never early
        assert row["due_at"].timestamp() >= handed + 4.0 - 0.5  # the policy's delay, not at once
        # The original was accepted: the group never hands it out again.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for msg in consumer.poll(0.5) or []:
                assert msg.error() or msg.offset() != first.offset(), "the handed-over record came again"
    finally:
        consumer.close()


def dead_letter_group(bootstrap: str, prefix: str, work: str, *, copy: bool) -> tuple[str, str]:
    """A share group whose rejected records the broker writes to ``dlq.<prefix>-work`` (KIP-1191): the
    topic allows group letters (``errors.deadletterqueue.group.enable``) and carries the broker's
    prefix (``dlq.``); the group names it, with the record copied into the letter or not."""
    group, dlq = f"{prefix}-workers", f"dlq.{prefix}-work"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(work, 1, 1),
        NewTopic(dlq, 1, 1, config={"errors.deadletterqueue.group.enable": "true"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result(timeout=15)
    configure_group(
        bootstrap, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq,
        **({"errors_deadletterqueue_copy_record_enable": "true"} if copy else {}),
    )  # fmt: skip
    return group, dlq


def reject_all(bootstrap: str, group: str, work: str, keys: set[bytes]) -> dict[bytes, Message]:
    """A share consumer of ``group`` rejects the records of ``keys``: the broker writes their letters."""
    consumer = share_consumer(bootstrap, group, [work])
    rejected: dict[bytes, Message] = {}
    deadline = time.monotonic() + 60
    try:
        while set(rejected) != keys:
            assert time.monotonic() < deadline, f"only {sorted(rejected)} of {sorted(keys)} polled in 60 s"
            for msg in consumer.poll(1.0) or []:  # every record of a poll is acknowledged before the next
                if not msg.error():
                    failed = msg.key() in keys
                    consumer.acknowledge(msg, AcknowledgeType.REJECT if failed else AcknowledgeType.ACCEPT)
                    if failed:
                        rejected[msg.key()] = msg
        consumer.commit_sync()
    finally:
        consumer.close()
    return rejected


@pytest.mark.parametrize("copy", [False, True], ids=["pointer-only", "copy-record"])
def test_the_broker_s_own_share_group_letters_are_adopted_completed_and_replayed_byte_for_byte(
    database_url: str, bootstrap_servers: str, topic_prefix: str, copy: bool
) -> None:
    work = f"{topic_prefix}-work"
    group, dlq = dead_letter_group(bootstrap_servers, topic_prefix, work, copy=copy)
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={dlq: "share"})
    records = [
        {
            "key": b"w-1",
            "value": b'{"job": 1}',
            "headers": [("tenant", b"acme"), ("empty", b""), ("none", None)],
        },
        {"key": b"w-2", "value": b"\x00\xff binary", "headers": []},
    ]
    produce(bootstrap_servers, work, records)
    rejected = reject_all(bootstrap_servers, group, work, {b"w-1", b"w-2"})

    letters = consume(bootstrap_servers, [dlq], expected=2)
    assert len(letters) == 2  # the broker wrote them, one a record
    assert {s.header("__dlq.errors.topic") for s in letters} == {work}
    assert {s.header("__dlq.errors.group") for s in letters} == {group}
    counts = loop.ingest(2)
    loop.publish(3)

    assert counts.adopted == {"share": 2} and counts.letters_unreadable == 0
    rows = {bytes(r["msg_key"]): r for r in loop.rows(f"source_topic = '{dlq}'")}
    assert sorted(rows) == [b"w-1", b"w-2"]
    for key, row in rows.items():
        assert (row["status"], row["dead_reason"], row["destination"]) == ("dead", "adopted", work)
        assert (row["original_partition"], row["original_offset"]) == (0, rejected[key].offset())
        assert row["consumer_group"] == group
    assert bytes(rows[b"w-2"]["msg_value"]) == b"\x00\xff binary"  # completed from its source, or copied

    deployment = loop.allowing(work)
    replay = Operation(action="replay", selection=Selection(dead_reason="adopted"), actor="ann", source="cli",
                       dry_run=False)  # fmt: skip
    assert run_action(loop.settings.database_url, replay, deployment=deployment).affected == 2
    loop.publish(3)
    again = [s for s in consume(bootstrap_servers, [work], expected=4) if s.header(p.ATTEMPT) is not None]
    by_key = {s.key: s for s in again}
    assert sorted(by_key) == [b"w-1", b"w-2"]
    for original in records:
        replayed = by_key[original["key"]]
        assert replayed.value == original["value"] and replayed.partition == 0
        own = [(k, v) for k, v in replayed.headers if not k.startswith(("retry.", "__dlq."))]
        assert own == original["headers"]  # the source record's headers, byte for byte, in order


def test_the_broker_s_share_group_letters_adopted_for_retry_come_back_when_due(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    work = f"{topic_prefix}-work"
    group, dlq = dead_letter_group(bootstrap_servers, topic_prefix, work, copy=False)
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={dlq: "share:retry"})
    produce(
        bootstrap_servers, work, [{"key": b"r-1", "value": b"first try", "headers": [("tenant", b"acme")]}]
    )
    read = time.time()
    [rejected] = reject_all(bootstrap_servers, group, work, {b"r-1"}).values()
    loop.ingest(1)
    [row] = loop.rows(f"source_topic = '{dlq}'")
    assert (row["status"], row["attempt"], row["destination"]) == ("pending", 0, work)  # delivered once
    loop.publish(4)

    back = [s for s in consume(bootstrap_servers, [work], expected=2) if s.header(p.ATTEMPT) is not None]
    assert len(back) == 1 and back[0].key == b"r-1" and back[0].value == b"first try"
    assert back[0].header("tenant") == "acme" and back[0].header(p.ATTEMPT) == "1"
    assert back[0].header(p.ORIGINAL_OFFSET) == str(rejected.offset())
    [published] = loop.rows(f"source_topic = '{dlq}' AND status = 'published'")
    assert published["published_at"] >= published["due_at"]
    assert published["due_at"].timestamp() >= read + 1.0 - 0.5


@pytest.mark.parametrize("max_attempts", [2, 4])
def test_a_record_the_share_group_always_rejects_dies_by_its_policy_when_adopted_for_retry(
    database_url: str, bootstrap_servers: str, topic_prefix: str, max_attempts: int
) -> None:
    """The broker's letter points at the record that came back, which carries our ``retry.attempt``: each
    letter counts from there (issue 60's defect: every letter started the policy over, at attempt 0,
    and a record that always fails came back every delay for ever)."""
    work = f"{topic_prefix}-work"
    group, dlq = dead_letter_group(bootstrap_servers, topic_prefix, work, copy=False)
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={dlq: "share:retry"})
    loop = dataclasses.replace(
        loop, registry=PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=max_attempts)])
    )
    produce(
        bootstrap_servers, work, [{"key": b"always", "value": b"fails", "headers": [("tenant", b"acme")]}]
    )
    for _ in range(max_attempts + 1):
        reject_all(bootstrap_servers, group, work, {b"always"})
        loop.ingest(1)
        newest = loop.rows(f"source_topic = '{dlq}'")[-1]
        if newest["status"] == "dead":
            break
        loop.publish(3)
        assert loop.rows(f"id = {newest['id']}")[0]["status"] == "published"
    rows = loop.rows(f"source_topic = '{dlq}'")
    assert [r["attempt"] for r in rows] == list(range(max_attempts + 1)), rows
    assert [r["status"] for r in rows] == ["published"] * max_attempts + ["dead"]
    assert (rows[-1]["dead_reason"], rows[-1]["dlq_topic"]) == ("exhausted", dlq)  # kept where it is
    assert len({r["retry_id"] for r in rows}) == 1  # one retry, followed through each letter
    assert all(bytes(r["msg_value"]) == b"fails" for r in rows)  # each completed from the record
