"""A consumer that keeps failing, the SDK and the scheduler: attempts count up, then the DLQ."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

from retry_scheduler.client import RetryClient
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
        while time.monotonic() < deadline and store.readings.status().counts.get("dead", 0) == 0:
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


def test_retry_shared_is_absent_without_share_consumers() -> None:
    import retry_scheduler.client as client_module

    assert hasattr(RetryClient, "retry_shared") == client_module.SHARE_CONSUMERS
