"""A backlog on one retry topic (a burst: one team's outage) does not hold back the records that
arrive meanwhile on another: the ingest consumer fetches only a little ahead, so what it has queued
locally from the backlog is small, and each fetch takes from every partition."""

from __future__ import annotations

import time

import psycopg

from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from tests.integration.test_loop import hdr, new_loop
from tests.kafkautil import create_topics, produce

#: About 18 MB: librdkafka's defaults (a 64 MB local queue) fetch all of it ahead of the quiet
#: topic's records (39 000 of 39 000 stored ahead of them when this test was written).
BACKLOG = 40_000
#: What the consumer may have fetched from the backlog when the quiet topic's records arrive: about a
#: megabyte in its local queue plus the fetches under way, at ~450 bytes a record (3 186 measured).
AHEAD_AT_MOST = 8_000


def test_records_on_a_quiet_retry_topic_are_stored_ahead_of_another_topic_s_backlog(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    burst_topic = f"{topic_prefix}-retry.1h"
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix,
        delay_topics={burst_topic: 3_600_000}, ingest_batch=500, ingest_workers=1,
    )  # fmt: skip
    create_topics(bootstrap_servers, [loop.settings.retry_topic, burst_topic], partitions=6)
    value = b'{"order": 1, "items": ["' + b"x" * 400 + b'"]}'
    burst = [
        {"key": f"b{i}".encode(), "value": value, "headers": hdr(destination=loop.dest)}
        for i in range(BACKLOG)
    ]
    produce(bootstrap_servers, burst_topic, burst)

    with Store(loop.settings.database_url) as store:
        ingestor = Ingestor(loop.settings, loop.registry, store)
        try:
            stored = 0
            deadline = time.monotonic() + 60
            while stored < 1_000 and time.monotonic() < deadline:  # the consumer is fetching the backlog
                stored += ingestor.ingest_batch(0.5).stored
            assert stored >= 1_000
            due_at = str(int(time.time() * 1000) + 60_000)
            quiet = [
                {"key": f"q{i}".encode(), "value": b"q", "headers": hdr(destination=loop.dest, at=due_at)}
                for i in range(10)
            ]
            produce(bootstrap_servers, loop.settings.retry_topic, quiet)
            sent_after = stored  # nothing is stored while this test produces: what comes next was fetched
            while stored < BACKLOG + 10 and time.monotonic() < deadline:
                stored += ingestor.ingest_batch(0.5).stored
        finally:
            ingestor.close()
    assert stored == BACKLOG + 10

    with psycopg.connect(database_url) as conn:
        (last_quiet,) = conn.execute(
            "SELECT max(id) FROM retry_jobs WHERE source_topic = %s", (loop.settings.retry_topic,)
        ).fetchone()  # type: ignore[misc]
        (burst_before,) = conn.execute(
            "SELECT count(*) FROM retry_jobs WHERE source_topic = %s AND id < %s", (burst_topic, last_quiet)
        ).fetchone()  # type: ignore[misc]
    # Stored ahead of the quiet records: what was stored before they were sent (>= 1 000), and what the
    # consumer had fetched ahead from the backlog meanwhile; never the whole backlog.
    assert burst_before - sent_after <= AHEAD_AT_MOST, (burst_before, sent_after)
