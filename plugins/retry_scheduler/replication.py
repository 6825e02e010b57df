"""How many replicas a topic that the service or its consumer helper creates gets.

By default (:data:`AUTO`) three, or the cluster's number of brokers when it has fewer, with
``min.insync.replicas`` 2 (1 below three replicas): a record the producer had acknowledged with
``acks=all`` then survives the loss of any one broker, and writes go on while one is down. A
single-broker dev cluster gets one replica. ``RETRY_TOPIC_REPLICATION_FACTOR`` and
``RETRY_TOPIC_MIN_INSYNC_REPLICAS`` choose otherwise (:data:`BROKER_DEFAULT`: the broker's
``default.replication.factor`` and ``min.insync.replicas``).

Part of the SDK: it needs nothing but confluent-kafka.
"""

from __future__ import annotations

from typing import Any

#: Three replicas, or the cluster's number of brokers when fewer; ``min.insync.replicas`` to match.
AUTO = 0
#: The broker's own default (``default.replication.factor``, ``min.insync.replicas``).
BROKER_DEFAULT = -1
#: The replicas :data:`AUTO` asks for on a cluster large enough.
AUTO_REPLICAS = 3


def replicas_for(brokers: int, asked: int = AUTO) -> int:
    """The replication factor to create a topic with on a cluster of ``brokers`` (``-1``: the broker's
    default)."""
    return max(1, min(AUTO_REPLICAS, brokers)) if asked == AUTO else asked


def min_insync_for(replicas: int, asked: int = AUTO) -> int | None:
    """The ``min.insync.replicas`` of a topic created with ``replicas`` (None: the broker's default)."""
    if asked == AUTO:
        return None if replicas < 0 else 2 if replicas >= 3 else 1
    return None if asked == BROKER_DEFAULT else asked


def resolved(topic: Any, brokers: int, min_insync: int = AUTO) -> Any:
    """``topic`` (a ``NewTopic``) as it is created on a cluster of ``brokers``: its replication factor
    :data:`AUTO` resolved, and its ``min.insync.replicas`` added unless its configuration has one."""
    from confluent_kafka.admin import NewTopic

    replicas = replicas_for(brokers, topic.replication_factor)
    config = dict(topic.config or {})
    isr = min_insync_for(replicas, min_insync)
    if isr is not None and "min.insync.replicas" not in config:
        config["min.insync.replicas"] = str(isr)
    return NewTopic(topic.topic, topic.num_partitions, replicas, config=config)


def under_replicated(brokers: int, replicas: int) -> str | None:
    """Why a topic of ``replicas`` on a cluster of ``brokers`` is at risk, or None: one replica where
    the cluster could keep more loses its records with that one broker."""
    if replicas == 1 and brokers > 1:
        return (
            f"1 replica on a cluster of {brokers} brokers: its records are lost with that broker "
            f"(recreate it with {min(AUTO_REPLICAS, brokers)}, or add replicas with "
            "kafka-reassign-partitions)"
        )
    return None
