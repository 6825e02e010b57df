"""No record can halt ingestion: row building never raises, whatever a producer sends.

Property-based (hypothesis): arbitrary keys, values, header lists (names and values of any bytes and
lengths, duplicates, many of them, ``retry.*`` headers among them) and timestamps. Every record must
end as a pending or a dead row whose values COPY can send (every integer fits its column), a dead
``invalid`` row keeps the headers exactly as they came, and no job waits beyond the allowed window.
The examples that matter most are pinned as plain tests below.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import HELD_DUE, CopyRow, decode_headers, ms_of_pg_time, pg_time
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.core.records import MIN_TRUSTED_MS, RowBuilder

NOW = 1_800_000_000_000
SETTINGS = Settings(destination_allowlist=r"^orders(\..*)?$", delay_topics={"retry.5m": 300_000})
REGISTRY = PolicyRegistry.of(
    [Policy("default", delays=["10s", "1m"], max_attempts=3, max_age="1d"), Policy("slow", delays=["2h"])]
)
INT8 = range(-(2**63), 2**63)
INT4 = range(-(2**31), 2**31)
DAY_MS = 86_400_000

names = st.one_of(
    st.sampled_from(sorted(p.KNOWN)),
    st.text(max_size=40),
    st.text(min_size=1, max_size=3).map(lambda s: s * 30_000),  # longer than the 65 535-byte encoding
)
values = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.sampled_from([b"orders", b"orders.eu", b"0", b"1", b"-1", b"dlq", b"retry", b"slow", b"nope"]),
    # valid UTF-8 that no PostgreSQL text can hold
    st.sampled_from([b"\x00", b"orders\x00", b"or\x00ders", b"caf\xc3\xa9\x00"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda i: str(i).encode()),
    st.binary(min_size=1, max_size=2).map(lambda b: b * 3000),
)
headers = st.one_of(
    st.none(),
    # an allowed destination and other retry.* headers, each once: the records that pass as valid
    st.dictionaries(st.sampled_from(sorted(p.KNOWN - {p.DESTINATION})), values, max_size=6).map(
        lambda d: [(p.DESTINATION, b"orders"), *d.items()]
    ),
    st.lists(st.tuples(names, values), max_size=12),
    st.lists(st.tuples(st.sampled_from(["a", p.DESTINATION]), values), min_size=250, max_size=300),
)
timestamps = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([NOW, NOW * 1000, NOW * 1_000_000, NOW // 1000, 1, 0, NOW + 2 * DAY_MS]),
)


def build(
    ts: int | None, key: bytes | None, value: bytes | None, hs: list | None, topic: str = "retry"
) -> CopyRow:
    row = build_any(ts, key, value, hs, topic)
    assert row is not None
    return row


def build_any(
    ts: int | None, key: bytes | None, value: bytes | None, hs: list | None, topic: str = "retry"
) -> CopyRow | None:
    """The row; None for a release record, only when its chain's release was taken for the batch."""
    builder = RowBuilder(Deployment(SETTINGS, REGISTRY))
    row = builder.row(topic, 0, 7, ts, key, value, hs, NOW)
    events = builder.take_chain_events()
    if row is None:
        assert any(name == p.RELEASE for name, _ in hs or [])
        assert [state for _, state, _ in events] == [p.CHAIN_RELEASED]
    return row


def check_storable(row: CopyRow) -> None:
    assert isinstance(row, CopyRow)
    assert row.status in ("pending", "dead")
    assert (row.status == "dead") == (row.dead_reason is not None)
    for column in (
        "source_offset",
        "source_timestamp_ms",
        "first_seen_at",
        "due_at",
        "dead_at",
        "original_offset",
    ):
        value = getattr(row, column)
        assert value is None or value in INT8, column
    for column in ("source_partition", "attempt", "original_partition", "destination_partition"):
        value = getattr(row, column)
        assert value is None or value in INT4, column
    # never a job that waits for centuries: at most the allowed retry.at window, or the policy's delay;
    # only a held job waits for its chain's release, pending
    latest = NOW + max(SETTINGS.max_retry_ahead_ms, SETTINGS.max_clock_skew_ms + 2 * 3_600_000)
    if row.held_by is None:
        assert ms_of_pg_time(row.due_at) <= latest
    else:
        assert (row.due_at, row.status, row.dead_reason) == (HELD_DUE, "pending", None)
    assert ms_of_pg_time(row.first_seen_at) <= NOW + SETTINGS.max_clock_skew_ms


#: A consumed record, part by part (``build_any``'s arguments); the stored-rows test draws the same.
records = {
    "ts": timestamps,
    "key": st.one_of(st.none(), st.binary(max_size=64)),
    "value": st.one_of(st.none(), st.binary(max_size=64)),
    "hs": headers,
    "topic": st.sampled_from(["retry", "retry.5m"]),
}


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(**records)
def test_row_building_never_raises_and_every_record_ends_pending_or_dead(
    ts: int | None, key: bytes | None, value: bytes | None, hs: list | None, topic: str
) -> None:
    row = build_any(ts, key, value, hs, topic)
    if row is None:
        return  # a release record: it stores no job
    check_storable(row)
    assert (row.msg_key, row.msg_value) == (key, value)
    if row.dead_reason == p.DEAD_INVALID:
        assert row.reason  # names the fault
        assert decode_headers(row.headers) == list(hs or [])  # the record is kept as it came


def test_a_header_name_longer_than_the_limit_is_invalid_and_kept() -> None:
    long_name = "x" * 70_000
    hs = [(p.DESTINATION, b"orders"), (long_name, b"v"), ("trace", None)]
    row = build(NOW, b"k", b"v", hs)
    assert row.dead_reason == p.DEAD_INVALID
    assert "header name is 70000 characters long, more than the 1024 allowed" in str(row.reason)
    assert decode_headers(row.headers) == hs


@pytest.mark.parametrize(
    "ts",
    [NOW * 1_000_000, NOW * 1000, NOW // 1000, 1, NOW + 2 * DAY_MS],
    ids=["nanoseconds", "microseconds", "seconds", "1970", "two days ahead"],
)
def test_an_untrusted_record_timestamp_counts_from_the_ingest_time(ts: int) -> None:
    builder = RowBuilder(Deployment(SETTINGS, REGISTRY))
    row = builder.row("retry", 0, 1, ts, b"k", b"v", [(p.DESTINATION, b"orders")], NOW)
    assert (row.status, row.source_timestamp_ms) == ("pending", ts)  # the record's own is kept
    assert row.first_seen_at == pg_time(NOW)
    assert row.due_at == pg_time(NOW + 10_000)  # the first delay, from the ingest time
    assert builder.untrusted_timestamps == 1


def test_a_trusted_record_timestamp_is_where_delays_count_from() -> None:
    builder = RowBuilder(Deployment(SETTINGS, REGISTRY))
    row = builder.row("retry", 0, 1, NOW - 5_000, b"k", b"v", [(p.DESTINATION, b"orders")], NOW)
    assert row.due_at == pg_time(NOW + 5_000) and builder.untrusted_timestamps == 0


@pytest.mark.parametrize(
    ("header", "value", "reason"),
    [
        (p.AT, NOW + 400 * DAY_MS, "header retry.at=1834560000000 is more than 366d ahead"),
        (
            p.ORIGINAL_TIMESTAMP,
            NOW + 2 * DAY_MS,
            "header retry.original-timestamp=1800172800000 is more than 1d",
        ),
    ],
)
def test_retry_times_far_ahead_are_invalid(header: str, value: int, reason: str) -> None:
    row = build(NOW, b"k", b"v", [(p.DESTINATION, b"orders"), (header, str(value).encode())])
    assert row.dead_reason == p.DEAD_INVALID
    assert str(row.reason).startswith(reason), row.reason


def test_retry_at_in_the_past_is_due_now() -> None:
    """Documented: a ``retry.at`` in the past (0 included) means due at once."""
    row = build(NOW, b"k", b"v", [(p.DESTINATION, b"orders"), (p.AT, b"0")])
    assert row.status == "pending" and ms_of_pg_time(row.due_at) <= NOW


def test_a_fault_of_the_builder_itself_becomes_an_invalid_row() -> None:
    """Headers that are not (str, bytes) pairs make the parser fail: the record is still kept, dead."""
    row = build(NOW, b"k", b"v", [(p.DESTINATION, "orders-as-str")])  # type: ignore[list-item]
    check_storable(row)
    assert row.dead_reason == p.DEAD_INVALID and "could not" in str(row.reason)


def test_min_trusted_is_the_year_2000() -> None:
    assert time.gmtime(MIN_TRUSTED_MS / 1000)[:3] == (2000, 1, 1)


def test_a_held_record_waits_unfailed_and_a_release_stores_no_job() -> None:
    origin = [(p.ORIGINAL_TOPIC, b"orders"), (p.ORIGINAL_OFFSET, b"12"), (p.ATTEMPT, b"3")]
    held = build(NOW, b"k", b"v", [*origin, (p.HOLD, b" B ")])
    check_storable(held)
    assert (held.held_by, held.attempt, held.original_offset, held.destination) == ("B", 3, 12, "orders")
    assert build_any(NOW, b"k", None, [(p.ORIGINAL_TOPIC, b"orders"), (p.RELEASE, b"B")]) is None
    # a release to a destination not allowed is kept, invalid, like any such record
    refused = build(NOW, b"k", None, [(p.ORIGINAL_TOPIC, b"payments"), (p.RELEASE, b"B")])
    assert refused.dead_reason == p.DEAD_INVALID
