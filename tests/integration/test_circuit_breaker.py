"""The consumer helper's circuit breaker with a real consumer on the real broker: a dependency that fails
for a while, then recovers. Instead of sending every record to retry, the consumer pauses its
partitions, probes after the cool-down, and goes on where it stopped: no record lost or skipped, few
sent to retry, and no rebalance while paused."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import Consumer, Message

from retry_scheduler.client import RetryClient
from retry_scheduler.consumer import CircuitBreaker, RetryingConsumer
from tests.kafkautil import consume, create_topics, produce

pytestmark = pytest.mark.integration

RECORDS = 60
#: A member that does not poll for 6 s leaves its group (librdkafka's max.poll.interval.ms, client-side
#: whatever the broker), and the breaker's cool-downs are longer than that.
STRICT_POLLING = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000}
COOLDOWN_S = 7.0


class Dependency:
    """A payment service that is down until ``recover()``; each call is timed."""

    def __init__(self) -> None:
        self.up = False
        self.calls: list[tuple[float, bytes, bool]] = []

    def call(self, msg: Message) -> None:
        key = msg.key()
        assert isinstance(key, bytes)
        self.calls.append((time.monotonic(), key, self.up))
        if not self.up:
            raise ConnectionError("payment service unreachable")


def test_a_failing_dependency_pauses_the_consumer_then_it_goes_on_where_it_stopped(
    bootstrap_servers: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    orders, retry = f"{topic_prefix}-orders", f"{topic_prefix}-retry"
    create_topics(bootstrap_servers, [orders, retry], partitions=2)
    produce(
        bootstrap_servers, orders, [{"key": f"k{i:02d}".encode(), "value": b"{}"} for i in range(RECORDS)]
    )
    dependency = Dependency()
    # Each cool-down is longer than the member may go without polling: a consumer that stopped polling
    # while open would leave its group and have its partitions revoked (as the control test shows).
    breaker = CircuitBreaker(failure_rate=0.5, window="30s", min_records=5, cool_down=COOLDOWN_S)
    consumer = RetryingConsumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": f"{topic_prefix}-billing", "auto.offset.reset": "earliest",
         **STRICT_POLLING},
        [orders],
        dependency.call,
        RetryClient({"bootstrap.servers": bootstrap_servers}, retry_topic=retry, group=f"{topic_prefix}-billing"),
        scope="topic",
        breaker=breaker,
    )  # fmt: skip
    thread = threading.Thread(target=consumer.run, args=(0.2,), daemon=True)

    with caplog.at_level(logging.WARNING, logger="retry_scheduler.consumer"):
        thread.start()
        deadline = time.monotonic() + 90
        while breaker.counts["opened"] < 3 and time.monotonic() < deadline:  # down through 2 failed probes
            time.sleep(0.1)
        dependency.up = True  # the service is back
        while len(dependency.calls) < RECORDS and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # anything unexpected (a record handled twice) has time to show
        revoked_while_running = consumer.revocations  # (closing the consumer revokes its partitions)
        consumer.stop()
        thread.join(30)

    assert breaker.counts["opened"] >= 3 and breaker.counts["closed"] == 1, breaker.counts
    assert breaker.counts["probes"] >= 3  # two failed probes while down, the one that closed it
    # Only the records that failed before the breaker opened, and the failed probes, went to retry ...
    retried = failed_keys(dependency)
    assert len(retried) <= 5 + breaker.counts["probes"], retried
    assert sorted(s.key for s in consume(bootstrap_servers, [retry], expected=len(retried))) == sorted(
        retried
    )
    # ... every other record was handled once the dependency was back: none lost, none skipped
    handled = {key for _, key, ok in dependency.calls if ok}
    assert handled | set(retried) == {f"k{i:02d}".encode() for i in range(RECORDS)}
    assert not handled & set(retried)
    # while open, nothing reached the dependency but the probes
    assert len(dependency.calls) == len(handled) + len(retried)
    assert revoked_while_running == 0  # paused, not rebalanced
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("circuit open: 5 of 5 records failed in the last 30 s") for m in messages), (
        messages
    )
    assert any(m.startswith("circuit open: the probe failed") for m in messages)
    assert "circuit probing: letting one record through to probe the dependency" in messages
    assert messages[-1] == "circuit closed: the probe succeeded, consuming again"


def failed_keys(dependency: Dependency) -> list[bytes]:
    return [key for _, key, ok in dependency.calls if not ok]


def test_a_breaker_refuses_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="failure_rate must be in"):
        CircuitBreaker(failure_rate=0)
    with pytest.raises(ValueError, match="min_records must be a whole number, at least 1"):
        CircuitBreaker(min_records=0)
    with pytest.raises(ValueError, match="window must be above 0"):
        CircuitBreaker(window=0)
    with pytest.raises(ValueError, match="duration 'soon' is not like"):
        CircuitBreaker(cool_down="soon")


def test_the_breaker_is_spelled_as_the_services_and_takes_0_4_s_names_with_a_warning() -> None:
    """The SDK spelled cooldown_s and half-open where the service's Breaker says cool_down and probing."""
    from retry_scheduler.core.breakers import Breaker

    mine = CircuitBreaker(failure_rate=0.5, window="1m", min_records=20, cool_down="30s")
    theirs = Breaker(failure_rate=0.5, window="1m", min_records=20, cool_down="30s")
    assert (mine.window_s, mine.cool_down_s) == (theirs.window_s, theirs.cool_down_s) == (60.0, 30.0)
    with pytest.warns(
        DeprecationWarning, match=r"CircuitBreaker\(cooldown_s=\) is deprecated: write cool_down="
    ):
        old = CircuitBreaker(window_s=60, cooldown_s=30, min_records=20)
    assert old == mine and old.cooldown_s == 30.0
    mine.record(False, 0.0)
    for n in range(19):
        mine.record(False, float(n))
    assert mine.state == "open" and mine.due_probe(100.0) and mine.state == "probing"


def test_the_control_a_consumer_that_stops_polling_for_a_cool_down_is_rebalanced(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    """What the test above would see if the breaker slept instead of polling while open: with the same
    settings, a member that goes a cool-down without polling has its partitions revoked."""
    orders = f"{topic_prefix}-orders"
    create_topics(bootstrap_servers, [orders], partitions=2)
    revoked: list[int] = []
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": f"{topic_prefix}-idle", **STRICT_POLLING}
    )
    consumer.subscribe([orders], on_revoke=lambda _c, parts: revoked.append(len(parts)))
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment()
    time.sleep(COOLDOWN_S)  # a cool-down without polling
    deadline = time.monotonic() + 15
    while not revoked and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.close()
    assert revoked and revoked[0] == 2
