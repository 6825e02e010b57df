"""Parse and validate the ``retry.*`` header protocol of a record sent to a retry topic.

:func:`parse_headers` either returns a typed :class:`RetryHeaders` or raises
:class:`InvalidRecordError` whose message names the fault; the ingest loop turns that
into a dead job (``retry.dead-reason=invalid``), so bad input never stops ingestion.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from retry_scheduler import protocol

#: A Kafka header as confluent-kafka hands it over: key and value (None = null value).
Header = tuple[str, bytes | None]

#: Epoch milliseconds accepted in time headers: 1970 .. year 9999.
MAX_EPOCH_MS = 253_402_300_799_999
MAX_INT32 = 2**31 - 1
_INT = re.compile(r"-?[0-9]{1,20}")
_TRUNCATED = "...[truncated]"


class InvalidRecordError(ValueError):
    """The record's retry headers cannot be understood; the message says what is wrong."""


@dataclass(frozen=True)
class RetryHeaders:
    """The ``retry.*`` headers of one record, validated, plus the headers that pass through."""

    destination: str
    destination_partition: int | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int | None
    attempt: int
    at_ms: int | None
    policy: str | None
    reason: str | None
    error_class: str | None
    group: str | None
    send_to_dlq: bool
    retry_id: str | None
    passthrough: tuple[Header, ...]


@dataclass(frozen=True)
class Limits:
    """Validation limits (see ``Settings``)."""

    destination_allowlist: re.Pattern[str]
    forbidden_destinations: frozenset[str] = frozenset()
    max_headers: int = 256
    max_header_value_bytes: int = 1024
    max_reason_chars: int = 2000


def _text(name: str, raw: bytes | None, limits: Limits) -> str:
    if raw is None:
        raise InvalidRecordError(f"header {name} is null")
    if name != protocol.REASON and len(raw) > limits.max_header_value_bytes:
        raise InvalidRecordError(
            f"header {name} is {len(raw)} bytes, more than the {limits.max_header_value_bytes} allowed"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecordError(
            f"header {name} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _int(name: str, text: str, low: int, high: int) -> int:
    stripped = text.strip()
    if not _INT.fullmatch(stripped):
        raise InvalidRecordError(f"header {name}={text[:40]!r} is not an integer")
    value = int(stripped)
    if not low <= value <= high:
        raise InvalidRecordError(f"header {name}={value} is out of range [{low}, {high}]")
    return value


def truncate_reason(reason: str, max_chars: int) -> str:
    """Cut an error message to ``max_chars``, saying that it was cut."""
    if len(reason) <= max_chars:
        return reason
    return reason[: max(0, max_chars - len(_TRUNCATED))] + _TRUNCATED


def parse_headers(headers: Sequence[Header] | None, limits: Limits) -> RetryHeaders:
    """Validate the retry headers of one record; raise :class:`InvalidRecordError` on any fault."""
    headers = list(headers or ())
    if len(headers) > limits.max_headers:
        raise InvalidRecordError(
            f"record has {len(headers)} headers, more than the {limits.max_headers} allowed"
        )
    known: dict[str, str] = {}
    passthrough: list[Header] = []
    for name, raw in headers:
        if name not in protocol.KNOWN:
            passthrough.append((name, raw))
            continue
        if name in known:
            raise InvalidRecordError(f"header {name} appears more than once")
        known[name] = _text(name, raw, limits)

    destination = known.get(protocol.DESTINATION) or known.get(protocol.ORIGINAL_TOPIC)
    if not destination:
        raise InvalidRecordError(f"no destination: set {protocol.DESTINATION} or {protocol.ORIGINAL_TOPIC}")
    if destination in limits.forbidden_destinations or not limits.destination_allowlist.fullmatch(
        destination
    ):
        raise InvalidRecordError(f"destination {destination!r} is not allowed by the destination allowlist")

    send_to = known.get(protocol.SEND_TO, protocol.SEND_TO_RETRY).strip().lower()
    if send_to not in (protocol.SEND_TO_RETRY, protocol.SEND_TO_DLQ):
        raise InvalidRecordError(f"header {protocol.SEND_TO}={send_to[:40]!r} must be 'retry' or 'dlq'")

    def opt_int(name: str, low: int, high: int) -> int | None:
        text = known.get(name)
        return None if text is None else _int(name, text, low, high)

    partition = opt_int(protocol.ORIGINAL_PARTITION, 0, MAX_INT32)
    original_topic = known.get(protocol.ORIGINAL_TOPIC)
    # The original partition only means something on the original topic.
    same_topic = original_topic is None or original_topic == destination
    reason = known.get(protocol.REASON)
    return RetryHeaders(
        destination=destination,
        destination_partition=partition if same_topic else None,
        original_partition=partition,
        original_topic=original_topic,
        original_offset=opt_int(protocol.ORIGINAL_OFFSET, 0, 2**63 - 1),
        original_timestamp_ms=opt_int(protocol.ORIGINAL_TIMESTAMP, 0, MAX_EPOCH_MS),
        attempt=opt_int(protocol.ATTEMPT, 0, MAX_INT32) or 0,
        at_ms=opt_int(protocol.AT, 0, MAX_EPOCH_MS),
        policy=known.get(protocol.POLICY) or None,
        reason=None if reason is None else truncate_reason(reason, limits.max_reason_chars),
        error_class=known.get(protocol.ERROR_CLASS) or None,
        group=known.get(protocol.GROUP) or None,
        send_to_dlq=send_to == protocol.SEND_TO_DLQ,
        retry_id=known.get(protocol.ID) or None,
        passthrough=tuple(passthrough),
    )
