"""The retry job: one row of ``retry_jobs``, its status machine, and the headers it goes out with."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from retry_scheduler.core import protocol
from retry_scheduler.core.headers import Header


class Status(enum.StrEnum):
    """Job status. ``pending`` waits for its due time; ``dead`` is kept for people to look at."""

    PENDING = "pending"
    PUBLISHED = "published"
    DEAD = "dead"


class CopyRow(NamedTuple):
    """One ``retry_jobs`` row as the ingest loop COPYs it: the table's column names, COPY's wire values.

    Times are binary-COPY ``timestamptz`` values (:func:`pg_time`); ``headers`` is encoded
    (:func:`encode_headers`); ``status`` is the enum's label.
    """

    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp_ms: int
    destination: str | None
    destination_partition: int | None
    msg_key: bytes | None
    msg_value: bytes | None
    headers: bytes
    attempt: int
    policy: str
    reason: str | None
    error_class: str | None
    consumer_group: str | None
    retry_id: str
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    first_seen_at: int
    due_at: int
    status: str
    dead_reason: str | None
    dlq_topic: str
    dead_at: int | None
    #: The ``retry.id`` this job is parked behind (``retry.hold``); its due time is then :data:`HELD_DUE`.
    held_by: str | None = None


#: The columns the ingest loop writes with one binary COPY, in order.
COPY_COLUMNS = CopyRow._fields
#: Their types on the wire. In binary COPY a ``timestamptz`` is the 8 bytes of an ``int8`` counting
#: microseconds since 2000-01-01 UTC (``pg_time``), and an enum is its label as ``text``: sending them
#: so spares the ingest loop building a datetime per timestamp.
COPY_TYPES = [
    "text", "int4", "int8", "int8", "text", "int4", "bytea", "bytea", "bytea", "int4", "text", "text", "text",
    "text", "text", "text", "int4", "int8", "int8", "int8", "text", "text", "text", "int8", "text",
]  # fmt: skip

_PG_EPOCH_MS = 946_684_800_000


def pg_time(ms: int) -> int:
    """Epoch milliseconds as a binary-COPY ``timestamptz``: microseconds since 2000-01-01 UTC."""
    return (ms - _PG_EPOCH_MS) * 1000


def ms_of_pg_time(us: int) -> int:
    return us // 1000 + _PG_EPOCH_MS


#: The due time of a held job (9999-12-31 UTC): never claimed until its chain is released, which sets
#: a real one. Not ``infinity``: PostgreSQL 15 cannot subtract it (the publish loop's next-due wait does).
HELD_DUE_MS = 253_402_214_400_000
HELD_DUE = pg_time(HELD_DUE_MS)


_HEADER = struct.Struct(">Hi")
#: A name longer than ``_HEADER`` can count: the marker ``(0, -2)``, then these two lengths.
_LONG_HEADER = struct.Struct(">Ii")
_LONG_MARK = _HEADER.pack(0, -2)
_MAX_SHORT_NAME = 0xFFFF


def encode_headers(headers: Iterable[Header]) -> bytes:
    """Pack headers (order and repeats kept, null values kept) into one ``bytea``.

    Each header is its name's length (2 bytes), its value's length (4 bytes, -1 for null), the name
    and the value. A name longer than 65 535 bytes (which only an invalid record can carry, kept as
    it came) is written as the marker ``(0, -2)`` followed by 4-byte lengths; the marker never
    occurs otherwise, so every blob stored before reads the same.
    """
    parts: list[bytes] = []
    for name, value in headers:
        key = name.encode("utf-8", "surrogateescape")
        value_len = -1 if value is None else len(value)
        if len(key) <= _MAX_SHORT_NAME:
            parts += (_HEADER.pack(len(key), value_len), key)
        else:
            parts += (_LONG_MARK, _LONG_HEADER.pack(len(key), value_len), key)
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def decode_headers(blob: bytes | memoryview | None) -> list[Header]:
    """Inverse of :func:`encode_headers`."""
    if not blob:
        return []
    data = bytes(blob)
    out: list[Header] = []
    pos = 0
    while pos < len(data):
        key_len, value_len = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        if key_len == 0 and value_len == -2:
            key_len, value_len = _LONG_HEADER.unpack_from(data, pos)
            pos += _LONG_HEADER.size
        key = data[pos : pos + key_len].decode("utf-8", "surrogateescape")
        pos += key_len
        if value_len < 0:
            out.append((key, None))
        else:
            out.append((key, data[pos : pos + value_len]))
            pos += value_len
    return out


def _common(row: OutgoingRow) -> list[Header]:
    out: list[Header] = [(protocol.ID, row.retry_id.encode())]
    if row.original_topic is not None:
        out.append((protocol.ORIGINAL_TOPIC, row.original_topic.encode()))
    if row.original_partition is not None:
        out.append((protocol.ORIGINAL_PARTITION, str(row.original_partition).encode()))
    if row.original_offset is not None:
        out.append((protocol.ORIGINAL_OFFSET, str(row.original_offset).encode()))
    out.append((protocol.ORIGINAL_TIMESTAMP, str(row.original_timestamp_ms).encode()))
    return out


class OutgoingRow(NamedTuple):
    """The columns a claimed job is published from (a named tuple: the publish loop builds thousands a
    second)."""

    id: int
    destination: str | None
    destination_partition: int | None
    key: bytes | None
    value: bytes | None
    headers: bytes | None
    attempt: int
    policy: str
    reason: str | None
    error_class: str | None
    consumer_group: str | None
    retry_id: str
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int
    dead_reason: str | None
    dlq_topic: str
    held_by: str | None = None
    #: When it fell due (claimed due jobs only): where the publisher's next claim may start.
    due_at: datetime | None = None
    #: A held job's chain: ``released`` or ``dead`` (how it was released), as ``retry.chain-state``;
    #: :data:`REPLAYED` for a job that was dead and is replayed.
    chain_state: str | None = None


#: :attr:`OutgoingRow.chain_state` of a job that was dead and is replayed (``dlq replay``, a bulk retry
#: of dead jobs): a head of a chain (ordered mode) whose chain went on without it, so it goes back
#: without its ``retry.blocks``; the consumer helper takes it for a new record of its key.
REPLAYED = "replayed"


#: The headers :func:`destination_headers` sets. A job's own earlier ones are left out of what it passes
#: through: a tool that copies a failed record's headers into its dead letter (Kafka Streams, Spring)
#: hands ours back, and a letter adopted ``:retry`` would otherwise go back with two ``retry.attempt``.
_SET_ON_DESTINATION = frozenset(
    {
        protocol.ATTEMPT, protocol.ID, protocol.ORIGINAL_TOPIC, protocol.ORIGINAL_PARTITION,
        protocol.ORIGINAL_OFFSET, protocol.ORIGINAL_TIMESTAMP,
    }
)  # fmt: skip


def destination_headers(row: OutgoingRow) -> list[Header]:
    """Headers of a retry published back to its destination: attempt raised, id and origin kept (each
    once: a passed-through header of the same name is left out).

    A released held job (ordered mode) did not fail: its attempt stays, ``retry.hold`` names the chain
    it waited in, which tells the consumer helper it is one of that chain, and ``retry.chain-state``
    how the chain was released (``dead``: its head died). A replayed head (:data:`REPLAYED`) goes back
    without its ``retry.blocks``."""
    passthrough: Sequence[Header] = [
        h for h in decode_headers(row.headers) if h[0] not in _SET_ON_DESTINATION
    ]
    if row.held_by is not None:
        held = [
            *passthrough,
            (protocol.ATTEMPT, str(row.attempt).encode()),
            *_common(row),
            (protocol.HOLD, row.held_by.encode()),
        ]
        if row.chain_state is not None:
            held.append((protocol.CHAIN_STATE, row.chain_state.encode()))
        return held
    if row.chain_state == REPLAYED:
        # Back from the dead letters: without its chain, and counted (retry.replays, one more).
        replays = replays_of(passthrough) + 1
        passthrough = [
            (name, value) for name, value in passthrough if name not in (protocol.BLOCKS, protocol.REPLAYS)
        ]
        passthrough.append((protocol.REPLAYS, str(replays).encode()))
    return [*passthrough, (protocol.ATTEMPT, str(row.attempt + 1).encode()), *_common(row)]


def replays_of(headers: Sequence[Header]) -> int:
    """How many times a record went back from the dead letters: its last ``retry.replays`` as a whole
    number (0 when it has none, or one that is not a whole number from 0 to 1 000 000)."""
    found = None
    for name, value in headers:
        if name == protocol.REPLAYS:
            found = value
    if found is None or not 0 < len(found) <= 7 or not found.isdigit():
        return 0
    return int(found)


def chain_headed(row: OutgoingRow) -> str | None:
    """The chain a job heads (ordered mode: its ``retry.blocks``, kept with its headers); None if none."""
    found = None
    for name, value in decode_headers(row.headers):
        if name == protocol.BLOCKS and value:
            found = value
    try:
        return None if found is None else found.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        return None


def dlq_headers(row: OutgoingRow) -> list[Header]:
    """Headers of a dead record on the DLQ topic: why it died and where it was going."""
    passthrough: Sequence[Header] = decode_headers(row.headers)
    if row.dead_reason == protocol.DEAD_INVALID:
        # The raw headers of an invalid record are kept for diagnosis, minus the ones we set.
        replaced = {protocol.ID, protocol.DEAD_REASON, protocol.REASON}
        passthrough = [h for h in passthrough if h[0] not in replaced]
        extra: list[Header] = [(protocol.ID, row.retry_id.encode())]
    else:
        extra = [(protocol.ATTEMPT, str(row.attempt).encode()), *_common(row)]
        if row.destination:
            extra.append((protocol.DESTINATION, row.destination.encode()))
        extra.append((protocol.POLICY, row.policy.encode()))
        if row.error_class:
            extra.append((protocol.ERROR_CLASS, row.error_class.encode()))
        if row.consumer_group:
            extra.append((protocol.GROUP, row.consumer_group.encode()))
    extra.append((protocol.DEAD_REASON, (row.dead_reason or "").encode()))
    if row.reason:
        extra.append((protocol.REASON, row.reason.encode()))
    return [*passthrough, *extra]
