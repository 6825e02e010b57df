"""The ingest's read-ahead on the broker (loops/read_ahead.py): records due soon, behind a backlog due
later on the same partition, are stored first; a loop stopped or killed -9 with rows waiting loses
none, and the next one stores none twice, even of those published meanwhile."""

from __future__ import annotations

import time
from collections import Counter

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


def _stored(loop: Loop) -> int:
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


def test_a_loop_stopped_with_rows_waiting_is_followed_by_one_that_stores_each_record_once(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    backlog = 3_000
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, ingest_batch=500, ingest_workers=1)
    _send_backlog_then_quick(loop, partitions=1, backlog=backlog)

    # The first loop stops as soon as it stored the quick records: the backlog's rows are still waiting.
    stored = IngestCounts()
    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            ingestor.pipeline(lambda: stored.stored < QUICK, stored.add)
        finally:
            ingestor.close()
    backlog_ids, quick_ids = _stored_ids(loop)
    assert len(quick_ids) == QUICK and len(backlog_ids) < backlog
    with psycopg.connect(database_url) as conn:
        [(next_offset, read_to)] = conn.execute(
            "SELECT next_offset, read_to FROM retry_ingest_offsets WHERE consumer_group = %s",
            (loop.settings.consumer_group,),
        ).fetchall()
    assert next_offset <= len(backlog_ids) < read_to == backlog + QUICK

    # The quick ones are published meanwhile: their rows leave retry_jobs' unique key.
    assert loop.publish(4).published == QUICK
    # The next loop reads the backlog's rows again from the lowest not stored, and the quick ones too.
    with loop.store() as store:
        ingestor = Ingestor(Deployment(loop.settings, loop.registry), store)
        try:
            total = ingestor.run(60, should_stop=lambda: ingestor.totals.consumed >= backlog + QUICK - next_offset,
                                 grace_s=0)  # fmt: skip
        finally:
            ingestor.close()
    assert total.duplicates == QUICK
    _each_record_once(loop, 1, backlog + QUICK)
    assert loop.publish(2).published == 0  # the quick ones are not published again
    assert len(consume(loop.bootstrap, [loop.dest], QUICK + 1, timeout_s=10)) == QUICK


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
            ingestor.run(60, should_stop=lambda: _stored(loop) >= expected, grace_s=0)
        finally:
            ingestor.close()
    _each_record_once(loop, 2, backlog + QUICK)
    loop.publish(3)
    assert len(consume(loop.bootstrap, [loop.dest], 2 * QUICK + 1, timeout_s=10)) == 2 * QUICK
