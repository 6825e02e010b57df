"""The rules a complete set of settings must keep: each broken one raises :class:`ConfigError` naming
the setting, what it must be, and why (a value that could lose or duplicate work is refused at start)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from retry_scheduler.core.setting_values import ConfigError

if TYPE_CHECKING:
    from retry_scheduler.core.config import Settings


def check_settings(s: Settings) -> None:
    """Raise :class:`ConfigError` for the first rule ``s`` breaks."""
    if clash := sorted(set(s.adopt_topics) & {s.retry_topic, *s.delay_topics}):
        raise ConfigError(
            f"RETRY_ADOPT_TOPICS names {', '.join(clash)}, a retry topic of this service: adopt only "
            "other tools' dead-letter topics"
        )
    if s.delivery_timeout_ms >= s.lease_ms:
        raise ConfigError(
            f"delivery timeout ({s.delivery_timeout_ms} ms) must be shorter than the claim "
            f"lease ({s.lease_ms} ms), or a job in flight could be claimed twice"
        )
    if s.ingest_workers < 1:
        raise ConfigError(f"RETRY_INGEST_WORKERS must be at least 1, not {s.ingest_workers}")
    if s.topic_replication_factor < -1:
        raise ConfigError(
            "RETRY_TOPIC_REPLICATION_FACTOR must be 0 (3, or the cluster's brokers when fewer), -1 (the "
            f"broker's default) or at least 1, not {s.topic_replication_factor}"
        )
    if s.topic_min_insync_replicas < -1:
        raise ConfigError(
            "RETRY_TOPIC_MIN_INSYNC_REPLICAS must be 0 (2 with three replicas or more, else 1), -1 (the "
            f"broker's default) or at least 1, not {s.topic_min_insync_replicas}"
        )
    if s.retry_topic_retention_ms < 60_000 and s.retry_topic_retention_ms != -1:
        raise ConfigError(
            "RETRY_TOPIC_RETENTION_MS must be at least 60000 (a minute) or -1 (kept for ever), "
            f"not {s.retry_topic_retention_ms}"
        )
    if s.retry_topic_retention_bytes == 0 or s.retry_topic_retention_bytes < -1:
        raise ConfigError(
            "RETRY_TOPIC_RETENTION_BYTES must be a positive number of bytes or -1 (no size bound), "
            f"not {s.retry_topic_retention_bytes}"
        )
    if 0 < s.topic_replication_factor < s.topic_min_insync_replicas:
        raise ConfigError(
            f"RETRY_TOPIC_MIN_INSYNC_REPLICAS ({s.topic_min_insync_replicas}) is more than "
            f"RETRY_TOPIC_REPLICATION_FACTOR ({s.topic_replication_factor}): no write could succeed"
        )
    if s.max_clock_skew_ms < 0 or s.max_retry_ahead_ms < 0:
        raise ConfigError("RETRY_MAX_CLOCK_SKEW_MS and RETRY_MAX_RETRY_AHEAD_MS must be >= 0")
    if s.replay_approval_above < 0:
        raise ConfigError(
            f"RETRY_REPLAY_APPROVAL_ABOVE must be >= 0 (0: no approval), not {s.replay_approval_above}"
        )
    if s.park_after_replays < 0:
        raise ConfigError(
            f"RETRY_PARK_AFTER_REPLAYS must be >= 0 (0: never park), not {s.park_after_replays}"
        )
    if s.max_header_name_chars < 1:
        raise ConfigError(f"RETRY_MAX_HEADER_NAME_CHARS must be at least 1, not {s.max_header_name_chars}")
    if s.publish_workers < 1:
        raise ConfigError(f"RETRY_PUBLISH_WORKERS must be at least 1, not {s.publish_workers}")
    if not 1 <= s.publish_tasks <= 32:
        raise ConfigError(f"RETRY_PUBLISH_TASKS must be from 1 to 32, not {s.publish_tasks}")
    try:
        re.compile(s.destination_allowlist)
    except re.error as exc:
        raise ConfigError(f"RETRY_DESTINATION_ALLOWLIST is not a valid regex: {exc}") from None
