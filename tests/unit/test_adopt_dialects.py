"""Kafka Streams' and share groups' dead letters read as Kafka writes them, and as hostile producers
might: what each header means, and what a malformed one leaves out (never an exception but
``AdoptError`` for a letter that names no topic to replay to)."""

from __future__ import annotations

import re

import pytest

from retry_scheduler.core.adopt import (
    AdoptError,
    adopt,
    parse_adopt_topics,
    retried,
    root_cause,
    source_format,
)


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


#: Kafka Connect 4.4's letter for a value JsonConverter cannot read, as the interop test's worker wrote
#: it (tests/interop/test_tools.py), its stack trace cut to what matters here.
CONNECT_TRACE = (
    b"org.apache.kafka.connect.errors.DataException: Converting byte[] to Kafka Connect data failed due to "
    b"serialization error: \n\tat org.apache.kafka.connect.json.JsonConverter.toConnectData(JsonConverter.java:333)\n"
    b"Caused by: org.apache.kafka.common.errors.SerializationException: com.fasterxml.jackson.core."
    b"JsonParseException: Unrecognized token 'fail': was expecting (JSON String, Number, Array, Object or "
    b"token 'null', 'true' or 'false')\n at [Source: REDACTED; line: 1, column: 5]\n\tat org.apache.kafka...\n"
    b"Caused by: com.fasterxml.jackson.core.JsonParseException: Unrecognized token 'fail': was expecting "
    b"(JSON String, Number, Array, Object or token 'null', 'true' or 'false')\n at [Source: REDACTED]\n"
    b"\tat com.fasterxml.jackson.core.JsonParser._constructError(JsonParser.java:2584)\n\t... 12 more\n"
)


def connect_letter(**override: bytes | None) -> list[tuple[str, bytes | None]]:
    headers = {
        "__connect.errors.topic": b"payments",
        "__connect.errors.partition": b"1",
        "__connect.errors.offset": b"0",
        "__connect.errors.connector.name": b"jdbc-sink",
        "__connect.errors.exception.class.name": b"org.apache.kafka.connect.errors.DataException",
        "__connect.errors.exception.message": b"Converting byte[] to Kafka Connect data failed due to "
        b"serialization error: ",
        "__connect.errors.exception.stacktrace": CONNECT_TRACE,
        **override,
    }
    return [("tenant", b"acme"), *((k, v) for k, v in headers.items() if v is not None)]


def test_a_connect_letter_names_the_cause_its_converter_wraps_from_the_stack_trace() -> None:
    found = adopt("connect", connect_letter(), 500)
    assert found.error_class == "com.fasterxml.jackson.core.JsonParseException"
    assert found.reason is not None
    assert found.reason.startswith(
        "Converting byte[] to Kafka Connect data failed due to serialization error: Unrecognized token 'fail'"
    )
    assert found.reason.endswith("(in org.apache.kafka.connect.errors.DataException)")
    # Without a trace (context headers of an older worker), or one without a cause: the wrapper, as before.
    for trace in (None, b"org.apache.kafka.connect.errors.DataException: boom\n\tat x.Y.z(Y.java:1)\n"):
        plain = adopt("connect", connect_letter(**{"__connect.errors.exception.stacktrace": trace}), 500)
        assert plain.error_class == "org.apache.kafka.connect.errors.DataException"


def test_a_connect_letter_of_a_record_that_failed_before_says_its_newest_failure() -> None:
    """A record published back by a :retry carries its older letter's headers; Connect adds its own after."""
    older = [(k, v) for k, v in connect_letter() if k.startswith("__connect.")]
    newest = connect_letter(
        **{
            "__connect.errors.exception.class.name": b"org.apache.kafka.connect.errors.ConnectException",
            "__connect.errors.exception.message": b"Sink refused the record",
            "__connect.errors.exception.stacktrace": b"org.apache.kafka.connect.errors.ConnectException: no\n",
            "__connect.errors.offset": b"9",
        }
    )
    found = adopt("connect", [*older, *newest], 500)
    assert (found.error_class, found.reason) == (
        "org.apache.kafka.connect.errors.ConnectException",
        "Sink refused the record",
    )
    assert found.original_offset == 0  # where the record first failed


@pytest.mark.parametrize(
    "trace",
    [
        b"Caused by: \n",
        b"Caused by: not a class name: because\n",
        b"Caused by: " + b"a." * 400 + b"B: long\n",
        b"\xff\xfe Caused by: x.Y: in the middle of a line\n",
        b"no causes at all" * 10_000,
    ],
)
def test_a_hostile_stack_trace_names_no_cause(trace: bytes) -> None:
    assert root_cause(trace) is None
    found = adopt("connect", connect_letter(**{"__connect.errors.exception.stacktrace": trace}), 500)
    assert found.error_class == "org.apache.kafka.connect.errors.DataException"


def test_only_the_start_of_a_huge_stack_trace_is_read_for_its_cause() -> None:
    assert root_cause(b"Caused by: a.B: first\n" + b"\tat x\n" * 100_000 + b"Caused by: c.D: too far\n") == (
        "a.B",
        "first",
    )


def test_a_spring_retryable_topic_letter_is_read_from_the_names_without_dlt() -> None:
    """As Spring Kafka 4.1.3's @RetryableTopic wrote it in tests/interop (its retry topic's own
    headers after the topic's)."""
    letter = [
        ("tenant", b"acme"),
        ("kafka_original-topic", b"orders"),
        ("kafka_original-partition", b"\x00\x00\x00\x01"),
        ("kafka_original-offset", b"\x00\x00\x00\x00\x00\x00\x00\x07"),
        ("kafka_original-timestamp", b"\x00\x00\x01\xa2Hq\x9a|"),
        ("kafka_original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"orders-app"),
        ("retry_topic-attempts", b"\x00\x00\x00\x02"),
        ("kafka_exception-fqcn", b"org.springframework.kafka.listener.ListenerExecutionFailedException"),
        ("kafka_exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_exception-message", b"Listener failed; could not handle it"),
        ("kafka_original-topic", b"orders-retry"),  # appended by the retry topic's own recoverer
    ]
    found = adopt("spring", letter, 500)
    assert (found.original_topic, found.original_partition, found.original_offset) == ("orders", 1, 7)
    assert found.original_timestamp_ms == 1796511734396
    assert (found.error_class, found.group) == ("java.lang.IllegalStateException", "orders-app")
    assert found.reason == (
        "Listener failed; could not handle it (in org.springframework.kafka.listener.ListenerExecutionFailedException)"
    )
    # A letter with both names reads the DLT ones, as ever.
    both = adopt("spring", [("kafka_dlt-original-topic", b"payments"), *letter], 500)
    assert both.original_topic == "payments"
