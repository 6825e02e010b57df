"""The ingest's read-ahead on the broker (loops/read_ahead.py): records due soon, behind a backlog due
later on the same partition, are stored first; a loop stopped or killed -9 with rows waiting loses
none, and the next one stores none twice, even of those published meanwhile."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.loops.ingest import IngestCounts, Ingestor
from retry_scheduler.loops.ingest_worker import IngestWorkerError
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics, produce

BACKLOG = 20_000
QUICK = 10


def _send_backlog_then_quick(loop: Loop, partitions: int, backlog: int) -> None:
    """On each partition: ``backlog`` records due in ten minutes, then QUICK due now."""
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest], partitions=partitions)
    later, now = str(int(time.time() * 1000) + 600_000), str(int(time.time() * 1000))
    for partition in range(partitions):
        records = [
            {"key": f"b{i}".encode(), "value": b"x" * 100, "headers": hdr(destination=loop.dest, at=later)}
            for i in range(backlog)
        ] + [
            {"key": f"q{i}".encode(), "value": b"q", "headers": hdr(destination=loop.dest, at=now)}
            for i in range(QUICK)
        ]
        produce(loop.bootstrap, loop.settings.retry_topic, records, partition=partition)


def _stored_ids(loop: Loop) -> tuple[list[int], list[int]]:
    """The ids (the order stored in) of the backlog's rows and of the quick ones."""
    with psycopg.connect(loop.settings.database_url) as conn:
        rows = conn.execute("SELECT id, msg_key FROM retry_jobs_all").fetchall()
    backlog = [i for i, key in rows if bytes(key).startswith(b"b")]
    quick = [i for i, key in rows if bytes(key).startswith(b"q")]
    return backlog, quick


def _stored_count(loop: Loop) -> int:
    with psycopg.connect(loop.settings.database_url) as conn:
        [(n,)] = conn.execute("SELECT count(*) FROM retry_jobs_all").fetchall()
    return int(n)


def _each_record_once(loop: Loop, partitions: int, per_partition: int) -> None:
    with psycopg.connect(loop.settings.database_url) as conn:
        stored = conn.execute("SELECT source_partition, source_offset FROM retry_jobs_all").fetchall()
    counts = Counter(stored)
    assert [k for k, n in counts.items() if n > 1] == []  # none twice
    assert sorted(counts) == [(p, o) for p in range(partitions) for o in range(per_partition)]  # none lost


@pytest.mark.parametrize("read_ahead_ms", [30_000, 0])
def test_records_due_soon_are_stored_ahead_of_a_backlog_due_later_on_their_partition(
    database_url: str, bootstrap_servers: str, topic_prefix: str, read_ahead_ms: int
) -> None:
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix,
        ingest_batch=500, ingest_workers=1, ingest_read_ahead_ms=read_ahead_ms,
    )  # fmt: skip
    _send_backlog_then_quick(loop, partitions=1, backlog=BACKLOG)

    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            total = ingestor.run(
                120, should_stop=lambda: ingestor.totals.stored >= BACKLOG + QUICK, grace_s=0
            )
        finally:
            ingestor.close()

    assert (total.stored, total.duplicates) == (BACKLOG + QUICK, 0)
    _each_record_once(loop, 1, BACKLOG + QUICK)
    backlog, quick = _stored_ids(loop)
    stored_after_quick = sum(i > max(quick) for i in backlog)
    if read_ahead_ms:  # the backlog's rows waited while the ingest read on to the quick ones
        assert stored_after_quick >= BACKLOG // 2, stored_after_quick
    else:  # in the order read: behind the whole backlog
        assert stored_after_quick == 0
    with psycopg.connect(database_url) as conn:
        marks = conn.execute(
            "SELECT next_offset, read_to FROM retry_ingest_offsets WHERE consumer_group = %s",
            (loop.settings.consumer_group,),
        ).fetchall()
    assert marks == [(BACKLOG + QUICK, BACKLOG + QUICK)]


class Killed(Exception):
    """Raised where a loop dies: what it committed stays, nothing else is done (no row waiting stored)."""


def _pipeline(loop: Loop, go_on: Callable[[IngestCounts], bool], *, killed: bool = False) -> IngestCounts:
    """One ingest loop (one process) while ``go_on(what it stored so far)``; ``killed``: it then dies
    instead of stopping (a loop asked to stop stores every row waiting first)."""
    stored = IngestCounts()

    def going() -> bool:
        if go_on(stored):
            return True
        if killed:
            raise Killed
        return False

    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            with contextlib.suppress(Killed):
                ingestor.pipeline(going, stored.add)
        finally:
            ingestor.close()
    return stored


def _marks(loop: Loop) -> tuple[int, int]:
    with psycopg.connect(loop.settings.database_url) as conn:
        [(next_offset, read_to)] = conn.execute(
            "SELECT next_offset, read_to FROM retry_ingest_offsets WHERE consumer_group = %s",
            (loop.settings.consumer_group,),
        ).fetchall()
    return next_offset, read_to


def test_a_loop_asked_to_stop_stores_every_row_waiting_first(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    backlog = 3_000
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, ingest_batch=500, ingest_workers=1)
    _send_backlog_then_quick(loop, partitions=1, backlog=backlog)

    _pipeline(loop, lambda stored: stored.stored < QUICK)  # stopped once the quick ones are stored

    next_offset, read_to = _marks(loop)
    assert next_offset == read_to == backlog + QUICK  # nothing waits: the next loop reads on from there
    _each_record_once(loop, 1, backlog + QUICK)


def test_loops_that_die_with_rows_waiting_are_followed_by_ones_that_store_each_record_once(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Two loops die with rows waiting, the third reads on; between them the records due soon are
    published, so that only the stored offsets can tell the next loop they were stored already."""
    backlog = 3_000
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, ingest_batch=500, ingest_workers=1)
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest], partitions=1)
    later, now = str(int(time.time() * 1000) + 600_000), str(int(time.time() * 1000))
    # every 50th record of the backlog is due now too, as steady traffic is among a burst
    records = [
        {"key": f"{'q' if i % 50 == 0 else 'b'}{i}".encode(), "value": b"x" * 100,
         "headers": hdr(destination=loop.dest, at=now if i % 50 == 0 else later)}
        for i in range(backlog)
    ]  # fmt: skip
    produce(loop.bootstrap, loop.settings.retry_topic, records, partition=0)
    soon = backlog // 50

    # The first loop dies once it stored the records due now: the backlog's rows are still waiting.
    _pipeline(loop, lambda stored: stored.stored < soon, killed=True)
    backlog_ids, quick_ids = _stored_ids(loop)
    assert len(quick_ids) == soon and len(backlog_ids) < backlog - soon
    next_offset, read_to = _marks(loop)
    assert next_offset < read_to == backlog  # read to the end, stored to the first waiting row

    # Those due now are published meanwhile: their rows leave retry_jobs' unique key.
    assert loop.publish(4).published == soon
    # The second loop reads again from the lowest record not stored, and dies after its first batch:
    # the first loop's mark must outlive it.
    second = _pipeline(loop, lambda stored: stored.batches < 1, killed=True)
    assert second.batches >= 1
    assert _marks(loop)[1] == backlog
    # The third reads everything that is left.
    third = _pipeline(loop, lambda _stored: _stored_count(loop) < backlog)
    assert third.stored > 0
    _each_record_once(loop, 1, backlog)
    assert loop.publish(2).published == 0  # those due now are not published again
    assert len(consume(loop.bootstrap, [loop.dest], soon + 1, timeout_s=10)) == soon


def test_an_ingest_worker_killed_with_rows_waiting_loses_none_and_stores_none_twice(
    database_url: str, bootstrap_servers: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog = 2_000
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, ingest_batch=300, ingest_workers=2)
    _send_backlog_then_quick(loop, partitions=2, backlog=backlog)
    expected = 2 * (backlog + QUICK)

    # Each worker process SIGKILLs itself after its first stored transaction, before Kafka's commit.
    monkeypatch.setenv("RETRY_FAULT", "ingest.stored:1")
    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            with pytest.raises(IngestWorkerError, match=r"exited with code -9"):
                ingestor.run(60, grace_s=0)
        finally:
            ingestor.close()
    monkeypatch.delenv("RETRY_FAULT")
    _backlog_ids, quick_ids = _stored_ids(loop)
    assert 0 < len(_backlog_ids) + len(quick_ids) < expected
    loop.publish(4)

    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            ingestor.run(60, should_stop=lambda: _stored_count(loop) >= expected, grace_s=0)
        finally:
            ingestor.close()
    _each_record_once(loop, 2, backlog + QUICK)
    loop.publish(3)
    assert len(consume(loop.bootstrap, [loop.dest], 2 * QUICK + 1, timeout_s=10)) == 2 * QUICK
