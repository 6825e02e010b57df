"""A consumer that keeps failing, the SDK and the scheduler: attempts count up, then the DLQ."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

from retry_scheduler.client import SHARE_CONSUMERS, RetryClient, RetryDeliveryError
from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher
from tests.conftest import TEST_DESTINATIONS
from tests.kafkautil import consume, create_topics, produce

pytestmark = pytest.mark.integration


def test_failing_consumer_retries_then_dead_letters(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders, retry, dlq = f"{topic_prefix}-orders", f"{topic_prefix}-retry", f"{topic_prefix}-dlq"
    settings = Settings(
        database_url=database_url, kafka={"bootstrap.servers": bootstrap_servers}, retry_topic=retry,
        consumer_group=f"{topic_prefix}-scheduler", create_topics=True, destination_allowlist=TEST_DESTINATIONS,
    )  # fmt: skip
    registry = PolicyRegistry.of([Policy("default", delays=["0s"], max_attempts=2, dlq_topic=dlq)])
    create_topics(bootstrap_servers, [orders, retry])
    produce(bootstrap_servers, orders, [{"key": b"order-1", "value": b"{}", "headers": [("trace", b"abc")]}])

    app = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"{topic_prefix}-app",
                    "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 6000})  # fmt: skip
    app.subscribe([orders])
    client = RetryClient({"bootstrap.servers": bootstrap_servers}, retry_topic=retry, group="app")
    seen_attempts: list[str] = []
    with Store(database_url) as store:
        ingestor = Ingestor(Deployment(settings, registry), store)
        publisher = Publisher(Deployment.load(settings), Store(database_url))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and store.status().counts.get("dead", 0) == 0:
            for msg in app.consume(10, 0.5):
                if msg.error():
                    continue
                seen_attempts.append(dict(msg.headers() or []).get(p.ATTEMPT, b"0").decode())
                client.retry(msg, TimeoutError("inventory service timed out"))  # always fails
                app.commit(msg, asynchronous=False)
            ingestor.ingest_batch(0.3)
            publisher.publish_once()
        ingestor.close()
        publisher.close()
    app.close()

    assert seen_attempts == ["0", "1", "2"]  # first delivery, then two retries
    [dead] = consume(bootstrap_servers, [dlq], 1)
    assert dead.header(p.DEAD_REASON) == "exhausted"
    assert dead.header(p.ATTEMPT) == "2"
    assert dead.header(p.ERROR_CLASS) == "builtins.TimeoutError"
    assert dead.header(p.REASON) == "inventory service timed out"
    assert dead.header(p.ORIGINAL_TOPIC) == orders
    assert ("trace", b"abc") in dead.headers
    retried = consume(bootstrap_servers, [orders], 3)
    assert len({s.header(p.ID) for s in retried if s.header(p.ID)} | {dead.header(p.ID)}) == 1  # one identity


@pytest.mark.skipif(not SHARE_CONSUMERS, reason="the installed confluent-kafka has no share consumer")
def test_a_share_consumer_hands_a_record_over_and_it_comes_back_when_due_counting_the_groups_deliveries(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The embedded broker has no share groups: the record is one a ``ShareConsumer`` polled as the
    client builds it (a ``Message`` with its ``delivery_count()``), and the consumer boundary records
    the acknowledgements; the retry topic, the scheduler and the record's way back are real."""
    from confluent_kafka import AcknowledgeType, Message

    from tests.integration.test_loop import new_loop

    class Polled(Message):  # as ShareConsumer.poll returns it: delivered twice by the group
        def delivery_count(self) -> int:
            return 2

    class Acknowledgements:  # the share consumer's acknowledge, recorded
        def __init__(self) -> None:
            self.made: list[tuple[bytes, AcknowledgeType]] = []

        def acknowledge(self, message: Message, ack_type: AcknowledgeType) -> None:
            self.made.append((message.key(), ack_type))

    loop = new_loop(database_url, bootstrap_servers, topic_prefix)  # default policy: 1 s, two attempts
    work = f"{topic_prefix}-work"
    create_topics(bootstrap_servers, [work, loop.settings.retry_topic], partitions=3)
    polled = Polled(topic=work, partition=1, offset=41, key=b"job-1", value=b"payload",
                    headers=[("tenant", b"acme")], timestamp=(1, int(time.time() * 1000) - 5000))  # fmt: skip
    consumer = Acknowledgements()
    client = RetryClient({"bootstrap.servers": bootstrap_servers}, retry_topic=loop.settings.retry_topic,
                         group=f"{topic_prefix}-workers")  # fmt: skip

    retry_id = client.retry_shared(consumer, polled, TimeoutError("downstream timed out"))

    assert consumer.made == [(b"job-1", AcknowledgeType.ACCEPT)]  # handed over, not rejected
    [sent] = consume(bootstrap_servers, [loop.settings.retry_topic], 1)
    assert sent.header(p.ATTEMPT) == "1" and sent.header(p.ID) == retry_id  # one redelivery by the group
    loop.ingest(1)
    loop.publish(4)
    back = [s for s in consume(bootstrap_servers, [work], 1) if s.key == b"job-1"]
    assert len(back) == 1 and back[0].value == b"payload" and back[0].partition == 1
    assert back[0].header(p.ATTEMPT) == "2" and back[0].header("tenant") == "acme"

    unreachable = RetryClient({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500}, timeout_s=3)
    with pytest.raises(RetryDeliveryError):
        unreachable.retry_shared(consumer, polled, TimeoutError("downstream timed out"))
    assert consumer.made[-1] == (b"job-1", AcknowledgeType.RELEASE)  # the group delivers it again


def test_retry_shared_is_absent_without_share_consumers() -> None:
    import retry_scheduler.client as client_module

    assert hasattr(RetryClient, "retry_shared") == client_module.SHARE_CONSUMERS
