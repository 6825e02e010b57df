"""``RetryingConsumer.assigned``: the partitions a member reads, as its rebalance callbacks were told,
under both rebalance protocols, through a join and a leave. Read from the test's thread while the
members poll on theirs (the consumer's own ``assignment()`` can block there), and checked against
``assignment()`` once a member's thread has stopped polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from retry_scheduler.consumer import RetryingConsumer
from tests.kafkautil import QUICK_JOIN, configure_group, create_topics

pytestmark = pytest.mark.integration

PARTITIONS = 4


class Member:
    """A member polling on a thread of its own until :meth:`halt`."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.helper = RetryingConsumer(config, [topic], lambda msg: None, scope="topic")
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._halt.is_set():
            self.helper.poll(0.2)

    def halt(self) -> None:
        """Stop polling (the consumer stays open: its own ``assignment()`` may now be asked)."""
        self._halt.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_assigned_follows_a_join_and_a_leave(
    bootstrap_servers: str, topic_prefix: str, protocol: str
) -> None:
    topic, group = f"{topic_prefix}-orders", f"{topic_prefix}-billing"
    create_topics(bootstrap_servers, [topic], partitions=PARTITIONS)
    every = {(topic, p) for p in range(PARTITIONS)}
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "group.id": group}
    if protocol == "consumer":  # KIP-848: the broker assigns, incrementally
        configure_group(bootstrap_servers, group, consumer_session_timeout_ms="6000",
                        consumer_heartbeat_interval_ms="500")  # fmt: skip
        config["group.protocol"] = "consumer"
    else:
        config.update(QUICK_JOIN)
    first = Member(config, topic)
    second: Member | None = None
    try:
        wait_for(lambda: first.helper.assigned == every, f"the first member never read all of {every}")
        second = Member(config, topic)
        # The join splits the partitions: each reads some, none twice, all read.
        wait_for(
            lambda: (
                bool(first.helper.assigned and second.helper.assigned)
                and first.helper.assigned | second.helper.assigned == every
                and not first.helper.assigned & second.helper.assigned
            ),
            "the partitions were not split between the two members",
        )
        second.halt()
        shared = second.helper.assigned
        assert shared == {(tp.topic, tp.partition) for tp in second.helper.consumer.assignment()}
        second.helper.close()  # leaves: the first reads every partition again
        second = None
        wait_for(lambda: first.helper.assigned == every, "the first member did not take the partitions back")
        first.halt()
        assert first.helper.assigned == {
            (tp.topic, tp.partition) for tp in first.helper.consumer.assignment()
        }
    finally:
        for member in (first, second):
            if member is not None:
                member.halt()
                member.helper.close()


def test_a_commit_the_group_refuses_is_logged_and_the_record_comes_again(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    """A handler slower than ``max.poll.interval.ms`` once: the member has left its group by the time it
    commits, and the group refuses the commit. ``poll`` goes on (it raised before), counts the failed
    commit, and the record is handled again once the member is back in the group (at least once)."""
    from tests.kafkautil import produce

    topic, group = f"{topic_prefix}-orders", f"{topic_prefix}-billing"
    create_topics(bootstrap_servers, [topic], partitions=1)
    produce(bootstrap_servers, topic, [{"key": b"k", "value": b"slow"}])
    handled: list[bytes] = []

    def handler(msg: Any) -> None:
        handled.append(msg.value())
        if len(handled) == 1:
            time.sleep(9)  # past max.poll.interval.ms: the client leaves the group meanwhile

    config = {"bootstrap.servers": bootstrap_servers, "group.id": group, "auto.offset.reset": "earliest",
              "max.poll.interval.ms": 6000, **QUICK_JOIN}  # fmt: skip
    helper = RetryingConsumer(config, [topic], handler, scope="topic")
    try:
        deadline = time.monotonic() + 90
        while len(handled) < 2 and time.monotonic() < deadline:
            helper.poll(0.2)  # never raises for the refused commit
        assert handled == [b"slow", b"slow"]
        assert helper.commit_failures == 1
    finally:
        helper.close()
