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
groups of ``orders`` never see a second copy. The scheduler creates the topic when it publishes
the first retry there (``RETRY_CREATE_TOPICS``; else create it beside ``orders``). A record from a
redelivery topic reaches the handler like one from ``orders``; :func:`original_topic` tells where
it came from. ``scope="topic"`` retries on ``orders`` itself, as ``RetryClient`` does by default.

Offsets are committed after the handler returned, or after its failure was acknowledged by the
retry topic: at-least-once, and a failing record never blocks its partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from retry_scheduler.client import RetryClient
from retry_scheduler.core import protocol

log = logging.getLogger(__name__)

#: How often the consumer looks for new topics (a redelivery topic created after it subscribed).
METADATA_REFRESH_MS = 10_000
_NOT_THERE_YET = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def original_topic(msg: Message) -> str | None:
    """The topic a record was first consumed from: its ``retry.original-topic``, else its own topic."""
    headers: Any = msg.headers() or ()
    for name, value in headers:
        if name == protocol.ORIGINAL_TOPIC and isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                break
    return msg.topic()


class RetryingConsumer:
    """Consume ``topics`` (and, with ``scope="group"``, the group's redelivery topics) and call
    ``handler(msg)`` for each record; a handler that raises has the record sent to retry.

    :param config: the ``confluent_kafka.Consumer`` configuration; ``group.id`` is required.
        Auto-commit is turned off (offsets are committed after each record).
    :param retries: the :class:`RetryClient` to send failures with; by default one on the same
        brokers, for this group and scope.
    """

    def __init__(
        self,
        config: dict[str, Any],
        topics: Sequence[str],
        handler: Callable[[Message], None],
        retries: RetryClient | None = None,
        *,
        scope: str = protocol.SCOPE_GROUP,
    ) -> None:
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
        self.retries = retries or RetryClient(
            {"bootstrap.servers": config["bootstrap.servers"]}, group=group, scope=scope
        )
        self.consumer = Consumer(
            {"topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS, **config, "enable.auto.commit": False}
        )
        self.consumer.subscribe(self.topics + self.redelivery_topics)
        self._stop = threading.Event()

    def poll(self, timeout_s: float = 1.0) -> bool:
        """Handle at most one record; True when one was handled (or sent to retry)."""
        msg = self.consumer.poll(timeout_s)
        if msg is None:
            return False
        error = msg.error()
        if error is not None:
            if error.code() in _NOT_THERE_YET:  # a redelivery topic the scheduler has not created yet
                log.debug("%s", error)
                return False
            raise KafkaException(error)
        try:
            self.handler(msg)
        except Exception as exc:
            log.info(
                "record %s[%s]@%s failed (%s): sent to retry", msg.topic(), msg.partition(), msg.offset(), exc
            )
            self.retries.retry(msg, exc)  # returns once acknowledged: committing after it loses nothing
        self.consumer.commit(message=msg, asynchronous=False)
        return True

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
