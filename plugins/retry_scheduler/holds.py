"""The consumer helper's ordered mode keeps, per key, what its records wait behind (a :class:`Hold`),
in a compacted topic (:class:`HoldStore`): a restarted consumer, or the group member a partition moves
to, reads the holds back and keeps each key's order. Needs only ``confluent-kafka``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.client import RetryDeliveryError
from retry_scheduler.core import protocol

log = logging.getLogger(__name__)

#: The compacted topic the ordered mode keeps its holds in.
DEFAULT_HOLDS_TOPIC = protocol.HOLDS_TOPIC


def create_topics(admin: AdminClient, topics: list[NewTopic], timeout_s: float = 30) -> dict[str, str]:
    """Create ``topics``; one that already exists counts as created. The broker's error of each that
    could not be created (topic -> message); empty when every one exists now."""
    failed: dict[str, str] = {}
    for name, future in admin.create_topics(topics, request_timeout=timeout_s).items() if topics else ():
        try:
            future.result(timeout_s + 5)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                failed[name] = exc.args[0].str()
        except concurrent.futures.TimeoutError:
            failed[name] = f"no answer from the broker within {timeout_s:.0f} s"
    return failed


@dataclass
class Hold:
    """The ordered mode's state of one key: its records wait behind the retry ``blocker``.

    ``released``: the blocker was handled (or died), its chain is coming back in order. ``parked``: the
    records parked behind the chain and not back yet; the key is free again when none is left.
    ``dead``: the blocker died (it is on the DLQ) rather than being handled.
    """

    blocker: str
    released: bool = False
    parked: int = 0
    dead: bool = False


def _hold(data: Any) -> Hold:
    if not isinstance(data, dict) or not isinstance(data.get("blocker"), str):
        raise ValueError("no blocker")
    released, parked, dead = data.get("released", False), data.get("parked", 0), data.get("dead", False)
    if not isinstance(released, bool) or not isinstance(parked, int) or not isinstance(dead, bool):
        raise ValueError(f"released {released!r}, parked {parked!r}, dead {dead!r}")
    return Hold(data["blocker"], released, parked, dead)


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
        failed = create_topics(admin, [NewTopic(self.topic, 1, -1, config={"cleanup.policy": "compact"})])
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

        value = None if hold is None else json.dumps(asdict(hold)).encode()
        self.producer.produce(self.topic, key=self._key(topic, key), value=value, on_delivery=delivered)
        remaining = self.producer.flush(30)
        if self._errors or remaining:
            error = self._errors[0].str() if self._errors else "no acknowledgement in 30 s"
            self._errors.clear()
            raise RetryDeliveryError(f"the hold of a key was not written to {self.topic}: {error}")

    def load(self) -> dict[tuple[str, bytes], Hold]:
        """Every hold of this group: the holds topic read from its start to its end."""
        reader = Consumer(
            {**self.config, "group.id": f"{self.group}.holds-reader", "enable.auto.commit": False}
        )
        holds: dict[tuple[str, bytes], Hold] = {}
        try:
            meta = reader.list_topics(self.topic, timeout=10).topics[self.topic]
            ends: dict[int, int] = {}
            for partition in meta.partitions:
                low, high = reader.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)
                if high > low:
                    ends[partition] = high
            reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in ends])
            deadline = time.monotonic() + 60
            while ends and time.monotonic() < deadline:
                msg = reader.poll(0.5)
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
                        holds[where] = _hold(json.loads(value))
                except (ValueError, TypeError) as exc:  # not written by a HoldStore: not a hold
                    log.warning("%s[%s]@%s is not a hold, left out: %s", self.topic, partition, offset, exc)
            if ends:
                raise RuntimeError(f"the holds topic {self.topic} could not be read to its end in 60 s")
        finally:
            reader.close()
        return holds

    def close(self) -> None:
        self.producer.flush(30)
