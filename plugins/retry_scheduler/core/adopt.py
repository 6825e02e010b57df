"""Dead-letter topics written by other tools, read as dead jobs: Spring Kafka's, Kafka Connect's, Kafka
Streams' and the broker's for share groups.

A deployment names such topics and their format (``RETRY_ADOPT_TOPICS=orders-dlt=spring,
connect.dlq=connect,clicks.dlq=streams,dlq.work=share``); the ingest loop reads them beside the retry
topics and stores each record as a dead job (reason ``adopted``) that is browsed, replayed and purged
like the service's own:

* the record's original topic (``kafka_dlt-original-topic``, ``__connect.errors.topic``,
  ``__streams.errors.topic``, ``__dlq.errors.topic``) is the job's destination, where a replay
  publishes it;
* the exception (class and message) is the job's error class and reason;
* the original partition, offset and timestamp, and the consumer group (Spring, share groups) or
  connector (Connect), are kept as the job's ``original_*`` fields and group; a share group's
  deliveries less the first are the job's attempt (retries already made).

The record is already on a dead-letter topic: it is not published to one again. Its key, value and
headers are kept byte for byte, the tool's headers included. With ``TOPIC=FORMAT:retry`` the letters
are not kept dead but retried: scheduled by their destination's policy and published back to their
original topic when due. The attempt counts the retries already made: the ``retry.attempt`` the
record carries (a record this service published and that failed again: Streams, Spring and Connect
copy its headers into their letter, a share group's letter points at it), plus a share group's
deliveries less one; so a record that always fails dies by its policy
(:meth:`retry_scheduler.core.records.RowBuilder.recount`).

Spring Kafka (``DeadLetterPublishingRecoverer``) writes the partition as a 4-byte and the offset and
timestamp as 8-byte big-endian integers, and the texts in UTF-8. Kafka Connect
(``DeadLetterQueueReporter``, ``errors.deadletterqueue.context.headers.enable=true``), Kafka Streams
(``ExceptionHandlerUtils.buildDeadLetterQueueRecord``, KIP-1034, 4.2) and the broker's share-group
dead-letter queue (``ShareGroupDLQ``, KIP-1191) write every value as a UTF-8 string. A header missing
or malformed is left out (the job still is adopted), but a record that names no valid original topic
cannot be replayed anywhere: it is stored as invalid, with the reason.

Every tool copies the failed record's own headers ahead of its own (the broker's share-group letter
holds none), so a record that failed in a tool before carries the older letter's headers first: the
last of each name counts for Streams and share groups; for Spring (which strips older exception
headers and appends the original-* ones) and Connect, the first original-* ones, where the record
first failed, and Connect's last exception. Spring names the cause its listener's exception wraps
(``kafka_dlt-exception-cause-fqcn``), and its ``@RetryableTopic`` letters use the same headers
without "dlt" in their names (:data:`SPRING_RETRYABLE`). Connect names only its converter's wrapper
(``DataException``, "... failed due to serialization error: "), and the cause is read from the stack
trace's last ``Caused by:`` line (:func:`root_cause`). All found by the tools' own programs
(``tests/interop/``).

A share group's letter holds the source record's key and value only with
``errors.deadletterqueue.copy.record.enable``; without, it is a pointer (no key, no value, no headers
of the source) that the ingest loop completes from the source topic
(:mod:`retry_scheduler.loops.sources`).
"""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from retry_scheduler.core import protocol
from retry_scheduler.core.headers import truncate_reason

SPRING: Final = "spring"
CONNECT: Final = "connect"
STREAMS: Final = "streams"
SHARE: Final = "share"
FORMATS: Final = (SPRING, CONNECT, STREAMS, SHARE)
#: ``TOPIC=FORMAT:retry``: the letters are retried by their destination's policy instead of kept dead.
RETRY: Final = "retry"
#: Who wrote a dead letter: this service (read from its retry topics), or the tool whose dead-letter
#: topic it was read from (its format).
SERVICE: Final = "retry-scheduler"
WRITERS: Final = (SERVICE, *FORMATS)


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
    #: The consumer group (Spring, share groups) or the connector's name (Connect).
    group: str | None
    #: How many times a share group delivered the record (``__dlq.errors.delivery.count``).
    delivery_count: int | None = None

    def failure_id(self, letter_topic: str) -> str | None:
        """The ``retry.id`` of a letter that carries none: the same for every letter of one record on
        ``letter_topic`` (a UUID named by that topic, the record's topic, partition and offset, and the
        group), so that a tool's duplicate letters (a Connect task restarted, a Streams instance killed
        before it committed) are identified as one failure. None when the letter names no partition or
        offset."""
        if self.original_partition is None or self.original_offset is None:
            return None
        name = "\0".join(
            (letter_topic, self.original_topic, str(self.original_partition), str(self.original_offset),
             self.group or "")
        )  # fmt: skip
        return str(uuid.uuid5(_LETTERS, name))


#: The namespace of :meth:`Adopted.failure_id`'s UUIDs.
_LETTERS: Final = uuid.UUID("6f1c3b1e-5a7d-4c1e-9a38-2b0f3d9e4c71")


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
#: Spring Kafka's non-blocking retries (``@RetryableTopic``) write their ``<topic>-dlt`` letters with
#: ``KafkaHeaders``' names that do not say "dlt" (``kafka_original-topic``, ``kafka_exception-fqcn``);
#: the consumer group's is the same. Read when a Spring letter has no ``kafka_dlt-original-topic``.
SPRING_RETRYABLE: Final[Mapping[str, str]] = {
    field: name if field == "group" else name.replace("kafka_dlt-", "kafka_", 1)
    for field, name in _SPRING.items()
}
_CONNECT = {
    "topic": "__connect.errors.topic",
    "partition": "__connect.errors.partition",
    "offset": "__connect.errors.offset",
    "error_class": "__connect.errors.exception.class.name",
    "reason": "__connect.errors.exception.message",
    "group": "__connect.errors.connector.name",
    "stacktrace": "__connect.errors.exception.stacktrace",
}
# Kafka Streams 4.2+: org.apache.kafka.streams.errors.internals.ExceptionHandlerUtils (KIP-1034).
_STREAMS = {
    "topic": "__streams.errors.topic",
    "partition": "__streams.errors.partition",
    "offset": "__streams.errors.offset",
    "error_class": "__streams.errors.exception",
    "reason": "__streams.errors.message",
}
# The broker, for a share group with errors.deadletterqueue.topic.name (KIP-1191): ShareGroupDLQ's headers.
_SHARE = {
    "topic": "__dlq.errors.topic",
    "partition": "__dlq.errors.partition",
    "offset": "__dlq.errors.offset",
    "group": "__dlq.errors.group",
    "delivery_count": "__dlq.errors.delivery.count",
    "reason": "__dlq.errors.message",
}
#: The headers each format is read from (the header protocol reference lists them).
HEADERS: Final[Mapping[str, Mapping[str, str]]] = {
    SPRING: _SPRING,
    CONNECT: _CONNECT,
    STREAMS: _STREAMS,
    SHARE: _SHARE,
}


def source_format(spec: str) -> str:
    """The format of an adopted topic's spec (``share`` of ``share:retry``)."""
    return spec.partition(":")[0]


def topics_of(fmt: str, adopt_topics: Mapping[str, str]) -> list[str]:
    """The adopted topics (``RETRY_ADOPT_TOPICS``: topic -> spec) of format ``fmt``, sorted."""
    return sorted(topic for topic, spec in adopt_topics.items() if source_format(spec) == fmt)


def retried(spec: str) -> bool:
    """Whether an adopted topic's letters are retried by policy (``FORMAT:retry``) rather than kept dead."""
    return spec.partition(":")[2] == RETRY


def _first(headers: Sequence[tuple[str, bytes | None]], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _last(headers: Sequence[tuple[str, bytes | None]], name: str) -> bytes | None:
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found


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


def adopt(spec: str, headers: Sequence[tuple[str, bytes | None]], max_reason_chars: int) -> Adopted:
    """Read a foreign dead letter's headers (``spec``: a format of :data:`FORMATS`, ``:retry`` or not).

    Raises :class:`AdoptError` when the original topic is missing or not a topic name.
    """
    fmt = source_format(spec)
    names = HEADERS[fmt]
    header = _first if fmt in (SPRING, CONNECT) else _last
    if (
        fmt == SPRING
        and header(headers, names["topic"]) is None
        and header(headers, SPRING_RETRYABLE["topic"])
    ):
        names = SPRING_RETRYABLE
    topic = _text(header(headers, names["topic"]), 300)
    if topic is None or not protocol.TOPIC_NAME.fullmatch(topic):
        raise AdoptError(
            f"a {fmt} dead letter must name its original topic in header {names['topic']}"
            + ("" if topic is None else f" (got {topic[:100]!r}, not a topic name)")
        )
    timestamp = delivery_count = None
    if fmt == SPRING:
        partition = _binary_int(header(headers, names["partition"]), 4, 0)
        offset = _binary_int(header(headers, names["offset"]), 8, 0)
        timestamp = _binary_int(header(headers, names["timestamp"]), 8, 0)
    else:
        partition = _text_int(header(headers, names["partition"]), 0)
        partition = partition if partition is not None and partition < 2**31 else None
        offset = _text_int(header(headers, names["offset"]), 0)
    if "delivery_count" in names:
        delivery_count = _text_int(header(headers, names["delivery_count"]), 0)
        delivery_count = delivery_count if delivery_count is not None and delivery_count < 2**15 else None
    # A letter of a record that failed before (published back by a :retry) holds the older failure's
    # headers too: Connect adds its own after them, so its newest exception is the last.
    failure = _last if fmt == CONNECT else header
    wrapper = _text(failure(headers, names["error_class"]), 300) if "error_class" in names else None
    # Spring wraps the listener's exception (ListenerExecutionFailedException says nothing): the cause
    # is the error class; the wrapper is kept in the reason (and, as every header, in the record).
    cause = _text(header(headers, names["cause_class"]), 300) if "cause_class" in names else None
    reason = _text(failure(headers, names["reason"]), max_reason_chars + 1)
    if "stacktrace" in names and cause is None:
        # Connect's converter wraps the error (DataException, "... failed due to serialization error: ")
        # and names the cause only in the stack trace: its last "Caused by:" is the error class, and its
        # message completes the reason.
        root = root_cause(failure(headers, names["stacktrace"]))
        if root is not None:
            cause, because = root
            reason = f"{(reason or '').rstrip()} {because}".strip() if because else reason
    if cause is not None and wrapper is not None and cause != wrapper:
        reason = f"{reason or ''} (in {wrapper})".lstrip()
    return Adopted(
        original_topic=topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp_ms=timestamp,
        error_class=cause or wrapper,
        reason=_reason(reason, max_reason_chars),
        group=_text(header(headers, names["group"]), 300) if "group" in names else None,
        delivery_count=delivery_count,
    )


#: A Java class's binary name (``com.fasterxml.jackson.core.JsonParseException``, ``a.B$C``).
_JAVA_CLASS: Final = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*")
#: How much of a stack trace is read for its causes.
_TRACE_CHARS: Final = 65_536


def root_cause(trace: bytes | None) -> tuple[str, str] | None:
    """The class and message of the last ``Caused by:`` line of a Java stack trace (its first
    :data:`_TRACE_CHARS` characters); None without one, or when what it names is not a class."""
    text = _text(trace[: _TRACE_CHARS * 2] if trace else None, _TRACE_CHARS)
    last = None
    for line in (text or "").splitlines():
        if line.startswith("Caused by: "):
            last = line[len("Caused by: ") :]
    if last is None:
        return None
    name, _, message = last.partition(": ")
    name = name.strip()
    return (name, message.strip()) if len(name) <= 300 and _JAVA_CLASS.fullmatch(name) else None


def parse_adopt_topics(raw: str) -> dict[str, str]:
    """``orders-dlt=spring,dlq.work=share:retry`` into ``{"orders-dlt": "spring", "dlq.work": "share:retry"}``."""
    topics: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, spec = (x.strip() for x in item.partition("="))
        fmt, colon, mode = (x.strip() for x in spec.partition(":"))
        if (
            not sep
            or not protocol.TOPIC_NAME.fullmatch(name)
            or fmt not in FORMATS
            or (colon and mode != RETRY)
        ):
            raise ValueError(
                f"RETRY_ADOPT_TOPICS entry {item!r} must look like TOPIC=FORMAT or TOPIC=FORMAT:retry with "
                f"FORMAT one of {', '.join(FORMATS)}, e.g. orders-dlt=spring or dlq.work=share:retry"
            )
        topics[name] = f"{fmt}:{RETRY}" if colon else fmt
    return topics
