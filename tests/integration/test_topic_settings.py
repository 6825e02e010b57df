"""The topics the service creates take their replication settings from the service's settings."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from retry_scheduler.core.config import Settings
from retry_scheduler.loops.kafka import TopicManager

pytestmark = pytest.mark.integration


def topic_config(bootstrap: str, topic: str) -> dict[str, str | None]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in future.result(15).items()}


def test_created_topics_carry_min_insync_replicas_only_when_set(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    base = Settings(kafka={"bootstrap.servers": bootstrap_servers})
    set_topic, default_topic = f"{topic_prefix}-isr1", f"{topic_prefix}-isr-default"

    assert (
        TopicManager(base.with_overrides(topic_min_insync_replicas=1)).ensure([set_topic], create=True) == []
    )
    assert TopicManager(base).ensure([default_topic], create=True) == []

    assert topic_config(bootstrap_servers, set_topic).get("min.insync.replicas") == "1"
    # Unset: the topic has no setting of its own, so the broker's default applies.
    assert "min.insync.replicas" not in topic_config(bootstrap_servers, default_topic)


def test_created_topics_get_the_replication_factor_asked_for(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    """What the broker reports for each partition of the topics created, not only what was asked:
    RETRY_TOPIC_REPLICATION_FACTOR when set, else the broker's default.replication.factor (1 here)."""
    base = Settings(kafka={"bootstrap.servers": bootstrap_servers})
    two, default = f"{topic_prefix}-rf2", f"{topic_prefix}-rf-default"
    assert TopicManager(base.with_overrides(topic_replication_factor=2)).ensure([two], create=True) == []
    assert TopicManager(base).ensure([default], create=True, partitions=2) == []

    topics = AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=10).topics
    assert {p: len(m.replicas) for p, m in topics[two].partitions.items()} == {0: 2, 1: 2, 2: 2}
    assert {p: len(m.replicas) for p, m in topics[default].partitions.items()} == {0: 1, 1: 1}
