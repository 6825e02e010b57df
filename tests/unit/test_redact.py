"""Passwords never reach a message: every form of database URL or DSN is redacted."""

from __future__ import annotations

import pytest

from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.db.connection import redact_url

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (f"postgresql://svc:{SECRET}@db:5432/retry", "postgresql://svc:***@db:5432/retry"),
        (f"postgresql://svc@db/retry?password={SECRET}", "postgresql://svc@db/retry?password=***"),
        (
            f"postgresql://db/retry?sslmode=require&PASSWORD={SECRET}&x=1",
            "postgresql://db/retry?sslmode=require&PASSWORD=***&x=1",
        ),
        (f"postgresql://db/retry?sslpassword={SECRET}", "postgresql://db/retry?sslpassword=***"),
        (f"host=db user=svc password={SECRET} dbname=retry", "host=db user=svc password=*** dbname=retry"),
        (f"host=db password = '{SECRET} with spaces' dbname=retry", "host=db password = *** dbname=retry"),
        ("postgresql://svc@db/retry", "postgresql://svc@db/retry"),
    ],
)
def test_every_form_of_password_is_redacted(dsn: str, shown: str) -> None:
    assert redact_url(dsn) == shown
    assert SECRET not in redact_url(dsn)


def test_replication_factor_is_automatic_the_brokers_default_or_a_real_count() -> None:
    assert Settings().topic_replication_factor == 0  # 3, or the cluster's brokers when fewer
    assert Settings.from_env({"RETRY_TOPIC_REPLICATION_FACTOR": "3"}).topic_replication_factor == 3
    assert Settings.from_env({"RETRY_TOPIC_REPLICATION_FACTOR": "-1"}).topic_replication_factor == -1
    with pytest.raises(ConfigError, match="RETRY_TOPIC_REPLICATION_FACTOR must be 0"):
        Settings(topic_replication_factor=-2)


def test_min_insync_replicas_is_the_brokers_default_or_a_count_the_replicas_allow() -> None:
    assert Settings().topic_min_insync_replicas == 0
    settings = Settings.from_env(
        {"RETRY_TOPIC_REPLICATION_FACTOR": "3", "RETRY_TOPIC_MIN_INSYNC_REPLICAS": "2"}
    )
    assert (settings.topic_replication_factor, settings.topic_min_insync_replicas) == (3, 2)
    with pytest.raises(ConfigError, match="RETRY_TOPIC_MIN_INSYNC_REPLICAS must be 0"):
        Settings(topic_min_insync_replicas=-2)
    with pytest.raises(ConfigError, match=r"\(3\) is more than RETRY_TOPIC_REPLICATION_FACTOR \(2\)"):
        Settings(topic_replication_factor=2, topic_min_insync_replicas=3)
