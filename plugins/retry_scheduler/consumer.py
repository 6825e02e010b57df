"""The SDK's consumer helper: read your topics and your group's redelivery topics, hand every record to
your handler, and send the ones it fails on to the retry scheduler. Needs only ``confluent-kafka``::

    from retry_scheduler.consumer import RetryingConsumer, original_topic

    def handle(msg):                      # raise to have the record retried
        charge(original_topic(msg), msg.value())

    consumer = RetryingConsumer(
        {"bootstrap.servers": "kafka:9092", "group.id": "payments-app"}, ["orders"], handle
    )
    consumer.run()                        # until consumer.stop() (from a signal handler, another thread)

With the default ``scope="group"`` a failed record is retried on ``orders.payments-app.redelivery``
(:func:`retry_scheduler.core.protocol.redelivery_topic`), which only this group reads: the other
groups of ``orders`` never see a second copy. The helper creates the topic when it subscribes (as
many partitions as ``orders``), and so does the scheduler when it publishes the first retry there
(``RETRY_CREATE_TOPICS``); where neither may create topics, create it beside ``orders``. A
redelivery partition the group has no committed offset for is read from its beginning, whatever
``auto.offset.reset`` says for ``orders``: a retry published before the group first saw the topic
is never skipped. A record from a redelivery topic reaches the handler like one from ``orders``;
:func:`original_topic` tells where it came from. ``scope="topic"`` retries on ``orders`` itself, as
``RetryClient`` does by default.

Offsets are committed after the handler returned, or after its failure was acknowledged by the
retry topic: at-least-once, and a failing record never blocks its partition.

When a dependency is down every record fails, and sending them all to retry only fills the retry
topic with records that will fail again. A :class:`CircuitBreaker` pauses instead::

    RetryingConsumer(config, ["orders"], handle, breaker=CircuitBreaker(failure_rate=0.5, cool_down="30s"))

Past the failure rate over the window it pauses the assigned partitions (``Consumer.pause``; polling
goes on, so the group does not rebalance and nothing is skipped: the records not yet handled are
read again on resume), lets one record through after the cool-down (probing), and resumes when
that one succeeds, or pauses again. State changes are logged and counted (``CircuitBreaker.counts``).

``ordered=True`` keeps each key's order: once a record of a key failed, its retry heads a chain for
the key (``retry.blocks``) and the key's later records are parked in it (``retry.hold``) instead of
handled; when the retry came back and was handled, a release (``retry.release``) has the scheduler
publish them one at a time in their original order (:mod:`retry_scheduler.ordered` decides what each
record does). The held keys are kept in a compacted topic (:mod:`retry_scheduler.holds`), so a
restart or a rebalance keeps the order. The guarantee: docs/guide/sending.md, "Per-key ordering";
the protocol: docs/header-protocol.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.circuit_breaker import PROBING, CircuitBreaker
from retry_scheduler.client import RetryClient, header_text
from retry_scheduler.coordinator import committed_offsets
from retry_scheduler.core import protocol
from retry_scheduler.holds import (
    DEFAULT_HOLDS_TOPIC,
    Hold,
    HoldStore,
    HoldsUnavailable,
    create_topics,
    shared_config,
)
from retry_scheduler.ordered import DEAD_LETTER, RELEASE, OrderedKeys, is_notice
from retry_scheduler.replication import AUTO

log = logging.getLogger(__name__)

__all__ = ["DEAD_LETTER", "RELEASE", "CircuitBreaker", "RetryingConsumer", "original_topic"]
#: How often the consumer looks for new topics (a redelivery topic created after it subscribed).
METADATA_REFRESH_MS = 10_000
_NOT_THERE_YET = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def original_topic(msg: Message) -> str | None:
    """The topic a record was first consumed from: its ``retry.original-topic`` (the last, as everywhere
    else), else its own topic."""
    headers: Any = msg.headers()
    return header_text(headers, protocol.ORIGINAL_TOPIC) or msg.topic()


def _check_assignor(config: dict[str, Any], consumer_protocol: bool) -> None:
    """Ordered mode with ``scope="group"`` needs the range assignor; say so (an error in the log) when
    ``config`` names another."""
    if consumer_protocol:
        assignor, setting = str(config.get("group.remote.assignor")), "group.remote.assignor"
    else:
        assignor = str(config.get("partition.assignment.strategy", "range,roundrobin"))
        setting = "partition.assignment.strategy"
    if not assignor.startswith("range") or "cooperative" in assignor:
        log.error(
            "ordered mode with scope='group' needs the range assignor (%s=range): with %s=%s a "
            "key's retries may come back to another member than the one that parked its "
            "records, which then wait", setting, setting, assignor,
        )  # fmt: skip


class RetryingConsumer:
    """Consume ``topics`` (and, with ``scope="group"``, the group's redelivery topics) and call
    ``handler(msg)`` for each record; a handler that raises has the record sent to retry.

    :param config: the ``confluent_kafka.Consumer`` configuration; ``group.id`` is required.
        Auto-commit is turned off (offsets are committed after each record).
    :param retries: the :class:`RetryClient` to send failures with; by default one on the same
        brokers, for this group and scope.
    :param ordered: keep each key's order (records without a key are handled as usual); the held
        keys are kept in ``holds_topic``, created (compacted) when missing. Name another than
        ``retry.holds`` in the service's ``RETRY_HOLDS_TOPICS`` too: it is then never a destination.
    :param after_dead: ordered mode, when a key's retry dies (it is on the DLQ): ``"release"`` (the
        default) hands the records held behind it to the handler, in order; ``"dead-letter"`` sends
        them to the DLQ too, with a reason naming the dead retry.
    """

    def __init__(
        self,
        config: dict[str, Any],
        topics: Sequence[str],
        handler: Callable[[Message], None],
        retries: RetryClient | None = None,
        *,
        scope: str = protocol.SCOPE_GROUP,
        breaker: CircuitBreaker | None = None,
        ordered: bool = False,
        holds_topic: str = DEFAULT_HOLDS_TOPIC,
        after_dead: str = RELEASE,
    ) -> None:
        if after_dead not in (RELEASE, DEAD_LETTER):
            raise ValueError(f"after_dead must be {RELEASE!r} or {DEAD_LETTER!r}, not {after_dead!r}")
        group = config.get("group.id")
        if not group:
            raise ValueError("config needs a group.id: the consumer group this application consumes as")
        if isinstance(topics, str):
            raise ValueError("topics must be a list of topic names, e.g. ['orders']")
        self.topics = list(topics)
        self.redelivery_topics = (
            [protocol.redelivery_topic(topic, group) for topic in self.topics]
            if scope == protocol.SCOPE_GROUP
            else []
        )
        self.handler = handler
        self.retries = retries or RetryClient(shared_config(config), group=group, scope=scope)
        consumer_protocol = config.get("group.protocol") == "consumer"
        if (
            ordered
            and self.redelivery_topics
            and consumer_protocol
            and not config.get("group.remote.assignor")
        ):
            # KIP-848's range assignor gives a member partition p of every topic of equal partition
            # count (its co-partitioning): a key's partition and its redelivery partition together.
            config = {**config, "group.remote.assignor": "range"}
        self.consumer = Consumer(
            {"topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS, **config, "enable.auto.commit": False}
        )
        self.breaker = breaker
        #: Partitions revoked from this consumer so far (a pause must not cause any).
        self.revocations = 0
        #: Offset commits the group refused or could not take (:meth:`_commit`): records that may be
        #: handled again by their partition's next owner.
        self.commit_failures = 0
        #: The partitions (topic, partition) this member reads now, as its rebalance callbacks were
        #: told: safe to read from another thread, unlike the consumer's own ``assignment()``, which
        #: can block while the member's thread polls.
        self.assigned: frozenset[tuple[str, int]] = frozenset()
        #: Ordered mode, ``scope="group"``: assignments that split a topic's partition from its
        #: redelivery topic's (logged as errors; see :meth:`_check_colocation`).
        self.colocation_warnings = 0
        #: Ordered mode: the held keys and what each record does to them (:mod:`retry_scheduler.ordered`).
        self.ordered: OrderedKeys | None = None
        self.hold_store: HoldStore | None = None
        #: Ordered mode: times the holds could not be read (the partitions waited, paused).
        self.holds_unavailable = 0
        self._holds_read = False  # read since the last assignment
        self._read_holds_after = 0.0  # monotonic: when to try again after a failed read
        self._swept_at = time.monotonic()
        if ordered:
            self.hold_store = HoldStore(config, group, holds_topic)
            self.hold_store.ensure_topic()
            self.ordered = OrderedKeys(self.hold_store, self.retries, self._call, after_dead)
        #: Whether the group's rebalance protocol hands out partitions incrementally (librdkafka
        #: tells no one: an assign() of the other kind fails inside the callback, and nothing is read).
        self._incremental = consumer_protocol or "cooperative" in str(
            config.get("partition.assignment.strategy", "")
        )
        if self.redelivery_topics:
            self._create_redelivery_topics(shared_config(config))
            if ordered:
                _check_assignor(config, consumer_protocol)
        self.consumer.subscribe(
            self.topics + self.redelivery_topics, on_assign=self._assigned, on_revoke=self._revoked
        )
        self._stop = threading.Event()

    def _create_redelivery_topics(self, config: dict[str, Any]) -> None:
        """Create this group's missing redelivery topics, each with as many partitions as its topic.

        Where the helper may not create topics it says so and goes on: the scheduler creates them
        (``RETRY_CREATE_TOPICS``), and the partitions are read from their beginning once they exist."""
        admin = AdminClient(config)
        try:
            known = admin.list_topics(timeout=10).topics
        except KafkaException as exc:
            log.warning("cannot list the topics (%s): the redelivery topics are not checked", exc)
            return
        missing = [
            NewTopic(redelivery, len(known[topic].partitions) if topic in known else -1, AUTO)
            for topic, redelivery in zip(self.topics, self.redelivery_topics, strict=True)
            if redelivery not in known
        ]
        failed = create_topics(admin, missing)
        for topic in missing:
            if topic.topic in failed:
                log.warning(
                    "cannot create the redelivery topic %s (%s): create it beside its topic, or let "
                    "the scheduler create it (RETRY_CREATE_TOPICS); it is read from its beginning "
                    "once it exists",
                    topic.topic, failed[topic.topic],
                )  # fmt: skip
            else:
                log.info("created the redelivery topic %s", topic.topic)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        given = frozenset((tp.topic, tp.partition) for tp in partitions)
        self.assigned = (self.assigned | given) if self._incremental else given
        # A redelivery partition the group never committed an offset for starts at its beginning:
        # with auto.offset.reset=latest (librdkafka's default) the retries published to it before
        # this moment would be skipped, and the group committed their originals long ago.
        fresh = [tp for tp in partitions if tp.topic in self.redelivery_topics]
        if fresh:
            try:
                committed = {
                    (tp.topic, tp.partition): tp.offset for tp in committed_offsets(consumer, fresh, 10)
                }
            except Exception as exc:  # closing, or the coordinator away: the group's positions as they are
                log.warning("cannot read the committed offsets of %s: %s", [str(tp) for tp in fresh], exc)
                committed = {(tp.topic, tp.partition): 0 for tp in fresh}
            for tp in fresh:
                if committed.get((tp.topic, tp.partition), OFFSET_INVALID) < 0:
                    tp.offset = OFFSET_BEGINNING
            if self._incremental:  # the cooperative protocols add to the assignment
                consumer.incremental_assign(partitions)
            else:  # the eager one replaces it
                consumer.assign(partitions)
        # Another member may have held keys of these partitions until now: the holds are read again
        # before the next record is handled (in poll, not here: a slow read must not stall the
        # rebalance, nor an unreadable topic raise inside it).
        self._holds_read = False
        if self.ordered is not None and self.redelivery_topics:
            self._check_colocation(consumer, partitions)

    def _check_colocation(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Ordered mode with ``scope="group"``: a key's retries come back on the partition of the
        redelivery topic numbered as its own, so the member reading ``orders[p]`` must read
        ``orders.<group>.redelivery[p]`` too. An assignor that splits them (anything but ``range``
        with topics of equal partition counts) would leave the member that parked a key's records
        waiting for a head another member handles: said at once, loudly."""
        try:
            assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        except KafkaException:
            return
        assigned |= {(tp.topic, tp.partition) for tp in partitions}
        split = sorted(
            f"{topic}[{partition}]"
            for topic, redelivery in zip(self.topics, self.redelivery_topics, strict=True)
            for t, partition in assigned
            if t == topic and (redelivery, partition) not in assigned
        )
        if split and not self._incremental:
            self.colocation_warnings += 1
            log.error(
                "ordered mode: this member reads %s without the same partition of its redelivery "
                "topic: a key's retry may reach another member and its parked records wait. Use "
                "partition.assignment.strategy=range and give each redelivery topic as many partitions "
                "as its topic (the helper and the scheduler create it so)", ", ".join(split[:5]),
            )  # fmt: skip

    def _revoked(self, _consumer: Consumer, partitions: list[Any]) -> None:
        self.revocations += len(partitions)
        self.assigned -= {(tp.topic, tp.partition) for tp in partitions}

    def poll(self, timeout_s: float = 1.0) -> bool:
        """Handle at most one record; True when one was handled (or sent to retry).

        While the breaker is open this only polls (the partitions are paused), which keeps the
        consumer in its group."""
        breaker = self.breaker
        if breaker is not None and breaker.state == "open":
            if breaker.due_probe(time.monotonic()):
                log.warning("circuit probing: letting one record through to probe the dependency")
                self.consumer.resume(self.consumer.assignment())
            else:
                self._hold(min(timeout_s, 0.5))
                return False
        if self.ordered is not None and not self._read_holds():
            self._hold(min(timeout_s, 0.5))  # the partitions wait until the holds are known
            return False
        msg = self.consumer.poll(timeout_s)
        if msg is None:
            return False
        if self.ordered is not None and not self._holds_read and msg.error() is None:
            # Assigned inside that poll: put the record back until the holds are read again.
            self.consumer.seek(
                TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            )
            return False
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            if error.code() in _NOT_THERE_YET:  # a redelivery topic the scheduler has not created yet
                log.debug("%s", error)
            else:  # a broker restarting, a partition moving: the client recovers by itself
                log.warning("consumer: %s (the client retries)", error)
            return False
        key = msg.key()
        if is_notice(msg):  # the scheduler's word to ordered mode, never a record of the application
            ok = None
            if self.ordered is not None and isinstance(key, bytes):
                self.ordered.notice(msg, (original_topic(msg) or "", key))
        elif self.ordered is not None and isinstance(key, bytes):
            ok = self.ordered.process(msg, (original_topic(msg) or "", key))
        else:
            ok = self._handle(msg)[0]
        self._commit(msg)
        if breaker is not None and ok is not None:
            self._count(breaker, ok)
        return True

    def _commit(self, msg: Message) -> None:
        """Commit the offset after ``msg``. A commit the group refuses or cannot take now (this member
        fenced after its session ran out, a rebalance, the coordinator moving) is not an error of the
        application: the record was handled, and the partition's next owner may handle it again (at
        least once). It is logged and counted (:attr:`commit_failures`); a fatal error raises."""
        try:
            self.consumer.commit(message=msg, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.fatal():
                raise
            self.commit_failures += 1
            log.warning(
                "consumer: the offset after %s [%s] @ %s could not be committed (%s): the record was handled, "
                "and the partition's next owner may handle it again (at least once)",
                msg.topic(), msg.partition(), msg.offset(), error.str(),
            )  # fmt: skip

    def _handle(self, msg: Message) -> tuple[bool, str | None]:
        """Call the handler; when it raises, send the record to retry. Whether it succeeded, and the
        ``retry.id`` of the retry it failed into (None when it succeeded or was dead-lettered)."""
        error = self._call(msg)
        if error is None:
            return True, None
        dead = self.retries.is_fatal(error)
        log.info(
            "record %s[%s]@%s failed (%s): sent to %s",
            msg.topic(), msg.partition(), msg.offset(), error, "the DLQ" if dead else "retry",
        )  # fmt: skip
        # Returns once acknowledged: committing the offset after it loses nothing.
        retry_id = self.retries.retry(msg, error)
        return False, None if dead else retry_id

    def _call(self, msg: Message) -> Exception | None:
        """Call the handler; the exception it raised, None when it succeeded."""
        try:
            self.handler(msg)
        except Exception as exc:
            return exc
        return None

    @property
    def holds(self) -> dict[tuple[str, bytes], Hold]:
        """Ordered mode: the keys held now, by (original topic, key); empty otherwise."""
        return {} if self.ordered is None else self.ordered.held()

    def _read_holds(self) -> bool:
        """Ordered mode: whether the holds are known since the last assignment; reads them when not
        (bounded; a failure is logged, counted and tried again 5 s later, the partitions paused
        meanwhile: a key whose holds are unknown must not be handled out of order). Every
        ``FINISHED_KEEP_S``/60 also forgets this member's finished chains."""
        assert self.ordered is not None and self.hold_store is not None
        now = time.monotonic()
        if not self._holds_read:
            if now < self._read_holds_after:
                return False
            try:
                self.ordered.holds = self.hold_store.load()
            except HoldsUnavailable as exc:
                self.holds_unavailable += 1
                self._read_holds_after = now + 5.0
                log.error("ordered mode: %s; the partitions wait, paused (trying again in 5 s)", exc)
                return False
            self._holds_read = True
            self.consumer.resume(self.consumer.assignment())
            if self.breaker is not None and self.breaker.state == "open":
                self.consumer.pause(self.consumer.assignment())
        if now - self._swept_at >= 60:
            self._swept_at = now
            owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            self.ordered.sweep(lambda topic, partition: (topic, partition) in owned)
        return True

    def _hold(self, timeout_s: float) -> None:
        """Poll while open: the membership stays. Partitions assigned since the pause are paused too;
        a record one of them delivered meanwhile is put back (the position goes back to it)."""
        self.consumer.pause(self.consumer.assignment())
        msg = self.consumer.poll(timeout_s)
        if msg is not None and msg.error() is None:
            self.consumer.seek(
                TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            )
            self.consumer.pause(self.consumer.assignment())

    def _count(self, breaker: CircuitBreaker, ok: bool) -> None:
        probing = breaker.state == PROBING
        change = breaker.record(ok, time.monotonic())
        if change == "open":
            partitions = self.consumer.assignment()
            # Paused, the records fetched but not handled are dropped from the client's queue and
            # fetched again from the position after the last one handled on resume: none is skipped.
            self.consumer.pause(partitions)
            log.warning(
                "circuit open: %s; %d partition(s) paused for %g s",
                "the probe failed" if probing else breaker.failure_summary(),
                len(partitions),
                breaker.cool_down_s,
            )
        elif change == "closed":
            log.warning("circuit closed: the probe succeeded, consuming again")

    def run(self, timeout_s: float = 1.0) -> None:
        """Poll until :meth:`stop`, then close."""
        try:
            while not self._stop.is_set():
                self.poll(timeout_s)
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.consumer.close()
        self.retries.flush()
        if self.hold_store is not None:
            self.hold_store.close()
