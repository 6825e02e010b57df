from __future__ import annotations

import pytest

from bench.jobs import Job
from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.headers import InvalidRecordError, Limits, parse_headers, truncate_reason
from retry_scheduler.core.jobs import (
    REPLAYED,
    OutgoingRow,
    Status,
    decode_headers,
    destination_headers,
    dlq_headers,
    encode_headers,
)
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.core.records import Consumed, RowBuilder


def job_from_record(
    record: Consumed, *, settings: Settings, registry: PolicyRegistry, limits: Limits, now_ms: int
) -> Job:
    """The job the ingest loop's row builder makes of one record (a release record makes none)."""
    row = RowBuilder(Deployment(settings, registry), limits).row(*record, now_ms)
    assert row is not None, "a release record stores no job"
    return Job.from_copy_row(row)


# What a deployment allowing everything but the never-allowed topics has.
LIMITS = Limits(Destinations.of([], r".*", {"retry", "retry.dlq"}))
NOW = 1_800_000_000_000


def h(**kv: str | bytes | None) -> list[tuple[str, bytes | None]]:
    out = []
    for k, v in kv.items():
        name = "retry." + k.replace("_", "-")
        out.append((name, v.encode() if isinstance(v, str) else v))
    return out


def test_valid_headers_parse_into_typed_values() -> None:
    parsed = parse_headers(
        [("trace", b"\x00\xff"), *h(original_topic="orders", original_partition="2", original_offset="41",
          attempt="1", at="1800000005000", reason="boom", error_class="x.Timeout", group="g", id="abc")],
        LIMITS,
    )  # fmt: skip
    assert parsed.destination == "orders"
    assert parsed.destination_partition == 2
    assert parsed.original_offset == 41
    assert parsed.attempt == 1
    assert parsed.at_ms == 1_800_000_005_000
    assert parsed.retry_id == "abc"
    assert parsed.passthrough == (("trace", b"\x00\xff"),)
    assert not parsed.send_to_dlq


def test_explicit_destination_wins_and_drops_the_original_partition() -> None:
    parsed = parse_headers(
        h(destination="orders.retry-target", original_topic="orders", original_partition="2"), LIMITS
    )
    assert parsed.destination == "orders.retry-target"
    assert parsed.destination_partition is None
    assert parsed.original_partition == 2


@pytest.mark.parametrize(
    ("headers", "fault"),
    [
        ([], "no destination"),
        (h(attempt="1"), "no destination"),
        (h(destination="orders", attempt="abc"), "retry.attempt='abc' is not an integer"),
        (h(destination="orders", attempt="-1"), "retry.attempt=-1 is out of range"),
        (h(destination="orders", attempt="1.5"), "not an integer"),
        (h(destination="orders", at="99999999999999999"), "retry.at=99999999999999999 is out of range"),
        (h(destination="orders", at="-5"), "out of range"),
        (h(destination="orders", original_partition="x"), "retry.original-partition"),
        (h(destination="orders", original_timestamp="1e12"), "not an integer"),
        (h(destination=b"ord\xffers"), "retry.destination is not valid UTF-8"),
        (h(destination="orders", reason=b"\xc3\x28"), "retry.reason is not valid UTF-8"),
        (h(destination="orders", send_to="later"), "retry.send-to='later' must be 'retry' or 'dlq'"),
        (h(destination="_schemas"), "'_schemas' is not allowed: internal topics never are"),
        (h(destination="__consumer_offsets"), "not allowed: internal topics never are"),
        (h(destination="retry"), "'retry' is not allowed: it is a topic this service keeps for itself"),
        (h(destination="retry.dlq"), "not allowed: it is a topic this service keeps for itself"),
        (h(destination="has space"), "not allowed: not a topic name"),
        (h(destination="x" * 250), "not allowed: not a topic name"),
        (h(destination=None), "retry.destination is null"),
        (h(destination="orders", policy="p" * 2000), "retry.policy is 2000 bytes"),
        (h(destination="orders", attempt="1") + h(attempt="x"), "retry.attempt='x' is not an integer"),
        (h(destination="orders", reason="ok") + h(reason=b"\xff"), "retry.reason is not valid UTF-8"),
        ([("x", b"1")] * 300 + h(destination="orders"), "301 headers, more than the 256 allowed"),
    ],
)
def test_malformed_headers_name_the_fault(headers: list, fault: str) -> None:
    with pytest.raises(InvalidRecordError) as err:
        parse_headers(headers, LIMITS)
    assert fault in str(err.value)


def test_a_repeated_retry_header_counts_by_its_last_occurrence_and_the_earlier_are_dropped() -> None:
    """A client that copies the failed record's headers and adds the retry headers again (the Java
    example's way) repeats them: the last occurrence counts, as Java's ``Headers.lastHeader`` reads
    it, even where an earlier one was malformed; only pass-through headers are kept in order."""
    copied = [
        ("trace", b"t1"),
        *h(destination="orders", attempt="2", reason=b"\xff", id="r-1"),
        ("trace", b"t2"),
    ]
    parsed = parse_headers([*copied, *h(destination="orders.v2", reason="second failure")], LIMITS)
    assert (parsed.destination, parsed.attempt, parsed.reason, parsed.retry_id) == (
        "orders.v2",
        2,
        "second failure",
        "r-1",
    )
    assert parsed.passthrough == (("trace", b"t1"), ("trace", b"t2"))


def test_long_reason_is_truncated_not_rejected() -> None:
    parsed = parse_headers(h(destination="orders", reason="e" * 10_000), LIMITS)
    assert parsed.reason is not None and len(parsed.reason) == 2000
    assert parsed.reason.endswith("...[truncated]")
    assert truncate_reason("short", 10) == "short"


REGISTRY = PolicyRegistry.of(
    [Policy("default", delays=["1m"], max_attempts=2), Policy("slow", delays=["1h"], max_attempts=5)],
    allowed=["orders"],
)
SETTINGS = Settings(delay_topics={"retry.5m": 300_000})


def job(topic: str = "retry", headers: list | None = None, ts: int | None = NOW - 1000, **kw: object):
    rec = Consumed(topic, 0, 7, ts, b"k", b"v", headers or [], **kw)
    return job_from_record(
        rec, settings=SETTINGS, registry=REGISTRY, limits=Deployment(SETTINGS, REGISTRY).limits, now_ms=NOW
    )


def test_job_from_valid_record() -> None:
    j = job(headers=h(original_topic="orders", attempt="1"))
    assert j.status is Status.PENDING
    assert j.due_ms == NOW - 1000 + 60_000
    assert j.original_timestamp_ms == NOW - 1000  # set by the scheduler when absent
    assert j.dlq_topic == "retry.dlq"
    assert len(j.retry_id) == 36


def test_per_delay_topic_counts_from_the_record_timestamp() -> None:
    j = job("retry.5m", h(destination="orders"), ts=NOW - 60_000)
    assert j.due_ms == NOW - 60_000 + 300_000


def test_delay_topic_record_with_explicit_at_keeps_it() -> None:
    assert job("retry.5m", h(destination="orders", at=str(NOW + 5))).due_ms == NOW + 5


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (h(destination="orders", attempt="2"), "exhausted"),
        (h(destination="orders", send_to="dlq"), "requested"),
        (h(destination="orders", policy="nope"), "invalid"),
        (h(destination="retry.5m"), "invalid"),  # would loop
    ],
)
def test_dead_decisions(headers: list, reason: str) -> None:
    j = job(headers=headers)
    assert j.status is Status.DEAD
    assert j.dead_reason == reason


def test_invalid_record_is_kept_whole_with_the_fault_as_reason() -> None:
    raw = [("trace", b"1"), *h(destination="orders", attempt="x", id="keep-me")]
    j = job(headers=raw)
    assert j.dead_reason == "invalid"
    assert j.reason == "header retry.attempt='x' is not an integer"
    assert j.headers == tuple(raw)
    assert j.retry_id == "keep-me"
    assert (j.key, j.value) == (b"k", b"v")


def test_oversize_record_is_invalid() -> None:
    big = Settings(max_record_bytes=100)
    rec = Consumed("retry", 0, 1, NOW, b"k", b"v" * 200, h(destination="orders"))
    j = job_from_record(
        rec, settings=big, registry=REGISTRY, limits=Deployment(big, REGISTRY).limits, now_ms=NOW
    )
    assert j.dead_reason == "invalid"
    assert "more than the 100 allowed" in (j.reason or "")


def test_header_codec_round_trips_order_repeats_nulls_and_bytes() -> None:
    headers = [("a", b"1"), ("b", None), ("a", b"\x00\xff"), ("", b""), ("ü", b"x" * 70000)]
    assert decode_headers(encode_headers(headers)) == headers
    assert decode_headers(None) == []


def row(**kw: object) -> OutgoingRow:
    base: dict = dict(
        id=1, destination="orders", destination_partition=None, key=b"k", value=b"v",
        headers=encode_headers([("trace", b"t")]), attempt=2, policy="default", reason="boom",
        error_class="x.E", consumer_group="g", retry_id="rid", original_topic="orders",
        original_partition=3, original_offset=9, original_timestamp_ms=NOW, dead_reason=None,
        dlq_topic="retry.dlq",
    )  # fmt: skip
    return OutgoingRow(**(base | kw))


def test_destination_headers_raise_attempt_and_keep_identity() -> None:
    assert destination_headers(row()) == [
        ("trace", b"t"),
        (p.ATTEMPT, b"3"),
        (p.ID, b"rid"),
        (p.ORIGINAL_TOPIC, b"orders"),
        (p.ORIGINAL_PARTITION, b"3"),
        (p.ORIGINAL_OFFSET, b"9"),
        (p.ORIGINAL_TIMESTAMP, str(NOW).encode()),
    ]


@pytest.mark.parametrize(
    ("carried", "sent"),
    [
        ([], b"1"),
        ([(p.REPLAYS, b"2")], b"3"),
        ([(p.REPLAYS, b"5"), (p.REPLAYS, b"1")], b"2"),  # repeated: the last counts, one is sent
        ([(p.REPLAYS, b"x")], b"1"),  # not a whole number: counted from 0
        ([(p.REPLAYS, b"99999999")], b"1"),  # past the bound
    ],
)
def test_a_replayed_record_counts_its_replays(carried: list, sent: bytes) -> None:
    """A record back from the dead letters carries retry.replays, one more than it came with, once;
    a record that was not replayed goes out without touching it."""
    replayed = destination_headers(
        row(headers=encode_headers([("trace", b"t"), *carried]), chain_state=REPLAYED)
    )
    assert [v for n, v in replayed if n == p.REPLAYS] == [sent]
    assert ("trace", b"t") in replayed
    plain = destination_headers(row(headers=encode_headers([("trace", b"t"), *carried])))
    assert [v for n, v in plain if n == p.REPLAYS] == [v for _n, v in carried]


@pytest.mark.parametrize(
    ("replays", "park_after", "dead_reason"),
    [
        ("3", 3, "parked"),
        ("7", 3, "parked"),
        ("2", 3, "exhausted"),
        (None, 3, "exhausted"),
        ("9", 0, "exhausted"),
    ],
)
def test_a_record_replayed_that_often_and_dead_again_is_parked(
    replays: str | None, park_after: int, dead_reason: str
) -> None:
    headers = h(destination="orders", attempt="2", reason="timeout")
    if replays is not None:
        headers.append((p.REPLAYS, replays.encode()))
    settings = Settings(park_after_replays=park_after)
    rec = Consumed("retry", 0, 7, NOW - 1000, b"k", b"v", headers)
    j = job_from_record(rec, settings=settings, registry=REGISTRY, limits=LIMITS, now_ms=NOW)
    assert (j.status, j.dead_reason) == (Status.DEAD, dead_reason)
    if dead_reason == "parked":
        assert j.reason == f"parked after {replays} replays, then exhausted: timeout"
    # kept with the record's own headers, so the next replay counts on from it
    assert [v for n, v in j.headers if n == p.REPLAYS] == ([replays.encode()] if replays else [])


def test_a_replayed_record_that_is_retried_again_is_not_parked() -> None:
    j = job(headers=[*h(destination="orders", attempt="1"), (p.REPLAYS, b"5")])
    assert (j.status, j.dead_reason) == (Status.PENDING, None)


def test_dlq_headers_say_why() -> None:
    out = dict(dlq_headers(row(dead_reason="exhausted")))
    assert out[p.DEAD_REASON] == b"exhausted"
    assert out[p.REASON] == b"boom"
    assert out[p.ERROR_CLASS] == b"x.E"
    assert out[p.ATTEMPT] == b"2"
    assert out["trace"] == b"t"


def test_dlq_headers_of_invalid_record_replace_only_what_we_set() -> None:
    raw = encode_headers([("trace", b"t"), (p.ATTEMPT, b"x"), (p.REASON, b"old"), (p.ID, b"\xff")])
    out = dlq_headers(row(headers=raw, dead_reason="invalid", reason="bad attempt", retry_id="new"))
    assert out == [
        ("trace", b"t"),
        (p.ATTEMPT, b"x"),
        (p.ID, b"new"),
        (p.DEAD_REASON, b"invalid"),
        (p.REASON, b"bad attempt"),
    ]


def test_the_copy_row_matches_the_copy_statement_and_round_trips() -> None:
    from retry_scheduler.core.jobs import COPY_COLUMNS, COPY_TYPES
    from retry_scheduler.db.schema import queries

    statement = queries()["copy_jobs"].split("COPY retry_jobs (", 1)[1]
    listed = statement[: statement.index(")")]
    assert tuple(c.strip() for c in listed.split(",")) == COPY_COLUMNS
    assert len(COPY_TYPES) == len(COPY_COLUMNS)

    for one in (
        job(headers=h(destination="orders", attempt="1", reason="boom", id="rid-1")),
        job(headers=[]),
    ):
        row = one.copy_row()
        assert len(row) == len(COPY_COLUMNS)
        assert Job.from_copy_row(row) == one


def test_new_retry_ids_are_version_4_uuids() -> None:
    import uuid

    from retry_scheduler.core.records import new_retry_id

    ids = {new_retry_id() for _ in range(5000)}  # several refills of the pool
    assert len(ids) == 5000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_a_forked_process_does_not_reuse_its_parents_retry_ids() -> None:
    import os

    from retry_scheduler.core.records import new_retry_id

    new_retry_id()  # the pool now holds ids this process will hand out
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's report is checked below
        os.write(write_end, "\n".join(new_retry_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        childs = set(pipe.read().split("\n"))
    os.waitpid(child, 0)
    parents = {new_retry_id() for _ in range(100)}
    assert len(childs) == 100
    assert not childs & parents


def test_a_chain_head_that_dies_in_a_groups_redelivery_scope_gets_a_notice_row() -> None:
    """Ordered mode: the retry of a chain's head that its policy gives up on, scoped to its group,
    makes one more row, the notice the helper needs when nothing is parked behind the head; with
    ``retry.scope: topic`` (every group reads the destination) or a head still pending, none."""
    registry = PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=2)])
    builder = RowBuilder(Deployment(Settings(), registry), LIMITS)
    head = h(original_topic="orders", original_partition="3", original_offset="40", attempt="2", id="r1",
             blocks="c1", scope="group", group="billing")  # fmt: skip
    row = builder.row("retry", 0, 7, NOW - 5, b"k", b"v", head, NOW)
    assert row is not None and row.dead_reason == p.DEAD_EXHAUSTED
    [notice] = builder.take_notices()
    assert (notice.source_topic, notice.source_partition, notice.source_offset) == ("retry", 0, 7)
    assert notice.source_timestamp_ms == -1 - (NOW - 5)  # one per head record, stored once when read again
    assert (notice.destination, notice.destination_partition) == ("orders.billing.redelivery", 3)
    assert (notice.msg_key, notice.msg_value, notice.held_by, notice.status) == (b"k", None, "c1", "pending")
    assert decode_headers(notice.headers) == [(p.NOTICE, p.NOTICE_HEAD_DEAD.encode())]
    assert notice.retry_id != "r1" and "r1" in (notice.reason or "") and notice.dead_reason is None
    assert builder.take_notices() == []

    topic_scoped = [x for x in head if x[0] != p.SCOPE]
    assert builder.row("retry", 0, 8, NOW, b"k", b"v", topic_scoped, NOW) is not None
    pending = [x for x in head if x[0] != p.ATTEMPT] + h(attempt="1")
    assert builder.row("retry", 0, 9, NOW, b"k", b"v", pending, NOW) is not None
    assert builder.take_notices() == []
    sent_dead = head + h(send_to="dlq")  # the consumer dead-lettered its head itself: it knows
    assert builder.row("retry", 0, 10, NOW, b"k", b"v", sent_dead, NOW) is not None
    assert builder.take_notices() == []
