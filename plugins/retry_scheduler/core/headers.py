"""Parse and validate the ``retry.*`` header protocol of a record sent to a retry topic.

:func:`parse_headers` either returns a typed :class:`RetryHeaders` or raises
:class:`InvalidRecordError` whose message names the fault; the ingest loop turns that
into a dead job (``retry.dead-reason=invalid``), so bad input never stops ingestion.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from retry_scheduler.core import protocol
from retry_scheduler.core.destinations import Destinations

#: A Kafka header as confluent-kafka hands it over: key and value (None = null value).
Header = tuple[str, bytes | None]

#: Epoch milliseconds accepted in time headers: 1970 .. year 9999.
MAX_EPOCH_MS = 253_402_300_799_999
MAX_INT32 = 2**31 - 1
#: The longest ``retry.id`` a hold or release may name.
MAX_RETRY_ID_CHARS = 200
_INT = re.compile(r"-?[0-9]{1,20}")
_TRUNCATED = "...[truncated]"


class InvalidRecordError(ValueError):
    """The record's retry headers cannot be understood; the message says what is wrong."""


class RetryHeaders(NamedTuple):
    """The ``retry.*`` headers of one record, validated, plus the headers that pass through.

    A named tuple: the ingest loop builds one per record, and a tuple is the cheapest to build.
    """

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
    #: The topic whose policy applies when ``destination`` is a group's redelivery topic (``retry.scope``).
    scoped_from: str | None = None
    #: ``retry.hold``: the chain this record is parked in (the consumer helper's ordered mode).
    hold: str | None = None
    #: ``retry.release``: this is a release record; the chain whose held records may go.
    release: str | None = None
    #: ``retry.blocks``: this failed record heads the chain its key's later records wait in.
    blocks: str | None = None
    #: ``retry.chain-state`` on a parked record: ``released`` when its chain is flowing.
    chain_state: str | None = None


@dataclass(frozen=True)
class Limits:
    """Validation limits (see ``Settings``)."""

    destinations: Destinations
    max_headers: int = 256
    max_header_value_bytes: int = 1024
    max_reason_chars: int = 2000
    max_header_name_chars: int = 1024


def _text(name: str, raw: bytes | None, limits: Limits) -> str:
    if raw is None:
        raise InvalidRecordError(f"header {name} is null")
    if name != protocol.REASON and len(raw) > limits.max_header_value_bytes:
        raise InvalidRecordError(
            f"header {name} is {len(raw)} bytes, more than the {limits.max_header_value_bytes} allowed"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecordError(
            f"header {name} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    if "\x00" in text:
        raise InvalidRecordError(
            f"header {name} contains a NUL byte (at byte {raw.index(0)}), which a PostgreSQL text value "
            "cannot hold"
        )
    return text


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


def _int_header(name: str, raw: bytes | None, low: int, high: int, limits: Limits) -> int:
    # Fast path: plain ASCII digits, the form every well-behaved producer sends.
    if raw is not None and len(raw) <= 20 and raw.isdigit():
        value = int(raw)
        if low <= value <= high:
            return value
    return _int(name, _text(name, raw, limits), low, high)  # the exact fault, or a sign or spaces


def parse_headers(
    headers: Sequence[Header] | None,
    limits: Limits,
    *,
    record_bytes: int = 0,
    max_record_bytes: int | None = None,
) -> RetryHeaders:
    """Validate the retry headers of one record; raise :class:`InvalidRecordError` on any fault.

    With ``max_record_bytes``, the record (``record_bytes`` of key and value, plus its headers) must
    not be larger. On the ingest loop's hot path (tens of thousands of records a second): one pass
    over the headers, then each ``retry.*`` header decoded once.
    """
    raw, texts, passthrough = _scan(headers or (), limits, record_bytes, max_record_bytes)
    get = raw.get

    destination, scoped_from = _destination(texts, limits)

    send_to = texts.get(protocol.SEND_TO)
    if send_to is not None:
        send_to = send_to.strip().lower()
        if send_to not in (protocol.SEND_TO_RETRY, protocol.SEND_TO_DLQ):
            raise InvalidRecordError(f"header {protocol.SEND_TO}={send_to[:40]!r} must be 'retry' or 'dlq'")

    partition = offset = timestamp = at_ms = None
    attempt = 0
    if protocol.ORIGINAL_PARTITION in raw:
        partition = _int_header(
            protocol.ORIGINAL_PARTITION, get(protocol.ORIGINAL_PARTITION), 0, MAX_INT32, limits
        )
    if protocol.ORIGINAL_OFFSET in raw:
        offset = _int_header(protocol.ORIGINAL_OFFSET, get(protocol.ORIGINAL_OFFSET), 0, 2**63 - 1, limits)
    if protocol.ORIGINAL_TIMESTAMP in raw:
        timestamp = _int_header(
            protocol.ORIGINAL_TIMESTAMP, get(protocol.ORIGINAL_TIMESTAMP), 0, MAX_EPOCH_MS, limits
        )
    if protocol.ATTEMPT in raw:
        attempt = _int_header(protocol.ATTEMPT, get(protocol.ATTEMPT), 0, MAX_INT32, limits)
    if protocol.AT in raw:
        at_ms = _int_header(protocol.AT, get(protocol.AT), 0, MAX_EPOCH_MS, limits)
    original_topic = texts.get(protocol.ORIGINAL_TOPIC)
    # The original partition only means something on the original topic, and on its group's
    # redelivery topic, made with as many partitions: the key's retry comes back on the partition
    # numbered as its own, which the member reading the key reads too (ordered mode).
    same_topic = original_topic is None or original_topic == (scoped_from or destination)
    reason = texts.get(protocol.REASON)
    hold, release, blocks, chain_state = _chain_headers(texts, raw, passthrough)
    return RetryHeaders(
        destination,
        partition if same_topic else None,
        original_topic,
        partition,
        offset,
        timestamp,
        attempt,
        at_ms,
        texts.get(protocol.POLICY) or None,
        None if reason is None else truncate_reason(reason, limits.max_reason_chars),
        texts.get(protocol.ERROR_CLASS) or None,
        texts.get(protocol.GROUP) or None,
        send_to == protocol.SEND_TO_DLQ,
        texts.get(protocol.ID) or None,
        tuple(passthrough),
        scoped_from,
        None if hold is None else hold.strip(),
        None if release is None else release.strip(),
        None if blocks is None else blocks.strip(),
        chain_state,
    )


def _scan(
    headers: Sequence[Header], limits: Limits, record_bytes: int, max_record_bytes: int | None
) -> tuple[dict[str, bytes | None], dict[str, str], list[Header]]:
    """One pass over a record's headers: the ``retry.*`` ones by name (the last of a repeated one),
    those of them decoded as text, and the others, passed through; the counts and sizes checked."""
    if len(headers) > limits.max_headers:
        raise InvalidRecordError(
            f"record has {len(headers)} headers, more than the {limits.max_headers} allowed"
        )
    raw: dict[str, bytes | None] = {}
    texts: dict[str, str] = {}
    faulty: set[str] = set()
    passthrough: list[Header] = []
    size = record_bytes
    max_text_bytes = limits.max_header_value_bytes
    max_name = limits.max_header_name_chars
    for header in headers:
        name, value = header
        if len(name) > max_name:
            raise InvalidRecordError(
                f"a header name is {len(name)} characters long, more than the {max_name} allowed "
                f"(it starts {name[:40]!r})"
            )
        size += len(name) + len(value or b"")
        if name not in _KNOWN:
            passthrough.append(header)
        else:
            if name in raw:
                # Repeated (a client that copied the failed record's headers and added its own): the
                # last occurrence counts, as Java's Headers.lastHeader reads it; the earlier are dropped.
                texts.pop(name, None)
                faulty.discard(name)
            raw[name] = value
            if name not in _INT_HEADERS:
                # Decoded here when it is valid UTF-8 within its size limit, the usual case.
                # A NUL byte is valid UTF-8 but no PostgreSQL text can hold it: _text says so.
                if value is not None and (len(value) <= max_text_bytes or name == protocol.REASON):
                    try:
                        text = value.decode("utf-8")
                    except UnicodeDecodeError:
                        pass
                    else:
                        if "\x00" not in text:
                            texts[name] = text
                            continue
                faulty.add(name)
    if max_record_bytes is not None and size > max_record_bytes:
        raise InvalidRecordError(f"record is {size} bytes, more than the {max_record_bytes} allowed")
    for name in sorted(faulty):
        _text(name, raw[name], limits)  # raises the exact fault, after the checks above as ever
    return raw, texts, passthrough


def _destination(texts: dict[str, str], limits: Limits) -> tuple[str, str | None]:
    """Where the retry goes (a group's redelivery topic for ``retry.scope=group``), and the topic it
    was scoped from (None: not scoped); refused when the deployment does not allow it."""
    destination = texts.get(protocol.DESTINATION) or texts.get(protocol.ORIGINAL_TOPIC)
    if not destination:
        raise InvalidRecordError(f"no destination: set {protocol.DESTINATION} or {protocol.ORIGINAL_TOPIC}")
    scope, scoped_from = texts.get(protocol.SCOPE), None
    if scope is not None and scope.strip().lower() != protocol.SCOPE_TOPIC:
        if scope.strip().lower() != protocol.SCOPE_GROUP:
            raise InvalidRecordError(f"header {protocol.SCOPE}={scope[:40]!r} must be 'topic' or 'group'")
        group = texts.get(protocol.GROUP)
        if not group:
            raise InvalidRecordError(
                f"header {protocol.SCOPE}=group needs {protocol.GROUP}: the group whose redelivery topic the "
                "retry goes to"
            )
        try:
            scoped_from, destination = destination, protocol.redelivery_topic(destination, group)
        except ValueError as exc:
            raise InvalidRecordError(f"header {protocol.SCOPE}=group: {exc}") from None
    if (refusal := limits.destinations.refusal(destination)) is not None:
        raise InvalidRecordError(refusal)
    return destination, scoped_from


def _chain_headers(
    texts: dict[str, str], raw: dict[str, bytes | None], passthrough: list[Header]
) -> tuple[str | None, str | None, str | None, str | None]:
    """Ordered mode's headers: ``retry.hold``, ``retry.release``, ``retry.blocks`` (at most one,
    passed on with the record) and ``retry.chain-state``, checked."""
    hold, release = texts.get(protocol.HOLD), texts.get(protocol.RELEASE)
    blocks, chain_state = texts.get(protocol.BLOCKS), texts.get(protocol.CHAIN_STATE)
    if sum(name is not None for name in (hold, release, blocks)) > 1:
        raise InvalidRecordError(
            f"a record carries at most one of {protocol.HOLD}, {protocol.RELEASE} and {protocol.BLOCKS}"
        )
    for name, chain in ((protocol.HOLD, hold), (protocol.RELEASE, release), (protocol.BLOCKS, blocks)):
        if chain is not None and not 0 < len(chain.strip()) <= MAX_RETRY_ID_CHARS:
            raise InvalidRecordError(
                f"header {name} must name the key's chain (1 to {MAX_RETRY_ID_CHARS} characters)"
            )
    if chain_state is not None:
        if hold is None or chain_state.strip() != protocol.CHAIN_RELEASED:
            raise InvalidRecordError(
                f"header {protocol.CHAIN_STATE} is sent only as {protocol.CHAIN_RELEASED!r}, with {protocol.HOLD}"
            )
        chain_state = protocol.CHAIN_RELEASED
    if blocks is not None:
        # It comes back with the record: the helper tells its chain's head by it.
        passthrough.append((protocol.BLOCKS, raw[protocol.BLOCKS]))
    return hold, release, blocks, chain_state


_KNOWN = protocol.KNOWN
#: Integer headers, parsed from their bytes (``_int_header``) rather than decoded first.
_INT_HEADERS = frozenset(
    {
        protocol.ORIGINAL_PARTITION,
        protocol.ORIGINAL_OFFSET,
        protocol.ORIGINAL_TIMESTAMP,
        protocol.ATTEMPT,
        protocol.AT,
    }
)
