"""Per-destination rate limits (``RATE_LIMITS`` in the policies module, issue 33): the publish loop
sends at most that many records per second to a destination, however large its backlog and however
many publishers run, without holding up the other destinations; replays are paced at the limit too.

Against the real PostgreSQL and the embedded broker; the backlog is stored with SQL (fast).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import psycopg
import pytest

from retry_scheduler.core.declarations import Destination
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import PolicyError, PolicyRegistry
from retry_scheduler.db.selection import Selection
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import PublishCounts, Publisher
from retry_scheduler.ops.dlq import Operation, run_action
from tests.integration.test_dlq import dead_job, insert
from tests.integration.test_fair_publish import _FLOOD
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration

RATE = 10.0


def limited_loop(loop: Loop, destination: str) -> Loop:
    registry = loop.registry
    limited = PolicyRegistry.of(
        registry.policies.values(),
        [*registry.declarations, Destination(destination, rate_limit=RATE)],
        registry.allowed,
    )
    return dataclasses.replace(loop, registry=limited)


def published(loop: Loop, destination: str) -> list[tuple[float, float, float]]:
    """(published at, due at, first stored at) of the destination's published jobs, in seconds."""
    with psycopg.connect(loop.settings.database_url) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT extract(epoch FROM published_at)::float8, extract(epoch FROM due_at)::float8, "
            "extract(epoch FROM created_at)::float8 FROM retry_published_jobs WHERE destination = %s "
            "ORDER BY published_at",
            (destination,),
        ).fetchall()


def most_in_one_second(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


def test_a_rate_limited_destination_gets_its_rate_from_two_publishers_and_the_other_is_not_held_up(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    base = new_loop(database_url, bootstrap_servers, topic_prefix)
    slow, other = f"{base.dest}.slow", base.dest
    loop = limited_loop(base, slow)
    create_topics(loop.bootstrap, [slow, other])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_FLOOD, {"dest": slow, "count": 40})
        conn.execute(_FLOOD.replace("'flood'", "'other'"), {"dest": other, "count": 20})
    results: list[PublishCounts] = []
    deployment = Deployment(loop.settings.with_overrides(publish_batch=15), loop.registry)

    def publish() -> None:
        with Store(database_url) as store:
            publisher = Publisher(deployment, store)
            try:
                results.append(publisher.run(6, grace_s=0))
            finally:
                publisher.close()

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    slow_jobs, other_jobs = published(loop, slow), published(loop, other)
    assert (len(slow_jobs), len(other_jobs)) == (40, 20)
    assert sum(r.deferred for r in results) >= 40 - 12, results  # the rest went to later slots
    # None early: each went out at or after its due time, deferred or not.
    assert all(at >= due - 1e-3 for at, due, _ in slow_jobs + other_jobs)
    # The slow destination: its rate (plus the one-tenth-of-a-second burst and the slot it starts on)
    # in any second, from both publishers together; spread over about 40 / 10 s.
    times = [at for at, _, _ in slow_jobs]
    assert most_in_one_second(times) <= RATE + 2, [round(t - times[0], 2) for t in times]
    assert times[-1] - times[0] >= (40 - RATE - 2) / RATE
    # The other destination is not held up behind it: all out within the first second.
    assert max(at for at, _, _ in other_jobs) - times[0] < 1.0
    # On the topic: each once, and spread the same way as the records' timestamps say.
    seen = consume(loop.bootstrap, [slow], 40)
    assert len(seen) == 40
    assert most_in_one_second(sorted(r.timestamp_ms / 1000 for r in seen)) <= RATE + 2
    assert len(consume(loop.bootstrap, [other], 20)) == 20


def test_a_replay_goes_at_a_destinations_rate_limit_when_it_is_below_the_pace(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    loop = limited_loop(new_loop(database_url, bootstrap_servers, topic_prefix), "payments")
    insert(
        database_url,
        [dead_job(i, destination="payments") for i in range(1, 6)] + [dead_job(i) for i in range(6, 9)],
    )
    deployment = Deployment(
        loop.settings.with_overrides(destination_allowlist="^(orders|payments)$"), loop.registry
    )
    operation = Operation(action="replay", selection=Selection(), actor="ann", source="cli", dry_run=False)
    outcome = run_action(database_url, operation, deployment=deployment)
    assert (outcome.affected, outcome.rate_per_s, outcome.rate_limited) == (8, None, {"payments": RATE})
    assert outcome.paced_s == pytest.approx(0.4)
    summary = outcome.summary()
    # Not "not paced: every job due at once" beside "at most 10/s": the limit paces its destination.
    assert (
        "; paced only by the destinations' rate limits (payments at most 10/s); every other job due at once"
        in summary
    )
    assert "not paced" not in summary
    with psycopg.connect(database_url) as conn:
        due = {
            d: [row[0] for row in conn.execute(
                "SELECT due_at FROM retry_jobs WHERE destination = %s ORDER BY id", (d,)
            ).fetchall()]
            for d in ("payments", "orders")
        }  # fmt: skip
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(due["payments"])]
    assert gaps == [pytest.approx(0.1, abs=1e-5)] * 4
    assert max(due["orders"]) - min(due["orders"]) < due["payments"][1] - due["payments"][0]  # at once


def test_rate_limits_are_checked_where_they_are_declared() -> None:
    registry = PolicyRegistry.of([], rate_limits={"payments": 50, "shop.*": 200, "shop.cart": 20})
    assert registry.rate_limit("payments") == 50.0
    assert registry.rate_limit("shop.cart") == 20.0  # its own name wins over the glob
    assert registry.rate_limit("shop.ledger") == 200.0
    assert registry.rate_limit("orders") is None
    # The most specific declaration wins, not the lowest rate (0.4 took the lowest that matched).
    registry = PolicyRegistry.of([], rate_limits={"*": 10, "payments": 500, "shop.*": 100, "shop.c*": 300})
    assert (registry.rate_limit("payments"), registry.rate_limit("shop.cart")) == (500.0, 300.0)
    assert (registry.rate_limit("shop.ledger"), registry.rate_limit("orders")) == (100.0, 10.0)
    for bad, message in (
        ({"payments": 0}, "more than 0"), ({"payments": "fast"}, "give records per second"),
        ({"payments": True}, "give records per second"), ({"": 5}, "must be a destination topic or a glob"),
        (["payments"], "RATE_LIMITS must be a dict"), ({"payments": float("inf")}, "at most 1,000,000"),
    ):  # fmt: skip
        with pytest.raises(PolicyError, match=message):
            PolicyRegistry.of([], rate_limits=bad)  # type: ignore[arg-type]
