"""Parking (issue 33): a record replayed from the dead letters RETRY_PARK_AFTER_REPLAYS times and dead
again each time is dead as ``parked``, which a replay leaves alone unless asked for it.

Through the real loops, broker and PostgreSQL; the application that fails the record again copies
the record's headers into its retry, as a Java client (or the SDK) does.
"""

from __future__ import annotations

import pytest

from retry_scheduler.core import protocol
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import Operation, run_action
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


def replay(loop: Loop, selection: Selection):
    operation = Operation(action="replay", selection=selection, actor="ann", source="cli", dry_run=False)
    return run_action(
        loop.settings.database_url,
        operation,
        deployment=Deployment(loop.settings, loop.registry),
    )


def test_a_record_replayed_three_times_and_dead_again_is_parked_and_replayed_only_when_asked(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, park_after_replays=3)
    create_topics(loop.bootstrap, [loop.dest])
    # Exhausted at once (the policy allows 2 attempts): dead.
    loop.send(
        [{"key": b"k", "value": b"v", "headers": [("trace", b"t"), *hdr(destination=loop.dest, attempt="2")]}]
    )
    assert loop.ingest(1).stored == 1
    dead_reasons, replays_seen = [], []
    for n in range(1, 4):
        assert replay(loop, Selection(destination=loop.dest)).affected == 1
        loop.publish(2)
        back = consume(loop.bootstrap, [loop.dest], n)[n - 1]  # the n-th time it went back
        replays_seen.append(back.header(protocol.REPLAYS))
        # The application fails it again: its retry copies the record's headers.
        loop.send(
            [{"key": back.key, "value": back.value, "headers": [*back.headers, *hdr(reason=f"down {n}")]}]
        )
        assert loop.ingest(1).stored == 1
        [row] = loop.rows("status = 'dead'")
        dead_reasons.append(row["dead_reason"])
    assert replays_seen == ["1", "2", "3"]
    assert dead_reasons == ["exhausted", "exhausted", "parked"]
    assert row["reason"] == "parked after 3 replays, then exhausted: down 3"

    # A replay of the destination's dead letters leaves it alone, and says why ...
    left = replay(loop, Selection(destination=loop.dest))
    assert (left.matched, left.affected) == (1, 0)
    assert left.skipped[next(k for k in left.skipped if k.startswith("parked"))] == 1
    assert [r["dead_reason"] for r in loop.rows("status = 'dead'")] == ["parked"]
    # ... one asking for parked letters (or naming it) sends it back.
    assert replay(loop, Selection(dead_reason="parked")).affected == 1
    loop.publish(2)
    assert consume(loop.bootstrap, [loop.dest], 4)[3].header(protocol.REPLAYS) == "4"


def test_a_bulk_retry_of_dead_jobs_leaves_parked_ones_unless_asked(database_url: str) -> None:
    """The Spark bulk retry's selection (what it counts, and reads over JDBC with the same fragments)
    leaves parked jobs out unless its filter asks for them by reason or id."""
    from retry_scheduler.spark.selection import summarize
    from tests.integration.test_dlq import dead_job, insert

    insert(database_url, [dead_job(1), dead_job(2, reason="parked"), dead_job(3, reason="parked")])

    def counted(selection: Selection) -> int:
        return sum(summarize(database_url, selection).per_destination.values())

    assert counted(Selection()) == 1
    assert counted(Selection(dead_reason="parked")) == 2
    assert counted(Selection(ids=(2,))) == 1
