"""The dead-letter watcher's apply function (pure): what an asset event carries, and what starts none.
The trigger itself runs against the real broker in tests/e2e/test_signals.py."""

from __future__ import annotations

from typing import Any

from retry_scheduler.airflow.dead_letters import dead_letter_event
from retry_scheduler.core import protocol


class Record:
    """The part of confluent_kafka.Message the function reads."""

    def __init__(self, value: bytes | None, headers: list[tuple[Any, Any]] | None) -> None:
        self._value, self._headers = value, headers

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[Any, Any]] | None:
        return self._headers

    def key(self) -> bytes | None:
        return b"k"

    def topic(self) -> str:
        return "retry.dlq"

    def partition(self) -> int:
        return 1

    def offset(self) -> int:
        return 7

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def test_a_dead_letter_becomes_its_headers_and_place_never_its_value() -> None:
    record = Record(
        b"secret payload", [(protocol.ORIGINAL_TOPIC, b"payments"), (protocol.ID, b"r1"), ("x", b"y")]
    )

    event = dead_letter_event(record)

    assert event is not None and "secret payload" not in str(event)
    assert (event["destination"], event["retry_id"], event["dlq_topic"], event["offset"]) == (
        "payments",
        "r1",
        "retry.dlq",
        7,
    )
    assert event["reason"] is None and event["timestamp_ms"] == 1_700_000_000_000


def test_destinations_narrow_the_events_and_a_tombstone_or_no_header_list_is_handled() -> None:
    payments = Record(b"v", [(protocol.DESTINATION, b"payments.eu")])

    assert dead_letter_event(payments, ["payments.*"]) is not None
    assert dead_letter_event(payments, ["orders"]) is None
    assert dead_letter_event(Record(None, [(protocol.DESTINATION, b"orders")])) is None
    assert dead_letter_event(Record(b"v", None))["destination"] is None  # type: ignore[index]
    assert dead_letter_event(Record(b"v", None), ["orders"]) is None
