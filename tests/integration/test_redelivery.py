"""Redelivery only to the group that failed, on the real broker and PostgreSQL: two consumer groups read
one topic; group A fails a record once and gets its retry on its own redelivery topic (created by the
scheduler); group B never sees a second copy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Message

from retry_scheduler.consumer import RetryingConsumer, original_topic
from retry_scheduler.core import protocol as p
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.headers import InvalidRecordError, Limits, parse_headers
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import create_topics, produce

pytestmark = pytest.mark.integration


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(
        database_url,
        bootstrap_servers,
        topic_prefix,
        destination_allowlist=rf"^{topic_prefix}-orders$",  # its redelivery topics come with it
    )


class App:
    """A consumer group's application: records what it handled; fails the keys in ``fail_once`` once."""

    def __init__(self, loop: Loop, group: str, fail_once: set[bytes]) -> None:
        self.handled: list[tuple[bytes, str, str | None, str | None]] = []
        self.fail_once = set(fail_once)
        config = {
            "bootstrap.servers": loop.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,  # find the redelivery topic soon after it exists
        }
        self.consumer = RetryingConsumer(config, [loop.dest], self.handle)
        self.consumer.retries.retry_topic = loop.settings.retry_topic
        self.thread = threading.Thread(target=self.consumer.run, args=(0.2,), daemon=True)

    def handle(self, msg: Message) -> None:
        key = msg.key()
        assert isinstance(key, bytes)
        attempt = next((v.decode() for k, v in msg.headers() or () if k == p.ATTEMPT and v), None)
        self.handled.append((key, str(msg.topic()), original_topic(msg), attempt))
        if key in self.fail_once:
            self.fail_once.discard(key)
            raise TimeoutError("payment service timed out")


def test_a_retry_reaches_only_the_group_that_failed(loop: Loop, topic_prefix: str) -> None:
    orders = loop.dest
    create_topics(loop.bootstrap, [orders, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=2)
    group_a, group_b = f"{topic_prefix}-billing", f"{topic_prefix}-shipping"
    billing, shipping = App(loop, group_a, fail_once={b"k1"}), App(loop, group_b, fail_once=set())
    billing.thread.start()
    shipping.thread.start()
    produce(loop.bootstrap, orders, [{"key": f"k{i}".encode(), "value": b"{}"} for i in range(3)])

    try:
        counts = loop.ingest(1)  # billing's retry of k1
        loop.publish(4)  # due 1 s later (the default policy's first delay), on billing's topic
        deadline = time.monotonic() + 60
        while len(billing.handled) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # time for anything unexpected to arrive too
    finally:
        billing.consumer.stop()
        shipping.consumer.stop()
        billing.thread.join(30)
        shipping.thread.join(30)

    redelivery = f"{orders}.{group_a}.redelivery"
    assert counts.stored == 1
    [job] = loop.rows()
    assert (job["destination"], job["original_topic"], job["consumer_group"]) == (redelivery, orders, group_a)
    assert sorted(h for h in billing.handled if h[0] != b"k1") == [
        (b"k0", orders, orders, None),
        (b"k2", orders, orders, None),
    ]
    # k1: failed on orders, then handled again from billing's redelivery topic, attempt 1
    assert [h for h in billing.handled if h[0] == b"k1"] == [
        (b"k1", orders, orders, None),
        (b"k1", redelivery, orders, "1"),
    ]
    # shipping read each record once, from orders only
    assert sorted(shipping.handled) == [
        (b"k0", orders, orders, None),
        (b"k1", orders, orders, None),
        (b"k2", orders, orders, None),
    ]


def test_group_scope_needs_a_group_that_fits_a_topic_name() -> None:
    limits = Limits(destinations=Destinations.of(["orders"]))
    scoped = [(p.DESTINATION, b"orders"), (p.SCOPE, b"group")]

    assert parse_headers([*scoped, (p.GROUP, b"billing")], limits).destination == "orders.billing.redelivery"
    assert parse_headers([*scoped, (p.GROUP, b"billing")], limits).scoped_from == "orders"
    with pytest.raises(InvalidRecordError, match=r"retry\.scope=group needs retry\.group"):
        parse_headers(scoped, limits)
    with pytest.raises(InvalidRecordError, match="gives no topic name for its redelivery topic"):
        parse_headers([*scoped, (p.GROUP, b"billing team/eu")], limits)
    with pytest.raises(InvalidRecordError, match="must be 'topic' or 'group'"):
        parse_headers([(p.DESTINATION, b"orders"), (p.SCOPE, b"everyone"), (p.GROUP, b"g")], limits)
    # the redelivery topic of a topic not allowed is not allowed either
    with pytest.raises(
        InvalidRecordError, match=r"destination 'payments\.billing\.redelivery' is not allowed"
    ):
        parse_headers([(p.DESTINATION, b"payments"), (p.SCOPE, b"group"), (p.GROUP, b"billing")], limits)
