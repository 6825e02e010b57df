"""Trials of a Kafka cluster failing under the running service (issue 62): ``retry-scheduler chaos
--cluster`` (``make chaos-cluster``) runs them on three brokers and two controllers only
(:class:`~retry_scheduler.dev.kafka_cluster.KafkaCluster`), every topic with three replicas and
``min.insync.replicas`` 2. Each strikes once the trial has published (or stored) a random number of
jobs:

* ``leader_kill_retry`` / ``leader_kill_destination`` / ``leader_kill_dlq``: SIGKILL of the broker
  leading a partition of the retry topic (while ingesting), of the destination or of the DLQ topic
  (while publishing); started again 2-8 s later;
* ``coordinator_kill``: SIGKILL of the broker coordinating the ingest's consumer group while it
  commits offsets; started again 2-8 s later;
* ``controller_kill``: SIGKILL of the active controller (a broker or a controller-only node);
* ``rolling_restart``: every broker stopped (SIGTERM) and started again in turn, as an upgrade does;
* ``two_brokers_down``: two brokers stopped at once for 3-10 s: ``acks=all`` is refused
  (``NOT_ENOUGH_REPLICAS``) until they are back;
* ``broker_freeze``: the broker leading a destination partition frozen (SIGSTOP) for 10-15 s, past
  the cluster's session timeout, then thawed.

Besides the trial's count, each notes ``failover_s`` (for a killed or frozen leader: until its
partition had another) and ``resumed_s`` (until the partition it struck got a record again, when
one was still due); a rolling restart notes the lateness p99 of the jobs published while it ran.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from bench.chaos.common import reached
from bench.chaos.topics import Topics
from retry_scheduler.dev.kafka_cluster import KafkaCluster

CLUSTER_FAULTS = (
    "leader_kill_retry",
    "leader_kill_destination",
    "leader_kill_dlq",
    "coordinator_kill",
    "controller_kill",
    "rolling_restart",
    "two_brokers_down",
    "broker_freeze",
)


def plan_cluster_fault(fault: str, rng: random.Random, records: int) -> dict[str, Any]:
    """When and where this trial's fault strikes (recorded in the report)."""
    published = int(records * 0.78)
    if fault in ("leader_kill_retry", "coordinator_kill"):
        detail: dict[str, Any] = {"after": "stored", "count": rng.randint(1, records // 2)}
    elif fault == "leader_kill_dlq":
        detail = {"after": "published", "count": rng.randint(1, published // 3)}
    else:
        detail = {"after": "published", "count": rng.randint(1, published // 2)}
    if fault.startswith("leader_kill"):
        detail["partition"] = rng.randrange(3) if fault != "leader_kill_retry" else rng.randrange(6)
    if "_kill" in fault:
        detail["down_s"] = round(rng.uniform(2, 8), 3)
    elif fault == "two_brokers_down":
        detail["down_s"] = round(rng.uniform(3, 10), 3)
    elif fault == "broker_freeze":
        detail["frozen_s"] = round(rng.uniform(10, 15), 3)
        detail["partition"] = rng.randrange(3)
    return detail


def _new_leader(
    cluster: KafkaCluster, topic: str, partition: int, old: int, timeout_s: float
) -> float | None:
    """Seconds until ``topic``'s ``partition`` is led by another node than ``old``; None if never."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if cluster.leader(topic, partition, timeout_s=2.0) != old:
                return round(time.monotonic() - began, 3)
        except Exception:  # no leader for now, or the broker asked is the one down
            pass
        time.sleep(0.1)
    return None


def _high_watermark(cluster: KafkaCluster, topic: str, partition: int) -> int | None:
    """The partition's high watermark, asked by a new consumer each time: one kept across a failover
    goes on asking the old leader (its metadata is stale), and a partition never seems to resume."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "chaos-watermarks", "log_level": 0}
    )
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=3.0)[1])
    except KafkaException:
        return None
    finally:
        consumer.close()


def _resumed(
    cluster: KafkaCluster, topic: str, partition: int, before: int | None, since: float, timeout_s: float
) -> float | None:
    """Seconds from ``since`` (``time.monotonic()``) until ``topic``'s ``partition`` holds more than
    ``before`` records; None if not within ``timeout_s`` (no record of it may have been due any more)."""
    while before is not None and time.monotonic() - since < timeout_s:
        now = _high_watermark(cluster, topic, partition)
        if now is not None and now > before:
            return round(time.monotonic() - since, 3)
        time.sleep(0.2)
    return None


def _lateness_p99(database_url: str, since: float, until: float) -> float | None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY retry_lateness_s(published_at, due_at)) "
            "FROM retry_published_jobs WHERE published_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
            (since, until),
        ).fetchone()
    return None if row is None or row[0] is None else round(float(row[0]), 3)


def cluster_striker(
    cluster: KafkaCluster, fault: str, detail: dict[str, Any], database_url: str, topics: Topics
) -> Callable[[], None]:
    """The body of the thread that strikes the cluster; notes what it struck and the figures."""

    def strike() -> None:
        try:
            _strike()
        finally:  # whatever happened, the next trial starts on the whole cluster
            cluster.start(announce=False)

    def _strike() -> None:
        began = time.monotonic()
        detail["triggered"] = reached(database_url, detail["after"], detail["count"], 60)
        detail["struck_at_s"] = round(time.monotonic() - began, 3)
        topic = {"leader_kill_retry": topics.retry, "leader_kill_dlq": topics.dlq}.get(fault, topics.dest)
        partition = int(detail.get("partition", 0))
        if fault.startswith("leader_kill") or fault == "broker_freeze":
            node = detail["node"] = cluster.leader(topic, partition)
            before = _high_watermark(cluster, topic, partition)
            freeze = fault == "broker_freeze"
            struck = time.monotonic()
            if freeze:
                cluster.freeze(node)
            else:
                cluster.kill(node)
            down_s = detail["frozen_s"] if freeze else detail["down_s"]
            detail["failover_s"] = _new_leader(cluster, topic, partition, node, 30)
            detail["resumed_s"] = _resumed(cluster, topic, partition, before, struck, 30)
            time.sleep(max(0.0, down_s - (time.monotonic() - struck)))
            if freeze:
                cluster.thaw(node)
            else:
                cluster.restart(node)
        elif fault in ("coordinator_kill", "controller_kill"):
            group = f"{topics.prefix}-scheduler"
            node = detail["node"] = (
                cluster.coordinator(group) if fault == "coordinator_kill" else cluster.controller()
            )
            cluster.kill(node)
            time.sleep(detail["down_s"])
            cluster.restart(node)
        elif fault == "rolling_restart":
            since = time.time()
            for node in [n.node_id for n in cluster.broker_nodes]:
                cluster.stop(node)
                cluster.restart(node)
            detail["restart_s"] = round(time.time() - since, 3)
            detail["lateness_p99_s"] = _lateness_p99(database_url, since, time.time())
        elif fault == "two_brokers_down":
            down = detail["nodes"] = sorted(random.Random(detail["count"]).sample([1, 2, 3], 2))
            for node in down:
                cluster.stop(node)
            time.sleep(detail["down_s"])
            for node in down:
                cluster.restart(node)
        else:
            raise ValueError(f"unknown cluster fault {fault!r} (known: {', '.join(CLUSTER_FAULTS)})")

    return strike
