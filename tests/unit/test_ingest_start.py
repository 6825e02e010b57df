"""Where the ingest starts reading a partition (``loops.offsets.start_offset``), and the ``retry.id`` a
record without one gets (``core.records.record_retry_id``): read twice, the same."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_STORED

from retry_scheduler.core.records import record_retry_id
from retry_scheduler.loops.offsets import commit_mark, start_offset

HERE = commit_mark("0f1e2d3c-0000-4000-8000-000000000001")
ELSEWHERE = commit_mark("0f1e2d3c-0000-4000-8000-000000000002")


@pytest.mark.parametrize(
    ("stored", "committed", "committed_mark", "start"),
    [
        (120, 120, HERE, 120),  # both: PostgreSQL's, the truth
        (120, 300, HERE, 120),  # Kafka's ahead (the replica lacked the last commits): PostgreSQL's
        (120, None, None, OFFSET_STORED),  # no Kafka offset: the group's reset (the partition may be new)
        (None, 300, ELSEWHERE, OFFSET_STORED),  # a new database: Kafka's
        (None, 300, None, OFFSET_STORED),  # committed by someone else, or before marks: Kafka's
        (None, 300, HERE, OFFSET_BEGINNING),  # this database stored from there and lost it: the start
        (None, -1001, HERE, OFFSET_STORED),  # no offset in Kafka either
        (None, None, None, OFFSET_STORED),
    ],
)
def test_where_the_ingest_starts_a_partition(
    stored: int | None, committed: int | None, committed_mark: str | None, start: int
) -> None:
    assert start_offset(stored, committed, committed_mark, HERE) == start


def test_a_record_without_a_retry_id_gets_the_same_one_each_time_it_is_read() -> None:
    first = record_retry_id("orders-retry", 3, 1_234, 1_700_000_000_000)
    assert first == record_retry_id("orders-retry", 3, 1_234, 1_700_000_000_000)
    assert uuid.UUID(first).version == 8 and str(uuid.UUID(first)) == first
    others = {
        record_retry_id("orders-retry", 3, 1_235, 1_700_000_000_000),
        record_retry_id("orders-retry", 2, 1_234, 1_700_000_000_000),
        record_retry_id("orders-retry", 3, 1_234, 1_700_000_000_001),
        record_retry_id("orders-retry", 3, 1_234, None),
        record_retry_id("orders-retr", 3, 1_234, 1_700_000_000_000),
        record_retry_id("\udcff", 3, 1_234, 1_700_000_000_000),  # a topic name that is not UTF-8
    }
    assert first not in others and len(others) == 6
