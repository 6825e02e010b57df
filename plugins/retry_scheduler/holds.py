"""The consumer helper's ordered mode keeps, per key, what its records wait behind (a :class:`Hold`),
in a compacted topic (:class:`HoldStore`): a restarted consumer, or the group member a partition moves
to, reads the holds back and keeps each key's order. Needs only ``confluent-kafka``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.client import RetryDeliveryError
from retry_scheduler.core import protocol
from retry_scheduler.replication import AUTO, BROKER_DEFAULT, resolved

log = logging.getLogger(__name__)

#: The compacted topic the ordered mode keeps its holds in.
DEFAULT_HOLDS_TOPIC = protocol.HOLDS_TOPIC


def create_topics(admin: AdminClient, topics: list[NewTopic], timeout_s: float = 30) -> dict[str, str]:
    """Create ``topics``; one that already exists counts as created. The broker's error of each that
    could not be created (topic -> message); empty when every one exists now.

    A topic asked with the replication factor :data:`~retry_scheduler.replication.AUTO` gets three
    replicas, or the cluster's number of brokers when fewer, and ``min.insync.replicas`` to match
    (:mod:`retry_scheduler.replication`); the broker's default when the brokers cannot be listed.

    Returns once the broker's metadata shows every created topic (or after ``timeout_s``): Kafka answers
    a creation when its controller has recorded it, and a broker may answer a metadata request without
    it a moment longer; a consumer that subscribed in that moment would find its partitions only at its
    next metadata refresh (librdkafka: 5 minutes by default)."""
    failed: dict[str, str] = {}
    if any(t.replication_factor == AUTO for t in topics):
        try:
            brokers = len(admin.list_topics(timeout=timeout_s).brokers)
        except KafkaException:
            brokers = 0
        topics = [
            (
                resolved(t, brokers)
                if brokers
                else NewTopic(t.topic, t.num_partitions, BROKER_DEFAULT, config=t.config)
            )
            if t.replication_factor == AUTO
            else t
            for t in topics
        ]
    for name, future in admin.create_topics(topics, request_timeout=timeout_s).items() if topics else ():
        try:
            future.result(timeout_s + 5)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                failed[name] = exc.args[0].str()
        except concurrent.futures.TimeoutError:
            failed[name] = f"no answer from the broker within {timeout_s:.0f} s"
    wait_until_listed(admin, [t.topic for t in topics if t.topic not in failed], timeout_s)
    return failed


def wait_until_listed(admin: AdminClient, topics: list[str], timeout_s: float = 30) -> bool:
    """Wait until the broker's metadata lists every one of ``topics`` with its partitions; whether it
    did within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while topics:
        try:
            listed = admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        except KafkaException:
            listed = {}
        if all(t in listed and listed[t].error is None and listed[t].partitions for t in topics):
            return True
        if time.monotonic() >= deadline:
            log.warning("the broker's metadata does not list %s yet", ", ".join(sorted(topics)))
            return False
        time.sleep(0.1)
    return True


#: A record's place in its key's order: its original partition and offset.
Position = tuple[int, int]


@dataclass
class Hold:
    """The ordered mode's state of one held key: its records wait in the chain ``chain``.

    ``head``: the ``retry.id`` of the failed record the chain waits on, whose retry comes back with
    ``retry.attempt`` = ``head_attempt`` (None: any; a hold 0.4.0 wrote); None while the chain flows
    (its head was handled, or died: ``dead`` is then the dead head's ``retry.id``). ``parked``: the places (original partition, offset) of
    the key's records parked in the chain and not handled yet, in order; a record of the chain that is
    not among them was handled already (a duplicate). The key is free again when no head is pending and
    nothing is parked: the hold then stays a while as a marker of the finished chain (``finished_at``,
    epoch seconds), so that a late duplicate of one of its records is known as one.
    ``partition``: the original partition of the key's records (the member that reads it owns the key).
    ``legacy``: a 0.4.0 hold's parked records, counted (it kept no places).
    """

    chain: str
    head: str | None = None
    head_attempt: int | None = None
    parked: list[Position] = field(default_factory=list)
    dead: str | None = None
    legacy: int = 0
    partition: int = -1
    finished_at: float = 0.0
    #: The head's own place in the key's order: the head read again (its offset was not committed
    #: when the helper stopped) is known as the head.
    head_position: Position | None = None

    @property
    def released(self) -> bool:
        """Whether the chain flows (no head pending)."""
        return self.head is None

    @property
    def finished(self) -> bool:
        """Whether the key is free again (nothing pending, nothing parked)."""
        return self.finished_at > 0

    def copy(self) -> Hold:
        return replace(self, parked=list(self.parked))

    def encode(self) -> bytes:
        """The hold as the holds topic keeps it: JSON, the places per partition as offset deltas."""
        places: dict[str, list[int]] = {}
        last: dict[int, int] = {}
        for partition, offset in self.parked:
            places.setdefault(str(partition), []).append(offset - last.get(partition, 0))
            last[partition] = offset
        data: dict[str, Any] = {"v": 2, "chain": self.chain, "parked": places}
        if self.head is not None:
            data["head"], data["attempt"] = self.head, self.head_attempt
            if self.head_position is not None:
                data["hp"] = list(self.head_position)
        if self.dead is not None:
            data["dead"] = self.dead
        if self.legacy:
            data["legacy"] = self.legacy
        if self.partition >= 0:
            data["p"] = self.partition
        if self.finished_at:
            data["finished"] = round(self.finished_at, 3)
        return json.dumps(data, separators=(",", ":")).encode()


def decode_hold(raw: bytes) -> Hold:
    """A hold as :meth:`Hold.encode` wrote it, or as 0.4.0 did; ``ValueError`` when it is neither."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("not an object")
    if data.get("v") == 2:
        return _hold_v2(data)
    # 0.4.0: {"blocker", "released", "parked" (a count), "dead"}; the chain is named by its blocker.
    if not isinstance(data.get("blocker"), str):
        raise ValueError("no blocker")
    released, parked, dead = data.get("released", False), data.get("parked", 0), data.get("dead", False)
    if not isinstance(released, bool) or type(parked) is not int or not isinstance(dead, bool):
        raise ValueError(f"released {released!r}, parked {parked!r}, dead {dead!r}")
    blocker = data["blocker"]
    return Hold(blocker, None if released else blocker, None, [], blocker if dead else None, max(parked, 0))


def _hold_v2(data: dict[str, Any]) -> Hold:
    chain, head, attempt = data.get("chain"), data.get("head"), data.get("attempt")
    dead, legacy, places = data.get("dead"), data.get("legacy", 0), data.get("parked", {})
    partition, finished, place = data.get("p", -1), data.get("finished", 0), data.get("hp")
    if place is not None and not (
        isinstance(place, list) and len(place) == 2 and all(type(n) is int for n in place)
    ):
        raise ValueError(f"hp {place!r}")
    if type(partition) is not int or not isinstance(finished, int | float) or isinstance(finished, bool):
        raise ValueError(f"p {partition!r}, finished {finished!r}")
    if not isinstance(chain, str) or not (head is None or isinstance(head, str)):
        raise ValueError(f"chain {chain!r}, head {head!r}")
    if (
        not (attempt is None or type(attempt) is int)
        or not (dead is None or isinstance(dead, str))
        or type(legacy) is not int
    ):
        raise ValueError(f"attempt {attempt!r}, dead {dead!r}, legacy {legacy!r}")
    if not isinstance(places, dict):
        raise ValueError(f"parked {places!r}")
    parked: list[Position] = []
    for number, deltas in places.items():
        if not isinstance(deltas, list) or not all(type(d) is int for d in deltas):
            raise ValueError(f"parked {places!r}")
        offset = 0
        for delta in deltas:
            offset += delta
            parked.append((int(number), offset))
    return Hold(
        chain,
        head,
        attempt if head is not None else None,
        sorted(parked),
        dead,
        legacy,
        partition,
        float(finished),
        (place[0], place[1]) if place is not None and head is not None else None,
    )


class HoldsUnavailable(RuntimeError):
    """The holds topic cannot be read to its end now (missing, or the broker too slow): the keys it
    holds are unknown, so their partitions must wait."""


#: Consumer properties, left out of the configuration the hold store's producer gets.
_CONSUMER_ONLY = (
    "auto.", "enable.auto.", "enable.partition.eof", "session.timeout", "heartbeat.", "max.poll.",
    "partition.assignment", "group.", "isolation.level", "fetch.", "queued.", "check.crcs",
    "topic.metadata.refresh",
)  # fmt: skip


def shared_config(config: dict[str, Any]) -> dict[str, Any]:
    """A consumer's settings that a producer or an admin client of the same cluster needs too (the
    brokers, security, client id), without the consumer's own."""
    return {k: v for k, v in config.items() if not k.startswith(_CONSUMER_ONLY)}


#: The holds topic's settings when the helper creates it: compacted, its segments rolled and cleaned
#: often so that a member reading it at a rebalance reads about one record per held key, and its
#: tombstones (keys free again) kept a day so that a member reading meanwhile sees them.
HOLDS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(86_400_000),
}
#: How long a read of the holds topic may take before it gives up (it is retried, never raised).
LOAD_TIMEOUT_S = 30.0


class HoldStore:
    """The holds of one consumer group, kept in a compacted topic (one record per held key, a tombstone
    when it is free again): a restarted consumer, or the one a partition moves to, reads them back."""

    def __init__(self, config: dict[str, Any], group: str, topic: str = DEFAULT_HOLDS_TOPIC) -> None:
        self.config = {k: v for k, v in config.items() if k != "group.id"}
        self.group, self.topic = group, topic
        self._prefix = group.encode("utf-8") + b"\0"
        self.producer = Producer({**shared_config(self.config), "enable.idempotence": True, "acks": "all"})
        self._errors: list[KafkaError] = []

    def ensure_topic(self) -> None:
        """Create the holds topic (compacted) when it is not there."""
        admin = AdminClient(shared_config(self.config))
        if self.topic in admin.list_topics(timeout=10).topics:
            return
        failed = create_topics(admin, [NewTopic(self.topic, 1, AUTO, config=HOLDS_TOPIC_CONFIG)])
        if failed:
            raise RuntimeError(
                f"cannot create the holds topic {self.topic} ({failed[self.topic]}): create it "
                "(cleanup.policy=compact) or name another with holds_topic="
            )

    def _key(self, topic: str, key: bytes) -> bytes:
        return self._prefix + topic.encode("utf-8") + b"\0" + key

    def put(self, topic: str, key: bytes, hold: Hold | None) -> None:
        """Write the hold of ``key`` (of ``topic``; None: it is free) and wait for the broker's ack."""

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self._errors.append(err)

        value = None if hold is None else hold.encode()
        self.producer.produce(self.topic, key=self._key(topic, key), value=value, on_delivery=delivered)
        remaining = self.producer.flush(30)
        if self._errors or remaining:
            error = self._errors[0].str() if self._errors else "no acknowledgement in 30 s"
            self._errors.clear()
            raise RetryDeliveryError(f"the hold of a key was not written to {self.topic}: {error}")

    def load(self, timeout_s: float = LOAD_TIMEOUT_S) -> dict[tuple[str, bytes], Hold]:
        """Every hold of this group: the holds topic read from its start to its end, within
        ``timeout_s``. Raises :class:`HoldsUnavailable` when the topic is missing or cannot be read
        to its end in time; a record that is not a hold is left out with a warning."""
        reader = Consumer(
            {**self.config, "group.id": f"{self.group}.holds-reader", "enable.auto.commit": False}
        )
        holds: dict[tuple[str, bytes], Hold] = {}
        deadline = time.monotonic() + timeout_s
        try:
            try:
                meta = reader.list_topics(self.topic, timeout=max(1.0, min(10.0, timeout_s))).topics[
                    self.topic
                ]
            except KafkaException as exc:
                raise HoldsUnavailable(f"the holds topic {self.topic} cannot be read: {exc}") from None
            if meta.error is not None or not meta.partitions:
                raise HoldsUnavailable(
                    f"the holds topic {self.topic} is not there ({meta.error.str() if meta.error else 'no partitions'})"
                )
            ends: dict[int, int] = {}
            for partition in meta.partitions:
                try:
                    low, high = reader.get_watermark_offsets(
                        TopicPartition(self.topic, partition), timeout=max(1.0, deadline - time.monotonic())
                    )
                except KafkaException as exc:
                    raise HoldsUnavailable(f"the holds topic {self.topic} cannot be read: {exc}") from None
                if high > low:
                    ends[partition] = high
            reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in ends])
            while ends and time.monotonic() < deadline:
                msg = reader.poll(min(0.5, max(0.01, deadline - time.monotonic())))
                if msg is None or msg.error() is not None:
                    continue
                partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                if offset + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
                raw = msg.key() or b""
                if not raw.startswith(self._prefix):
                    continue  # another group's
                topic, _, key = raw[len(self._prefix) :].partition(b"\0")
                value = msg.value()
                try:
                    where = (topic.decode("utf-8"), key)
                    if value is None:
                        holds.pop(where, None)
                    else:
                        holds[where] = decode_hold(value)
                except (ValueError, TypeError, RecursionError) as exc:  # not written by a HoldStore
                    log.warning("%s[%s]@%s is not a hold, left out: %s", self.topic, partition, offset, exc)
            if ends:
                raise HoldsUnavailable(
                    f"the holds topic {self.topic} could not be read to its end in {timeout_s:.0f} s"
                )
        finally:
            reader.close()
        return holds

    def close(self) -> None:
        self.producer.flush(30)
