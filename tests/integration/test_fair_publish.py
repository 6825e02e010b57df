"""Fair publishing: a destination's flood of due jobs does not delay another destination's few.

Against the real PostgreSQL and the embedded broker; the flood is stored with SQL (fast), the few
through the ingest loop, as an application's retries would be.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration

#: Jobs of one destination, all due ten minutes ago, oldest first.
_FLOOD = """
INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms, destination,
    msg_key, msg_value, attempt, policy, reason, consumer_group, retry_id, original_topic,
    original_partition, first_seen_at, due_at, status, dlq_topic)
SELECT 'flood', 0, g, 0, %(dest)s, 'k', 'v', 1, 'default', 'r', 'g', md5(g::text), %(dest)s,
       0, now(), now() - interval '10 minutes' + g * interval '1 ms', 'pending', 'dlq'
FROM generate_series(1, %(count)s) AS g
"""


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(database_url, bootstrap_servers, topic_prefix)


def _published(loop: Loop, destination: str) -> int:
    with psycopg.connect(loop.settings.database_url) as conn:
        [(count,)] = conn.execute(
            "SELECT count(*) FROM retry_published_jobs WHERE destination = %s", (destination,)
        ).fetchall()
    return int(count)


def test_a_flood_of_due_jobs_does_not_delay_another_destinations_few(loop: Loop) -> None:
    """10 000 jobs of one destination are due (ten minutes late) when 50 of another fall due: the 50 go
    out in the next round, not after the 10 000 (20 rounds of 500 in due order), and then every job of
    both is on its topic once. The publisher never claimed the second destination before: it knows it
    from the ingest (retry_destinations)."""
    flood = f"{loop.dest}.flood"
    create_topics(loop.bootstrap, [flood, loop.dest])
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(_FLOOD, {"dest": flood, "count": 10_000})
    loop.send(
        [{"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(50)]
    )
    assert loop.ingest(50).stored == 50
    time.sleep(1.2)  # the policy's delay: 1 s
    settings = loop.settings.with_overrides(publish_batch=500)
    with Store(settings.database_url) as store:
        publisher = Publisher(Deployment.load(settings), store)
        try:
            rounds = [publisher.publish_once() for _ in range(2)]
            few_early, flood_early = _published(loop, loop.dest), _published(loop, flood)
            while _published(loop, flood) + _published(loop, loop.dest) < 10_050:
                publisher.publish_once()
        finally:
            publisher.close()
    assert few_early == 50, f"{few_early} of the 50 published in the first two rounds"
    assert flood_early <= 1_000 and sum(r.fair_claimed for r in rounds) == 50, (flood_early, rounds)
    assert len(consume(loop.bootstrap, [loop.dest], 50)) == 50
    assert len(consume(loop.bootstrap, [flood], 10_000, timeout_s=60)) == 10_000


def test_a_lane_claim_reads_its_own_destinations_jobs_only(loop: Loop) -> None:
    """One index descent per destination: a lane's claim of 20 due jobs reads about 20 entries, not
    the 20 000 due jobs of another destination due before them."""
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(_FLOOD, {"dest": f"{loop.dest}.flood", "count": 20_000})
        conn.execute(
            _FLOOD.replace("'flood', 0, g", "'few', 0, g").replace(
                "interval '10 minutes'", "interval '1 minute'"
            ),
            {"dest": loop.dest, "count": 20},
        )
    counter = "SELECT pg_stat_get_xact_tuples_returned('retry_jobs_destination_due_idx'::regclass)"
    with loop.store() as store, store.conn.transaction(force_rollback=True):
        [(before,)] = store.conn.execute(counter).fetchall()
        rows, _ = store.queue.claim_lanes({loop.dest: None}, 100)
        [(after,)] = store.conn.execute(counter).fetchall()
    assert len(rows) == 20 and {r.destination for r in rows} == {loop.dest}
    assert [r.due_at for r in rows] == sorted(r.due_at for r in rows if r.due_at)  # oldest first
    assert after - before <= 25, f"a lane claim of 20 jobs read {after - before} index entries"


def test_no_lane_while_the_claim_keeps_up(loop: Loop) -> None:
    """Lanes are for a backlog: with every due job claimed in a round, none is claimed in a lane."""
    other = f"{loop.dest}.other"
    create_topics(loop.bootstrap, [other, loop.dest])
    records = [{"key": b"k", "value": b"v", "headers": hdr(destination=d)} for d in (loop.dest, other)]
    loop.send(records * 20)
    assert loop.ingest(40).stored == 40
    time.sleep(1.2)
    counts = loop.publish(3)
    assert (counts.published, counts.fair_claimed) == (40, 0)
