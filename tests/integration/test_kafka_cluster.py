"""The service on a Kafka cluster while it fails (issue 62): three brokers and two controllers only
(Apache Kafka 4.4, KRaft, :mod:`retry_scheduler.dev.kafka_cluster`), topics with three replicas and
``min.insync.replicas`` 2, the real ingest and publish loops and PostgreSQL.

- The leader of the destination's partition is killed (-9) while the publish loop sends to it: a
  replica takes over, publishing resumes, and every retry reaches the destination, none early,
  none with an attempt spent by the failover; a copy sent twice carries the same ``retry.id``.
- Two of the three brokers are stopped: ``acks=all`` cannot be had (``NOT_ENOUGH_REPLICAS``), the
  publish loop keeps its jobs pending with their attempts unspent, and publishes them all once the
  brokers are back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from retry_scheduler.core import protocol as p
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.dev.kafka_cluster import KafkaCluster
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(
        tmp_path_factory.mktemp("kafka-cluster"), 3, controllers=2, say=lambda _m: None
    ) as cluster:
        cluster.start()
        yield cluster


@pytest.fixture
def cluster(kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The module's cluster, every broker running again after the test, whatever it stopped."""
    yield kafka_cluster
    for node in kafka_cluster.broker_nodes:
        if not node.running:
            kafka_cluster.restart(node.node_id)


def _jobs(loop: Loop) -> dict[str, dict[str, Any]]:
    """Every job of the test's destination, by retry.id: status, attempt, due, published, failures."""
    with Store(loop.settings.database_url) as store:
        rows = store.conn.execute(
            "SELECT retry_id, status::text, attempt, due_at, published_at, publish_failures "
            "FROM retry_jobs_all WHERE destination = %s",
            (loop.dest,),
        ).fetchall()
    return {r[0]: {"status": r[1], "attempt": r[2], "due_at": r[3], "published_at": r[4], "failures": r[5]}
            for r in rows}  # fmt: skip


def _publish_until(loop: Loop, count: int, timeout_s: float, **changes: object) -> Publisher:
    settings = loop.settings.with_overrides(**changes)
    with Store(settings.database_url) as store:
        publisher = Publisher(Deployment.load(settings), store)
        try:
            publisher.run(timeout_s, should_stop=lambda: publisher.published_so_far() >= count)
        finally:
            publisher.close()
    return publisher


def test_the_destination_leader_killed_while_publishing_loses_nothing_and_publishing_resumes(
    database_url: str, cluster: KafkaCluster, topic_prefix: str
) -> None:
    # The service's defaults: deliveries wait out the failover themselves (librdkafka retries until
    # delivery.timeout.ms, 30 s), inside the claim's lease (60 s).
    loop = new_loop(
        database_url, cluster.bootstrap, topic_prefix, delivery_timeout_ms=30_000, lease_ms=60_000
    )
    create_topics(loop.bootstrap, [loop.dest], partitions=1)
    total = 400
    due_from = int(time.time() * 1000) + 15_000  # after the ingest (with its group join)
    loop.send([{"key": b"k%d" % i, "value": b"v%d" % i,
                "headers": hdr(destination=loop.dest, at=str(due_from + i * 25), id=f"r{i}")}
               for i in range(total)])  # fmt: skip
    assert loop.ingest(total, timeout_s=60).stored == total
    leader = cluster.leader(loop.dest, 0)

    publishing = threading.Thread(target=_publish_until, args=(loop, total, 180))
    publishing.start()
    try:
        while sum(j["status"] == "published" for j in _jobs(loop).values()) < total // 4:
            assert publishing.is_alive(), "the publish loop ended before a quarter was published"
            time.sleep(0.1)
        cluster.kill(leader)
        killed_at = time.time()
        publishing.join(240)
    finally:
        publishing.join(240)
    assert not publishing.is_alive()

    jobs = _jobs(loop)
    assert {j["status"] for j in jobs.values()} == {"published"} and len(jobs) == total
    assert all(j["published_at"] >= j["due_at"] for j in jobs.values()), "published early"
    assert cluster.leader(loop.dest, 0) != leader  # a replica took over
    after = sorted(
        j["published_at"].timestamp() for j in jobs.values() if j["published_at"].timestamp() > killed_at
    )
    assert after, "nothing was published after the leader was killed"
    print(f"\nfirst publish {after[0] - killed_at:.1f} s after the leader was killed")

    seen = consume(loop.bootstrap, [loop.dest], total, timeout_s=60)
    ids = [s.header(p.ID) for s in seen]
    assert set(ids) == set(jobs), "records lost"
    # No attempt spent by the failover, each record's as the scheduler published it; a copy sent
    # twice (an acknowledgement lost with the leader) is the same retry, same retry.id.
    assert {s.header(p.ATTEMPT) for s in seen} == {"1"}
    assert all(s.timestamp_ms >= jobs[s.header(p.ID)]["due_at"].timestamp() * 1000 for s in seen)
    print(f"{len(seen) - total} duplicate(s), each with its retry.id")


def test_two_brokers_down_the_publish_loop_keeps_its_jobs_with_their_attempts_and_resumes(
    database_url: str, cluster: KafkaCluster, topic_prefix: str
) -> None:
    loop = new_loop(database_url, cluster.bootstrap, topic_prefix, delivery_timeout_ms=3000, lease_ms=10_000)
    create_topics(loop.bootstrap, [loop.dest], partitions=1)
    total = 50
    loop.send([{"key": b"k%d" % i, "value": b"v", "headers": hdr(destination=loop.dest, at="0", id=f"r{i}")}
               for i in range(total)])  # fmt: skip
    assert loop.ingest(total, timeout_s=60).stored == total
    leader = cluster.leader(loop.dest, 0)
    followers = [n.node_id for n in cluster.broker_nodes if n.node_id != leader]
    for node_id in followers:
        cluster.stop(node_id)

    # Only the leader is left in sync: acks=all is refused (NOT_ENOUGH_REPLICAS) until delivery.timeout.ms.
    stuck = _publish_until(loop, total, 12)
    jobs = _jobs(loop)
    assert stuck.published_so_far() == 0
    assert {j["status"] for j in jobs.values()} == {"pending"} and len(jobs) == total
    assert {j["attempt"] for j in jobs.values()} == {0}, "an attempt was spent on the brokers' outage"
    assert any(j["failures"] for j in jobs.values())

    for node_id in followers:
        cluster.restart(node_id)
    _publish_until(loop, total, 120, delivery_timeout_ms=30_000, lease_ms=60_000)
    jobs = _jobs(loop)
    assert {j["status"] for j in jobs.values()} == {"published"}
    seen = consume(loop.bootstrap, [loop.dest], total, timeout_s=60)
    assert {s.header(p.ID) for s in seen} == set(jobs)
    assert {s.header(p.ATTEMPT) for s in seen} == {"1"}


def test_the_topics_the_service_creates_get_three_replicas_and_status_warns_of_one(
    cluster: KafkaCluster, topic_prefix: str
) -> None:
    """By default (RETRY_TOPIC_REPLICATION_FACTOR 0) the retry topics get three replicas and
    ``min.insync.replicas`` 2 on this cluster; a service topic made with one replica is named by
    ``status`` (and in ``--json``) as lost with its broker."""
    from confluent_kafka.admin import ConfigResource, NewTopic

    from retry_scheduler.core.config import Settings
    from retry_scheduler.holds import wait_until_listed
    from retry_scheduler.loops.kafka import ensure_retry_topics
    from retry_scheduler.ops.status import topics_at_risk

    settings = Settings(
        kafka={"bootstrap.servers": cluster.bootstrap},
        retry_topic=f"{topic_prefix}-retry",
        delay_topics={f"{topic_prefix}-retry.5m": 300_000},
    )
    admin = cluster.admin()
    for future in admin.create_topics([NewTopic(f"{topic_prefix}-retry.5m", 1, 1)]).values():
        future.result(30)  # made by hand with one replica, before the service could
    ensure_retry_topics(settings)
    # Each broker learns of a new topic from the controller in its own time: ask once this client's
    # broker lists both (the service's own creation waits the same way, holds.wait_until_listed).
    assert wait_until_listed(admin, settings.retry_topics)
    meta = admin.list_topics(timeout=10).topics
    assert {len(pm.replicas) for pm in meta[settings.retry_topic].partitions.values()} == {3}
    [config] = admin.describe_configs([ConfigResource("topic", settings.retry_topic)]).values()
    assert config.result(15)["min.insync.replicas"].value == "2"
    risks = topics_at_risk(settings)
    assert set(risks) == {f"{topic_prefix}-retry.5m"}
    assert "1 replica on a cluster of 3 brokers" in risks[f"{topic_prefix}-retry.5m"]
