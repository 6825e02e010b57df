"""Ingest and publish against the real PostgreSQL and the embedded broker."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.declarations import Destination
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import COPY_COLUMNS
from retry_scheduler.core.policy import Backoff, Policy, PolicyRegistry
from retry_scheduler.db.store import Store
from retry_scheduler.db.vacuum import SelfVacuum
from retry_scheduler.loops.handover import LoopTenure
from retry_scheduler.loops.ingest import IngestCounts, Ingestor
from retry_scheduler.loops.ingest_worker import SPARES_AFTER_S, SPARES_APART_S, IngestWorkerError
from retry_scheduler.loops.kafka import ServiceProducer, make_producer, wait_until_ready
from retry_scheduler.loops.publish import PublishCounts, Publisher
from tests.kafkautil import consume, create_topics, produce

pytestmark = pytest.mark.integration

POLICIES = PolicyRegistry.of(
    [
        Policy("default", delays=["1s"], max_attempts=2, max_age="1h", fatal_errors=["SchemaError"]),
        Policy("short-lived", delays=["1s"], max_attempts=5, max_age="2s"),
        Policy("backoff", backoff=Backoff(base="1s", factor=2, max="4s"), max_attempts=3),
    ]
)


@dataclass
class Loop:
    settings: Settings
    registry: PolicyRegistry
    bootstrap: str
    dest: str

    def store(self) -> Store:
        return Store(self.settings.database_url)

    def send(self, records: list[dict], topic: str | None = None) -> None:
        produce(self.bootstrap, topic or self.settings.retry_topic, records)

    def ingest(
        self, expected: int, timeout_s: float = 30, ingestor_class: type[Ingestor] = Ingestor, **kw: object
    ) -> IngestCounts:
        """Run the ingest loop until ``expected`` records were consumed."""
        settings = self.settings.with_overrides(**kw) if kw else self.settings
        with Store(settings.database_url) as store:
            ingestor = ingestor_class(Deployment(settings, self.registry), store)
            total = IngestCounts()
            deadline = time.monotonic() + timeout_s
            try:
                while total.consumed < expected and time.monotonic() < deadline:
                    total.add(ingestor.ingest_batch(0.5))
            finally:
                ingestor.close()
        return total

    def publish(self, seconds: float, **kw: object):
        settings = self.settings.with_overrides(**kw) if kw else self.settings
        with Store(settings.database_url) as store:
            publisher = Publisher(Deployment.load(settings), store)
            try:
                return publisher.run(seconds)
            finally:
                publisher.close()

    def allowing(self, *topics: str) -> Deployment:
        """The loop's deployment with ``topics`` declared as destinations (as a replay is given one)."""
        declared = [Destination(t) for t in topics]
        return Deployment(self.settings, PolicyRegistry.of(self.registry.policies.values(), declared))

    def rows(self, where: str = "true") -> list[dict]:
        with psycopg.connect(self.settings.database_url, row_factory=psycopg.rows.dict_row) as conn:
            return conn.execute(f"SELECT * FROM retry_jobs_all WHERE {where} ORDER BY id").fetchall()  # type: ignore[arg-type]


def new_loop(database_url: str, bootstrap_servers: str, topic_prefix: str, **changes: object) -> Loop:
    """The loops of these tests on topics of their own (``{prefix}-retry``, ``-orders``, ``-dlq``);
    ``changes`` override the settings."""
    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        retry_topic=f"{topic_prefix}-retry",
        consumer_group=f"{topic_prefix}-scheduler",
        destination_allowlist=rf"^{topic_prefix}-[a-z.]+$",
        create_topics=True,
        lease_ms=3000,
        delivery_timeout_ms=2000,
        loop_grace_ms=0,  # no successor loop in these tests: stop on time
    ).with_overrides(**changes)
    dlq = f"{topic_prefix}-dlq"
    registry = PolicyRegistry.of([dataclasses.replace(x, dlq_topic=dlq) for x in POLICIES.policies.values()])
    return Loop(settings, registry, bootstrap_servers, f"{topic_prefix}-orders")


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(database_url, bootstrap_servers, topic_prefix)


def hdr(**kv: str | bytes) -> list[tuple[str, bytes]]:
    return [("retry." + k.replace("_", "-"), v.encode() if isinstance(v, str) else v) for k, v in kv.items()]


def test_record_comes_back_byte_for_byte_never_early(loop: Loop) -> None:
    create_topics(loop.bootstrap, [loop.dest], partitions=3)
    due_ms = int(time.time() * 1000) + 8000  # ingest (with its group join) is done well before
    headers = [("trace-id", b"\x00\x01\xfe"), ("dup", b"1"), ("dup", b"2"), ("nullh", None)]
    loop.send(
        [{"key": b"\xffkey", "value": b"\x00value\xff",
          "headers": headers + hdr(original_topic=loop.dest, original_partition="2", original_offset="17",
                                   at=str(due_ms), reason="db down", error_class="x.Timeout", group="g1")}]
    )  # fmt: skip
    counts = loop.ingest(1)
    assert (counts.consumed, counts.stored, counts.pending) == (1, 1, 1)
    published = loop.publish(10)
    assert published.published == 1

    [seen] = consume(loop.bootstrap, [loop.dest], 1)
    assert (seen.key, seen.value, seen.partition) == (b"\xffkey", b"\x00value\xff", 2)
    assert seen.headers[:4] == headers  # pass-through headers unchanged, in order, repeats and nulls kept
    assert seen.header(p.ATTEMPT) == "1"
    assert seen.header(p.ORIGINAL_TOPIC) == loop.dest
    assert seen.header(p.ORIGINAL_OFFSET) == "17"
    [row] = loop.rows()
    assert seen.header(p.ID) == row["retry_id"]
    assert row["status"] == "published"
    assert seen.timestamp_ms >= due_ms, "published before its due time"
    assert row["published_at"] >= row["due_at"]
    assert (row["published_at"] - row["due_at"]).total_seconds() < 1.0


class CrashBeforeOffsetCommit(Ingestor):
    """An ingest loop whose process dies after each DB commit, before the Kafka offset commit."""

    def _commit(self, next_offsets):
        pass


def test_offsets_are_committed_after_rows_and_duplicates_are_ignored(loop: Loop) -> None:
    loop.send(
        [{"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(50)]
    )

    first = loop.ingest(50, ingestor_class=CrashBeforeOffsetCommit)
    assert first.stored == 50

    # Kafka has no offset of the group (never committed here; or expired, offsets.retention.minutes):
    # the partitions are the ones PostgreSQL's offsets came from, so those are taken, and nothing is
    # read twice (not from the start of the topic).
    again = loop.ingest(1, timeout_s=8)
    assert again.consumed == 0
    assert len(loop.rows()) == 50


def test_a_retry_topic_created_again_is_read_from_its_start(loop: Loop) -> None:
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=1)
    loop.send(
        [{"key": b"old%d" % i, "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(20)]
    )
    assert loop.ingest(20, ingestor_class=CrashBeforeOffsetCommit).stored == 20

    # The topic is deleted and created again: its offsets start over, below PostgreSQL's 20.
    admin = AdminClient({"bootstrap.servers": loop.bootstrap})
    admin.delete_topics([loop.settings.retry_topic])[loop.settings.retry_topic].result(15)
    deadline = time.monotonic() + 15
    while loop.settings.retry_topic in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=1)
    loop.send([{"key": b"new%d" % i, "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(5)])

    again = loop.ingest(5)
    assert (again.consumed, again.stored) == (5, 5)  # not skipped as if PostgreSQL's offsets applied
    assert sorted(r["msg_key"] for r in loop.rows("msg_key::text LIKE '%6e6577%'")) == [
        b"new%d" % i for i in range(5)
    ]
    assert len(loop.rows()) == 25


def test_a_new_ingest_loop_starts_from_the_offsets_stored_with_the_rows(loop: Loop) -> None:
    loop.send([{"key": b"a%d" % i, "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(20)])
    assert loop.ingest(20).stored == 20  # Kafka now knows the group's offsets too
    loop.send([{"key": b"b%d" % i, "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(30)])
    first = loop.ingest(30, ingestor_class=CrashBeforeOffsetCommit)
    assert first.stored == 30

    # Kafka's offsets are 30 records behind; PostgreSQL's, stored with the rows, are not.
    again = loop.ingest(1, timeout_s=8)
    assert again.consumed == 0
    assert len(loop.rows()) == 50
    with psycopg.connect(loop.settings.database_url) as conn:
        offsets = conn.execute(
            "SELECT sum(next_offset) FROM retry_ingest_offsets WHERE consumer_group = %s",
            (loop.settings.consumer_group,),
        ).fetchone()
    assert offsets == (50,)


@pytest.mark.parametrize(
    ("headers", "dead_reason", "reason_part"),
    [
        ({"attempt": "2"}, "exhausted", None),
        ({"original_timestamp": "1000"}, "expired", None),
        ({"error_class": "app.SchemaError", "reason": "bad schema"}, "fatal", "bad schema"),
        ({"send_to": "dlq", "reason": "operator said so"}, "requested", "operator said so"),
        ({"attempt": "many"}, "invalid", "retry.attempt='many' is not an integer"),
        ({"send_to": "later"}, "invalid", "must be 'retry' or 'dlq'"),
        ({"policy": "nope"}, "invalid", "unknown policy 'nope'"),
        ({"at": b"\xff\xfe"}, "invalid", "retry.at is not valid UTF-8"),
    ],
)
def test_every_dead_path_lands_on_the_dlq(
    loop: Loop, headers: dict, dead_reason: str, reason_part: str | None
) -> None:
    loop.send(
        [{"key": b"k", "value": b"v", "headers": [("keep", b"me"), *hdr(destination=loop.dest, **headers)]}]
    )
    counts = loop.ingest(1)
    assert counts.dead == {dead_reason: 1}
    assert loop.publish(3).dead_published == 1

    [seen] = consume(loop.bootstrap, [f"{loop.settings.retry_topic.rsplit('-', 1)[0]}-dlq"], 1)
    assert seen.header(p.DEAD_REASON) == dead_reason
    assert (seen.key, seen.value) == (b"k", b"v")
    assert ("keep", b"me") in seen.headers
    if reason_part:
        assert reason_part in (seen.header(p.REASON) or "")
    [row] = loop.rows()
    assert (row["status"], row["dead_reason"]) == ("dead", dead_reason)
    assert row["dlq_published_at"] is not None


@pytest.mark.parametrize(
    ("headers", "reason_part"),
    [
        ([], "no destination"),
        (hdr(destination="_internal"), "not allowed"),
        (hdr(destination="retry"), "not allowed"),
        ([("x", b"y")] * 300, "more than the 256 allowed"),
    ],
)
def test_malformed_records_are_dead_and_never_stop_ingestion(
    loop: Loop, headers: list, reason_part: str
) -> None:
    good = {"key": b"good", "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
    loop.send([{"key": b"bad", "value": b"v", "headers": headers}, good])
    counts = loop.ingest(2)
    assert counts.dead == {"invalid": 1} and counts.pending == 1
    loop.publish(3)
    dlq = consume(loop.bootstrap, [loop.registry.get("default").dlq_topic], 1)
    assert [s.key for s in dlq] == [b"bad"]
    assert reason_part in (dlq[0].header(p.REASON) or "")
    assert [s.key for s in consume(loop.bootstrap, [loop.dest], 1)] == [b"good"]


def test_oversize_record_is_dead_invalid(loop: Loop) -> None:
    loop.send([{"key": b"big", "value": b"x" * 5000, "headers": hdr(destination=loop.dest)}])
    counts = loop.ingest(1, max_record_bytes=4096)
    assert counts.dead == {"invalid": 1}
    [row] = loop.rows()
    assert "more than the 4096 allowed" in row["reason"]
    assert bytes(row["msg_value"]) == b"x" * 5000  # kept whole


def test_crash_between_produce_and_mark_republishes_with_same_identity(loop: Loop) -> None:
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, attempt="1", at="0")}])
    loop.ingest(1)

    class Crash(Exception):
        pass

    with loop.store() as store:
        publisher = Publisher(Deployment.load(loop.settings), store)

        def crash(_acked):
            raise Crash("killed after the broker acknowledged, before the mark")

        publisher.store.queue.mark_published = crash  # type: ignore[method-assign]
        with pytest.raises(Crash):
            publisher.publish_once()
        publisher.close()
    [row] = loop.rows()
    # The crash ended the claiming transaction: nothing was written, and no lease holds the job.
    assert (row["status"], row["lease_until"], row["publish_failures"]) == ("pending", None, 0)

    result = loop.publish(1)  # due again at once
    assert result.published == 1

    seen = consume(loop.bootstrap, [loop.dest], 2)
    assert len(seen) == 2
    assert {s.header(p.ID) for s in seen} == {row["retry_id"]}
    assert {s.header(p.ATTEMPT) for s in seen} == {"2"}
    assert loop.rows()[0]["status"] == "published"


class Recorder:
    """A metrics sink that keeps what it is sent (the one boundary the metrics tests replace)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []

    def incr(self, name: str, count: int = 1) -> None:
        self.sent.append(("incr", name, count))

    def gauge(self, name: str, value: float) -> None:
        self.sent.append(("gauge", name, value))

    def timing(self, name: str, ms: float) -> None:
        self.sent.append(("timing", name, ms))


def test_a_job_stored_twice_whose_twin_was_published_never_stops_publishing(loop: Loop) -> None:
    """Should a record's job be stored again after its first was published (a bug of ours, or rows
    restored by hand), the second is published as a duplicate (same retry.id) and leaves retry_jobs:
    its move to retry_published_jobs must not roll back the round, or that publisher would fail
    every round after it, and hold back every job claimed with it."""
    create_topics(loop.bootstrap, [loop.dest], partitions=1)
    loop.send([{"key": b"k1", "value": b"v1", "headers": hdr(destination=loop.dest)}])
    assert loop.ingest(1).stored == 1
    assert loop.publish(3).published == 1
    columns = ", ".join(COPY_COLUMNS)
    pending = {"status": "'pending'", "dead_reason": "NULL", "dead_at": "NULL"}
    chosen = ", ".join(pending.get(column, column) for column in COPY_COLUMNS)
    with psycopg.connect(loop.settings.database_url) as conn:
        conn.execute(f"INSERT INTO retry_jobs ({columns}) SELECT {chosen} FROM retry_published_jobs")  # type: ignore[arg-type]
    loop.send([{"key": b"k2", "value": b"v2", "headers": hdr(destination=loop.dest)}])
    assert loop.ingest(1).stored == 1

    # the twin (produced again, its row not counted again: its first is) and the record behind it
    assert loop.publish(3).published == 1

    assert loop.rows("status = 'pending'") == []
    seen = consume(loop.bootstrap, [loop.dest], 3)
    assert sorted(s.key for s in seen) == [b"k1", b"k1", b"k2"]
    twins = [s for s in seen if s.key == b"k1"]
    assert twins[0].header(p.ID) == twins[1].header(p.ID)  # a duplicate a consumer can tell


def test_metrics_are_reported_per_round_and_a_failing_snapshot_never_stops_publishing(loop: Loop) -> None:
    """The metrics sink records what the loop reports (a recorder at that one boundary); the snapshot's
    reading fails, as a statement timeout would, and the loop publishes on."""
    import threading

    loop.send(
        [
            {"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
            for i in range(3)
        ]
    )
    loop.ingest(3)
    recorder = Recorder()
    with loop.store() as store:
        publisher = Publisher(Deployment.load(loop.settings), store, metrics=recorder)

        def timed_out() -> dict:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

        store.readings.metrics_reading = timed_out  # type: ignore[method-assign]
        stop = threading.Event()
        rounds = iter(range(3))
        publisher.work(stop, go_on=lambda: next(rounds, None) is not None)
        publisher.close()
    assert publisher.totals.published == 3
    assert ("incr", "retry_scheduler.publish.published", 3) in recorder.sent
    assert ("gauge", "retry_scheduler.publish.batch_size", 3) in recorder.sent
    assert not [
        s for s in recorder.sent if s[1].endswith(("backlog_due", "lateness_p99"))
    ]  # snapshot skipped
    assert [r["status"] for r in loop.rows()] == ["published"] * 3


def test_a_job_in_flight_is_not_claimed_by_another_publisher(loop: Loop) -> None:
    loop.send(
        [
            {"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
            for i in range(5)
        ]
    )
    loop.ingest(5)
    with loop.store() as store_a, loop.store() as store_b:
        a, b = (
            Publisher(Deployment.load(loop.settings), store_a),
            Publisher(Deployment.load(loop.settings), store_b),
        )
        tried_meanwhile = []
        real_mark = store_a.queue.mark_published

        def mark_after_b_tried(acked):  # a's jobs are acknowledged, not yet marked
            tried_meanwhile.append(b.publish_once())
            return real_mark(acked)

        store_a.queue.mark_published = mark_after_b_tried  # type: ignore[method-assign]
        first = a.publish_once()
        a.close()
        b.close()
    assert first.published == 5
    assert tried_meanwhile[0].claimed == 0
    assert [r["status"] for r in loop.rows()] == ["published"] * 5
    assert len(consume(loop.bootstrap, [loop.dest], 5)) == 5


def test_failed_delivery_leaves_the_job_claimable(loop: Loop) -> None:
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at="0")}])
    loop.ingest(1)
    counts = loop.publish(1, create_topics=False)  # destination missing, creation not allowed
    assert counts.published == 0 and counts.failed >= 1
    [row] = loop.rows()
    assert row["status"] == "pending"
    assert row["publish_failures"] >= 1
    assert f"topic {loop.dest} does not exist" in row["last_error"]

    assert loop.publish(3).published == 1  # configuration now allows creating it
    assert len(consume(loop.bootstrap, [loop.dest], 1)) == 1


def test_failed_deliveries_back_off_from_one_second_doubling_to_a_minute(loop: Loop) -> None:
    """Through real failed deliveries (the destination missing, creation not allowed): each failure
    makes the job claimable again 1 s, 2 s, 4 s, 8 s ... later, never more than 60 s, and no publisher
    tries it before. The later steps start from a failure count set in the row (waiting them out
    takes two minutes); the backoff after each is still what a real failure wrote."""
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at="0")}])
    loop.ingest(1)
    settings = loop.settings.with_overrides(create_topics=False)

    def server_clock(store: Store) -> float:
        with store.conn.transaction():
            [(now,)] = store.conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchall()
        return float(now)

    def backoff_after_failure(
        store: Store, publisher: Publisher, deadline_s: float
    ) -> tuple[float, float, float]:
        """Publish until the job's delivery fails: (the backoff it got, the server's clock when the
        round that tried it ended, when the job is claimable again), in seconds. The round claimed
        the job at some moment before it ended, so a round ending before the previous failure's
        backoff ran out would show an early try."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            started = server_clock(store)
            if publisher.publish_once().failed:
                ended = server_clock(store)
                [row] = loop.rows()
                claimable = row["lease_until"].timestamp()
                return claimable - started, ended, claimable
            time.sleep(0.05)
        raise AssertionError(f"the job was not tried within {deadline_s} s")

    with loop.store() as store:
        publisher = Publisher(Deployment.load(settings), store)
        try:
            tries = [backoff_after_failure(store, publisher, 5) for _ in range(4)]
            with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
                for failures in (5, 6, 40):  # as after that many failures, due again now
                    conn.execute(
                        "UPDATE retry_jobs SET publish_failures = %s, lease_until = NULL", (failures,)
                    )
                    tries.append(backoff_after_failure(store, publisher, 5))
        finally:
            publisher.close()
    backoffs = [b for b, _, _ in tries]
    for got, expected in zip(backoffs, [1, 2, 4, 8, 32, 60, 60], strict=True):
        assert expected <= got < expected + 0.5, backoffs
    for (_, _, claimable), (_, next_tried, _) in itertools.pairwise(tries[:4]):
        assert next_tried >= claimable  # never tried again before its backoff ended
    [row] = loop.rows()
    assert (row["status"], row["publish_failures"]) == ("pending", 41)
    assert f"topic {loop.dest} does not exist" in row["last_error"]


def test_per_delay_topic_counts_from_the_record_timestamp(loop: Loop) -> None:
    delay_topic = f"{loop.settings.retry_topic}.2s"
    sent = int(time.time() * 1000)
    loop.settings = loop.settings.with_overrides(delay_topics={delay_topic: 2000})
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest)}], topic=delay_topic)
    loop.ingest(1)
    [row] = loop.rows()
    due_ms = row["due_at"].timestamp() * 1000
    assert sent <= due_ms - 2000 <= sent + 1000
    loop.publish(4)
    [seen] = consume(loop.bootstrap, [loop.dest], 1)
    assert seen.timestamp_ms >= due_ms


def test_concurrent_publishers_never_publish_a_job_twice(loop: Loop) -> None:
    import threading

    loop.send(
        [
            {"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
            for i in range(300)
        ]
    )
    loop.ingest(300)
    # Each publisher made (its connections and producer) before any claims: they start together, so
    # one that was slower to set up cannot find the work already done.
    settings = loop.settings.with_overrides(publish_batch=20)
    stores = [Store(settings.database_url) for _ in range(3)]
    publishers = [Publisher(Deployment.load(settings), store) for store in stores]
    ready = threading.Barrier(len(publishers))
    results = []

    def run(publisher: Publisher) -> None:
        ready.wait()
        results.append(publisher.run(3))

    threads = [threading.Thread(target=run, args=(publisher,)) for publisher in publishers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for publisher, store in zip(publishers, stores, strict=True):
            publisher.close()
            store.close()
    assert sum(r.published for r in results) == 300
    assert all(r.published > 0 for r in results)  # the work was really shared
    seen = consume(loop.bootstrap, [loop.dest], 300)
    assert len(seen) == 300
    assert len({s.key for s in seen}) == 300


def test_the_publish_loop_shares_work_with_its_helper_publishers(loop: Loop) -> None:
    loop.send(
        [
            {"key": str(i).encode(), "value": b"v", "headers": hdr(destination=loop.dest, at="0")}
            for i in range(200)
        ]
    )
    loop.ingest(200)
    settings = loop.settings.with_overrides(publish_workers=2, publish_batch=10)
    with loop.store() as store:
        publisher = Publisher(Deployment.load(settings), store)
        total = publisher.run(30, should_stop=lambda: publisher.published_so_far() >= 200)
        publisher.close()
    assert total.published == 200
    [helper] = publisher.helpers
    assert 0 < helper.totals.published < 200  # both worked, each job once
    assert publisher.totals.published + helper.totals.published == 200
    assert len({s.key for s in consume(loop.bootstrap, [loop.dest], 200)}) == 200


def test_a_publish_loop_relieves_the_running_one_only_once_its_producers_can_publish(loop: Loop) -> None:
    """An idempotent producer's first records wait about 0.5 s for its producer id: a loop that took
    over (and claimed a round of due jobs) before then held those jobs late at every task start."""
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at="0")}] * 20)
    loop.ingest(20)
    settings = loop.settings.with_overrides(publish_workers=2)
    relieved_at: list[float] = []
    with loop.store() as running_store, loop.store() as store:
        running = LoopTenure(running_store.loops, "publish", duration_s=0, grace_s=300)  # the loop taken over
        publisher = Publisher(Deployment.load(settings), store)
        assert not publisher.producer.id_assigned.is_set(), "a new producer has no id yet"

        def watch() -> None:
            while running.go_on():
                time.sleep(0.02)
            relieved_at.append(time.time())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        total = publisher.run(1)
        publisher.close()
        watcher.join(30)
        running.finish()
    producers = [p.producer for p in (publisher, *publisher.helpers)]
    assert len(producers) == 2 and all(isinstance(p, ServiceProducer) for p in producers)
    ready = [p.ready_at for p in producers]
    assert None not in ready, "every producer got its id from the broker"
    assert relieved_at and relieved_at[0] >= max(ready), (
        "the running loop was relieved before the new one could publish"
    )
    assert total.published == 20


def test_a_producer_with_no_broker_is_waited_for_a_bounded_time(
    loop: Loop, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = Settings(kafka={"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    producer = make_producer(unreachable)
    began = time.monotonic()
    assert not wait_until_ready([producer], 1.5)
    assert 1.5 <= time.monotonic() - began < 10
    assert "no producer id from the broker after 2 s" in caplog.text
    # Reports turned off in the settings: nothing to wait for.
    silent = make_producer(
        unreachable.with_overrides(kafka={**unreachable.kafka, "statistics.interval.ms": "0"})
    )
    assert wait_until_ready([silent], 30) and silent.ready_at is not None


def _due_index_entries_read(store: Store, floor: datetime | None) -> int:
    """How many entries of retry_jobs_due_idx one claim from ``floor`` reads (the claim rolled back)."""
    counter = "SELECT pg_stat_get_xact_tuples_returned('retry_jobs_due_idx'::regclass)"
    with store.conn.transaction(force_rollback=True):  # no flush of the session's counts within it
        [(before,)] = store.conn.execute(counter).fetchall()
        store.queue.claim_due(10_000, floor=floor)
        [(after,)] = store.conn.execute(counter).fetchall()
    return int(after - before)


def _publish(publisher: Publisher, jobs: int, timeout_s: float = 30) -> None:
    """Publish rounds until ``jobs`` more jobs were published."""
    deadline, published = time.monotonic() + timeout_s, 0
    while published < jobs:
        assert time.monotonic() < deadline, f"{published} of {jobs} published within {timeout_s} s"
        published += publisher.publish_once().published
        time.sleep(0.02)


def test_claims_start_past_the_entries_a_held_snapshot_keeps_in_the_due_index(loop: Loop) -> None:
    """While a transaction holds an old snapshot (a report, a dump, a Spark JDBC read), PostgreSQL can
    neither remove nor mark dead the due index's entry of any job published since: a claim from the
    index's head walks them all, which at thousands of retries a second made claims take seconds."""
    ago = str(int(time.time() * 1000) - 10_000)
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at=ago)}] * 2_000)
    loop.ingest(2_000)
    with psycopg.connect(loop.settings.database_url) as report:  # its snapshot: before any publish
        report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        report.execute("SELECT count(*) FROM retry_jobs_all").fetchone()
        with loop.store() as store:
            publisher = Publisher(Deployment.load(loop.settings.with_overrides(publish_batch=500)), store)
            try:
                _publish(publisher, 2_000)
                assert publisher.publish_once().claimed == 0  # the round that finds nothing more due
                floor = publisher.floor
                assert floor is not None
                from_head, from_floor = (
                    _due_index_entries_read(store, None),
                    _due_index_entries_read(store, floor),
                )
                # Still published under the snapshot: jobs stored now.
                now = str(int(time.time() * 1000))
                loop.send([{"key": b"n", "value": b"v", "headers": hdr(destination=loop.dest, at=now)}] * 10)
                loop.ingest(10)
                _publish(publisher, 10)
            finally:
                publisher.close()
    assert from_head >= 2_000, (
        "the snapshot keeps every published job's entry: a scan from the head reads them"
    )
    assert from_floor <= 10, f"a claim from the publisher's floor read {from_floor} entries"
    assert len(consume(loop.bootstrap, [loop.dest], 2_010)) == 2_010


def taken_over(floors: list[datetime | None], recorded: datetime) -> datetime | None:
    """The first claim floor at or above the relieved loop's recorded one, if any."""
    return next((f for f in floors if f is not None and f >= recorded), None)


def test_a_new_publish_loop_starts_its_claims_at_the_floor_of_the_loop_it_relieves(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each Airflow task starts a new publish loop; its first claim was a sweep from the due index's
    head, which under a held snapshot walks the entry of every job published since (two seconds of
    lateness at each task's start beside a Spark bulk retry). It starts where the loop it relieves
    left nothing claimable behind, and sweeps when that loop would have. A job stored an hour late is
    published at once by whichever loop hears of it first (``db.overdue``), not at the next sweep."""
    # A sweep every 8 s: the first loop's is at its start, the second loop's when it would have been.
    monkeypatch.setattr("retry_scheduler.loops.claim_floors.SWEEP_COST_SHARE", 1e9)
    monkeypatch.setattr("retry_scheduler.loops.claim_floors.SWEEP_MAX_EVERY_S", 8.0)
    ago = str(int(time.time() * 1000) - 10_000)
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at=ago)}] * 2_000)
    loop.ingest(2_000)
    settings = loop.settings.with_overrides(publish_batch=500, publish_workers=2)
    with psycopg.connect(loop.settings.database_url) as report:  # its snapshot: before any publish
        report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        report.execute("SELECT count(*) FROM retry_jobs_all").fetchone()
        with loop.store() as store_a, loop.store() as store_b, loop.store() as probe:
            first = Publisher(Deployment.load(settings), store_a)
            done: list[PublishCounts] = []
            thread = threading.Thread(target=lambda: done.append(first.run(1, grace_s=60)), daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            while (recorded := probe.loops.claim_state_alive(5)) is None or first.published_so_far() < 2_000:
                assert time.monotonic() < deadline, "the running loop recorded no floor"
                time.sleep(0.1)
            second = Publisher(Deployment.load(settings), store_b)
            floors: list[datetime | None] = []
            claim_due = store_b.queue.claim_due
            store_b.queue.claim_due = lambda limit, floor=None: (
                floors.append(floor) or claim_due(limit, floor)
            )  # type: ignore[method-assign]
            hour_ago = str(int(time.time() * 1000) - 3_600_000)
            loop.send([{"key": b"late", "value": b"v", "headers": hdr(destination=loop.dest, at=hour_ago)}])
            loop.ingest(1)
            try:
                total = second.run(
                    20,
                    should_stop=lambda: (
                        len(floors) >= 2 and first.published_so_far() + second.published_so_far() >= 2_001
                    ),
                )
            finally:
                second.close()
            thread.join(30)
            first.close()
            from_head, from_floor = (
                _due_index_entries_read(probe, None),
                _due_index_entries_read(probe, taken_over(floors, recorded[0])),
            )
    assert done, "the first loop stopped, relieved by the second"
    assert done[0].published + total.published == 2_001  # the late job by one of them, once
    # (the first loop went on recording, higher, until the second relieved it)
    # (a claim lowered for the late job starts an hour back: the others start at the floor taken over)
    assert taken_over(floors, recorded[0]) is not None, (floors, recorded)
    assert from_head >= 2_000 and from_floor <= 10, (from_head, from_floor)
    assert {s.key for s in consume(loop.bootstrap, [loop.dest], 2_001)} == {b"k", b"late"}


def test_a_loop_taking_over_sweeps_first_when_its_predecessors_sweep_is_overdue(loop: Loop) -> None:
    """The sweep's schedule comes with the floor: overdue (a predecessor that swept long ago), the
    first claim is a sweep; never further off than SWEEP_MAX_EVERY_S, whatever was recorded."""
    from retry_scheduler.loops.claim_floors import SWEEP_MAX_EVERY_S

    floor = datetime.now(UTC)
    with loop.store() as store:
        publisher = Publisher(Deployment.load(loop.settings), store)
        try:
            publisher.take_over(floor, -5.0)
            overdue = publisher.claim_floor()
            publisher.take_over(floor, 30.0)
            soon = publisher.claim_floor()
            publisher.take_over(floor, 1e9)
            capped = publisher._sweep_after - time.monotonic()
        finally:
            publisher.close()
    assert overdue is None and soon == floor
    assert capped <= SWEEP_MAX_EVERY_S


def test_one_publisher_of_a_loop_sweeps_at_a_time(loop: Loop) -> None:
    """A sweep under a held snapshot takes seconds; when every publisher of a loop swept at once (their
    sweeps fall due together: the same start, or the schedule a loop takes over), no claim went out
    meanwhile. One whose sweep is due while another sweeps claims from its floor, and sweeps next."""
    floor = datetime.now(UTC)
    with loop.store() as store_a, loop.store() as store_b:
        first, second = (
            Publisher(Deployment.load(loop.settings), store_a),
            Publisher(Deployment.load(loop.settings), store_b),
        )
        second._sweeping = first._sweeping  # as run() shares it with its helpers
        try:
            for publisher in (first, second):
                publisher.take_over(floor, -1.0)  # both sweeps due
            first_claims = first.claim_floor()
            second_claims = second.claim_floor()
            first._swept()
            second_after = second.claim_floor()
            second._swept()
            first.publish_once()  # a whole round releases it too
            second_then = second.claim_floor()
            second._swept()
        finally:
            first.close()
            second.close()
    assert first_claims is None and second_claims == floor, "the second claims from its floor"
    assert second_after is None and second_then is None, "the second sweeps once the first has"


_JOBS = """
INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms, destination,
    msg_key, msg_value, attempt, policy, reason, consumer_group, retry_id, original_topic,
    original_partition, first_seen_at, due_at, status, dlq_topic, dead_reason, dead_at)
SELECT 'plan-test', %(partition)s, g, 0, %(dest)s, 'k', 'v', 1, 'default', 'r', 'g', md5(g::text), %(dest)s,
       0, now(), now() - interval '10 minutes' + g * interval '1 ms', %(status)s::retry_job_status, 'dlq',
       CASE WHEN %(status)s = 'dead' THEN 'exhausted' END, CASE WHEN %(status)s = 'dead' THEN now() END
FROM generate_series(1, %(count)s) AS g
"""


_ROWS_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)
       + pg_stat_get_xact_tuples_returned('retry_jobs'::regclass)
FROM pg_index AS i WHERE i.indrelid = 'retry_jobs'::regclass
"""


@pytest.mark.parametrize("pending_when_analyzed", [20, 0])
def test_a_round_marks_its_jobs_by_id_however_large_the_backlog_its_statistics_did_not_see(
    loop: Loop, pending_when_analyzed: int
) -> None:
    """Statistics taken when few jobs were pending (autovacuum off, or not come round yet) made the
    planner hash every pending job for each mark instead of looking its ids up: 1.5-2 s to mark 300
    jobs with a million pending, so a backlog slowed every round the more it grew, and the loop
    never caught up (ten minutes of a held snapshot, then a Spark bulk retry beside it: lateness
    climbing to 300 s). With hash joins off and statistics taken when none was pending, it walked
    every pending job instead, for each id: 212 s to mark 300 with 830 000 pending, and the loop
    stopped. Each mark reads no job but its own, by id, whatever index the statistics favour."""
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(_JOBS, {"partition": 0, "dest": loop.dest, "count": 50_000, "status": "dead"})
        if pending_when_analyzed:
            conn.execute(
                _JOBS,
                {"partition": 1, "dest": loop.dest, "count": pending_when_analyzed, "status": "pending"},
            )
        conn.execute("ANALYZE retry_jobs")  # statistics: hardly any (or no) job pending
        conn.execute(_JOBS, {"partition": 2, "dest": loop.dest, "count": 60_000, "status": "pending"})
    with loop.store() as store, store.conn.transaction(force_rollback=True):
        rows = store.queue.claim_due(300)
        [(before,)] = store.conn.execute(_ROWS_READ).fetchall()
        marked = store.queue.mark_published([(row.id, int(time.time() * 1000)) for row in rows[:200]])
        invalid = store.queue.mark_invalid([(row.id, "no such partition") for row in rows[200:]])
        [(after,)] = store.conn.execute(_ROWS_READ).fetchall()
    assert len(rows) == 300 and marked == 200 and invalid == 100
    # (the counter may still hold the claim's own 300 entries)
    assert after - before <= 2 * 300, f"marking 300 jobs read {after - before} rows of retry_jobs"


def test_dead_jobs_are_leased_and_marked_sent_by_id_however_many_their_statistics_did_not_see(
    loop: Loop,
) -> None:
    """The same for the dead jobs' way to the DLQ topic: statistics taken when no job was dead, then
    60 000 dead (an outage's end, a bulk dead-lettering): leasing 300 and marking them sent reads no
    job but those."""
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(_JOBS, {"partition": 0, "dest": loop.dest, "count": 50_000, "status": "pending"})
        conn.execute("ANALYZE retry_jobs")  # statistics: no job dead
        conn.execute(_JOBS, {"partition": 2, "dest": loop.dest, "count": 60_000, "status": "dead"})
    # One transaction around both (the counters are the transaction's).
    with loop.store() as store, store.conn.transaction(force_rollback=True):
        [(before,)] = store.conn.execute(_ROWS_READ).fetchall()
        rows = store.queue.claim_dead(300, 30_000, "w")
        [(leased,)] = store.conn.execute(_ROWS_READ).fetchall()
        marked = store.queue.mark_dlq_published([(row.id, int(time.time() * 1000)) for row in rows])
        [(after,)] = store.conn.execute(_ROWS_READ).fetchall()
    assert len(rows) == marked == 300
    # The lease reads the 300 oldest dead jobs' entries (twice at most: the index, then by id).
    assert leased - before <= 3 * 300, f"leasing 300 dead jobs read {leased - before} rows of retry_jobs"
    assert after - leased <= 2 * 300, f"marking 300 dead jobs sent read {after - leased} rows of retry_jobs"


def _unsummarized_ranges(conn: psycopg.Connection) -> int:
    """How many full page ranges of the published_at BRIN index are not summarized (counted by
    summarizing them in a transaction rolled back)."""
    with conn.transaction(force_rollback=True):
        [(ranges,)] = conn.execute(
            "SELECT brin_summarize_new_values('retry_published_jobs_published_at_brin'::regclass)"
        ).fetchall()
    return int(ranges)


def test_the_publish_loop_keeps_the_published_at_index_summarized_while_a_snapshot_is_held(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only VACUUM summarizes a BRIN index's new ranges, and a BRIN scan reads every heap page of a
    range not summarized: while a snapshot held every VACUUM back, each lateness read (every metrics
    snapshot, every publish task's summary) read every page published since, 2 s a read after ten
    minutes at 5 000 retries/s. The loop summarizes the new ranges at each metrics snapshot."""
    monkeypatch.setattr("retry_scheduler.loops.publish.SNAPSHOT_EVERY_S", 0.0)  # a snapshot each round
    ago = str(int(time.time() * 1000) - 10_000)
    loop.send([{"key": b"k", "value": b"v" * 200, "headers": hdr(destination=loop.dest, at=ago)}] * 6_000)
    loop.ingest(6_000)
    with psycopg.connect(loop.settings.database_url, autocommit=True) as report, report.transaction():
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM retry_jobs_all").fetchone()  # its snapshot: before any publish
        with psycopg.connect(loop.settings.database_url, autocommit=True) as other:
            with loop.store() as store:
                publisher = Publisher(Deployment.load(loop.settings.with_overrides(publish_batch=500)), store)
                try:
                    publisher.run(60, should_stop=lambda: publisher.published_so_far() >= 6_000)
                finally:
                    publisher.close()
                late = store.readings.lateness(3_600)
            after = _unsummarized_ranges(other)
            [(filled,)] = other.execute(
                "SELECT pg_relation_size('retry_published_jobs') / current_setting('block_size')::int / 16"
            ).fetchall()
    assert filled >= 10, f"the published jobs filled {filled} ranges, which no VACUUM summarized"
    # What the last round published after its snapshot may wait for the next one: a range or two.
    assert after <= 2, f"{after} ranges of published jobs left for every lateness read to read whole"
    assert late.count == 6_000 and late.early == 0
    assert len(consume(loop.bootstrap, [loop.dest], 6_000)) == 6_000


def test_a_job_due_below_the_claims_floor_is_published_by_a_sweep(loop: Loop) -> None:
    """A job that falls due below where claims start (here a record stored an hour after its due
    time) is published all the same: told of by its batch, or found by the next sweep (the other
    ways below the floor: test_stored_late.py)."""
    now = str(int(time.time() * 1000))
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at=now)}] * 5)
    loop.ingest(5)
    with loop.store() as store:
        publisher = Publisher(Deployment.load(loop.settings), store)
        try:
            _publish(publisher, 5)
            floor = publisher.floor
            assert floor is not None and floor.timestamp() > time.time() - 60
            hour_ago = str(int(time.time() * 1000) - 3_600_000)
            loop.send([{"key": b"late", "value": b"v", "headers": hdr(destination=loop.dest, at=hour_ago)}])
            loop.ingest(1)
            assert publisher.floor is not None and publisher.floor >= floor  # nothing moved it down
            _publish(publisher, 1)
        finally:
            publisher.close()
    assert [r["status"] for r in loop.rows()] == ["published"] * 6
    assert {s.key for s in consume(loop.bootstrap, [loop.dest], 6)} == {b"k", b"late"}


def test_the_publish_loop_vacuums_retry_jobs_where_autovacuum_does_not(loop: Loop) -> None:
    """With autovacuum off (the server's setting, or the table's as here) nothing removed the rows
    published jobs leave dead: at 5 000 retries/s the table grew by 570 MB in three minutes."""
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE retry_jobs SET (autovacuum_enabled = false)")
    ago = str(int(time.time() * 1000) - 10_000)
    loop.send([{"key": b"k", "value": b"v", "headers": hdr(destination=loop.dest, at=ago)}] * 12_000)
    loop.ingest(12_000)
    with loop.store() as store:
        assert store.queue.vacuum_need()[0] is False, "autovacuum does not cover the table"
        publisher = Publisher(Deployment.load(loop.settings), store)
        assert publisher.vacuum is not None
        vacuum = publisher.vacuum
        try:
            total = publisher.run(60, should_stop=lambda: bool(vacuum.runs))
        finally:
            publisher.close()
            vacuum.close(60)
    assert total.published == 12_000 and vacuum.runs, "the loop vacuumed once 12 000 rows were dead"
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        [(last_vacuum, dead)] = conn.execute(
            "SELECT last_vacuum, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'retry_jobs'"
        ).fetchall()
    assert last_vacuum is not None and dead < 1_000, (last_vacuum, dead)
    # RETRY_SELF_VACUUM=false: the operator vacuums.
    with loop.store() as store:
        assert (
            Publisher(Deployment.load(loop.settings.with_overrides(self_vacuum=False)), store).vacuum is None
        )


def _flush_statistics(conn: psycopg.Connection) -> None:
    """Make this session's counts (dead rows) visible to others now, not within the next second."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def test_the_self_vacuum_does_not_repeat_while_a_held_snapshot_keeps_the_dead_rows(loop: Loop) -> None:
    """A VACUUM can remove no row that a transaction's old snapshot may still see: running it again
    while one is held would only cost CPU, more each time as the table grows (one of 800 000 dead rows
    held the loop back for two seconds). (The clock stands in for the waits between checks.)"""
    from bench.queries import bq

    now = [0.0]
    vacuum = SelfVacuum(loop.settings.database_url, clock=lambda: now[0])
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE retry_jobs SET (autovacuum_enabled = false)")
        conn.execute(bq("bench_fill_due"), {"count": 15_000})
        with psycopg.connect(loop.settings.database_url) as report:
            report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            report.execute("SELECT count(*) FROM retry_jobs_all").fetchone()
            conn.execute("UPDATE retry_jobs SET attempt = attempt + 1")  # 15 000 dead rows, all still visible
            _flush_statistics(conn)
            with loop.store() as store:
                assert vacuum.tick(store.queue), "15 000 dead rows and no autovacuum: a VACUUM"
                vacuum.close(60)
                now[0] += 3600
                assert not vacuum.tick(store.queue), (
                    "nothing could be removed: no VACUUM again for the same rows"
                )
                for _ in range(2):  # three times as many dead rows now, none removable either
                    conn.execute("UPDATE retry_jobs SET attempt = attempt + 1")
                _flush_statistics(conn)
                now[0] += 3600
                assert not vacuum.tick(store.queue), "the same snapshot is held: still nothing to remove"
            report.rollback()
        with loop.store() as store:
            now[0] += 3600
            assert vacuum.tick(store.queue), "the snapshot ended: this one removes them"
            vacuum.close(60)
        [(dead,)] = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'retry_jobs'"
        ).fetchall()
    assert len(vacuum.runs) == 2 and dead < 1_000, (vacuum.runs, dead)


def test_a_failing_helper_publisher_stops_the_loop_with_its_error(loop: Loop) -> None:
    made: list[Store] = []

    def store_factory(url: str) -> Store:
        made.append(Store(url))
        return made[-1]

    def kill_the_helpers_session() -> bool:  # as when PostgreSQL ends it under the helper
        with psycopg.connect(loop.settings.database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (made[0].conn.info.backend_pid,))
        return False

    settings = loop.settings.with_overrides(publish_workers=2)
    with loop.store() as store:
        publisher = Publisher(Deployment.load(settings), store, store_factory=store_factory)
        began = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            publisher.run(120, should_stop=kill_the_helpers_session)
        publisher.close()
    assert time.monotonic() - began < 60  # stopped by the error, not at the end of its 120 s


def test_overlapping_ingest_loops_hand_over_without_loss_or_rereading(loop: Loop) -> None:
    loop.send(
        [{"key": f"a{i}".encode(), "value": b"v", "headers": hdr(destination=loop.dest)} for i in range(20)]
    )
    with loop.store() as store_a, loop.store() as store_b:
        first = Ingestor(Deployment(loop.settings, loop.registry), store_a)
        assert first.acquire(5)
        second = Ingestor(Deployment(loop.settings, loop.registry), store_b)
        assert not second.acquire(0.5)  # the first loop owns the retry topics
        got = IngestCounts()
        deadline = time.monotonic() + 20
        while got.consumed < 20 and time.monotonic() < deadline:
            got.add(first.ingest_batch(0.5))
        first.close()  # offsets committed after each batch; the lock goes with the session

        loop.send(
            [
                {"key": f"b{i}".encode(), "value": b"v", "headers": hdr(destination=loop.dest)}
                for i in range(20)
            ]
        )
        assert second.acquire(5)  # free now: the waiting loop takes over
        later = IngestCounts()
        while later.consumed < 20 and time.monotonic() < deadline + 20:
            later.add(second.ingest_batch(0.5))
        second.close()
    assert (got.stored, later.stored, later.duplicates) == (20, 20, 0)
    assert len(loop.rows()) == 40


def _send_to_partitions(loop: Loop, partitions: int, per_partition: int) -> None:
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=partitions)
    for partition in range(partitions):
        produce(
            loop.bootstrap,
            loop.settings.retry_topic,
            [
                {"key": f"{partition}-{i}".encode(), "value": b"v", "headers": hdr(destination=loop.dest)}
                for i in range(per_partition)
            ],
            partition=partition,
        )


def _run_ingest_loop(loop: Loop, expected: int, **changes: object) -> IngestCounts:
    settings = loop.settings.with_overrides(**changes)
    with loop.store() as store:
        ingestor = Ingestor(Deployment(settings, loop.registry), store)
        try:
            return ingestor.run(60, should_stop=lambda: ingestor.totals.stored >= expected, grace_s=0)
        finally:
            ingestor.close()


def test_the_ingest_loop_shares_the_partitions_among_worker_processes(loop: Loop) -> None:
    _send_to_partitions(loop, partitions=4, per_partition=30)

    total = _run_ingest_loop(loop, 120, ingest_workers=2, ingest_batch=10)

    assert (total.consumed, total.stored, total.duplicates) == (120, 120, 0)
    rows = loop.rows()
    assert sorted((r["source_partition"], r["source_offset"]) for r in rows) == [
        (partition, offset) for partition in range(4) for offset in range(30)
    ]
    with psycopg.connect(loop.settings.database_url) as conn:
        offsets = conn.execute(
            "SELECT partition, next_offset FROM retry_ingest_offsets WHERE consumer_group = %s ORDER BY 1",
            (loop.settings.consumer_group,),
        ).fetchall()
    assert offsets == [(0, 30), (1, 30), (2, 30), (3, 30)]


def test_a_retry_topic_with_fewer_partitions_than_ingest_workers_is_said(
    loop: Loop, caplog: pytest.LogCaptureFixture
) -> None:
    # As the broker makes a topic a first record is sent to: its default of one partition.
    _send_to_partitions(loop, partitions=1, per_partition=10)

    with caplog.at_level("WARNING", logger="retry_scheduler.loops.ingest"):
        total = _run_ingest_loop(loop, 10, ingest_workers=2, ingest_batch=10)

    assert total.stored == 10  # ingested all the same, by the loop itself
    assert "have 1 partition(s) in all: only 1 of RETRY_INGEST_WORKERS=2 ingest processes" in caplog.text
    assert "--partitions 6" in caplog.text


def test_a_killed_ingest_worker_stops_the_loop_and_the_next_loop_loses_nothing(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    _send_to_partitions(loop, partitions=2, per_partition=40)
    # Each worker process reads the plan at import: it SIGKILLs itself after storing its 2nd batch,
    # before committing that batch's Kafka offsets.
    monkeypatch.setenv("RETRY_FAULT", "ingest.stored:2")
    with pytest.raises(IngestWorkerError, match=r"ingest-worker-\d exited with code -9"):
        _run_ingest_loop(loop, 80, ingest_workers=2, ingest_batch=10)
    monkeypatch.delenv("RETRY_FAULT")
    assert 0 < len(loop.rows()) < 80

    _run_ingest_loop(loop, 80 - len(loop.rows()), ingest_workers=2, ingest_batch=10)

    rows = loop.rows()
    assert sorted((r["source_partition"], r["source_offset"]) for r in rows) == [
        (partition, offset) for partition in range(2) for offset in range(40)
    ]


def _ingest_workers() -> set[int]:
    """The ingest worker processes under this one (started ahead or working)."""
    import psutil

    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and any("worker_main" in a for a in child.cmdline()):
                found.add(child.pid)
    return found


def test_a_waiting_ingest_loop_takes_over_with_the_worker_processes_it_started_while_waiting(
    loop: Loop,
) -> None:
    _send_to_partitions(loop, partitions=2, per_partition=10)
    settings = loop.settings.with_overrides(ingest_workers=2, ingest_batch=10)
    with loop.store() as holder_store, loop.store() as store:
        holder = Ingestor(Deployment(loop.settings, loop.registry), holder_store)
        assert holder.acquire(5, assign=False)  # the previous loop, still ingesting
        waiting = Ingestor(Deployment(settings, loop.registry), store)
        totals: list[IngestCounts] = []
        thread = threading.Thread(
            target=lambda: totals.append(
                waiting.run(60, should_stop=lambda: waiting.totals.stored >= 20, grace_s=0)
            )
        )
        thread.start()
        released = False
        try:
            _wait_for(lambda: len(_ingest_workers()) == 2, "the waiting loop's two worker processes started")
            ahead = _ingest_workers()
            assert loop.rows() == []  # started, but not ingesting: the lock is not theirs yet
            holder.close()  # the previous loop hands over
            released = True
            _wait_for(lambda: len(loop.rows()) == 20, "20 rows stored")
            assert _ingest_workers() <= ahead  # the processes that ingested were those started ahead
        finally:
            if not released:
                holder.close()
            thread.join(60)
        waiting.close()
    assert [(t.stored, t.duplicates) for t in totals] == [(20, 0)]
    assert _ingest_workers() == set()


def test_an_ingest_loop_that_never_gets_the_retry_topics_ends_the_workers_it_started(loop: Loop) -> None:
    settings = loop.settings.with_overrides(ingest_workers=2)
    with loop.store() as holder_store, loop.store() as store:
        holder = Ingestor(Deployment(loop.settings, loop.registry), holder_store)
        assert holder.acquire(5, assign=False)
        waiting = Ingestor(Deployment(settings, loop.registry), store)
        # It waits 10 s for the lock: its workers start 5 and 6 s into the wait.
        thread = threading.Thread(target=lambda: waiting.run(10, grace_s=0))
        began = time.time()
        thread.start()
        _wait_for(lambda: len(_ingest_workers()) == 2, "the waiting loop's worker processes started")
        started = sorted(psutil.Process(pid).create_time() for pid in _ingest_workers())
        thread.join(60)
        holder.close()
        waiting.close()
    assert not thread.is_alive() and waiting.totals.consumed == 0
    assert _ingest_workers() == set()  # none left behind
    # Not at the task's start, when Airflow's own start-up has the CPU: 5 s into the wait, then 1 s apart
    # (a process's start time counts from the boot time, which Linux gives in whole seconds: 1 s slack).
    assert started[0] >= began + SPARES_AFTER_S - 1.0 and started[1] >= started[0] + SPARES_APART_S - 0.05


def test_a_destination_taken_off_the_list_is_not_published_to(loop: Loop) -> None:
    legacy = f"{loop.dest}.legacy"
    create_topics(loop.bootstrap, [loop.dest, legacy])
    loop.send(
        [
            {"key": b"stays", "value": b"v", "headers": hdr(destination=loop.dest, at="0")},
            {"key": b"refused", "value": b"v", "headers": hdr(destination=legacy, at="0", reason="db down")},
        ]
    )
    assert loop.ingest(2).pending == 2  # both allowed when they arrived
    # The deployment narrows its list before the jobs are due: the legacy topic is no longer allowed.
    loop.publish(4, destination_allowlist=rf"^{re.escape(loop.dest)}$")

    [kept] = consume(loop.bootstrap, [loop.dest], 1)
    assert kept.key == b"stays"
    [dead] = consume(loop.bootstrap, [f"{loop.settings.retry_topic.removesuffix('-retry')}-dlq"], 1)
    assert dead.key == b"refused" and dead.header(p.DEAD_REASON) == p.DEAD_INVALID
    [row] = loop.rows("msg_key = 'refused'")
    assert (row["status"], row["dead_reason"]) == ("dead", "invalid")
    assert row["reason"].startswith(f"destination '{legacy}' is not allowed: add it to ALLOWED_DESTINATIONS")
    assert row["reason"].endswith("the record had failed with: db down")
    assert consume(loop.bootstrap, [legacy], 1, timeout_s=3) == []


TASK_BODY = """
import json, pickle, sys
from retry_scheduler.airflow import tasks
settings, kind = pickle.load(sys.stdin.buffer)
body = tasks.run_ingest if kind == "ingest" else tasks.run_publish
print(json.dumps(body(300, settings), default=str))
"""


def _start_task_body(settings: Settings, kind: str) -> subprocess.Popen[bytes]:
    """The loop as the DAG's task runs it (``run_ingest``/``run_publish`` in the process's main
    thread), for 300 s, in a process group of its own as Airflow starts a task."""
    with tempfile.TemporaryFile() as given:
        given.write(pickle.dumps((settings, kind)))
        given.seek(0)
        return subprocess.Popen(
            [sys.executable, "-c", TASK_BODY],
            stdin=given,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.2)


def test_loop_tasks_sent_sigterm_end_after_the_work_in_hand_with_it_committed(loop: Loop) -> None:
    """A task sent SIGTERM (a deleted pod, a ``kill``, a dev stack stopping; to its process group
    for ingest): the loops stop within seconds instead of running out their 300 s, exit cleanly with
    their counts, and what they did is committed (rows and offsets, published marks)."""
    _send_to_partitions(loop, partitions=2, per_partition=20)
    settings = loop.settings.with_overrides(ingest_workers=2, ingest_batch=10)
    ingest = _start_task_body(settings, "ingest")
    try:
        _wait_for(lambda: len(loop.rows()) == 40, "storing the 40 records")
        sent = time.monotonic()
        os.killpg(ingest.pid, signal.SIGTERM)  # the loop and its worker processes
        out, err = ingest.communicate(timeout=30)
    finally:
        if ingest.poll() is None:
            os.killpg(ingest.pid, signal.SIGKILL)
    stopped_in = time.monotonic() - sent
    assert ingest.returncode == 0, err.decode()[-3000:]
    assert json.loads(out)["stored"] == 40
    assert (
        "ingest loop: stopped early, after the work in hand, because the task was sent SIGTERM"
        in err.decode()
    )
    with psycopg.connect(loop.settings.database_url) as conn:
        offsets = conn.execute(
            "SELECT partition, next_offset FROM retry_ingest_offsets WHERE consumer_group = %s ORDER BY 1",
            (loop.settings.consumer_group,),
        ).fetchall()
    assert offsets == [(0, 20), (1, 20)]

    publish = _start_task_body(loop.settings, "publish")
    try:
        seen = consume(loop.bootstrap, [loop.dest], 40, timeout_s=60)
        _wait_for(lambda: [r["status"] for r in loop.rows()] == ["published"] * 40, "marking 40 published")
        os.kill(publish.pid, signal.SIGTERM)
        out, err = publish.communicate(timeout=30)
    finally:
        if publish.poll() is None:
            os.killpg(publish.pid, signal.SIGKILL)
    assert publish.returncode == 0, err.decode()[-3000:]
    assert json.loads(out)["published"] == 40 and len(seen) == 40
    assert "publish loop: stopped early" in err.decode()
    # (the deadline is there to tell "stopped on the signal" from "ran out its 300 s"; not a timing claim)
    assert stopped_in < 30


def test_the_spark_bulk_retry_marks_its_jobs_by_id_however_many_its_statistics_did_not_see(
    loop: Loop,
) -> None:
    """The same for the Spark bulk retry's marks (the loop's own statement, run by its executors with
    the server's own plan settings): statistics taken when no job was dead, then 60 000 dead jobs
    re-published."""
    from retry_scheduler.db.bulk_retry import mark_batch

    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(_JOBS, {"partition": 0, "dest": loop.dest, "count": 50_000, "status": "pending"})
        conn.execute("ANALYZE retry_jobs")  # statistics: no job dead
        conn.execute(_JOBS, {"partition": 2, "dest": loop.dest, "count": 60_000, "status": "dead"})
        conn.execute(_JOBS, {"partition": 3, "dest": loop.dest, "count": 60_000, "status": "pending"})
        ids = [
            row[0] for row in conn.execute("SELECT id FROM retry_jobs_all WHERE status = 'dead' LIMIT 300")
        ]
        with conn.transaction(force_rollback=True):
            [(before,)] = conn.execute(_ROWS_READ).fetchall()
            acked = [int(time.time() * 1000)] * len(ids)
            marked = mark_batch(conn, ids, acked)
            [(after,)] = conn.execute(_ROWS_READ).fetchall()
    assert marked == 300
    assert after - before <= 2 * 300, f"marking 300 jobs read {after - before} rows of retry_jobs"
