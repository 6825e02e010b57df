"""The loops on a PostgreSQL primary with a streaming replica (``dev.postgres_pair``), reached by one
URL naming both: the primary killed -9, the replica promoted, the loops carrying on by themselves.

With asynchronous replication the promoted replica may lack the last commits. The tests make that
happen for sure (the replica cut off before the commits, ``cut_replication``) and show what it does:
the ingest's Kafka offsets are past the replica's stored ones (the hole), yet every record is stored
once, and jobs whose publication the replica never learnt of are published again, every copy
carrying its job's ``retry.id``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from retry_scheduler.coordinator import committed_offsets
from retry_scheduler.core import protocol as p
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.connection import StoreError, database_lost
from retry_scheduler.db.schema import migrate
from retry_scheduler.db.store import Store
from retry_scheduler.dev.postgres_pair import PostgresPair
from retry_scheduler.loops.counts import IngestCounts
from retry_scheduler.loops.runners import reconnecting, run_ingest, run_publish
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


@pytest.fixture
def pair_root() -> Iterator[Path]:
    """A folder the postgres account can reach (pytest's own are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="retry-pg-pair-"))
    os.chmod(root, 0o755)
    yield root
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def _pair(root: Path, synchronous: bool = False) -> PostgresPair:
    pair = PostgresPair(root / "pair", synchronous=synchronous, say=lambda _line: None).start()
    migrate(pair.url())
    return pair


@pytest.fixture
def pair(pair_root: Path) -> Iterator[PostgresPair]:
    with _pair(pair_root) as started:
        yield started


class Background:
    """A loop runner (``run_ingest`` or ``run_publish``, as the Airflow task calls it) in a thread."""

    def __init__(self, runner: Callable[..., dict[str, Any]], seconds: float, deployment: Deployment) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.result = runner(seconds, deployment)
            except BaseException as exc:  # the test reads it
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def join(self, timeout_s: float) -> dict[str, Any]:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the loop did not end"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _rows(url: str, where: str = "true") -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(
            f"SELECT source_partition, source_offset, status, retry_id FROM retry_jobs_all WHERE {where}"
        ).fetchall()


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except (psycopg.OperationalError, StoreError):
            pass  # no primary just now
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _send(loop: Loop, n: int, first: int, due_ms: int) -> None:
    loop.send(
        [{"key": f"k{first + i}".encode(), "value": str(first + i).encode(),
          "headers": hdr(original_topic=loop.dest, at=str(due_ms), reason="down")} for i in range(n)]
    )  # fmt: skip


def _kafka_committed(loop: Loop) -> int:
    """The next offsets the ingest's group committed to Kafka, summed over the retry topic's partitions."""
    consumer = Consumer({"bootstrap.servers": loop.bootstrap, "group.id": loop.settings.consumer_group})
    try:
        parts = consumer.list_topics(loop.settings.retry_topic, timeout=10).topics[loop.settings.retry_topic]
        tps = [TopicPartition(loop.settings.retry_topic, n) for n in parts.partitions]
        return sum(max(0, tp.offset) for tp in committed_offsets(consumer, tps))
    finally:
        consumer.close()


def _stored_offsets(url: str, group: str) -> int:
    with Store(url) as store:
        return sum(store.queue.ingest_offsets(group).values())


@pytest.mark.long
def test_ingest_reads_again_what_the_promoted_replica_never_had(
    pair: PostgresPair, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The primary stores 300 records the replica never gets and the ingest commits their offsets to
    Kafka; then the primary dies and the replica is promoted. The ingest loop reconnects by itself,
    plans its partitions from the offsets the new primary holds (behind Kafka's: the hole), and
    every record, those 300 included, ends up stored once."""
    loop = new_loop(pair.url(), bootstrap_servers, topic_prefix)
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=3)
    url, group = pair.url(), loop.settings.consumer_group
    later = int(time.time() * 1000) + 3_600_000
    ingest = Background(run_ingest, 40, Deployment(loop.settings, loop.registry))
    _send(loop, 200, 0, later)
    _wait("200 stored", lambda: len(_rows(url)) == 200)
    _wait("the replica to have them", lambda: pair.replay_gap() == 0)

    pair.cut_replication()
    _send(loop, 300, 200, later)
    _wait("500 stored on the primary", lambda: len(_rows(url)) == 500)
    _wait("their offsets committed to Kafka", lambda: _kafka_committed(loop) == 500)
    pair.kill_primary()
    time.sleep(2)  # the loop finds no primary for a while
    pair.promote()

    # What the promoted replica holds: the first 200 records and their offsets; Kafka's are 300 past.
    # A consumer resuming from Kafka's offsets would never read those 300 again.
    assert _stored_offsets(url, group) == 200
    assert _kafka_committed(loop) == 500
    _send(loop, 100, 500, later)  # and traffic goes on
    _wait("600 stored on the new primary", lambda: len(_rows(url)) == 600)
    counts = ingest.join(90)

    rows = _rows(url)
    assert Counter((r[0], r[1]) for r in rows).most_common(1)[0][1] == 1  # each record once
    assert len(rows) == 600
    assert counts["reconnects"] >= 1
    assert _stored_offsets(url, group) == _kafka_committed(loop) == 600


@pytest.mark.long
def test_a_partition_the_promoted_replica_holds_nothing_of_is_read_from_its_start(
    pair: PostgresPair, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Every commit of the ingest is lost: the promoted replica holds no offset at all, while Kafka
    holds the group's offsets past all 150 records. Those offsets bear the database's mark, so the
    ingest reads the partitions from their start instead of from there: all 150 are stored, once."""
    loop = new_loop(pair.url(), bootstrap_servers, topic_prefix)
    create_topics(loop.bootstrap, [loop.settings.retry_topic], partitions=2)
    url, group = pair.url(), loop.settings.consumer_group
    pair.cut_replication()
    _send(loop, 150, 0, int(time.time() * 1000) + 3_600_000)
    assert loop.ingest(150).stored == 150
    assert _kafka_committed(loop) == 150
    pair.kill_primary()
    pair.promote()
    assert (_stored_offsets(url, group), len(_rows(url))) == (0, 0)  # the replica got none of it

    counts = Background(run_ingest, 15, Deployment(loop.settings, loop.registry)).join(60)
    rows = _rows(url)
    assert len(rows) == 150 == len({(r[0], r[1]) for r in rows}) == counts["stored"]
    assert _stored_offsets(url, group) == 150


@pytest.mark.long
def test_jobs_the_promoted_replica_saw_pending_are_published_again_identified(
    pair: PostgresPair, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The primary marks 80 jobs published, which the replica never learns of; after the failover the
    publish loop, reconnected by itself, publishes them again. The destination gets each job at least
    once, and every second copy carries the same ``retry.id`` as the first: a duplicate the
    application can tell."""
    loop = new_loop(pair.url(), bootstrap_servers, topic_prefix)
    create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest], partitions=2)
    url = pair.url()
    due = int(time.time() * 1000) + 4_000
    _send(loop, 80, 0, due)
    assert loop.ingest(80).stored == 80
    _wait("the replica to have the jobs", lambda: pair.replay_gap() == 0)
    pair.cut_replication()
    publish = Background(run_publish, 40, Deployment(loop.settings, loop.registry))
    _wait("80 published on the primary", lambda: len(_rows(url, "status = 'published'")) == 80)
    pair.kill_primary()
    time.sleep(2)
    pair.promote()
    _wait("80 published on the new primary", lambda: len(_rows(url, "status = 'published'")) == 80)
    counts = publish.join(90)

    ids = {r[3] for r in _rows(url)}
    seen = consume(loop.bootstrap, [loop.dest], 160, timeout_s=30)
    copies = Counter(s.header(p.ID) for s in seen)
    assert set(copies) == ids  # every job reached the destination; nothing else did
    assert len(seen) == 160 and set(copies.values()) == {2}  # published twice, the second identified
    assert all(int(s.timestamp_ms) >= due for s in seen)  # never early, the second time neither
    assert counts["reconnects"] >= 1


@pytest.mark.long
def test_with_synchronous_replication_the_promoted_replica_lacks_nothing(
    pair_root: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Synchronous replication: a commit waits for the replica. The primary is killed -9 while both
    loops run; after the promotion the new primary's offsets are Kafka's (no hole). It commits nothing
    until it has a replica in turn (its ``synchronous_standby_names`` is the old one's): the old primary
    comes back as its replica, and every job is published, none early, every copy identified."""
    with _pair(pair_root, synchronous=True) as pair:
        loop = new_loop(pair.url(), bootstrap_servers, topic_prefix)
        create_topics(loop.bootstrap, [loop.settings.retry_topic, loop.dest], partitions=3)
        url, group = pair.url(), loop.settings.consumer_group
        deployment = Deployment(loop.settings, loop.registry)
        ingest = Background(run_ingest, 45, deployment)
        publish = Background(run_publish, 45, deployment)
        due = int(time.time() * 1000) + 2_000
        for n in range(6):  # 6 x 50 records, due as they come
            _send(loop, 50, n * 50, due + n * 1000)
            time.sleep(0.5)
        _wait("some published", lambda: len(_rows(url, "status = 'published'")) >= 50)
        pair.kill_primary()
        time.sleep(1)
        pair.promote()
        assert _stored_offsets(url, group) >= _kafka_committed(loop)  # no hole
        pair.rejoin()
        _wait("300 published", lambda: len(_rows(url, "status = 'published'")) == 300, timeout_s=90)
        ingested, published = ingest.join(90), publish.join(90)

        ids = {r[3] for r in _rows(url)}
        seen = consume(loop.bootstrap, [loop.dest], 300, timeout_s=30)
        assert len(ids) == 300 and {s.header(p.ID) for s in seen} == ids
        assert all(int(s.timestamp_ms) >= due for s in seen)
        assert ingested["reconnects"] + published["reconnects"] >= 2


@pytest.mark.long
def test_a_replay_cut_short_by_a_failover_and_run_again_sends_each_job_once_more(
    pair: PostgresPair, bootstrap_servers: str, topic_prefix: str
) -> None:
    """A replay of 600 dead jobs, in batches of 100, loses its database after the second batch (the
    primary killed, the replica promoted); the operator runs it again. Every job reaches its
    destination, and a job sent twice (the publish loop's round in flight at the kill) is sent as
    the same ``retry.id`` and ``retry.attempt``."""
    import dataclasses

    from retry_scheduler.core.config import Settings
    from retry_scheduler.core.policy import Policy, PolicyRegistry
    from retry_scheduler.ops.dlq import Operation, Selection, run_action
    from tests.integration.test_dlq import dead_job, insert

    url = pair.url()
    dest, dlq = f"{topic_prefix}.orders", f"{topic_prefix}.dlq"
    create_topics(bootstrap_servers, [dest, dlq], partitions=2)
    settings = Settings(
        database_url=url, kafka={"bootstrap.servers": bootstrap_servers}, destination_allowlist=rf"^{topic_prefix}\.[a-z]+$",
        create_topics=True, lease_ms=3000, delivery_timeout_ms=2000, loop_grace_ms=0,
    )  # fmt: skip
    deployment = Deployment(settings, PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=4)]))
    insert(url, [dataclasses.replace(dead_job(i, destination=dest), dlq_topic=dlq) for i in range(600)])
    publish = Background(run_publish, 35, deployment)
    _wait("the dead jobs on the DLQ", lambda: len(_rows(url, "dlq_published_at IS NOT NULL")) == 600)

    def fail_over(done: int, _total: int) -> None:
        if done >= 200 and pair.primary_at == 0:
            pair.kill_primary()
            pair.promote()

    replay = Operation(
        action="replay", selection=Selection(), actor="ops", source="cli", dry_run=False, rate_per_s=0
    )
    with pytest.raises(Exception) as cut:
        run_action(url, replay, deployment=deployment, progress=fail_over, batch_size=100)
    assert database_lost(cut.value)
    again = run_action(url, replay, deployment=deployment, batch_size=100)
    assert again.affected == 600 - 200  # what the first run committed is not replayed again
    _wait("600 published", lambda: len(_rows(url, "status = 'published'")) == 600, timeout_s=60)
    publish.join(90)

    seen = consume(bootstrap_servers, [dest], 600, timeout_s=30)
    copies: dict[str | None, set[tuple[str | None, str | None]]] = {}
    for s in seen:
        copies.setdefault(s.header(p.ID), set()).add((s.header(p.ID), s.header(p.ATTEMPT)))
    assert set(copies) == {f"rid-{i}" for i in range(600)}
    assert all(len(v) == 1 for v in copies.values())  # copies of a job are the same send: identified


@pytest.mark.long
def test_the_pages_pool_hands_out_a_connection_to_the_new_primary(pair: PostgresPair) -> None:
    """The Dead letters page's pool after a failover: its idle connection to the dead primary is
    replaced when handed out, and the first request after the promotion is answered by the new one."""
    from retry_scheduler.db.connection import open_pool

    pool = open_pool(pair.url(), size=2, wait_s=10, application_name="failover-test")
    try:
        with pool.connection() as conn:
            old_port = conn.execute("SELECT inet_server_port()").fetchone()
        pair.kill_primary()
        pair.promote()
        with pool.connection() as conn:
            assert conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone() == (
                pair.primary.port,
                False,
            )
        assert old_port != (pair.primary.port,)
    finally:
        pool.close()


def test_a_loop_carries_on_after_losing_its_database_and_stops_on_any_other_error(database_url: str) -> None:
    """``reconnecting``: a run that ends because the database went away is started again for the time
    left; a run that fails otherwise ends the loop with its error."""
    calls: list[float] = []

    def flaky(seconds: float, _stop: Callable[[], bool]) -> None:
        calls.append(seconds)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    counts = IngestCounts()
    reconnecting("ingest", database_url, 30, flaky, lambda: False, counts)
    assert len(calls) == 2 and calls[1] < calls[0] <= 30 and counts.reconnects == 1

    def broken(seconds: float, _stop: Callable[[], bool]) -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        reconnecting("ingest", database_url, 30, broken, lambda: False, IngestCounts())
    # A run that loses its database again at once waits longer each time (no spinning), and the loss is
    # raised when the loop's time runs out.
    always: list[float] = []

    def lost_at_once(seconds: float, _stop: Callable[[], bool]) -> None:
        always.append(seconds)
        raise psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reconnecting("ingest", database_url, 4, lost_at_once, lambda: False, IngestCounts())
    assert 3 <= len(always) <= 5, always  # after 0.5 s, 1 s, 2 s
    # A database that does not come back within the loop's time: the loss is raised.
    with pytest.raises(psycopg.OperationalError):
        reconnecting("publish", "postgresql://nobody@127.0.0.1:1/none", 1.5, flaky_always, lambda: False,
                     IngestCounts())  # fmt: skip


def flaky_always(seconds: float, _stop: Callable[[], bool]) -> None:
    raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.IdleInTransactionSessionTimeout("idle-in-transaction timeout"), True),
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), True),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (ValueError("a bug"), False),
    ],
)
def test_what_counts_as_losing_the_database(error: Exception, lost: bool) -> None:
    assert database_lost(error) is lost
    try:  # as the loops meet it: raised from inside another error
        try:
            raise error
        except Exception as inner:
            raise RuntimeError("the writer thread failed") from inner
    except RuntimeError as outer:
        assert database_lost(outer) is lost
