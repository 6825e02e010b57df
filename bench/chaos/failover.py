"""Trials of the PostgreSQL primary failing under the running service (issue 62): ``retry-scheduler
chaos --postgres-failover`` (``make chaos-failover``) runs them on a primary and a streaming replica
(:class:`~retry_scheduler.dev.postgres_pair.PostgresPair`, asynchronous replication), the workers
given one URL that names both (``target_session_attrs=read-write``). Each strikes once the trial has
stored or published a random number of jobs:

* ``pg_failover_ingest`` / ``pg_failover_publish``: the primary killed -9 while the ingest stores, or
  while the publish loop publishes; the replica promoted 0.5-3 s later;
* ``pg_failover_bulk_retry``: the primary killed -9 while a Spark bulk retry (reaching PostgreSQL
  over JDBC by the same two hosts) publishes the trial's dead jobs; the bulk retry is then run
  again, as Airflow's retry of its task would (:func:`bench.chaos.bulk.run_bulk_trial`);
* ``pg_failover_lost_commits``: the replica cut off first, then the primary killed once more jobs
  were stored and published on it alone: the promoted replica lacks those last commits, the
  ingest's Kafka offsets are ahead of the ones it holds (``kafka_ahead``: the records a consumer
  resuming from Kafka's offsets would skip), and jobs it saw pending were published already.

After each, the old primary comes back as the new one's replica (rebuilt from it). Besides the count,
each notes ``promoted_s`` (from the kill until the replica took writes) and ``resumed_s`` (from the
promotion until a job was published again, when one was still to publish).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from bench.chaos.common import COUNTS_SQL, reached
from bench.chaos.topics import Topics
from retry_scheduler.dev.postgres_pair import PostgresPair

#: The kind run as a bulk trial (:func:`bench.chaos.bulk.run_bulk_trial`): the primary killed during a bulk retry.
FAILOVER_BULK_RETRY = "pg_failover_bulk_retry"
FAILOVER_FAULTS = (
    "pg_failover_ingest",
    "pg_failover_publish",
    "pg_failover_lost_commits",
    FAILOVER_BULK_RETRY,
)


def plan_failover_fault(fault: str, rng: random.Random, records: int) -> dict[str, Any]:
    """When this trial's primary dies (recorded in the report)."""
    published = int(records * 0.78)
    if fault == "pg_failover_ingest":
        detail: dict[str, Any] = {"after": "stored", "count": rng.randint(1, records * 4 // 5)}
    elif fault == "pg_failover_publish":
        detail = {"after": "published", "count": rng.randint(1, published * 2 // 3)}
    elif fault == FAILOVER_BULK_RETRY:  # every workload record dead, then bulk-retried
        detail = {"after": "published", "count": rng.randint(1, records // 3)}
    elif fault == "pg_failover_lost_commits":
        cut = rng.randint(1, records // 3)
        detail = {"after": "stored", "count": cut, "then_published": rng.randint(1, published // 2)}
    else:
        raise ValueError(f"unknown failover fault {fault!r} (known: {', '.join(FAILOVER_FAULTS)})")
    detail["down_s"] = round(rng.uniform(0.5, 3), 3)
    return detail


def _counts(database_url: str) -> tuple[int, int] | None:
    import psycopg

    try:
        with psycopg.connect(database_url, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(COUNTS_SQL).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else (int(row[0]), int(row[1]))


def _kafka_ahead(bootstrap: str, topics: Topics, database_url: str) -> int | None:
    """Records of the retry topic past the offsets the database holds, up to the ones the ingest
    committed to Kafka: what resuming from Kafka's offsets would have skipped."""
    from confluent_kafka import Consumer, TopicPartition

    from retry_scheduler.coordinator import committed_offsets
    from retry_scheduler.db.store import Store

    group = f"{topics.prefix}-scheduler"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        parts = consumer.list_topics(topics.retry, timeout=10).topics[topics.retry].partitions
        tps = [TopicPartition(topics.retry, n) for n in parts]
        kafka = {(tp.topic, tp.partition): tp.offset for tp in committed_offsets(consumer, tps, 10)}
        with Store(database_url) as store:
            stored = store.queue.ingest_offsets(group)
    except Exception:  # a figure only: the count says whether anything was lost
        return None
    finally:
        consumer.close()
    return sum(max(0, offset - stored.get(where, 0)) for where, offset in kafka.items() if offset >= 0)


def failover_striker(
    pair: PostgresPair, fault: str, detail: dict[str, Any], database_url: str, bootstrap: str, topics: Topics
) -> Callable[[], None]:
    """The body of the thread that kills the primary and promotes the replica; notes the figures."""

    def strike() -> None:
        try:
            _strike()
        finally:  # the next trial starts on a primary with its replica again
            pair.rejoin()

    def _strike() -> None:
        began = time.monotonic()
        detail["triggered"] = reached(database_url, detail["after"], detail["count"], 60)
        if fault == "pg_failover_lost_commits":
            pair.cut_replication()
            detail["triggered"] &= reached(database_url, "published", detail["then_published"], 60)
        detail["struck_at_s"] = round(time.monotonic() - began, 3)
        before = _counts(database_url)
        killed = time.monotonic()
        pair.kill_primary()
        time.sleep(detail["down_s"])
        pair.promote()
        promoted = time.monotonic()
        detail["promoted_s"] = round(promoted - killed, 3)
        after = _counts(database_url)
        if before is not None and after is not None:
            # What the promoted replica lacked of what the primary had said: jobs stored, and jobs it
            # saw published, that it holds as never stored or still to publish.
            detail["lost_stored"] = max(0, before[0] - after[0])
            detail["lost_published"] = max(0, before[1] - after[1])
        detail["kafka_ahead"] = _kafka_ahead(bootstrap, topics, database_url)
        if fault != FAILOVER_BULK_RETRY:  # the bulk retry publishes again only when run again
            detail["resumed_s"] = _resumed(database_url, after, promoted, 30)

    return strike


def _resumed(
    database_url: str, after: tuple[int, int] | None, since: float, timeout_s: float
) -> float | None:
    """Seconds from ``since`` until the database shows a job published beyond ``after``'s count; None
    when none was within ``timeout_s`` (none may have been left to publish)."""
    while after is not None and time.monotonic() - since < timeout_s:
        now = _counts(database_url)
        if now is not None and now[1] > after[1]:
            return round(time.monotonic() - since, 3)
        time.sleep(0.1)
    return None
