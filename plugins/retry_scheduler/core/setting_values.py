"""Settings' values read from text (the environment, a connection file): each parser names the setting
and what it expects when the text is wrong (:class:`ConfigError`), and never repeats a text that may
hold a password. :class:`retry_scheduler.core.config.Settings` is made with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from retry_scheduler.core.durations import parse_duration_ms
from retry_scheduler.core.protocol import HOLDS_TOPIC, TOPIC_NAME


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it and says what is expected."""


def parse_delay_topics(raw: str) -> dict[str, int]:
    """Parse ``retry.5m=5m,retry.1h=1h`` into ``{"retry.5m": 300000, ...}``."""
    topics: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, delay = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f"RETRY_DELAY_TOPICS entry {item!r} must look like TOPIC=DELAY, e.g. retry.5m=5m"
            )
        topics[name.strip()] = parse_duration_ms(delay.strip())
    return topics


def parse_holds_topics(raw: str) -> tuple[str, ...]:
    """``orders.holds,payments.holds``: the holds topics of the consumer helpers, beside ``retry.holds``."""
    topics = [HOLDS_TOPIC]
    for name in filter(None, (part.strip() for part in raw.split(","))):
        if not TOPIC_NAME.fullmatch(name):
            raise ConfigError(f"RETRY_HOLDS_TOPICS entry {name!r} is not a topic name ([A-Za-z0-9._-])")
        if name not in topics:
            topics.append(name)
    return tuple(topics)


def parse_adopt_setting(raw: str) -> dict[str, str]:
    from retry_scheduler.core.adopt import parse_adopt_topics

    try:
        return parse_adopt_topics(raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def kafka_config_from_json(text: str, where: str) -> dict[str, Any]:
    """librdkafka settings from a JSON object (``RETRY_KAFKA_CONFIG``, a connection file).

    The error names ``where`` the text came from and never repeats the text: it may hold passwords.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc.msg} at character {exc.pos})") from None
    return checked_kafka_config(config, where)


def checked_kafka_config(config: object, where: str) -> dict[str, Any]:
    """``config`` if it is an object of librdkafka settings (scalar values); else an error naming ``where``."""
    if not isinstance(config, dict) or not all(
        isinstance(v, str | int | float | bool) for v in config.values()
    ):
        raise ConfigError(
            f'{where} must be a JSON object of librdkafka settings, e.g. {{"security.protocol": "SASL_SSL"}}'
        )
    return config


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} must be true or false")


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be an integer") from None
