"""Ingest: consume retry topics in batches, store jobs in PostgreSQL, then commit offsets.

At-least-once: a batch's rows and its next offsets are committed in one PostgreSQL transaction,
and the Kafka offsets only after that. A new loop starts from the offsets stored with the rows, so a
crash in between stores nothing twice; when Kafka has no offset for the group, the partition is read
from its start and the unique source identity skips the records stored already.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from retry_scheduler.coordinator import committed_offsets
from retry_scheduler.core import faults, protocol
from retry_scheduler.core.adopt import source_format
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.durations import format_duration_ms
from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import CopyRow
from retry_scheduler.core.metrics import Metrics, NoMetrics
from retry_scheduler.core.records import Consumed, RowBuilder
from retry_scheduler.db.loop_records import IngestLock
from retry_scheduler.db.store import Store
from retry_scheduler.loops.counts import IngestCounts
from retry_scheduler.loops.handover import LoopTenure
from retry_scheduler.loops.ingest_batch import Batch
from retry_scheduler.loops.ingest_worker import (
    SPARES_AFTER_S,
    SPARES_APART_S,
    end_unused,
    run_workers,
    spawn_worker,
)
from retry_scheduler.loops.kafka import (
    ensure_retry_topics,
    few_partitions,
    make_consumer,
)
from retry_scheduler.loops.offsets import commit_mark, same_partition, start_offset
from retry_scheduler.loops.sources import SourceReader, share_topics

log = logging.getLogger(__name__)


class IngestBusyError(RuntimeError):
    """Another ingest loop holds the retry topics; this one got no turn in time."""


class Ingestor:
    """Consumes the retry topics and stores their records as jobs.

    One ingest loop at a time owns the retry topics: it holds a PostgreSQL advisory lock and
    assigns itself every partition. Overlapping Airflow runs hand over when the lock is released,
    in well under a second, where a consumer-group rebalance would stall ingestion for seconds.

    The next offset of each partition is stored in PostgreSQL with the rows, in one transaction,
    and a new owner starts from there: a batch is never stored twice, so rows are copied straight
    into ``retry_jobs``. The group's Kafka offsets are committed after each batch as well (for lag
    monitoring, and as the start of a partition PostgreSQL has no offset for).
    """

    def __init__(
        self,
        deployment: Deployment,
        store: Store,
        consumer: Consumer | None = None,
        clock: Callable[[], float] = time.time,
        share: Sequence[tuple[str, int, int]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """``share``: a worker process's partitions (topic, partition, start offset), given by the
        loop that holds the ingest lock; an ingestor with a share takes no lock of its own.
        ``metrics``: where each stored batch's counts are reported (its workers' too)."""
        self.deployment = deployment
        self.settings = settings = deployment.settings
        self.store = store
        self.limits = deployment.limits
        self.rows = RowBuilder(deployment)
        self.clock = clock
        self.share = share
        if consumer is None:
            if share is None:
                ensure_retry_topics(settings)
            consumer = make_consumer(settings)
        self.consumer = consumer
        share_letters = share_topics(settings)
        #: Completes a share group's pointer-only dead letters from their source topics.
        self.sources = (
            SourceReader(settings, share_letters, self.limits.destinations.refusal) if share_letters else None
        )
        self.totals = IngestCounts()
        self.metrics: Metrics = metrics or NoMetrics()
        self._control: Store | None = None
        self._lock: IngestLock | None = None
        self._assigned: set[tuple[str, int]] = set()
        self._refreshed_at = 0.0
        #: The metadata of this ingest's Kafka offset commits (:func:`~retry_scheduler.loops.offsets.commit_mark`).
        self._commit_mark = commit_mark(store.queue.database_identity())

    def acquire(
        self, timeout_s: float, on_wait: Callable[[], None] = lambda: None, *, assign: bool = True
    ) -> bool:
        """Wait up to ``timeout_s`` for the ingest lock, then (with ``assign``) take every retry-topic
        partition. An ingestor with a ``share`` only assigns itself its share."""
        if self.share is not None:
            if not self._assigned:
                self.consumer.assign([TopicPartition(t, p, start) for t, p, start in self.share])
                self._assigned = {(t, p) for t, p, _ in self.share}
                self._refreshed_at = float("inf")  # a share never changes
            return True
        if self._lock is None:
            lock = IngestLock(self.settings.database_url, self.settings.consumer_group)
            if not lock.acquire(timeout_s, on_wait):
                lock.release()
                return False
            self._lock = lock
            if assign:
                self._refresh_assignment()
        return True

    def partitions(self) -> list[tuple[str, int]]:
        """Every partition of the retry topics the broker knows, sorted."""
        topics = self.consumer.list_topics(timeout=10).topics
        return sorted(
            (topic, p)
            for topic in self.settings.retry_topics
            if topic in topics
            for p in topics[topic].partitions
        )

    def plan(self) -> list[tuple[str, int, int]]:
        """Every retry-topic partition with its start offset (:mod:`retry_scheduler.loops.offsets`)."""
        return self._with_starts(self.partitions())

    def _with_starts(self, partitions: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
        if not partitions:
            return []
        stored = (self._control or self.store).queue.ingest_offsets(self.settings.consumer_group)
        committed = {
            (tp.topic, tp.partition): tp
            for tp in committed_offsets(self.consumer, [TopicPartition(t, p) for t, p in partitions])
        }
        starts = []
        for t, p in partitions:
            ours, kafkas = stored.get((t, p)), committed.get((t, p))
            kafka_offset = None if kafkas is None else kafkas.offset
            start = start_offset(
                ours, kafka_offset, None if kafkas is None else kafkas.metadata, self._commit_mark
            )
            if start == OFFSET_BEGINNING:
                log.warning(
                    "PostgreSQL has no offset of group %s for %s[%s], yet Kafka's (%s) was committed after "
                    "this database stored rows from there: it lost those commits (a replica promoted "
                    "without the last ones, a restore). Reading the partition from its first record, "
                    "skipping what is stored", self.settings.consumer_group, t, p, kafka_offset,
                )  # fmt: skip
            elif (
                start == OFFSET_STORED
                and ours is not None
                and same_partition(self.consumer, self.settings, self._control or self.store, t, p, ours)
            ):
                log.info(
                    "Kafka has no offset of group %s for %s[%s] (expired?): resuming from PostgreSQL's, %s",
                    self.settings.consumer_group, t, p, ours,
                )  # fmt: skip
                start = ours
            starts.append((t, p, start))
        return starts

    def _refresh_assignment(self) -> None:
        """Assign partitions not assigned yet (new topics or partitions), each from its start offset."""
        if self.share is not None:
            return
        self._refreshed_at = time.monotonic()
        try:
            partitions = self.partitions()
        except KafkaException as exc:  # a broker frozen or failing over: the assignment stands
            if not self._assigned:
                raise
            log.warning("the retry topics' partitions could not be listed (%s): looking again in 10 s", exc)
            return
        new = [tp for tp in partitions if tp not in self._assigned]
        if new:
            self.consumer.incremental_assign([TopicPartition(t, p, o) for t, p, o in self._with_starts(new)])
            self._assigned |= set(new)
            log.info(
                "ingesting %s partitions of %s", len(self._assigned), ", ".join(self.settings.retry_topics)
            )

    def close(self) -> None:
        # Offsets are committed after every batch; releasing the lock hands over to the next loop.
        self.consumer.close()
        if self.sources is not None:
            self.sources.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def read_batch(self, timeout_s: float = 0.2) -> Batch | None:
        """Consume up to one batch and build its rows; None when nothing came."""
        if self._lock is None and not self.acquire(30):
            raise IngestBusyError("another ingest loop holds the retry topics (lock held for 30 s)")
        if time.monotonic() - self._refreshed_at > 10:
            self._refresh_assignment()
        messages = self.consumer.consume(self.settings.ingest_batch, timeout_s)
        now_ms = int(self.clock() * 1000)
        build = self.rows.row
        untrusted_before = self.rows.untrusted_timestamps
        rows: list[CopyRow] = []
        offsets: dict[tuple[str, int], int] = {}
        released = 0
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error on %s [%s]: %s", msg.topic(), msg.partition(), err)
                continue
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            ts_type, ts = msg.timestamp()
            timestamp = ts if ts_type != 0 and ts > 0 else None
            try:
                headers = cast(Sequence[Header], msg.headers())
            except Exception as exc:  # e.g. a header name that is not UTF-8: the client cannot decode it
                rows.append(
                    self.rows.invalid(
                        Consumed(topic, partition, offset, timestamp, msg.key(), msg.value(), ()), now_ms,
                        f"the record's headers cannot be read ({type(exc).__name__}: {exc})",
                    )
                )  # fmt: skip
            else:
                row = build(topic, partition, offset, timestamp, msg.key(), msg.value(), headers, now_ms)
                if row is not None:
                    rows.append(row)
                else:  # a release record: its event is taken below
                    released += 1
            offsets[(topic, partition)] = offset + 1  # a partition's records come in order
        if self.sources is not None:
            rows = self.sources.complete(rows, now_ms, self.settings.max_reason_chars, then=self.rows.recount)
        untrusted = self.rows.untrusted_timestamps - untrusted_before
        events, notices = self.rows.take_chain_events(), self.rows.take_notices()
        rows.extend(notices)
        return (
            Batch(rows, offsets, untrusted, events, released, messages, notices=len(notices))
            if offsets
            else None
        )

    def store_batch(self, batch: Batch) -> IngestCounts:
        """Store a batch's rows and its next offsets in one transaction."""
        began, registry = time.perf_counter(), self.deployment.policies
        # The batch's destinations with a breaker: the queue counts which of their records came back.
        destinations = {r.destination for r in batch.rows} if registry.any("breaker") else set()
        counted_back = {d for d in destinations if d and registry.has_breaker(d)}
        stored = batch.store(
            self.store.queue,
            self.rows,
            int(self.clock() * 1000),
            consumer_group=self.settings.consumer_group,
            adopted_topics=self.settings.adopt_topics,
            counted_back=counted_back,
        )
        counts = IngestCounts(
            consumed=len(batch.rows) - batch.notices + batch.release_records, stored=len(stored), batches=1
        )
        if batch.release_records:
            log.info("%s chain(s) released by their consumers", batch.release_records)
        counts.slowest_batch_s, counts.slowest_batch_records = time.perf_counter() - began, len(batch.rows)
        untrusted = batch.untrusted_timestamps
        if untrusted:
            counts.untrusted_timestamps = untrusted
            log.warning(
                "%s record(s) carried a timestamp before 2000 or more than %s ahead: their ingest time "
                "was used (their own is kept in source_timestamp_ms)", untrusted,
                format_duration_ms(self.settings.max_clock_skew_ms),
            )  # fmt: skip
        counts.duplicates = len(batch.rows) - counts.stored
        counts.pending = stored.count(None)
        counts.dead.update(reason for reason in stored if reason)
        if adopt_topics := self.settings.adopt_topics:
            for row in batch.rows:
                if row.source_topic in adopt_topics:
                    counts.adopted[source_format(adopt_topics[row.source_topic])] += 1
                    # an adopted letter has its original topic as destination, unless its record is lost
                    counts.letters_unreadable += row.destination is None and row.original_topic is not None
        for row in batch.rows:
            if row.dead_reason == protocol.DEAD_INVALID:
                log.warning(
                    "invalid record %s[%s]@%s is dead: %s", row.source_topic, row.source_partition,
                    row.source_offset, row.reason,
                )  # fmt: skip
        return counts

    def ingest_batch(self, timeout_s: float = 0.2) -> IngestCounts:
        """Consume up to one batch, store it, then commit its offsets."""
        batch = self.read_batch(timeout_s)
        if batch is None:
            return IngestCounts()
        faults.checkpoint("ingest.consumed")
        return self._finish(batch, self.store_batch(batch))

    def _commit(self, next_offsets: dict[tuple[str, int], int]) -> None:
        mark = self._commit_mark
        offsets = [TopicPartition(t, p, o, metadata=mark) for (t, p), o in next_offsets.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # a rebalance may revoke the partitions first
            # Safe: the rows and PostgreSQL's offsets are committed; the next loop starts from those.
            log.warning("Kafka offset commit failed (PostgreSQL holds the offsets): %s", exc)

    def run(
        self, duration_s: float, should_stop: Callable[[], bool] = lambda: False, grace_s: float | None = None
    ) -> IngestCounts:
        """Ingest for ``duration_s`` (then until a newer loop takes over, within the grace); returns totals.

        With ``ingest_workers`` above 1 and more than one partition, this loop holds the ingest lock
        and worker processes share the partitions, each with its own consumer and connection (header
        parsing is CPU work in Python: one process per core). Otherwise it ingests itself.
        """
        grace = self.settings.loop_grace_ms / 1000 if grace_s is None else grace_s
        # The writer thread has ``store`` to itself; heartbeats and offset lookups use another connection.
        self._control = Store(self.settings.database_url)
        tenure = LoopTenure(self._control.loops, "ingest", duration_s, grace)
        go_on = lambda: tenure.go_on() and not should_stop()  # noqa: E731
        workers = self.settings.ingest_workers
        # While the previous loop still ingests, this one starts its worker processes (and their
        # imports): the handover then waits for none of that. Not at once, but from SPARES_AFTER_S
        # into the wait, a second apart: this task's own start has the machine's CPU just then.
        spares: list[subprocess.Popen[bytes]] = []
        waiting_since = time.monotonic()

        def while_waiting() -> None:
            tenure.beat()
            due = waiting_since + SPARES_AFTER_S + len(spares) * SPARES_APART_S
            if workers > 1 and len(spares) < workers and time.monotonic() >= due:
                spares.append(spawn_worker())

        try:
            if not self.acquire(tenure.remaining_s(), on_wait=while_waiting, assign=workers == 1):
                log.info("another ingest loop held the retry topics all along: nothing to do")
                return IngestCounts()
            plan = self.plan() if workers > 1 else []
            if workers > 1 and len(plan) < workers:
                log.warning(few_partitions(len(plan), workers, self.settings.retry_topics))
            if len(plan) > 1:
                while go_on():
                    self._run_workers(plan, workers, go_on, spares)
                    plan = self.plan()
            else:
                self.pipeline(go_on)
        finally:
            end_unused(spares)
            tenure.finish()
            self._control.close()
            self._control = None
        return self.totals

    def pipeline(
        self, go_on: Callable[[], bool], on_batch: Callable[[IngestCounts], None] = lambda counts: None
    ) -> None:
        """Ingest while ``go_on()``: while PostgreSQL stores one batch (in a writer thread), the next one
        is consumed and built. A batch's Kafka offsets are committed only after its rows."""
        if self.share is not None:
            self.acquire(0)  # assigns the share
        elif not self._assigned:
            self._refresh_assignment()
        with ThreadPoolExecutor(1, thread_name_prefix="ingest-writer") as writer:
            storing: tuple[Batch, Future[IngestCounts]] | None = None
            while True:
                more = go_on()
                batch = self.read_batch(timeout_s=0.2) if more else None
                if batch is not None:
                    faults.checkpoint("ingest.consumed")
                if storing is not None:
                    previous, written = storing
                    on_batch(self._finish(previous, written.result()))
                    storing = None
                if batch is not None:
                    storing = (batch, writer.submit(self.store_batch, batch))
                elif not more:
                    break

    def _run_workers(
        self,
        plan: list[tuple[str, int, int]],
        workers: int,
        go_on: Callable[[], bool],
        spares: list[subprocess.Popen[bytes]] | None = None,
    ) -> None:
        """Ingest ``plan``'s partitions in worker processes (:func:`~retry_scheduler.loops.ingest_worker.run_workers`),
        each given this loop's settings, policies and its share, its counts added to this loop's."""
        run_workers(
            plan,
            workers,
            go_on,
            spares,
            work=lambda share, name: pickle.dumps((self.settings, self.deployment.policies, share, name)),
            on_counts=lambda counts: self._count(IngestCounts.from_dict(counts)),
            partitions=self.partitions,
        )

    def _count(self, counts: IngestCounts) -> None:
        """Add a stored batch's counts to the run's, and report them as metrics."""
        self.totals.add(counts)
        m = self.metrics
        m.incr("retry_scheduler.ingest.records", counts.consumed)
        m.incr("retry_scheduler.ingest.stored", counts.stored)
        m.incr("retry_scheduler.ingest.duplicates", counts.duplicates)
        m.incr("retry_scheduler.ingest.invalid", counts.dead.get("invalid", 0))
        m.incr("retry_scheduler.ingest.dead", sum(counts.dead.values()))
        for fmt, letters in counts.adopted.items():
            m.incr(f"retry_scheduler.ingest.adopted.{fmt}", letters)
        if counts.letters_unreadable:
            m.incr("retry_scheduler.ingest.letters_unreadable", counts.letters_unreadable)
        if counts.consumed:
            m.gauge("retry_scheduler.ingest.batch_size", counts.consumed)

    def _finish(self, batch: Batch, counts: IngestCounts) -> IngestCounts:
        """After a batch's rows are stored: commit its Kafka offsets and count it."""
        faults.checkpoint("ingest.stored")
        self._commit(batch.offsets)
        self._count(counts)
        log.info(
            "ingested %s records: %s stored, %s duplicates, %s pending, dead %s",
            counts.consumed, counts.stored, counts.duplicates, counts.pending, dict(counts.dead),
        )  # fmt: skip
        return counts
