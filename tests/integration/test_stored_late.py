"""A job stored after its due time is published at once: within a second of being stored.

The mechanism (:mod:`retry_scheduler.db.overdue`) is pinned by the last test, whose publisher's next
sweep is an hour off; the first shows the whole loop's figure (JUnit properties).

Records whose ``retry.at`` is already past when they reach the retry topic (an application that
computed its own due time, or an ingest that fell behind) are stored overdue. With the ingest and
publish loops running side by side, as the ``retry_scheduler`` DAG runs them, each is published
within a second of the moment its row was stored (``created_at``), never before it was due; and the
same with a snapshot held open in another session (a long report, a ``pg_dump``), which keeps every
dead row version visible to the publisher's claims.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.integration.test_replay_watch import running_loops
from tests.kafkautil import create_topics, produce

pytestmark = pytest.mark.integration

#: The promise is a second from stored to published; the figure is in the test's JUnit properties
#: (``stored_to_published_*``) and the benchmark's. The bound asserted is looser, as a timed assertion
#: on a loaded 2-core machine must be: it catches a publisher that waits for its next sweep (up to a
#: minute) or its next run, which is what this guards against.
AT_ONCE_S = 1.0
BOUND_S = 5 * AT_ONCE_S


def published_within(loop: Loop, keys: list[bytes], timeout_s: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        with psycopg.connect(loop.settings.database_url, row_factory=psycopg.rows.dict_row) as conn:
            rows = conn.execute(
                "SELECT msg_key, status, due_at, created_at, published_at FROM retry_jobs_all "
                "WHERE msg_key = ANY(%s)",
                [keys],
            ).fetchall()
        if len(rows) == len(keys) and all(r["status"] == "published" for r in rows):
            return rows
        assert time.monotonic() < deadline, f"not all published in {timeout_s} s: {rows}"
        time.sleep(0.2)


@pytest.mark.parametrize("snapshot", [False, True], ids=["plain", "snapshot-held"])
def test_a_job_stored_after_its_due_time_is_published_within_a_second_of_being_stored(
    database_url: str, bootstrap_servers: str, topic_prefix: str, snapshot: bool, record_property: Any
) -> None:
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, loop_grace_ms=0)
    create_topics(bootstrap_servers, [loop.settings.retry_topic, loop.dest], partitions=2)
    holder = psycopg.connect(database_url, autocommit=False)
    try:
        if snapshot:  # a transaction that keeps its snapshot for the whole test
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM retry_jobs").fetchone()
        with running_loops(loop):
            time.sleep(3)  # the loops have started and are idle
            keys: list[bytes] = []
            for wave in range(5):  # waves a second apart: each stored while the loops are running
                now_ms = int(time.time() * 1000)
                batch = [
                    {"key": f"late-{wave}-{i}".encode(), "value": b"v",
                     "headers": hdr(destination=loop.dest, at=str(now_ms - 10_000 * (i + 1)))}
                    for i in range(20)
                ]  # fmt: skip
                produce(bootstrap_servers, loop.settings.retry_topic, batch)
                keys += [r["key"] for r in batch]
                time.sleep(1)
            rows = published_within(loop, keys)
    finally:
        holder.close()

    waits = sorted((r["published_at"] - r["created_at"]).total_seconds() for r in rows)
    p50, p99, worst = waits[len(waits) // 2], waits[int(len(waits) * 0.99)], waits[-1]
    for name, value in (("p50", p50), ("p99", p99), ("max", worst)):
        record_property(f"stored_to_published_{name}_s", round(value, 3))
    assert all(r["published_at"] >= r["due_at"] for r in rows)  # never early (they were due before)
    assert all(r["created_at"] > r["due_at"] for r in rows)  # stored overdue, as meant
    assert worst <= BOUND_S, f"stored -> published: p50 {p50:.3f} s, p99 {p99:.3f} s, max {worst:.3f} s"


def test_a_job_stored_below_a_publisher_s_floor_is_in_its_very_next_claim(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The mechanism, with the one thing that varies with load pinned: the publisher's next sweep is
    an hour off (as when a held snapshot makes sweeps slow and rare). A job stored 10 s after its due
    time, below the publisher's floor, is claimed and published by its next round all the same."""
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    create_topics(bootstrap_servers, [loop.settings.retry_topic, loop.dest], partitions=1)
    with Store(database_url) as store:
        publisher = Publisher(Deployment(loop.settings, loop.registry), store)
        try:
            now_ms = int(time.time() * 1000)
            loop.send(
                [{"key": b"first", "value": b"v", "headers": hdr(destination=loop.dest, at=str(now_ms))}]
            )
            loop.ingest(1)
            assert publisher.publish_once().published == 1  # a sweep: the floor is set by it
            publisher._sweep_after = time.monotonic() + 3600  # the next sweep an hour off
            floor = publisher.floor
            assert floor is not None
            late_ms = int(floor.timestamp() * 1000) - 10_000
            loop.send(
                [{"key": b"late", "value": b"v", "headers": hdr(destination=loop.dest, at=str(late_ms))}]
            )
            loop.ingest(1)

            round_ = publisher.publish_once()
        finally:
            publisher.close()
    assert round_.published == 1
    [row] = [r for r in loop.rows() if bytes(r["msg_key"]) == b"late"]
    assert row["status"] == "published" and row["due_at"].timestamp() * 1000 < late_ms + 1
