"""Redelivery only to the group that failed, on the real broker and PostgreSQL: two consumer groups read
one topic; group A fails a record once and gets its retry on its own redelivery topic (created by the
scheduler); group B never sees a second copy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.consumer import RetryingConsumer, original_topic
from retry_scheduler.core import protocol as p
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.headers import InvalidRecordError, Limits, parse_headers
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import QUICK_JOIN, consume, create_topics, produce

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
            **QUICK_JOIN,
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
        # billing's retry of k1, once its consumer has joined, read k1 and sent it: on a loaded machine
        # (a random-order run) that took 70 s, past the ingest's default 30 s
        counts = loop.ingest(1, timeout_s=180)
        assert counts.stored == 1, f"billing's retry of k1 never reached the retry topic: {billing.handled}"
        loop.publish(4)  # due 1 s later (the default policy's first delay), on billing's topic
        deadline = time.monotonic() + 60
        while (len(billing.handled) < 4 or len(shipping.handled) < 3) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        billing.consumer.stop()
        shipping.consumer.stop()
        billing.thread.join(30)
        shipping.thread.join(30)

    redelivery = f"{orders}.{group_a}.redelivery"
    # The topics hold exactly what the groups handled: nothing else was published that could still come.
    assert len(consume(loop.bootstrap, [orders], 3)) == 3
    assert len(consume(loop.bootstrap, [redelivery], 1)) == 1
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


class ReadmeApp:
    """An application configured exactly as the README shows: ``bootstrap.servers`` and ``group.id``,
    nothing else (so librdkafka's defaults: ``auto.offset.reset=latest``, 5-minute metadata refresh
    unless the helper sets one). Fails each key in ``fail_once`` once."""

    def __init__(self, loop: Loop, group: str, fail_once: set[bytes]) -> None:
        self.handled: list[tuple[bytes, str]] = []
        self.fail_once = set(fail_once)
        config = {"bootstrap.servers": loop.bootstrap, "group.id": group}
        self.consumer = RetryingConsumer(config, [loop.dest], self.handle)
        self.consumer.retries.retry_topic = loop.settings.retry_topic  # the test's own retry topic
        self.thread = threading.Thread(target=self.consumer.run, args=(0.2,), daemon=True)

    def handle(self, msg: Message) -> None:
        key = msg.key()
        assert isinstance(key, bytes)
        self.handled.append((key, str(msg.topic())))
        if key in self.fail_once:
            self.fail_once.discard(key)
            raise TimeoutError("payment service timed out")

    def wait_reading(self, loop: Loop, timeout_s: float = 90) -> None:
        """Until the group reads every partition of ``orders`` (with ``latest``, a partition's start is
        looked up after the assignment, and what comes before that answer is not the group's): a marker
        record on each partition every second until each one's is handled. (Asking the consumer for its
        assignment from this thread while it polls in its own can block both.)"""
        topics = AdminClient({"bootstrap.servers": loop.bootstrap}).list_topics(loop.dest, timeout=10).topics
        markers = {b"marker%d" % p: p for p in topics[loop.dest].partitions}
        deadline = time.monotonic() + timeout_s
        while missing := set(markers) - {k for k, _ in self.handled}:
            assert time.monotonic() < deadline, f"the group never read {sorted(missing)} of its topic"
            for key in missing:
                produce(loop.bootstrap, loop.dest, [{"key": key, "value": b"{}"}], partition=markers[key])
            time.sleep(1)

    def wait_handled(self, count: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.handled) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # time for anything unexpected to arrive too

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(30)


def test_with_the_readme_configuration_every_retry_reaches_the_group(loop: Loop, topic_prefix: str) -> None:
    """Once a group lost all 20 retries: the redelivery topic did not exist until the scheduler published
    the first retry, the helper found it at a metadata refresh and, with ``auto.offset.reset=latest``,
    started at its end. Now the helper creates it when it subscribes (as many partitions as the topic),
    and a redelivery partition without a committed offset is read from its beginning."""
    orders, group = loop.dest, f"{topic_prefix}-billing"
    redelivery = f"{orders}.{group}.redelivery"
    create_topics(loop.bootstrap, [orders, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=3)
    assert redelivery not in AdminClient({"bootstrap.servers": loop.bootstrap}).list_topics(timeout=10).topics
    keys = [b"k%02d" % i for i in range(20)]
    app = ReadmeApp(loop, group, fail_once=set(keys))
    try:
        meta = AdminClient({"bootstrap.servers": loop.bootstrap}).list_topics(timeout=10).topics
        assert len(meta[redelivery].partitions) == 3  # created by the helper, like its topic
        app.thread.start()
        app.wait_reading(loop)
        produce(loop.bootstrap, orders, [{"key": k, "value": b"{}"} for k in keys])
        assert loop.ingest(20).stored == 20
        loop.publish(4)  # due 1 s later (the default policy's first delay), on the group's topic
        app.wait_handled(40 + sum(k.startswith(b"marker") for k, _ in app.handled))
    finally:
        app.stop()
    assert sorted(k for k, t in app.handled if t == orders and not k.startswith(b"marker")) == keys
    assert sorted(k for k, t in app.handled if t == redelivery) == keys  # every retry, once


def test_retries_published_before_the_group_first_read_its_redelivery_topic_are_read(
    loop: Loop, topic_prefix: str
) -> None:
    """The README's configuration (``auto.offset.reset=latest``) and retries already on the redelivery
    topic when the group first gets its partitions: read from the beginning, none skipped. Partitions
    with a committed offset go on from it: nothing is handled twice after a restart."""
    orders, group = loop.dest, f"{topic_prefix}-billing"
    redelivery = f"{orders}.{group}.redelivery"
    create_topics(loop.bootstrap, [orders, redelivery], partitions=2)
    produce(loop.bootstrap, redelivery, [{"key": b"r%d" % i, "value": b"{}"} for i in range(6)])
    produce(loop.bootstrap, orders, [{"key": b"old", "value": b"{}"}])  # before the group: latest skips it

    first = ReadmeApp(loop, group, fail_once=set())
    first.thread.start()
    try:
        first.wait_handled(6)
    finally:
        first.stop()
    assert sorted(first.handled) == [(b"r%d" % i, redelivery) for i in range(6)]

    produce(loop.bootstrap, redelivery, [{"key": b"later", "value": b"{}"}])
    again = ReadmeApp(loop, group, fail_once=set())
    again.thread.start()
    try:
        again.wait_handled(1)
    finally:
        again.stop()
    assert again.handled == [(b"later", redelivery)]


def test_a_plain_consumer_following_the_header_reference_gets_every_retry(
    loop: Loop, topic_prefix: str
) -> None:
    """Not the helper: a bare consumer with the client's defaults that does the three steps of
    docs/header-protocol.md ("Redelivery only to the group that failed"), and sends its retries by hand
    with the headers, as another language would."""
    orders, group = loop.dest, f"{topic_prefix}-ledger"
    redelivery = f"{orders}.{group}.redelivery"
    create_topics(loop.bootstrap, [orders, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=2)
    # 1. create the redelivery topic before subscribing, as many partitions as its topic
    admin = AdminClient({"bootstrap.servers": loop.bootstrap})
    admin.create_topics([NewTopic(redelivery, 2, -1)])[redelivery].result(30)
    consumer = Consumer({"bootstrap.servers": loop.bootstrap, "group.id": group, "enable.auto.commit": False})

    def assigned(c: Consumer, parts: list[TopicPartition]) -> None:
        # 3. a redelivery partition without a committed offset: from its beginning
        fresh = [tp for tp in parts if tp.topic.endswith(".redelivery")]
        committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(fresh, timeout=10)}
        for tp in fresh:
            if committed[(tp.topic, tp.partition)] < 0:
                tp.offset = OFFSET_BEGINNING
        c.assign(parts)

    consumer.subscribe([orders, redelivery], on_assign=assigned)  # 2. both, in one group
    handled: list[tuple[bytes, str]] = []
    try:
        deadline = time.monotonic() + 180
        # With ``latest``, a partition's start is looked up after the assignment, and what is written
        # before that answer is not the group's: a marker on each partition until each one is read.
        reading: set[int] = set()
        while reading != {0, 1}:
            assert time.monotonic() < deadline, f"the group read only partitions {reading} of {orders}"
            for partition in {0, 1} - reading:
                produce(loop.bootstrap, orders, [{"key": b"marker", "value": b"{}"}], partition=partition)
            until = time.monotonic() + 1
            while time.monotonic() < until:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None and msg.key() == b"marker":
                    reading.add(msg.partition())
                    consumer.commit(msg, asynchronous=False)
        produce(loop.bootstrap, orders, [{"key": b"k%d" % i, "value": b"{}"} for i in range(5)])
        while len(handled) < 5 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.key() == b"marker":
                continue
            handled.append((msg.key(), msg.topic()))
            produce(loop.bootstrap, loop.settings.retry_topic, [{"key": msg.key(), "value": msg.value(), "headers": [
                (p.ORIGINAL_TOPIC, orders.encode()), (p.SCOPE, b"group"), (p.GROUP, group.encode()),
                (p.REASON, b"ledger down"),
            ]}])  # fmt: skip
            consumer.commit(msg, asynchronous=False)
        assert len(handled) == 5, f"the group handled {handled} in 180 s"
        # (a loaded machine has taken over a minute for the ingest consumer's group to join)
        assert loop.ingest(5, timeout_s=180).stored == 5
        loop.publish(4)
        while len(handled) < 10 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None and msg.key() != b"marker":
                handled.append((msg.key(), msg.topic()))
                consumer.commit(msg, asynchronous=False)
    finally:
        consumer.close()
    keys = sorted(b"k%d" % i for i in range(5))
    assert sorted(k for k, t in handled if t == orders) == keys
    assert sorted(k for k, t in handled if t == redelivery) == keys
