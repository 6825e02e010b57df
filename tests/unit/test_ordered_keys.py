"""Ordered mode's decisions (``OrderedKeys.process``) replayed step by step: pure logic, with the
helper's two boundaries (the retry client's sends, the holds topic's writes) recorded instead of sent.
The model-based test (tests/integration/test_ordered_model.py) runs the same code on the real broker."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message

from retry_scheduler.core import protocol
from retry_scheduler.ordered import OrderedKeys, is_notice

TOPIC, KEY = "orders", b"k2"


class Sent:
    """The retry client's sends, recorded (a retry's id is the record's, or a new one)."""

    def __init__(self) -> None:
        self.retries: list[dict[str, Any]] = []
        self.releases: list[str] = []

    def is_fatal(self, error: BaseException | None) -> bool:
        return False

    def retry(self, msg: Message, error: BaseException | None = None, **kw: Any) -> str:
        self.retries.append({"offset": msg.offset(), **kw})
        return kw.get("retry_id") or "r"

    def release(self, msg: Message, chain: str) -> None:
        self.releases.append(chain)

    def dead_letter(self, msg: Message, **kw: Any) -> str:
        raise AssertionError("nothing is dead-lettered here")


class Holds:
    def __init__(self) -> None:
        self.written: list[Any] = []

    def put(self, topic: str, key: bytes, hold: Any) -> None:
        self.written.append(hold)


def record(offset: int, **headers: str) -> Message:
    """A record of key ``k2`` at ``offset`` of ``orders``, or its retry (``retry.*`` headers)."""
    raw = [(name, value.encode()) for name, value in headers.items()]
    return Message(topic=TOPIC, partition=1, offset=offset, key=KEY, value=str(offset).encode(), headers=raw,
                   timestamp=(1, 1_795_000_000_000))  # fmt: skip


def retry_of(offset: int, chain: str, retry_id: str, at: int) -> Message:
    """The retry of the record at ``offset`` as the scheduler publishes it (on the redelivery topic,
    at ``at``): its chain (``retry.blocks``), its id, attempt 1 and its original place."""
    return record(
        at, **{protocol.BLOCKS: chain, protocol.ID: retry_id, protocol.ATTEMPT: "1",
               protocol.ORIGINAL_PARTITION: "1", protocol.ORIGINAL_OFFSET: str(offset)},
    )  # fmt: skip


def test_a_late_copy_of_an_older_chain_s_head_is_a_duplicate_once_a_newer_chain_finished() -> None:
    """Found by the model test in CI (seed 11, 2026-11-29): record 1 failed and headed a chain, its retry
    was handled, record 2 failed and headed a second chain, handled too; then a copy of record 1's retry
    (the publisher sent it twice) came back. The key's hold was the second chain's, finished, so the
    copy was taken for a record of a free key and handled: 1 after 2. A record of an older chain is a
    copy: skipped."""
    sent, holds, handled = Sent(), Holds(), []
    fail_once = {1, 2}

    def call(msg: Message) -> BaseException | None:
        n = int(msg.value())
        original = next((int(v) for k, v in msg.headers() or [] if k == protocol.ORIGINAL_OFFSET), n)
        if original in fail_once:
            fail_once.discard(original)
            return TimeoutError("not yet")
        handled.append(original)
        return None

    keys = OrderedKeys(holds, sent, call)  # type: ignore[arg-type]
    where = (TOPIC, KEY)

    keys.process(record(1), where)  # fails: heads a chain
    first = keys.holds[where].chain
    keys.process(retry_of(1, first, sent.retries[-1]["retry_id"], at=101), where)  # handled: finished
    keys.process(record(2), where)  # fails: heads a new chain
    second = keys.holds[where].chain
    keys.process(retry_of(2, second, sent.retries[-1]["retry_id"], at=102), where)  # handled: finished
    late = keys.process(retry_of(1, first, sent.retries[0]["retry_id"], at=103), where)  # the copy

    assert first != second
    assert handled == [1, 2]  # not [1, 2, 1]
    assert late is None and keys.counts["duplicates"] == 1


def notice_of(chain: str, head: str, offset: int, value: bytes | None = None) -> Message:
    """A notice as the scheduler publishes it: the head ``head`` of ``chain`` died."""
    headers = {protocol.NOTICE: protocol.NOTICE_HEAD_DEAD, protocol.HOLD: chain,
               protocol.CHAIN_STATE: f"dead:{head}", protocol.ID: "n1", protocol.ATTEMPT: "2",
               protocol.ORIGINAL_PARTITION: "1", protocol.ORIGINAL_OFFSET: "1"}  # fmt: skip
    raw = [(name, v.encode()) for name, v in headers.items()]
    return Message(topic=TOPIC, partition=1, offset=offset, key=KEY, value=value, headers=raw,
                   timestamp=(1, 1_795_000_000_000))  # fmt: skip


def failing(fails: set[int], handled: list[int]) -> Any:
    """A handler failing the records (by original offset) in ``fails`` every time."""

    def call(msg: Message) -> BaseException | None:
        original = next(
            (int(v) for k, v in msg.headers() or [] if k == protocol.ORIGINAL_OFFSET), msg.offset()
        )
        if original in fails:
            return TimeoutError("not yet")
        handled.append(original)
        return None

    return call


def test_a_notice_of_the_pending_head_frees_a_key_with_nothing_parked() -> None:
    sent, holds, handled = Sent(), Holds(), []
    keys = OrderedKeys(holds, sent, failing({1}, handled))  # type: ignore[arg-type]
    where = (TOPIC, KEY)
    keys.process(record(1), where)  # fails: heads a chain
    chain, head = keys.holds[where].chain, keys.holds[where].head
    assert head is not None and keys.held()

    keys.notice(notice_of(chain, head, offset=201), where)

    assert not keys.held() and keys.holds[where].finished and holds.written[-1].finished
    assert keys.counts["dead_heads"] == 1 and handled == []
    keys.process(record(2), where)  # the key's next record: handled at once, not parked
    assert handled == [2] and len(sent.retries) == 1


def test_a_notice_with_records_parked_lets_them_go_in_order_and_a_stale_one_changes_nothing() -> None:
    sent, holds, handled = Sent(), Holds(), []
    keys = OrderedKeys(holds, sent, failing({1}, handled))  # type: ignore[arg-type]
    where = (TOPIC, KEY)
    keys.process(record(1), where)
    keys.process(record(2), where)  # parked behind 1
    chain, head = keys.holds[where].chain, keys.holds[where].head
    assert head is not None

    keys.notice(notice_of(chain, "another-head", offset=201), where)  # not the head the key waits for
    keys.notice(notice_of("another-chain", head, offset=202), where)
    assert keys.counts["stale_notices"] == 2 and keys.holds[where].head == head

    keys.notice(notice_of(chain, head, offset=203), where)
    assert keys.holds[where].head is None and keys.holds[where].parked == [(1, 2)]
    assert not keys.holds[where].finished  # record 2 still to come, released behind the dead head
    released = record(2, **{protocol.HOLD: chain, protocol.CHAIN_STATE: f"dead:{head}", protocol.ATTEMPT: "0",
                            protocol.ORIGINAL_PARTITION: "1", protocol.ORIGINAL_OFFSET: "2"})  # fmt: skip
    assert keys.process(released, where) is True and handled == [2] and keys.holds[where].finished
    keys.notice(notice_of(chain, head, offset=204), where)  # read again after a restart
    assert keys.counts["stale_notices"] == 3 and keys.counts["dead_heads"] == 1


def test_only_a_valueless_record_with_the_notice_word_is_a_notice() -> None:
    assert is_notice(notice_of("c", "h", 1))
    assert not is_notice(notice_of("c", "h", 1, value=b"data"))  # an application's record
    assert not is_notice(record(1, **{protocol.NOTICE: "other"}))
