"""How many replicas a topic the service or its consumer helper creates gets (issue 62)."""

from __future__ import annotations

from confluent_kafka.admin import NewTopic

from retry_scheduler.replication import (
    AUTO,
    BROKER_DEFAULT,
    min_insync_for,
    replicas_for,
    resolved,
    under_replicated,
)


def test_by_default_three_replicas_or_the_clusters_brokers_when_fewer() -> None:
    assert [replicas_for(brokers) for brokers in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert replicas_for(5, BROKER_DEFAULT) == -1 and replicas_for(1, 2) == 2  # asked: as asked


def test_min_insync_replicas_matches_the_replicas_unless_asked() -> None:
    assert [min_insync_for(r) for r in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert min_insync_for(-1) is None  # the broker's replication: its min.insync.replicas too
    assert min_insync_for(3, BROKER_DEFAULT) is None and min_insync_for(3, 3) == 3


def test_a_new_topic_is_resolved_for_its_cluster_keeping_its_own_config() -> None:
    topic = resolved(NewTopic("t", 6, AUTO, config={"cleanup.policy": "compact"}), brokers=3)
    assert (topic.topic, topic.num_partitions, topic.replication_factor) == ("t", 6, 3)
    assert topic.config == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    own = resolved(NewTopic("t", 1, AUTO, config={"min.insync.replicas": "3"}), brokers=5)
    assert own.config == {"min.insync.replicas": "3"}
    assert resolved(NewTopic("t", 1, AUTO), brokers=1).config == {"min.insync.replicas": "1"}


def test_one_replica_is_a_risk_only_where_the_cluster_could_keep_more() -> None:
    assert under_replicated(brokers=1, replicas=1) is None
    assert under_replicated(brokers=3, replicas=3) is None
    why = under_replicated(brokers=3, replicas=1)
    assert why is not None and "lost with that broker" in why and "recreate it with 3" in why
