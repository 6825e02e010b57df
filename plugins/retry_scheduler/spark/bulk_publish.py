"""Bulk retry's executor side: produce a partition of the selection and mark what was acknowledged.

Each partition of the selection reaches a Python worker as Arrow batches (``mapInArrow``); it is
produced with one idempotent producer, with exactly the headers of the normal publish path, paced
when asked, while a thread of the worker marks the acknowledged jobs published. The driver is
:mod:`retry_scheduler.spark.bulk_retry`.

Executors import this module by name: they need the package installed (docs/guide/spark.md says how
on a cluster).
"""

from __future__ import annotations

import itertools
import logging
import queue
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from retry_scheduler.core import faults
from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import REPLAYED, OutgoingRow, destination_headers
from retry_scheduler.db.bulk_retry import mark_batch, marking_connection
from retry_scheduler.spark.bulk_options import MARK_BATCH

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message
    from pyspark import Accumulator

log = logging.getLogger("retry_scheduler.bulk_retry")

#: What each partition hands back to the driver: how many of its jobs it marked published, and the
#: seconds its UPDATEs took (while it went on producing).
MARKED_SCHEMA = "marked long, mark_s double"


class MarkingError(RuntimeError):
    """A partition could not mark acknowledged jobs published: those jobs stay as they were."""


class OutgoingMessage(NamedTuple):
    """One record to produce, exactly as the publish loop would send it."""

    job_id: int
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]


#: The fields of a row of the selection (selection.OUTGOING_COLUMNS): OutgoingRow's, but the due time
#: where a publisher's next claim may start and a held job's chain state, which a bulk retry has no
#: use for (it selects dead jobs, and pending ones not held).
SELECTION_FIELDS = tuple(name for name in OutgoingRow._fields if name not in ("due_at", "chain_state"))


def outgoing_rows(batch: pa.RecordBatch) -> Iterator[OutgoingRow]:
    """The rows of an Arrow batch of the selection, built column by column (``bytea`` as ``bytes``).

    About 0.6 us per row of ``bytea`` and text columns here, against 2.1-2.4 us for ``batch.to_pylist()``,
    which builds a dict per row.
    """
    columns = [batch.column(name).to_pylist() for name in SELECTION_FIELDS]
    return itertools.starmap(OutgoingRow, zip(*columns, strict=True))


def to_message(job: OutgoingRow) -> OutgoingMessage:
    """The record to produce for a job of the selection, exactly as the publish loop would send it."""
    if not job.destination:
        raise ValueError("job has no destination")
    # A dead job replayed: sent as `dlq replay` sends it.
    headers = destination_headers(job._replace(chain_state=REPLAYED) if job.dead_reason is not None else job)
    return OutgoingMessage(job.id, job.destination, job.destination_partition, job.key, job.value, headers)


class _Pace:
    """A partition's share of the run's pace: when each destination's next record may go."""

    def __init__(self, rate_per_s: float | None, rates: Mapping[str, float] | None) -> None:
        self.gap_s = 1.0 / rate_per_s if rate_per_s else None
        self.gaps = {topic: 1.0 / rate for topic, rate in (rates or {}).items() if rate}
        self.next_turn: dict[str, float] = {}

    def gap(self, topic: str) -> float | None:
        """Seconds between two records of ``topic``; None when it is not paced."""
        return self.gaps.get(topic, self.gap_s)

    def take_turn(self, topic: str, gap: float) -> float:
        """When the next record of ``topic`` may go (now at the earliest, never a burst to catch up:
        the turn after it is one gap later)."""
        now = time.monotonic()
        turn = max(self.next_turn.get(topic, now), now)
        self.next_turn[topic] = turn + gap
        return turn

    def start(self, topic: str, gap: float) -> None:
        """The first record of ``topic`` is acknowledged: its turns start now."""
        self.next_turn[topic] = time.monotonic() + gap


class _Producing:
    """A partition's producer, the acknowledgements not yet handed on, and its failures by kind."""

    def __init__(self, producer_conf: Mapping[str, Any], clock: Callable[[], float]) -> None:
        # Imported here: confluent-kafka's classes claim the module "cimpl", which cloudpickle cannot
        # import on the worker, so a global reference would be shipped by value and break.
        from confluent_kafka import KafkaException, Producer

        self.producer = Producer(dict(producer_conf))
        self._kafka_exception = KafkaException
        self._clock = clock
        self.acked: deque[tuple[int, int]] = deque()
        self.errors: dict[str, int] = {}
        self.produced = 0

    def fail(self, error: str) -> None:
        self.errors[error] = self.errors.get(error, 0) + 1

    def _delivered(self, job_id: int, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked.append((job_id, int(self._clock() * 1000)))
        else:
            self.fail(f"delivery failed: {err.str()}")

    def produce(self, msg: OutgoingMessage) -> None:
        """Queue ``msg``, waiting while the local queue is full; a refused record counts as failed."""
        kwargs: dict[str, Any] = {"headers": msg.headers, "on_delivery": partial(self._delivered, msg.job_id)}
        if msg.partition is not None:
            kwargs["partition"] = msg.partition
        while True:
            try:
                self.producer.produce(msg.topic, msg.value, msg.key, **kwargs)
                self.produced += 1
                return
            except BufferError:
                self.producer.poll(0.05)  # local queue full: let deliveries drain
            except self._kafka_exception as exc:
                self.fail(f"produce failed: {exc}")
                return

    def take_acked(self) -> Iterator[tuple[int, int]]:
        """The acknowledgements received so far, each once."""
        while self.acked:
            yield self.acked.popleft()

    def wait_until(self, turn: float) -> Iterator[tuple[int, int]]:
        """Serve deliveries until ``turn`` (``time.monotonic()``), handing on their acknowledgements."""
        while (wait := turn - time.monotonic()) > 0:
            self.producer.poll(min(wait, 0.1))
            yield from self.take_acked()

    def flush(self, timeout_s: float) -> None:
        """Wait for every delivery; records still unacknowledged after ``timeout_s`` count as failed."""
        unacknowledged = self.producer.flush(timeout_s)
        if unacknowledged:
            self.errors["no acknowledgement before the flush timeout"] = unacknowledged


def publish_partition(
    rows: Iterable[OutgoingRow],
    *,
    producer_conf: Mapping[str, Any],
    missing: frozenset[str],
    failed_count: Accumulator[int],
    flush_timeout_s: float,
    clock: Callable[[], float] = time.time,
    rate_per_s: float | None = None,
    rates: Mapping[str, float] | None = None,
) -> Iterator[tuple[int, int]]:
    """Produce one partition of the selection; yield ``(job id, ack time in ms)`` per acknowledged record.

    Acks are yielded as they arrive, so the partition is never held in memory; the producer is
    flushed before the partition ends. Failed deliveries are counted and their jobs left as they are.
    ``rate_per_s``: this partition's share of the run's pace: the n-th record of a destination is
    produced no sooner than n / rate seconds after its first was acknowledged, each at its turn or,
    when the producer comes back late from waiting, just after (never a burst to catch up: the next
    turn is still 1 / rate after the late one's). ``rates``: the destinations paced otherwise (their
    rate limits), records per second each.
    """
    if not logging.getLogger().handlers:  # a Python worker: nobody configured logging
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    out, pace = _Producing(producer_conf, clock), _Pace(rate_per_s, rates)
    for row in rows:
        try:
            msg = to_message(row)
        except (ValueError, TypeError, struct.error) as exc:
            out.fail(f"cannot build the record: {exc}")
            continue
        if msg.topic in missing:
            out.fail(f"topic {msg.topic} does not exist")
            continue
        gap = pace.gap(msg.topic)
        first_of_topic = gap is not None and msg.topic not in pace.next_turn
        if gap is not None:  # paced: this destination's next record waits its turn
            yield from out.wait_until(pace.take_turn(msg.topic, gap))
        out.produce(msg)
        if first_of_topic and gap is not None:
            # Paced, a destination's first record is acknowledged before its turns start: records
            # queued while the producer connects (its id, the topic's metadata) would go out at once.
            out.producer.flush(flush_timeout_s)
            pace.start(msg.topic, gap)
        out.producer.poll(0)
        yield from out.take_acked()
    out.flush(flush_timeout_s)
    yield from out.take_acked()
    failed = sum(out.errors.values())
    failed_count.add(failed)
    log.info("partition done: %s produced, %s failed", out.produced, failed)
    if out.errors:
        log.warning("partition failures (jobs left unchanged): %s", out.errors)


def _array_literal(values: list[int]) -> str:
    """PostgreSQL's text form of an integer array: far cheaper to build than adapting each int."""
    return "{" + ",".join(map(str, values)) + "}"


class Marker:
    """Marks a partition's acknowledged jobs published, a batch per transaction, on its own
    connection and thread, while the partition goes on producing.

    PostgreSQL writes the new row versions while Python builds and produces records, instead of
    after them. Each batch commits on its own: a crash loses only the batches not yet committed,
    whose jobs stay dead (or pending) for the next run to re-publish.
    """

    def __init__(self, database_url: str) -> None:
        self._conn = marking_connection(database_url)
        # Two batches in hand at most: a stalled database slows producing instead of filling memory.
        self._queue: queue.Queue[tuple[str, str, int] | None] = queue.Queue(maxsize=2)
        self._error: MarkingError | None = None
        self.marked = 0
        self.seconds = 0.0  # spent in the UPDATEs
        self._thread = threading.Thread(target=self._run, name="bulk-retry-marker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is not None:
                continue  # keep draining: the partition raises the error at its next submit or close
            ids, acked_ms, count = batch
            began = time.perf_counter()
            try:
                self.marked += mark_batch(self._conn, ids, acked_ms)
            except Exception as exc:  # handed to the partition's thread, which raises it
                self._error = MarkingError(
                    f"marking {count} acknowledged jobs published failed ({type(exc).__name__}: "
                    f"{str(exc).strip()}); they stay as they were and the next run publishes them "
                    "again with the same retry.id and retry.attempt"
                )
                self._error.__cause__ = exc
            self.seconds += time.perf_counter() - began

    def submit(self, ids: list[int], acked_ms: list[int]) -> None:
        """Queue a batch of acknowledged jobs (ids and ack times in ms) to be marked published."""
        if self._error is not None:
            raise self._error
        self._queue.put((_array_literal(ids), _array_literal(acked_ms), len(ids)))

    def close(self) -> int:
        """Wait for the batches in hand; return how many jobs were marked, or raise the marking's error."""
        self._queue.put(None)
        self._thread.join()
        self._conn.close()
        if self._error is not None:
            raise self._error
        return self.marked


def publish_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    database_url: str,
    mark_batch: int = MARK_BATCH,
    **publish: Any,
) -> Iterator[pa.RecordBatch]:
    """:func:`publish_partition` over Arrow, marking the acknowledged jobs published as it goes.

    For ``DataFrame.mapInArrow``: the selection comes in as record batches (several times cheaper
    than pickling every row into a ``Row``, see bench/README.md); a :class:`Marker` marks every
    ``mark_batch`` acknowledged jobs; one row goes out: how many were marked and the seconds the
    marking took (``MARKED_SCHEMA``).
    """
    import pyarrow as pa  # the Python workers' import, like confluent-kafka's (see publish_partition)

    marker = Marker(database_url)
    rows = (row for batch in batches for row in outgoing_rows(batch))
    ids: list[int] = []
    acked_ms: list[int] = []
    try:
        for job_id, at_ms in publish_partition(rows, **publish):
            ids.append(job_id)
            acked_ms.append(at_ms)
            if len(ids) >= mark_batch:
                marker.submit(ids, acked_ms)
                ids, acked_ms = [], []
                faults.checkpoint("bulk_retry.acked")  # chaos: the job dies, this batch maybe unmarked
        if ids:
            marker.submit(ids, acked_ms)
    finally:
        marked = marker.close()  # also on an error: what was acknowledged and queued gets marked
    schema = pa.schema([("marked", pa.int64()), ("mark_s", pa.float64())])  # MARKED_SCHEMA
    yield pa.RecordBatch.from_pydict({"marked": [marked], "mark_s": [marker.seconds]}, schema=schema)
