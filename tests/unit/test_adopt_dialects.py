"""Kafka Streams' and share groups' dead letters read as Kafka writes them, and as hostile producers
might: what each header means, and what a malformed one leaves out (never an exception but
``AdoptError`` for a letter that names no topic to replay to)."""

from __future__ import annotations

import re

import pytest

from retry_scheduler.core.adopt import AdoptError, adopt, parse_adopt_topics, retried, source_format


def share_letter(**overrides: bytes | None) -> list[tuple[str, bytes | None]]:
    headers = {
        "__dlq.errors.topic": b"work",
        "__dlq.errors.partition": b"2",
        "__dlq.errors.offset": b"41",
        "__dlq.errors.group": b"workers",
        "__dlq.errors.delivery.count": b"5",
        "__dlq.errors.message": b"Offset rejected by client.",
        **overrides,
    }
    return [(k, v) for k, v in headers.items() if v is not None or k == "__dlq.errors.message"]


def test_a_share_group_letter_as_the_broker_writes_it() -> None:
    found = adopt("share", share_letter(), max_reason_chars=2000)

    assert (found.original_topic, found.original_partition, found.original_offset) == ("work", 2, 41)
    assert (found.group, found.delivery_count, found.reason, found.error_class) == (
        "workers", 5, "Offset rejected by client.", None,
    )  # fmt: skip
    assert adopt("share:retry", share_letter(), 2000) == found  # the mode does not change the reading


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [
        ({"__dlq.errors.partition": b"-1"}, "original_partition", None),
        ({"__dlq.errors.partition": b"2147483648"}, "original_partition", None),
        ({"__dlq.errors.offset": b"4x"}, "original_offset", None),
        ({"__dlq.errors.offset": b"9" * 40}, "original_offset", None),
        ({"__dlq.errors.delivery.count": b"40000"}, "delivery_count", None),  # not a Java short
        ({"__dlq.errors.delivery.count": None}, "delivery_count", None),
        ({"__dlq.errors.group": b"\xff\xfeworkers\x00"}, "group", "\ufffd\ufffdworkers\ufffd"),
        ({"__dlq.errors.message": None}, "reason", None),
    ],
)
def test_a_malformed_header_is_left_out_or_made_safe(override: dict, field: str, expected: object) -> None:
    found = adopt("share", share_letter(**override), max_reason_chars=2000)

    assert getattr(found, field) == expected
    assert found.original_topic == "work"  # the letter is still adopted


@pytest.mark.parametrize("topic", [None, b"", b"work topic", b"\xffwork", b"x" * 300])
def test_a_letter_naming_no_topic_to_replay_to_is_refused_with_the_header_named(topic: bytes | None) -> None:
    with pytest.raises(
        AdoptError,
        match=re.escape("a share dead letter must name its original topic in header __dlq.errors.topic"),
    ):
        adopt("share", share_letter(**{"__dlq.errors.topic": topic}), max_reason_chars=2000)


def test_a_streams_letter_reads_its_newest_headers_and_an_exception_without_a_message() -> None:
    headers = [
        ("__streams.errors.exception", b"java.lang.IllegalStateException"),  # an older failure's
        ("__streams.errors.topic", b"old-topic"),
        ("__streams.errors.exception", b"org.apache.kafka.common.errors.SerializationException"),
        ("__streams.errors.message", None),  # StringSerializer of a null message
        ("__streams.errors.stacktrace", b"\tat ..." * 1000),
        ("__streams.errors.topic", b"clicks"),
        ("__streams.errors.partition", b"-1"),  # a punctuator's record has no partition
        ("__streams.errors.offset", b"-1"),
    ]

    found = adopt("streams", headers, max_reason_chars=2000)

    assert (found.original_topic, found.error_class, found.reason) == (
        "clicks", "org.apache.kafka.common.errors.SerializationException", None,
    )  # fmt: skip
    assert (found.original_partition, found.original_offset, found.group, found.delivery_count) == (
        None, None, None, None,
    )  # fmt: skip


def test_the_topics_spec_says_the_format_and_whether_letters_are_retried() -> None:
    topics = parse_adopt_topics("a.dlq=streams, b.dlq=share:retry ,c.DLT=spring:retry")

    assert topics == {"a.dlq": "streams", "b.dlq": "share:retry", "c.DLT": "spring:retry"}
    assert [(source_format(s), retried(s)) for s in topics.values()] == [
        ("streams", False), ("share", True), ("spring", True),
    ]  # fmt: skip
    for wrong in ("a.dlq=share:later", "a.dlq=share:", "a.dlq=kafka", "a dlq=share"):
        with pytest.raises(ValueError, match="must look like TOPIC=FORMAT or TOPIC=FORMAT:retry"):
            parse_adopt_topics(wrong)
