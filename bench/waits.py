"""Waiting for a measured window's records, cheaply: on the ingest's stored offsets (O(partitions))
and on whether any job of a destination is still pending (one index descent), never on a count of the
window's jobs, which at millions of rows would take the CPU of the very records being measured."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from bench.env import BenchEnv


def stored_from(env: BenchEnv, topic: str) -> int:
    """Records the service's ingest stored from ``topic`` so far (its stored next offsets, summed)."""
    return int(env.sql("bench_topic_stored", {"topic": topic}, fetch=True)[0][0])


def topic_end(bootstrap: str, topic: str) -> int:
    """The sum of ``topic``'s end offsets (high watermarks) now: the stored next offsets the ingest
    reaches once it has stored every record the topic holds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-end-{uuid.uuid4().hex[:8]}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        )
    finally:
        consumer.close()


def wait_stored(env: BenchEnv, topic: str, before: int, expected: int, deadline_s: float) -> None:
    """Wait until the ingest stored ``expected`` records of ``topic`` beyond ``before`` (its stored
    next offsets: O(partitions), asked every 0.5 s while a figure is measured)."""
    deadline = time.monotonic() + deadline_s
    while stored_from(env, topic) - before < expected and time.monotonic() < deadline:
        time.sleep(0.5)


def wait_not_pending(env: BenchEnv, destination: str, deadline: float, every_s: float = 0.5) -> None:
    """Wait until none of ``destination``'s jobs is pending (one index descent a question), or the
    monotonic ``deadline``."""
    while (
        time.monotonic() < deadline
        and env.sql("bench_destination_waiting", {"destination": destination}, fetch=True)[0][0]
    ):
        time.sleep(every_s)


def wait_published(
    env: BenchEnv, topic: str, stored_before: int, sent: int, destination: str, deadline_s: float
) -> int:
    """Wait until the ``sent`` records sent to ``topic`` (beyond ``stored_before`` stored) are stored
    and none of ``destination``'s jobs is pending, then until ``sent`` are published (or the deadline);
    returns how many are. While a window's last records are still being published, the wait asks
    only O(partitions) and one-index-descent questions: a count of the window's published jobs (up to
    millions) every second would take CPU from the very records whose lateness is measured."""
    deadline = time.monotonic() + deadline_s
    wait_stored(env, topic, stored_before, sent, deadline_s)
    wait_not_pending(env, destination, deadline)
    while True:
        published = env.job_counts(destination).get("published", 0)
        if published >= sent or time.monotonic() >= deadline:
            return published
        time.sleep(1)
