"""Hostile records in front of ordinary ones on a real topic: ingestion goes on, the ordinary come back on time.

A header name of 70 000 characters (once it stopped ingestion for good: the stored encoding raised),
record timestamps in nanoseconds and microseconds (once a stored job due tens of thousands of years
later, or an overflow), a ``retry.at`` in the year 3000: each ends as a row, and the ordinary records
produced after them are published when due, never early.
"""

from __future__ import annotations

import time

import psycopg
from confluent_kafka import Producer
from psycopg.rows import dict_row

from retry_scheduler.core import protocol as p
from tests.integration.test_loop import Loop, hdr
from tests.kafkautil import consume, create_topics

LONG_NAME = "n" * 70_000


def produce_with_timestamps(bootstrap: str, topic: str, records: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[object] = []
    for rec in records:
        producer.produce(
            topic, key=rec["key"], value=rec["value"], headers=rec["headers"], timestamp=rec.get("timestamp", 0),
            on_delivery=lambda err, _m: errors.append(err) if err else None,
        )  # fmt: skip
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors


def test_hostile_records_do_not_halt_ingestion_and_ordinary_ones_come_back_on_time(loop: Loop) -> None:
    dlq = f"{loop.dest.rsplit('-', 1)[0]}-dlq"
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest, dlq], partitions=1)
    now_ms = int(time.time() * 1000)
    hostile = [
        {"key": b"long-name", "value": b"v", "headers": [*hdr(destination=loop.dest), (LONG_NAME, b"x")]},
        {
            "key": b"nanoseconds",
            "value": b"v",
            "headers": hdr(destination=loop.dest),
            "timestamp": now_ms * 1_000_000,
        },
        {
            "key": b"microseconds",
            "value": b"v",
            "headers": hdr(destination=loop.dest),
            "timestamp": now_ms * 1000,
        },
        {"key": b"year-3000", "value": b"v", "headers": hdr(destination=loop.dest, at="32503680000000")},
    ]
    due_ms = now_ms + 6_000
    ordinary = [
        {"key": f"ok-{i}".encode(), "value": b"v", "headers": hdr(destination=loop.dest, at=str(due_ms))}
        for i in range(20)
    ]
    # One partition: the hostile records sit in front of the ordinary ones.
    produce_with_timestamps(loop.bootstrap, loop.settings.retry_topic, [*hostile, *ordinary])

    counts = loop.ingest(expected=len(hostile) + len(ordinary))
    assert (counts.consumed, counts.stored) == (24, 24)
    assert counts.untrusted_timestamps == 2
    assert counts.dead == {p.DEAD_INVALID: 2}

    loop.publish(seconds=max(0.0, (due_ms - time.time() * 1000) / 1000) + 4)

    with psycopg.connect(loop.settings.database_url, row_factory=dict_row) as conn:
        rows = {
            bytes(r["msg_key"]).decode(): r
            for r in conn.execute(
                "SELECT msg_key, status, dead_reason, reason, due_at, published_at, dlq_published_at,"
                " source_timestamp_ms, first_seen_at, created_at FROM retry_jobs"
            )
        }
    assert rows["long-name"]["dead_reason"] == p.DEAD_INVALID
    assert "header name is 70000 characters long" in rows["long-name"]["reason"]
    assert rows["year-3000"]["dead_reason"] == p.DEAD_INVALID
    assert "retry.at=32503680000000 is more than 366d ahead" in rows["year-3000"]["reason"]
    for name, scale in (("nanoseconds", 1_000_000), ("microseconds", 1000)):
        row = rows[name]
        assert row["source_timestamp_ms"] == now_ms * scale  # the record's own, kept
        assert abs((row["first_seen_at"] - row["created_at"]).total_seconds()) < 60  # the ingest time counted
        assert row["status"] in ("pending", "published")
    for i in range(20):
        row = rows[f"ok-{i}"]
        assert row["status"] == "published", row
        late_s = (row["published_at"] - row["due_at"]).total_seconds()
        assert 0 <= late_s < 3, f"ok-{i} published {late_s:.3f} s after its due time"

    seen = consume(loop.bootstrap, [loop.dest], expected=20, timeout_s=30)
    assert sorted(s.key for s in seen if s.key.startswith(b"ok-")) == sorted(r["key"] for r in ordinary)
    dead = consume(loop.bootstrap, [dlq], expected=2, timeout_s=30)
    [long_one] = [s for s in dead if s.key == b"long-name"]
    assert (LONG_NAME, b"x") in long_one.headers  # the record as it came, its 70 000-character header too
    assert long_one.header(p.DEAD_REASON) == p.DEAD_INVALID
