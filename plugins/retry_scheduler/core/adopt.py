"""Dead-letter topics written by other tools, read as dead jobs: Spring Kafka's and Kafka Connect's.

A deployment names such topics and their format (``RETRY_ADOPT_TOPICS=orders.DLT=spring,
connect.dlq=connect``); the ingest loop reads them beside the retry topics and stores each record
as a dead job (reason ``adopted``) that is browsed, replayed and purged like the service's own:

* the record's original topic (``kafka_dlt-original-topic``, ``__connect.errors.topic``) is the
  job's destination, where a replay publishes it;
* the exception (class and message) is the job's error class and reason;
* the original partition, offset and timestamp, and the consumer group (Spring) or connector
  (Connect), are kept as the job's ``original_*`` fields and group.

The record is already on a dead-letter topic: it is not published to one again. Its key, value and
headers are kept byte for byte, the tool's headers included.

Spring Kafka (``DeadLetterPublishingRecoverer``) writes the partition as a 4-byte and the offset and
timestamp as 8-byte big-endian integers, and the texts in UTF-8. Kafka Connect
(``DeadLetterQueueReporter``, ``errors.deadletterqueue.context.headers.enable=true``) writes every
value as a UTF-8 string. A header missing or malformed is left out (the job still is adopted), but a
record that names no valid original topic cannot be replayed anywhere: it is stored as invalid, with
the reason.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from retry_scheduler.core import protocol
from retry_scheduler.core.headers import truncate_reason

SPRING: Final = "spring"
CONNECT: Final = "connect"
FORMATS: Final = (SPRING, CONNECT)


class AdoptError(ValueError):
    """A record of an adopted topic that cannot become a job (no valid original topic)."""


@dataclass(frozen=True)
class Adopted:
    """What a foreign dead letter says about its failure."""

    original_topic: str
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int | None
    error_class: str | None
    reason: str | None
    #: The consumer group (Spring) or the connector's name (Connect).
    group: str | None


_SPRING = {
    "topic": "kafka_dlt-original-topic",
    "partition": "kafka_dlt-original-partition",
    "offset": "kafka_dlt-original-offset",
    "timestamp": "kafka_dlt-original-timestamp",
    "error_class": "kafka_dlt-exception-fqcn",
    "cause_class": "kafka_dlt-exception-cause-fqcn",
    "reason": "kafka_dlt-exception-message",
    "group": "kafka_dlt-original-consumer-group",
}
_CONNECT = {
    "topic": "__connect.errors.topic",
    "partition": "__connect.errors.partition",
    "offset": "__connect.errors.offset",
    "error_class": "__connect.errors.exception.class.name",
    "reason": "__connect.errors.exception.message",
    "group": "__connect.errors.connector.name",
}
#: The headers each format is read from (the header protocol reference lists them).
HEADERS: Final[Mapping[str, Mapping[str, str]]] = {SPRING: _SPRING, CONNECT: _CONNECT}


def _first(headers: Sequence[tuple[str, bytes | None]], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _text(raw: bytes | None, max_chars: int) -> str | None:
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace").replace("\x00", "\ufffd")
    return text[:max_chars] if text else None


def _binary_int(raw: bytes | None, size: int, low: int) -> int | None:
    """Spring's big-endian int (4 bytes) or long (8 bytes); None when absent, of another size, or below ``low``."""
    if raw is None or len(raw) != size:
        return None
    value = struct.unpack(">i" if size == 4 else ">q", raw)[0]
    return value if value >= low else None


def _text_int(raw: bytes | None, low: int) -> int | None:
    """Connect's decimal string; None when absent, not a number, or out of ``low``..2**63-1."""
    text = _text(raw, 32)
    if text is None or not text.strip().lstrip("-").isdigit():
        return None
    value = int(text.strip())
    return value if low <= value < 2**63 else None


def _reason(text: str | None, max_chars: int) -> str | None:
    """The exception message, cut to ``max_chars`` saying so, as a ``retry.reason`` is."""
    return None if text is None else truncate_reason(text, max_chars)


def adopt(fmt: str, headers: Sequence[tuple[str, bytes | None]], max_reason_chars: int) -> Adopted:
    """Read a foreign dead letter's headers (``fmt``: ``spring`` or ``connect``).

    Raises :class:`AdoptError` when the original topic is missing or not a topic name.
    """
    names = HEADERS[fmt]
    topic = _text(_first(headers, names["topic"]), 300)
    if topic is None or not protocol.TOPIC_NAME.fullmatch(topic):
        raise AdoptError(
            f"a {fmt} dead letter must name its original topic in header {names['topic']}"
            + ("" if topic is None else f" (got {topic[:100]!r}, not a topic name)")
        )
    if fmt == SPRING:
        partition = _binary_int(_first(headers, names["partition"]), 4, 0)
        offset = _binary_int(_first(headers, names["offset"]), 8, 0)
        timestamp = _binary_int(_first(headers, names["timestamp"]), 8, 0)
    else:
        partition = _text_int(_first(headers, names["partition"]), 0)
        partition = partition if partition is not None and partition < 2**31 else None
        offset = _text_int(_first(headers, names["offset"]), 0)
        timestamp = None
    wrapper = _text(_first(headers, names["error_class"]), 300)
    # Spring wraps the listener's exception (ListenerExecutionFailedException says nothing): the cause
    # is the error class; the wrapper is kept in the reason (and, as every header, in the record).
    cause = _text(_first(headers, names["cause_class"]), 300) if "cause_class" in names else None
    reason = _text(_first(headers, names["reason"]), max_reason_chars + 1)
    if cause is not None and wrapper is not None and cause != wrapper:
        reason = f"{reason or ''} (in {wrapper})".lstrip()
    return Adopted(
        original_topic=topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp_ms=timestamp,
        error_class=cause or wrapper,
        reason=_reason(reason, max_reason_chars),
        group=_text(_first(headers, names["group"]), 300),
    )


def parse_adopt_topics(raw: str) -> dict[str, str]:
    """``orders.DLT=spring,connect.dlq=connect`` into ``{"orders.DLT": "spring", ...}``."""
    topics: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, fmt = (x.strip() for x in item.partition("="))
        if not sep or not protocol.TOPIC_NAME.fullmatch(name) or fmt not in FORMATS:
            raise ValueError(
                f"RETRY_ADOPT_TOPICS entry {item!r} must look like TOPIC=FORMAT with FORMAT one of "
                f"{', '.join(FORMATS)}, e.g. orders.DLT=spring"
            )
        topics[name] = fmt
    return topics
