"""The ingest's read-ahead (loops/read_ahead.py): which rows wait, when they are stored, and the offsets
stored with each batch. The loop itself is tested on the broker (tests/integration/test_read_ahead.py)."""

from __future__ import annotations

from retry_scheduler.core.jobs import CopyRow, pg_time
from retry_scheduler.loops.ingest_types import Batch
from retry_scheduler.loops.read_ahead import ROW_OVERHEAD_BYTES, ReadAhead

NOW_MS = 1_800_000_000_000
TOPIC = "retry"


def row(offset: int, due_in_s: float, partition: int = 0, **kw: object) -> CopyRow:
    fields: dict[str, object] = dict(
        source_topic=TOPIC, source_partition=partition, source_offset=offset, source_timestamp_ms=NOW_MS,
        destination="orders", destination_partition=None, msg_key=b"k", msg_value=b"v", headers=b"",
        attempt=1, policy="default", reason=None, error_class=None, consumer_group=None,
        retry_id=f"id-{partition}-{offset}", original_topic=None, original_partition=None,
        original_offset=None, first_seen_at=pg_time(NOW_MS), due_at=pg_time(NOW_MS + int(due_in_s * 1000)),
        status="pending", dead_reason=None, dlq_topic="dlq", dead_at=None,
    )  # fmt: skip
    fields.update(kw)
    return CopyRow(**fields)  # type: ignore[arg-type]


def batch(rows: list[CopyRow], **kw: object) -> Batch:
    offsets: dict[tuple[str, int], int] = {}
    for r in rows:
        offsets[(r.source_topic, r.source_partition)] = r.source_offset + 1
    return Batch(rows, offsets, messages=[f"msg{r.source_offset}" for r in rows], **kw)  # type: ignore[arg-type]


def offsets_of(b: Batch | None) -> list[int]:
    assert b is not None
    return [r.source_offset for r in b.rows]


def ahead(
    horizon_s: int = 30, max_mb: int = 256, marks: dict[tuple[str, int], int] | None = None
) -> ReadAhead:
    return ReadAhead(horizon_s * 1000, max_mb, batch_size=100, read_marks=marks or {})


def test_rows_due_later_wait_and_the_rest_is_stored_with_the_lowest_waiting_offset() -> None:
    a = ahead()
    stored = a.arrange(
        batch([row(0, 120), row(1, 120), row(2, 5), row(3, 120), row(4, 1)]), NOW_MS, caught_up=False
    )
    assert offsets_of(stored) == [2, 4]
    assert stored is not None
    # Kafka and PostgreSQL are told to start again from the lowest record not stored; read up to 5
    assert stored.offsets == {(TOPIC, 0): 0} and stored.read_to == {(TOPIC, 0): 5}
    assert a.waiting_rows == 3 and not stored.maybe_stored


def test_waiting_rows_are_stored_once_caught_up_in_the_order_read_and_the_offsets_move_on() -> None:
    a = ahead()
    a.arrange(batch([row(0, 120), row(1, 120)]), NOW_MS, caught_up=False)
    a.arrange(batch([row(2, 120), row(3, 2)]), NOW_MS, caught_up=False)
    stored = a.arrange(None, NOW_MS, caught_up=True)
    assert offsets_of(stored) == [0, 1, 2]
    assert stored is not None and stored.offsets == {(TOPIC, 0): 4} and stored.read_to == {(TOPIC, 0): 4}
    assert not stored.messages  # waiting rows keep no message object (their memory)
    assert a.waiting_rows == 0 and a.waiting_bytes == 0
    assert a.arrange(None, NOW_MS, caught_up=True) is None


def test_caught_up_stores_waiting_rows_a_batch_at_a_time() -> None:
    a = ahead()
    for start in range(0, 300, 50):
        a.arrange(batch([row(o, 120) for o in range(start, start + 50)]), NOW_MS, caught_up=False)
    stored = a.arrange(None, NOW_MS, caught_up=True)
    assert offsets_of(stored) == list(range(100))  # a batch (100 rows) of the oldest
    assert stored is not None and stored.offsets == {(TOPIC, 0): 100} and stored.read_to == {(TOPIC, 0): 300}


def test_rows_are_stored_when_their_due_time_comes_within_half_the_horizon() -> None:
    a = ahead(horizon_s=30)
    a.arrange(batch([row(0, 40), row(1, 300)]), NOW_MS, caught_up=False)
    assert a.arrange(None, NOW_MS + 20_000, caught_up=False) is None  # 20 s left: more than 15
    stored = a.arrange(None, NOW_MS + 26_000, caught_up=False)  # 14 s left
    assert offsets_of(stored) == [0, 1]  # a batch's waiting rows go together


def test_past_the_memory_allowed_the_oldest_waiting_rows_are_stored() -> None:
    a = ahead(max_mb=1)
    per_row = ROW_OVERHEAD_BYTES + 2  # the key and value of row()
    rows_per_mb = 1024 * 1024 // per_row
    a.arrange(batch([row(o, 120) for o in range(rows_per_mb)]), NOW_MS, caught_up=False)
    assert a.arrange(None, NOW_MS, caught_up=False) is None  # within the megabyte
    stored = a.arrange(batch([row(rows_per_mb, 120), row(rows_per_mb + 1, 1)]), NOW_MS, caught_up=False)
    assert offsets_of(stored) == [*range(rows_per_mb), rows_per_mb + 1]
    assert stored is not None and stored.offsets == {(TOPIC, 0): rows_per_mb}
    assert a.waiting_rows == 1


def test_dead_and_held_rows_never_wait() -> None:
    a = ahead()
    rows = [
        row(0, 120, status="dead", dead_reason="exhausted"),
        row(1, 10**6, held_by="head-id"),
        row(2, 120),
    ]
    assert offsets_of(a.arrange(batch(rows), NOW_MS, caught_up=False)) == [0, 1]


def test_an_ordered_mode_batch_stores_every_waiting_row_before_its_own() -> None:
    a = ahead()
    a.arrange(batch([row(0, 120), row(1, 120)]), NOW_MS, caught_up=False)
    events = [("key", "blocked", "id-0-2")]
    stored = a.arrange(batch([row(2, 120)], chain_events=events), NOW_MS, caught_up=False)
    assert offsets_of(stored) == [0, 1, 2]
    assert stored is not None and stored.chain_events == events and stored.offsets == {(TOPIC, 0): 3}


def test_each_partition_keeps_its_own_lowest_waiting_offset() -> None:
    a = ahead()
    stored = a.arrange(batch([row(0, 120, partition=0), row(0, 1, partition=1), row(1, 1, partition=1)]),
                       NOW_MS, caught_up=False)  # fmt: skip
    # partition 0 stores nothing yet: its next offset stays where its reading began
    assert stored is not None and stored.offsets == {(TOPIC, 0): 0, (TOPIC, 1): 2}
    stored = a.arrange(batch([row(1, 1, partition=0)]), NOW_MS, caught_up=False)
    assert stored is not None and stored.offsets == {(TOPIC, 0): 0} and stored.read_to == {(TOPIC, 0): 2}


def test_rows_read_again_below_the_mark_a_loop_before_stored_go_through_the_staging_path() -> None:
    a = ahead(marks={(TOPIC, 0): 10})
    stored = a.arrange(batch([row(6, 1), row(7, 1)]), NOW_MS, caught_up=False)
    assert stored is not None and stored.maybe_stored
    # the mark is kept until read past: a loop stopped here leaves the next one the same mark
    assert stored.read_to == {(TOPIC, 0): 10} and stored.offsets == {(TOPIC, 0): 8}
    stored = a.arrange(batch([row(8, 1), row(9, 1)]), NOW_MS, caught_up=False)
    assert stored is not None and stored.maybe_stored and stored.read_to == {(TOPIC, 0): 10}
    stored = a.arrange(batch([row(10, 1), row(11, 1)]), NOW_MS, caught_up=False)
    assert stored is not None and not stored.maybe_stored


def test_with_no_horizon_or_no_memory_nothing_waits() -> None:
    for a in (ahead(horizon_s=0), ahead(max_mb=0)):
        stored = a.arrange(batch([row(0, 120), row(1, 1)]), NOW_MS, caught_up=False)
        assert offsets_of(stored) == [0, 1]
        assert stored is not None and stored.offsets == {(TOPIC, 0): 2}
