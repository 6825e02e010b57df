"""A letter adopted ``:retry`` counts the retries its record already carries: a record that always fails
dies by its destination's policy instead of starting the policy over (issue 60's defect).

Pure logic, one boundary: the letters are built here as Kafka Streams and the broker's share-group
queue write them (Streams copies the failed record's headers, ours included, ahead of its own; a
share group's letter points at the record, whose headers the ingest reads back from its topic). The
same through the real loops and broker: ``tests/integration/test_adopt.py`` and
``tests/integration/test_share_groups.py``.
"""

from __future__ import annotations

import pytest

from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import (
    CopyRow,
    OutgoingRow,
    decode_headers,
    destination_headers,
    encode_headers,
    ms_of_pg_time,
)
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.core.records import RowBuilder, carried_attempt

NOW = 1_800_000_000_000
FIRST_FAILED = NOW - 3_600_000


def builder(max_attempts: int) -> RowBuilder:
    registry = PolicyRegistry.of(
        [Policy("work", delays=["10s", "20s", "40s"], max_attempts=max_attempts)],
        destinations={"work": "work"},
    )
    settings = Settings(adopt_topics={"work.streams-dlq": "streams:retry", "work.share-dlq": "share:retry"})
    return RowBuilder(Deployment(settings, registry))


def published(row: CopyRow) -> list[Header]:
    """The headers the publish loop sends a due job back to its destination with."""
    out = OutgoingRow(
        id=1, destination=row.destination, destination_partition=row.destination_partition, key=row.msg_key,
        value=row.msg_value, headers=row.headers, attempt=row.attempt, policy=row.policy, reason=row.reason,
        error_class=row.error_class, consumer_group=row.consumer_group, retry_id=row.retry_id,
        original_topic=row.original_topic, original_partition=row.original_partition,
        original_offset=row.original_offset, original_timestamp_ms=ms_of_pg_time(row.first_seen_at),
        dead_reason=row.dead_reason, dlq_topic=row.dlq_topic,
    )  # fmt: skip
    return destination_headers(out)


def streams_letter(record_headers: list[Header]) -> list[Header]:
    """Kafka Streams' letter (KIP-1034): the failed record's headers, then its own."""
    return [
        *record_headers,
        ("__streams.errors.exception", b"java.lang.IllegalStateException"),
        ("__streams.errors.message", b"boom"),
        ("__streams.errors.topic", b"work"),
        ("__streams.errors.partition", b"0"),
        ("__streams.errors.offset", b"7"),
    ]


def share_letter(deliveries: int) -> list[Header]:
    """The broker's share-group letter without a copy of the record (KIP-1191): a pointer."""
    return [
        ("__dlq.errors.topic", b"work"),
        ("__dlq.errors.partition", b"0"),
        ("__dlq.errors.offset", b"7"),
        ("__dlq.errors.group", b"workers"),
        ("__dlq.errors.delivery.count", str(deliveries).encode()),
        ("__dlq.errors.message", b"Offset rejected by client."),
    ]


@pytest.mark.parametrize("max_attempts", [3, 5, 8])
def test_a_streams_record_that_always_fails_dies_by_its_policy(max_attempts: int) -> None:
    rows = builder(max_attempts)
    record: list[Header] = [("trace", b"t-1")]  # the application's first record: none of ours
    jobs = []
    for n in range(max_attempts + 3):
        row = rows.row("work.streams-dlq", 0, n, NOW, b"k", b"v", streams_letter(record), NOW)
        assert row is not None
        jobs.append(row)
        if row.status == "dead":
            break
        record = published(row)  # what comes back to `work`, fails again, and Streams writes again
    # Attempts 0, 1, ... then dead, exhausted, after exactly max_attempts retries, one id throughout.
    assert [j.attempt for j in jobs] == list(range(max_attempts + 1))
    assert [j.status for j in jobs] == ["pending"] * max_attempts + ["dead"]
    assert jobs[-1].dead_reason == protocol.DEAD_EXHAUSTED
    assert len({j.retry_id for j in jobs}) == 1
    # Each retry waits its own delay: 10 s, 20 s, 40 s, then 40 s again (the schedule's last repeats).
    waits = [(ms_of_pg_time(j.due_at) - NOW) // 1000 for j in jobs[:-1]]
    assert waits == [10, 20, 40, 40, 40, 40, 40, 40][:max_attempts]


@pytest.mark.parametrize("max_attempts", [3, 5])
def test_a_share_record_that_always_fails_dies_by_its_policy(max_attempts: int) -> None:
    rows = builder(max_attempts)
    source: list[Header] = []  # the record on `work`, as the broker's letter points at it
    jobs = []
    for n in range(max_attempts + 3):
        row = rows.row("work.share-dlq", 0, n, NOW, None, None, share_letter(deliveries=1), NOW)
        assert row is not None and row.msg_value is None  # a pointer: the ingest reads the record back
        # What SourceReader.complete does, then the ingest's recount of a :retry letter.
        row = row._replace(msg_key=b"k", msg_value=b"v", headers=encode_headers(source) + row.headers)
        row = rows.recount(row, NOW)
        jobs.append(row)
        if row.status == "dead":
            break
        source = published(row)
    assert [j.attempt for j in jobs] == list(range(max_attempts + 1))
    assert jobs[-1].dead_reason == protocol.DEAD_EXHAUSTED


def test_a_share_groups_deliveries_add_to_the_retries_the_record_carries() -> None:
    rows = builder(5)
    source: list[Header] = [
        (protocol.ATTEMPT, b"2"),
        (protocol.ORIGINAL_TIMESTAMP, str(FIRST_FAILED).encode()),
    ]
    row = rows.row("work.share-dlq", 0, 0, NOW, None, None, share_letter(deliveries=3), NOW)
    assert row is not None and row.attempt == 2  # the deliveries less the first, before it is read back
    row = rows.recount(row._replace(headers=encode_headers(source) + row.headers), NOW)
    assert (row.attempt, ms_of_pg_time(row.first_seen_at)) == (4, FIRST_FAILED)
    assert (ms_of_pg_time(row.due_at) - NOW) // 1000 == 40  # the schedule's fifth delay: its last


def test_a_policys_maximum_age_counts_from_the_first_failure_the_record_carries() -> None:
    registry = PolicyRegistry.of(
        [Policy("work", delays=["10s"], max_attempts=50, max_age="30m")], {"work": "work"}
    )
    rows = RowBuilder(Deployment(Settings(adopt_topics={"w.dlq": "streams:retry"}), registry))
    carried = [(protocol.ATTEMPT, b"1"), (protocol.ORIGINAL_TIMESTAMP, str(FIRST_FAILED).encode())]
    row = rows.row("w.dlq", 0, 0, NOW, b"k", b"v", streams_letter(carried), NOW)
    assert row is not None
    assert (row.status, row.dead_reason) == ("dead", protocol.DEAD_EXPIRED)  # an hour old, 30 minutes allowed


@pytest.mark.parametrize(
    "value, expected",
    [(b"3", 3), (b" 7 ", 7), (b"-1", 0), (b"x", 0), (b"", 0), (None, 0), (b"99999999999", 0), (b"\xff", 0)],
)
def test_the_carried_attempt_is_a_whole_number_or_nothing(value: bytes | None, expected: int) -> None:
    assert carried_attempt([(protocol.ATTEMPT, b"1"), (protocol.ATTEMPT, value)]) == expected


def test_a_row_that_is_not_a_retried_letter_is_not_recounted() -> None:
    rows = builder(5)
    row = rows.row(
        "retry", 0, 0, NOW, b"k", b"v", [(protocol.DESTINATION, b"work"), (protocol.ATTEMPT, b"1")], NOW
    )
    assert row is not None
    assert rows.recount(row._replace(headers=b""), NOW) == row._replace(headers=b"")
    assert decode_headers(row.headers) == []


def test_a_hostile_attempt_is_exhausted_and_still_fits_the_column() -> None:
    rows = builder(5)
    # A letter written by whoever may write to the topic: a share group's delivery count (a Java short)
    # and a retry.attempt at the column's top.
    letter = [*share_letter(deliveries=32767), (protocol.ATTEMPT, b"2147483647")]
    row = rows.row("work.share-dlq", 0, 0, NOW, None, None, letter, NOW)
    assert row is not None
    assert (row.attempt, row.status, row.dead_reason) == (2**31 - 1, "dead", protocol.DEAD_EXHAUSTED)
    # The same top read back from the source record of a letter delivered twice.
    row = rows.row("work.share-dlq", 0, 1, NOW, None, None, share_letter(deliveries=2), NOW)
    assert row is not None and row.status == "pending"
    source = [(protocol.ATTEMPT, b"2147483647")]
    row = rows.recount(row._replace(headers=encode_headers(source) + row.headers), NOW)
    assert (row.attempt, row.status, row.dead_reason) == (2**31 - 1, "dead", protocol.DEAD_EXHAUSTED)


def test_a_tool_s_duplicate_letters_of_one_record_are_one_failure() -> None:
    """A Connect task restarted, or a Streams instance killed before it committed, writes a record's
    letter again: both letters get the same retry.id (named by the letter topic, the record's topic,
    partition and offset, and the group), so a replay of both publishes two identified duplicates."""
    rows = builder(3)
    first = rows.row("work.streams-dlq", 0, 10, NOW, b"k", b"v", streams_letter([]), NOW)
    again = rows.row("work.streams-dlq", 0, 11, NOW, b"k", b"v", streams_letter([]), NOW)
    assert first is not None and again is not None
    assert first.retry_id == again.retry_id and len(first.retry_id) == 36
    # Another record of the work topic, or the same one in another letter topic, is another failure.
    other = [(k, b"8" if k == "__streams.errors.offset" else v) for k, v in streams_letter([])]
    assert rows.row("work.streams-dlq", 0, 12, NOW, b"k", b"v", other, NOW).retry_id != first.retry_id  # type: ignore[union-attr]
    assert rows.row("work.share-dlq", 0, 1, NOW, None, None, share_letter(1), NOW).retry_id != first.retry_id  # type: ignore[union-attr]
    # A letter of a record we published carries its retry.id: that one counts.
    carried = rows.row(
        "work.streams-dlq", 0, 13, NOW, b"k", b"v", streams_letter([(protocol.ID, b"r-1")]), NOW
    )
    assert carried is not None and carried.retry_id == "r-1"
