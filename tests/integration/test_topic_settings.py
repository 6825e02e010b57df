"""The topics the service creates take their replication settings from the service's settings."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from retry_scheduler.core.config import Settings
from retry_scheduler.loops.kafka import TopicManager

pytestmark = pytest.mark.integration


def topic_config(bootstrap: str, topic: str) -> dict[str, str | None]:
    """The topic's own settings (what it was created with), not the broker's defaults it shows too."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {
        name: entry.value
        for name, entry in future.result(15).items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def test_created_topics_state_min_insync_replicas_unless_left_to_the_broker(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    base = Settings(kafka={"bootstrap.servers": bootstrap_servers})
    set_topic, auto_topic, broker_topic = (f"{topic_prefix}-isr1", f"{topic_prefix}-isr-auto",
                                           f"{topic_prefix}-isr-broker")  # fmt: skip

    assert (
        TopicManager(base.with_overrides(topic_min_insync_replicas=1)).ensure([set_topic], create=True) == []
    )
    assert TopicManager(base).ensure([auto_topic], create=True) == []
    assert (
        TopicManager(base.with_overrides(topic_min_insync_replicas=-1)).ensure([broker_topic], create=True)
        == []
    )

    assert topic_config(bootstrap_servers, set_topic).get("min.insync.replicas") == "1"
    # By default: stated on the topic, to match its replicas (one broker here: one replica, 1).
    assert topic_config(bootstrap_servers, auto_topic).get("min.insync.replicas") == "1"
    # -1: the topic has no setting of its own, so the broker's default applies.
    assert "min.insync.replicas" not in topic_config(bootstrap_servers, broker_topic)


def test_created_topics_get_the_replication_factor_asked_for(
    bootstrap_servers: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What the broker reports for each partition of the topics created, not only what was asked:
    RETRY_TOPIC_REPLICATION_FACTOR when set, else 3 or the cluster's brokers when fewer (1 here). On
    this one-broker cluster a factor of 2 cannot be had: the topic is not created and the broker's
    reason is logged."""
    base = Settings(kafka={"bootstrap.servers": bootstrap_servers})
    one, two, default = f"{topic_prefix}-rf1", f"{topic_prefix}-rf2", f"{topic_prefix}-rf-default"
    assert TopicManager(base.with_overrides(topic_replication_factor=1)).ensure([one], create=True) == []
    assert TopicManager(base).ensure([default], create=True, partitions=2) == []
    with caplog.at_level("WARNING", logger="retry_scheduler.loops.kafka"):
        assert TopicManager(base.with_overrides(topic_replication_factor=2)).ensure([two], create=True) == [
            two
        ]

    topics = AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=10).topics
    assert {p: len(m.replicas) for p, m in topics[one].partitions.items()} == {0: 1, 1: 1, 2: 1}
    assert {p: len(m.replicas) for p, m in topics[default].partitions.items()} == {0: 1, 1: 1}
    assert two not in topics
    assert f"could not create topic {two}" in caplog.text and "INVALID_REPLICATION_FACTOR" in caplog.text


def test_retry_topics_created_by_the_ingest_state_their_retention(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The retry and delay topics get the stated retention; an adopted topic (another tool's) the
    broker's."""
    from retry_scheduler.loops.kafka import ensure_retry_topics

    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        retry_topic=f"{topic_prefix}-retry",
        delay_topics={f"{topic_prefix}-retry.5m": 300_000},
        adopt_topics={f"{topic_prefix}-orders.DLT": "spring"},
        retry_topic_retention_ms=3 * 24 * 3600 * 1000,
    )
    ensure_retry_topics(settings, partitions=2)

    for own in (settings.retry_topic, f"{topic_prefix}-retry.5m"):
        config = topic_config(bootstrap_servers, own)
        assert (config.get("retention.ms"), config.get("retention.bytes")) == ("259200000", "-1"), own
    assert "retention.ms" not in topic_config(bootstrap_servers, f"{topic_prefix}-orders.DLT")
