from __future__ import annotations

import subprocess
import sys

from retry_scheduler.client import RetryClient, build_retry_headers, error_class_name
from retry_scheduler.core import protocol as p


class FakeRecord:
    """A consumed record as confluent-kafka hands it over (the SDK's one boundary)."""

    def __init__(self, headers=None, topic="orders", partition=2, offset=40, ts=1_800_000_000_000):
        self._headers, self._topic, self._partition, self._offset, self._ts = (
            headers,
            topic,
            partition,
            offset,
            ts,
        )

    def topic(self):
        return self._topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, self._ts)

    def key(self):
        return b"k"

    def value(self):
        return b"v"

    def headers(self):
        return self._headers


class PaymentDown(Exception):
    pass


def as_dict(headers):
    return {k: (v.decode() if v is not None else None) for k, v in headers}


def test_first_failure_points_at_the_original_record() -> None:
    out = build_retry_headers(FakeRecord([("trace", b"\xff")]), PaymentDown("503 from PSP"), group="svc")
    assert out[0] == ("trace", b"\xff")  # the record's own headers pass through first
    h = as_dict(out[1:])
    assert h == {
        p.ORIGINAL_TOPIC: "orders",
        p.ORIGINAL_PARTITION: "2",
        p.ORIGINAL_OFFSET: "40",
        p.ORIGINAL_TIMESTAMP: "1800000000000",
        p.ATTEMPT: "0",
        p.ID: h[p.ID],
        p.REASON: "503 from PSP",
        p.ERROR_CLASS: f"{__name__}.PaymentDown",
        p.GROUP: "svc",
    }
    assert len(h[p.ID]) == 36


def test_a_retried_record_keeps_its_identity_and_attempt() -> None:
    retried = FakeRecord(
        [("trace", b"t"), (p.ATTEMPT, b"2"), (p.ID, b"rid-1"), (p.ORIGINAL_TOPIC, b"orders"),
         (p.ORIGINAL_PARTITION, b"0"), (p.ORIGINAL_OFFSET, b"7"), (p.ORIGINAL_TIMESTAMP, b"1700000000000")],
        partition=1, offset=99,
    )  # fmt: skip
    h = as_dict(build_retry_headers(retried, PaymentDown("again")))
    assert (h[p.ATTEMPT], h[p.ID]) == ("2", "rid-1")
    assert (h[p.ORIGINAL_PARTITION], h[p.ORIGINAL_OFFSET], h[p.ORIGINAL_TIMESTAMP]) == (
        "0",
        "7",
        "1700000000000",
    )
    assert [k for k, _ in build_retry_headers(retried)].count(p.ATTEMPT) == 1  # never duplicated


def test_a_replayed_record_keeps_its_replay_count_into_its_retry() -> None:
    """retry.replays (set by the scheduler on a record back from the dead letters) is one of the
    record's own headers: the SDK's retry carries it, so the scheduler can park the record."""
    replayed = FakeRecord([("trace", b"t"), (p.ATTEMPT, b"3"), (p.ID, b"rid-1"), (p.REPLAYS, b"2")])
    out = build_retry_headers(replayed, PaymentDown("still down"))
    assert [v for k, v in out if k == p.REPLAYS] == [b"2"]


def test_fatal_errors_go_to_the_dlq_and_long_reasons_are_cut() -> None:
    client = RetryClient({"bootstrap.servers": "127.0.0.1:1"}, fatal_errors=(ValueError,))
    assert client.is_fatal(ValueError("x")) and not client.is_fatal(PaymentDown("x"))
    h = as_dict(build_retry_headers(FakeRecord(), ValueError("e" * 5000), send_to_dlq=True, at_ms=5))
    assert h[p.SEND_TO] == "dlq"
    assert h[p.AT] == "5"
    assert len(h[p.REASON]) == 2000
    custom = RetryClient(
        {"bootstrap.servers": "127.0.0.1:1"}, classify=lambda e: "dlq" if "poison" in str(e) else "retry"
    )
    assert custom.is_fatal(PaymentDown("poison pill")) and not custom.is_fatal(PaymentDown("timeout"))


def test_error_class_name() -> None:
    assert error_class_name(KeyError("x")) == "builtins.KeyError"


def test_sdk_imports_with_only_confluent_kafka() -> None:
    code = (
        "import sys\n"
        "for m in ('airflow', 'psycopg', 'psycopg2', 'pyspark', 'pandas'): sys.modules[m] = None\n"
        "from retry_scheduler.client import RetryClient\n"
        "from retry_scheduler.consumer import RetryingConsumer\n"
        "assert not any(m.startswith(('airflow', 'psycopg', 'pyspark')) for m in sys.modules if sys.modules[m])\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_group_scope_asks_for_the_group_s_redelivery_topic() -> None:
    import pytest

    scoped = as_dict(build_retry_headers(FakeRecord([]), PaymentDown("x"), group="billing", scope="group"))
    assert (scoped[p.SCOPE], scoped[p.GROUP], scoped[p.ORIGINAL_TOPIC]) == ("group", "billing", "orders")
    assert p.SCOPE not in as_dict(build_retry_headers(FakeRecord([]), PaymentDown("x"), group="billing"))
    with pytest.raises(ValueError, match="scope='group' needs the consumer group"):
        RetryClient({"bootstrap.servers": "127.0.0.1:1"}, scope="group")
    with pytest.raises(ValueError, match="scope must be 'topic' or 'group'"):
        build_retry_headers(FakeRecord([]), PaymentDown("x"), group="billing", scope="everyone")


def test_the_helper_keys_a_record_by_its_last_original_topic_as_the_scheduler_reads_it() -> None:
    """A repeated retry.original-topic counts by its last occurrence everywhere (the scheduler, Java's
    Headers.lastHeader, the client): the consumer helper's key for ordered mode too."""
    from confluent_kafka import Message

    from retry_scheduler.consumer import original_topic

    repeated = Message(
        topic="orders.redelivery", headers=[("retry.original-topic", b"a"), ("retry.original-topic", b"b")]
    )
    assert original_topic(repeated) == "b"
    assert original_topic(Message(topic="orders", headers=[("retry.original-topic", b"\xff")])) == "orders"
    assert original_topic(Message(topic="orders")) == "orders"
