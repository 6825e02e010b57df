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

from bench.chaos.topics import PERMISSIVE_TOPIC_CONFIG
from retry_scheduler.core import protocol as p
from retry_scheduler.core.jobs import decode_headers
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
    # Topics that take any timestamp (Kafka 4 refuses one over an hour ahead by default; older
    # brokers, and topics configured so, deliver them)
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest, dlq], partitions=1,
                  config=PERMISSIVE_TOPIC_CONFIG)  # fmt: skip
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
                " source_timestamp_ms, first_seen_at, created_at FROM retry_jobs_all"
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


#: Every ``retry.*`` header stored as text, with a NUL byte in it (valid UTF-8, refused by PostgreSQL's text).
NUL_HEADERS = [
    p.REASON, p.ERROR_CLASS, p.ID, p.GROUP, p.ORIGINAL_TOPIC, p.DESTINATION, p.POLICY, p.HOLD, p.RELEASE,
    p.SCOPE, p.SEND_TO,
]  # fmt: skip


#: The headers the service sets on a dead letter of an invalid record, in place of the record's own.
SET_ON_DLQ = {p.ID, p.REASON, p.DEAD_REASON}


def test_a_nul_byte_in_any_text_header_makes_the_record_invalid_and_kept(loop: Loop) -> None:
    """Once one such record stopped ingestion: the batch's COPY failed, and was read again every run."""
    dlq = f"{loop.dest.rsplit('-', 1)[0]}-dlq"
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest, dlq], partitions=1)
    hostile = []
    for name in NUL_HEADERS:
        value = loop.dest.encode() if name in (p.DESTINATION, p.ORIGINAL_TOPIC) else b"ab"
        headers = [(k, v) for k, v in hdr(destination=loop.dest) if k != name]
        headers += [("trace", b"\x00\xff"), (name, value[:1] + b"\x00" + value[1:])]
        hostile.append({"key": name.encode(), "value": b"\x00v", "headers": headers})
    ordinary = [
        {"key": b"ok-%d" % i, "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(10)
    ]
    produce_with_timestamps(loop.bootstrap, loop.settings.retry_topic, [*hostile, *ordinary])

    counts = loop.ingest(expected=len(hostile) + len(ordinary))
    assert (counts.consumed, counts.stored) == (len(hostile) + 10, len(hostile) + 10)
    assert counts.dead == {p.DEAD_INVALID: len(hostile)}
    rows = {bytes(r["msg_key"]): r for r in loop.rows()}
    for rec in hostile:
        row = rows[rec["key"]]
        assert row["dead_reason"] == p.DEAD_INVALID
        assert f"header {rec['key'].decode()} contains a NUL byte" in row["reason"], row["reason"]
        assert decode_headers(row["headers"]) == rec["headers"]  # stored byte for byte, the NUL too
    assert all(rows[r["key"]]["status"] == "pending" for r in ordinary)

    loop.publish(seconds=3)
    dead = consume(loop.bootstrap, [dlq], expected=len(hostile), timeout_s=30)
    assert sorted(s.key for s in dead) == sorted(r["key"] for r in hostile)
    for seen in dead:
        [rec] = [r for r in hostile if r["key"] == seen.key]
        assert seen.value == b"\x00v"
        # As they came, the NUL byte too, but for the three headers the service sets on a dead letter.
        sent = [h for h in rec["headers"] if h[0] not in SET_ON_DLQ]
        assert seen.headers[: len(sent)] == sent
        assert seen.header(p.DEAD_REASON) == p.DEAD_INVALID


def test_a_record_the_server_refuses_is_stored_dead_and_the_rest_of_its_batch_is_stored(
    latin1_database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Defence in depth, forced with a record the row builder accepts and the server refuses: in a LATIN1
    database, a euro sign or Japanese in a text header. The batch is split until those are found; they
    are stored dead with the server's error, their bytes kept, and every other record of the batch is
    stored pending, once."""
    from tests.integration.test_loop import new_loop

    loop = new_loop(latin1_database_url, bootstrap_servers, topic_prefix, ingest_batch=500)
    dlq = f"{topic_prefix}-dlq"
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest, dlq], partitions=1)
    refused = {
        5: hdr(destination=loop.dest, reason="price 5 \u20ac"),
        77: hdr(destination=loop.dest, group="\u30b0\u30eb\u30fc\u30d7", id="\u00e9t\u00e9-1"),
        78: hdr(destination=loop.dest, error_class="x.\u0416"),
    }
    records = [
        {"key": b"%d" % i, "value": b"v", "headers": refused.get(i, hdr(destination=loop.dest, reason="caf\u00e9"))}
        for i in range(120)
    ]  # fmt: skip
    produce_with_timestamps(loop.bootstrap, loop.settings.retry_topic, records)

    counts = loop.ingest(expected=len(records))
    assert (counts.consumed, counts.stored, counts.duplicates) == (120, 120, 0)
    assert counts.dead == {p.DEAD_INVALID: 3}
    rows = {int(bytes(r["msg_key"])): r for r in loop.rows()}
    assert len(rows) == 120
    for i, headers in refused.items():
        row = rows[i]
        assert (row["status"], row["dead_reason"]) == ("dead", p.DEAD_INVALID)
        assert row["reason"].startswith("PostgreSQL refused the record: character with byte sequence"), row
        assert 'has no equivalent in encoding "LATIN1"' in row["reason"] and "column" in row["reason"]
        assert decode_headers(row["headers"]) == headers  # the record's own headers, byte for byte
    assert rows[78]["retry_id"].isascii()
    assert all(
        rows[i]["status"] == "pending" and rows[i]["reason"] == "caf\u00e9" for i in rows if i not in refused
    )

    loop.publish(seconds=3)
    dead = consume(loop.bootstrap, [dlq], expected=3, timeout_s=30)
    assert sorted(int(s.key) for s in dead) == sorted(refused)
    for seen in dead:
        sent = [h for h in refused[int(seen.key)] if h[0] not in SET_ON_DLQ]
        assert seen.headers[: len(sent)] == sent


def test_a_retry_to_any_topic_the_service_keeps_for_itself_is_invalid_whatever_the_allowlist(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """With ``RETRY_DESTINATION_ALLOWLIST=.*``: the retry topic, a delay topic, an adopted topic, the DLQ
    topic, the helper's default holds topic and one named in ``RETRY_HOLDS_TOPICS`` each refuse a retry."""
    from tests.integration.test_loop import new_loop

    own = {
        "retry topic": f"{topic_prefix}-retry",
        "delay topic": f"{topic_prefix}-retry.5m",
        "adopted topic": f"{topic_prefix}-orders.DLT",
        "DLQ topic": f"{topic_prefix}-dlq",
        "default holds topic": "retry.holds",
        "configured holds topic": f"{topic_prefix}-orders.holds",
    }
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix, destination_allowlist=".*",
        delay_topics={own["delay topic"]: 300_000}, adopt_topics={own["adopted topic"]: "spring"},
        holds_topics=("retry.holds", own["configured holds topic"]),
    )  # fmt: skip
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest, own["DLQ topic"]], partitions=1)
    records = [
        {"key": kind.encode(), "value": b"v", "headers": hdr(destination=t)} for kind, t in own.items()
    ]
    records.append({"key": b"ordinary", "value": b"v", "headers": hdr(destination=loop.dest)})
    produce_with_timestamps(loop.bootstrap, loop.settings.retry_topic, records)

    counts = loop.ingest(expected=len(records))
    assert counts.dead == {p.DEAD_INVALID: len(own)}
    rows = {bytes(r["msg_key"]).decode(): r for r in loop.rows()}
    for kind, topic in own.items():
        assert rows[kind]["dead_reason"] == p.DEAD_INVALID
        assert rows[kind]["reason"] == (
            f"destination {topic!r} is not allowed: it is a topic this service keeps for itself "
            "(a retry, adopted, DLQ or holds topic)"
        )
    assert rows["ordinary"]["status"] == "pending"
    loop.publish(seconds=2)
    assert not consume(loop.bootstrap, [own["configured holds topic"]], expected=0, timeout_s=3)
