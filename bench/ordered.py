"""Ordered mode's cost (issue 29): the consumer helper with and without ``ordered=True``, and a held
chain's way back, through the real helper, loops, broker and PostgreSQL.

Three runs of the helper, each on a topic of its own with ``PARTITIONS`` partitions and
``ordered_keys`` keys:

1. ``plain_records_per_s``: ``ordered_records`` records, nothing failing, ``ordered=False``: the
   baseline.
2. ``ordered_records_per_s``: the same records with ``ordered=True`` (every record's key looked up in
   the holds; no hold written while nothing fails), and their ratio, ``ordered_vs_plain``.
3. A chain per key: each key's first record fails once, so the ``ordered_chain`` records after it are
   parked behind it; the scheduler's ingest and publish loops run beside the helper (threads, as the
   DAG runs them). ``round_trips_per_parked_record``: the helper's acknowledged writes (retry-topic
   sends and hold writes, each waited for) per record parked, beyond the :data:`CHAIN_WRITES` every
   chain costs; ``parking_records_per_s``: parks sent per second, from the first to the last; and,
   once each head's retry was handled and its release sent, the lateness of its
   chain's records: ``held_step_p50_s`` / ``held_step_p99_s`` (from one record of a chain handled to
   the next: one publish round and one poll, since a chain goes out one record at a time) and
   ``held_chain_drain_s`` (the median, over chains, of the time from the release to the chain's last
   record handled).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from confluent_kafka import Message, Producer

from bench.env import PARTITIONS, BenchEnv, BenchError, Result
from bench.loop_threads import LoopThreads
from bench.sizes import Sizes
from bench.timeline import percentile
from retry_scheduler.consumer import RetryingConsumer
from retry_scheduler.core import protocol
from retry_scheduler.core.policy import Policy, PolicyRegistry

log = logging.getLogger(__name__)

#: A head's retry comes back a second after it failed.
POLICIES = PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=10)])
#: The helper's acknowledged writes a chain costs whatever its length: the head's hold and retry, its
#: release and the hold written after it.
CHAIN_WRITES = 4


class _Counted:
    """A producer whose records are counted (each one the helper sends is waited for: a round trip)."""

    def __init__(
        self, real: Any, counts: dict[str, int], name: str, parks: list[float] | None = None
    ) -> None:
        self._real, self._counts, self._name, self._parks = real, counts, name, parks

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        self._counts[self._name] += 1
        headers = kwargs.get("headers") or ()
        if self._parks is not None and any(k == protocol.HOLD for k, _ in headers):
            self._parks.append(time.perf_counter())
        return self._real.produce(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _consumer(
    env: BenchEnv, settings: Any, topic: str, handle: Callable[[Message], None], ordered: bool
) -> RetryingConsumer:
    assert env.bootstrap is not None
    config = {"bootstrap.servers": env.bootstrap, "group.id": f"{settings.consumer_group}-{topic}",
              "auto.offset.reset": "earliest", "session.timeout.ms": 6000}  # fmt: skip
    consumer = RetryingConsumer(config, [topic], handle, ordered=ordered, holds_topic=f"{topic}.holds")
    consumer.retries.retry_topic = settings.retry_topic
    return consumer


def _send(env: BenchEnv, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Produce ``records`` (key, value) to ``topic``, in their order per key, all acknowledged."""
    assert env.bootstrap is not None
    producer = Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    if producer.flush(60):
        raise BenchError(f"ordered: records to {topic} not acknowledged in 60 s")


def _records(keys: int, per_key: int) -> list[tuple[bytes, bytes]]:
    return [(f"key-{k}".encode(), str(n).encode()) for n in range(per_key) for k in range(keys)]


def _through(
    env: BenchEnv, settings: Any, topic: str, records: list[tuple[bytes, bytes]], ordered: bool
) -> float:
    """Records/s of a helper handling ``records`` (nothing failing), from its first record to its last."""
    env.create_topics([topic])
    _send(env, topic, records)
    stamps: list[float] = []
    consumer = _consumer(env, settings, topic, lambda _msg: stamps.append(time.perf_counter()), ordered)
    deadline = time.monotonic() + 600
    try:
        while len(stamps) < len(records):
            if time.monotonic() > deadline:
                raise BenchError(f"ordered: {len(stamps)} of {len(records)} records handled in 600 s")
            consumer.poll(0.2)
    finally:
        consumer.close()
    return (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)


def measure_ordered(env: BenchEnv, sizes: Sizes) -> Result:
    result = Result("ordered")
    settings = env.settings("ordered")
    keys, total = sizes.ordered_keys, sizes.ordered_records
    plain = _through(env, settings, f"bench.ordered-plain-{env.tag}", _records(keys, total // keys), False)
    ordered = _through(env, settings, f"bench.ordered-on-{env.tag}", _records(keys, total // keys), True)

    # A chain per key: its first record fails once, the rest wait behind it.
    topic, per_key = f"bench.ordered-chains-{env.tag}", sizes.ordered_chain + 1
    env.create_topics([topic, f"{topic}.{settings.consumer_group}-{topic}.redelivery", settings.retry_topic])
    records = _records(keys, per_key)
    failed: set[bytes] = set()
    handled: dict[bytes, list[tuple[int, float]]] = defaultdict(list)

    def handle(msg: Message) -> None:
        key, n = bytes(msg.key() or b""), int(msg.value() or b"0")
        if n == 0 and key not in failed:
            failed.add(key)
            raise TimeoutError("the first record of each key fails once")
        handled[key].append((n, time.perf_counter()))

    consumer = _consumer(env, settings, topic, handle, True)
    writes = {"sends": 0, "holds": 0}
    parks: list[float] = []
    releases: dict[bytes, float] = {}
    assert consumer.hold_store is not None
    consumer.retries.producer = _Counted(consumer.retries.producer, writes, "sends", parks)  # type: ignore[assignment]
    consumer.hold_store.producer = _Counted(consumer.hold_store.producer, writes, "holds")  # type: ignore[assignment]
    real_release = consumer.retries.release

    def release(record: Any, chain: str, **kwargs: Any) -> None:
        real_release(record, chain, **kwargs)
        releases[bytes(record.key() or b"")] = time.perf_counter()

    consumer.retries.release = release  # type: ignore[method-assign,assignment]
    _send(env, topic, records)
    loops = LoopThreads(settings, POLICIES)
    deadline = time.monotonic() + 900
    try:
        while sum(len(v) for v in handled.values()) < len(records) or consumer.holds:
            if time.monotonic() > deadline:
                done = sum(len(v) for v in handled.values())
                raise BenchError(f"ordered: {done} of {len(records)} chain records handled in 900 s")
            consumer.poll(0.1)
    finally:
        consumer.close()
        loops.close()
    parked = keys * (per_key - 1)
    steps, drains = [], []
    for key, seen in handled.items():
        order = [n for n, _ in seen]
        if order != list(range(per_key)):
            raise BenchError(f"ordered: key {key!r} handled out of order: {order[:20]}...")
        times = [t for n, t in seen if n > 0]
        steps += [b - a for a, b in itertools.pairwise(times)]
        drains.append(times[-1] - releases[key])
    steps.sort()
    round_trips = (writes["sends"] + writes["holds"] - CHAIN_WRITES * keys) / parked
    result.figures.update(
        plain_records_per_s=round(plain),
        ordered_records_per_s=round(ordered),
        ordered_vs_plain=round(ordered / plain, 3),
        parking_records_per_s=round((len(parks) - 1) / max(parks[-1] - parks[0], 1e-9)) if parks else None,
        round_trips_per_parked_record=round(round_trips, 2),
        held_step_p50_s=round(statistics.median(steps), 4),
        held_step_p99_s=round(percentile(steps, 0.99), 4),
        held_chain_drain_s=round(statistics.median(drains), 2),
    )
    result.details.update(keys=keys, records=total, chain=per_key - 1, writes=writes, parks_sent=len(parks),
                          partitions=PARTITIONS)  # fmt: skip
    result.notes.append(
        f"Helper: {result.figures['plain_records_per_s']} records/s plain, {result.figures['ordered_records_per_s']} "
        f"in ordered mode ({result.figures['ordered_vs_plain']}x) with nothing failing. A chain of "
        f"{per_key - 1} records behind each of {keys} heads: {result.figures['round_trips_per_parked_record']} "
        f"acknowledged writes per parked record beyond a chain's own {CHAIN_WRITES} (its park, the hold "
        f"recording it, the hold after it was handled; more when one is parked again) "
        f"({result.figures['parking_records_per_s']} parks sent/s); after "
        f"its head was released, one record of a chain every {result.figures['held_step_p50_s']} s (p50; "
        f"p99 {result.figures['held_step_p99_s']} s), a chain drained in {result.figures['held_chain_drain_s']} s "
        "(median)."
    )
    return result
