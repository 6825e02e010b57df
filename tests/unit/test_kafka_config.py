"""What the service's producer sends with: Java's partitioner, no compression unless asked, idempotence."""

from __future__ import annotations

from retry_scheduler.core.config import Settings
from retry_scheduler.loops.kafka import producer_config


def test_records_go_out_uncompressed_with_the_java_partitioner() -> None:
    config = producer_config(Settings())
    assert config["compression.type"] == "none"  # not every consumer reads every codec (kafkajs: no LZ4)
    assert config["partitioner"] == "murmur2_random"  # where a Java producer puts the key
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")


def test_settings_may_ask_for_compression_but_not_weaken_delivery() -> None:
    kafka = {
        "bootstrap.servers": "k:9092",
        "compression.type": "zstd",
        "acks": "1",
        "enable.idempotence": False,
    }
    config = producer_config(Settings(kafka=kafka))
    assert config["compression.type"] == "zstd"
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")
