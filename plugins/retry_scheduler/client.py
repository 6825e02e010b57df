"""Python SDK: hand a failed Kafka record to the retry scheduler and move on.

Needs only ``confluent-kafka``::

    from confluent_kafka import Consumer
    from retry_scheduler.client import RetryClient

    retries = RetryClient({"bootstrap.servers": "localhost:9092"}, group="orders-service",
                          fatal_errors=(ValueError,))
    for msg in consumer:                       # your poll loop
        try:
            handle(msg)
        except Exception as exc:
            retries.retry(msg, exc)            # waits for the broker's ack, then returns
        consumer.commit(msg)                   # never blocks the partition

The record goes to the ``retry`` topic with the header protocol filled in: the attempt and
``retry.id`` are copied from the record that failed (so a retried record keeps its identity),
the ``retry.original-*`` headers point at where it was first consumed, and an exception that
is classified fatal is sent straight to the DLQ (``retry.send-to=dlq``).

A share consumer (``confluent_kafka.ShareConsumer``, explicit acknowledgement) hands a record over
with ``retries.retry_shared(consumer, msg, exc)``: sent to the retry topic, then acknowledged.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, cast

import confluent_kafka
from confluent_kafka import KafkaError, Producer

from retry_scheduler.core import protocol

DEFAULT_RETRY_TOPIC = "retry"
MAX_REASON_CHARS = 2000

Header = tuple[str, bytes | None]


class RetryDeliveryError(RuntimeError):
    """The retry record was not acknowledged by the broker: do not commit the failed offset."""


class FailedRecord(Protocol):
    """What the SDK reads from a failed record (a ``confluent_kafka.Message`` fits)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> Any: ...
    def value(self) -> Any: ...
    def headers(self) -> Any: ...


def error_class_name(error: BaseException) -> str:
    """``module.QualifiedName`` of an exception, as sent in ``retry.error-class``."""
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def _to_ms(at: datetime | float | int) -> int:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError("retry time must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return int(at.timestamp() * 1000)
    return int(at)


def header_text(headers: Sequence[Header] | None, name: str) -> str | None:
    """The last ``name`` header as text (a repeated ``retry.*`` header counts by its last occurrence,
    as the scheduler and Java's ``Headers.lastHeader`` read it); None when absent or not UTF-8."""
    found = None
    for key, value in headers or ():
        if key == name and isinstance(value, bytes):
            found = value
    if found is None:
        return None
    try:
        return found.decode("utf-8")
    except UnicodeDecodeError:
        return None


def build_retry_headers(
    record: FailedRecord,
    error: BaseException | None = None,
    *,
    reason: str | None = None,
    group: str | None = None,
    destination: str | None = None,
    policy: str | None = None,
    at_ms: int | None = None,
    send_to_dlq: bool = False,
    now_ms: int | None = None,
    scope: str = protocol.SCOPE_TOPIC,
    hold: str | None = None,
    blocks: str | None = None,
    chain_flows: bool = False,
    retry_id: str | None = None,
    redeliveries: int = 0,
) -> list[Header]:
    """Headers for the retry topic: the record's own headers plus the ``retry.*`` protocol.

    ``scope="group"`` sends the retry to ``group``'s redelivery topic instead of the shared topic
    (``retry.scope``; see :func:`retry_scheduler.core.protocol.redelivery_topic`). Ordered mode:
    ``hold`` parks the record in its key's chain (``retry.hold``; with ``chain_flows``, a chain whose
    head was handled: ``retry.chain-state: released``); ``blocks`` makes this failed record the head of
    its key's chain (``retry.blocks``). ``retry_id``: the ``retry.id`` to give a record that carries
    none (a new one otherwise). ``redeliveries``: retries made by others than the scheduler (a share
    group's redeliveries), added to the ``retry.attempt`` the record carries.

    A ``retry.attempt`` or ``retry.original-*`` number the record carries that is not a whole number
    is replaced by the record's own (the attempt by 0): a retry the scheduler would refuse as invalid
    is never sent.
    """
    if scope not in (protocol.SCOPE_TOPIC, protocol.SCOPE_GROUP):
        raise ValueError(f"scope must be 'topic' or 'group', not {scope!r}")
    if scope == protocol.SCOPE_GROUP and not group:
        raise ValueError("scope='group' needs the consumer group: RetryClient(..., group='orders-app')")
    raw = record.headers() or []
    headers: list[Header] = [(k, v if v is None or isinstance(v, bytes) else str(v).encode()) for k, v in raw]
    passthrough = [(k, v) for k, v in headers if k not in protocol.KNOWN]

    def carried(name: str, fallback: object) -> str | None:
        found = header_text(headers, name)
        if found is not None and (name not in _NUMBERS or (found.isascii() and found.isdigit())):
            return found
        return None if fallback is None else str(fallback)

    ts_type, ts = record.timestamp()
    out: list[Header] = []

    def put(name: str, value: str | None) -> None:
        if value is not None:
            out.append((name, value.encode("utf-8")))

    put(protocol.ORIGINAL_TOPIC, carried(protocol.ORIGINAL_TOPIC, record.topic()))
    put(protocol.ORIGINAL_PARTITION, carried(protocol.ORIGINAL_PARTITION, record.partition()))
    put(protocol.ORIGINAL_OFFSET, carried(protocol.ORIGINAL_OFFSET, record.offset()))
    put(
        protocol.ORIGINAL_TIMESTAMP,
        carried(protocol.ORIGINAL_TIMESTAMP, ts if ts_type != 0 and ts > 0 else now_ms),
    )
    put(protocol.ATTEMPT, str(int(carried(protocol.ATTEMPT, 0) or 0) + max(redeliveries, 0)))
    put(protocol.ID, carried(protocol.ID, None) or retry_id or str(uuid.uuid4()))
    put(protocol.DESTINATION, destination)
    put(protocol.POLICY, policy)
    if at_ms is not None:
        put(protocol.AT, str(at_ms))
    text = reason if reason is not None else (str(error) if error is not None else None)
    if text is not None:
        put(protocol.REASON, text[:MAX_REASON_CHARS])
    if error is not None:
        put(protocol.ERROR_CLASS, error_class_name(error))
    put(protocol.GROUP, group)
    put(protocol.SEND_TO, protocol.SEND_TO_DLQ if send_to_dlq else None)
    put(protocol.SCOPE, protocol.SCOPE_GROUP if scope == protocol.SCOPE_GROUP else None)
    put(protocol.HOLD, hold)
    put(protocol.CHAIN_STATE, protocol.CHAIN_RELEASED if hold is not None and chain_flows else None)
    put(protocol.BLOCKS, blocks)
    return passthrough + out


#: The headers whose value is a whole number (``carried`` keeps only such a value).
_NUMBERS = frozenset(
    {protocol.ORIGINAL_PARTITION, protocol.ORIGINAL_OFFSET, protocol.ORIGINAL_TIMESTAMP, protocol.ATTEMPT}
)


class RetryClient:
    """Sends failed records to the retry topic. Thread-safe like the producer it wraps.

    :param producer: a ``confluent_kafka.Producer`` or its configuration dict.
    :param group: your consumer group, sent as ``retry.group`` for diagnostics.
    :param fatal_errors: exception types that will never succeed on retry: sent to the DLQ.
    :param classify: optional ``error -> "retry" | "dlq"``; overrides ``fatal_errors``.
    :param scope: ``"topic"`` (the default): a retry goes back to the record's topic, where every
        consumer group reads it again; ``"group"``: to ``{topic}.{group}.redelivery``, which only
        ``group`` reads (:class:`retry_scheduler.consumer.RetryingConsumer` subscribes to it).
    """

    def __init__(
        self,
        producer: Producer | dict[str, Any],
        *,
        retry_topic: str = DEFAULT_RETRY_TOPIC,
        group: str | None = None,
        fatal_errors: tuple[type[BaseException], ...] = (),
        classify: Callable[[BaseException], str] | None = None,
        timeout_s: float = 30.0,
        scope: str = protocol.SCOPE_TOPIC,
    ) -> None:
        if scope == protocol.SCOPE_GROUP and not group:
            raise ValueError("scope='group' needs the consumer group: RetryClient(..., group='orders-app')")
        if isinstance(producer, dict):
            producer = Producer({"enable.idempotence": True, "acks": "all", **producer})
        self.producer = producer
        self.retry_topic = retry_topic
        self.group = group
        self.fatal_errors = fatal_errors
        self.classify = classify
        self.timeout_s = timeout_s
        self.scope = scope
        self._errors: list[KafkaError] = []

    def is_fatal(self, error: BaseException | None) -> bool:
        if error is None:
            return False
        if self.classify is not None:
            return self.classify(error) == protocol.SEND_TO_DLQ
        return isinstance(error, self.fatal_errors)

    def retry(
        self,
        record: FailedRecord,
        error: BaseException | None = None,
        *,
        reason: str | None = None,
        at: datetime | float | int | None = None,
        destination: str | None = None,
        policy: str | None = None,
        dead: bool = False,
        wait: bool = True,
        hold: str | None = None,
        blocks: str | None = None,
        chain_flows: bool = False,
        retry_id: str | None = None,
        redeliveries: int = 0,
    ) -> str:
        """Send ``record`` to the retry topic; returns its ``retry.id`` (kept from the record, or new).

        ``at`` is an explicit due time (aware datetime or epoch ms); otherwise the policy decides.
        ``dead=True`` (or a fatal error) sends it straight to the DLQ. With ``wait`` (the default)
        this returns only once the broker acknowledged the record, so committing the failed
        offset afterwards loses nothing; with ``wait=False`` call :meth:`flush` before committing.
        Ordered mode (:class:`~retry_scheduler.consumer.RetryingConsumer` uses these): ``hold`` parks
        the record, unfailed, in the chain it names: the scheduler publishes it only after
        :meth:`release` of the chain, in its original order (``chain_flows``: the chain is released
        already); ``blocks`` makes this retry the head of that chain (it waits while this is pending).
        ``retry_id``: the ``retry.id`` for a record that carries none (a new one otherwise).
        """
        headers = build_retry_headers(
            record,
            error,
            reason=reason,
            group=self.group,
            destination=destination,
            policy=policy,
            at_ms=None if at is None else _to_ms(at),
            send_to_dlq=dead or self.is_fatal(error),
            now_ms=int(datetime.now().timestamp() * 1000),
            scope=self.scope,
            hold=hold,
            blocks=blocks,
            chain_flows=chain_flows,
            retry_id=retry_id,
            redeliveries=redeliveries,
        )
        self._produce(record.key(), record.value(), headers, wait)
        return next(v for k, v in headers if k == protocol.ID and v is not None).decode()

    def release(self, record: FailedRecord, blocker: str, *, wait: bool = True) -> None:
        """Tell the scheduler that the head of the chain ``blocker`` was handled: the records parked in
        it (``hold=blocker``) are published, one at a time, in their original order. ``record`` is the
        head as it came back (its key and origin route the release)."""
        headers = build_retry_headers(record, group=self.group, scope=self.scope)
        kept = {protocol.ORIGINAL_TOPIC, protocol.ORIGINAL_PARTITION, protocol.GROUP, protocol.SCOPE}
        out = [(k, v) for k, v in headers if k in kept] + [(protocol.RELEASE, blocker.encode())]
        self._produce(record.key(), None, out, wait)

    def _produce(self, key: Any, value: Any, headers: list[Header], wait: bool) -> None:
        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self._errors.append(err)

        self.producer.produce(
            self.retry_topic, key=key, value=value, headers=cast(Any, headers), on_delivery=delivered
        )
        if wait:
            self.flush()

    def retry_shared(
        self, consumer: Any, record: FailedRecord, error: BaseException | None = None, **kwargs: Any
    ) -> str:
        """Hand a record a share consumer could not handle to the retry topic, then acknowledge it.

        For ``confluent_kafka.ShareConsumer`` with ``share.acknowledgement.mode=explicit`` (Kafka 4.2+
        share groups): a share group redelivers a released record at once, with no delay, at most its
        delivery limit times; handed here, the record comes back to its topic when the policy says,
        where the group reads it again. Its ``retry.attempt`` counts the group's redeliveries too (its
        ``delivery_count()`` less one, added to the attempt it carries). Once the retry topic
        acknowledged the record it is acknowledged ``ACCEPT``: handed over, not failed (a ``REJECT``
        would also write it to the group's dead-letter topic, a second copy). If the retry cannot be
        sent, it is acknowledged ``RELEASE`` (the group delivers it again) and the error raised.
        ``kwargs`` are :meth:`retry`'s. Commit the acknowledgements as usual (``commit_sync``, or the
        next ``poll``). Only on a confluent-kafka with share consumers (2.16+); absent otherwise.
        Returns the ``retry.id``.
        """
        from confluent_kafka import AcknowledgeType

        count = getattr(record, "delivery_count", None)
        delivered = count() if callable(count) else None
        redeliveries = delivered - 1 if isinstance(delivered, int) and delivered > 1 else 0
        try:
            retry_id = self.retry(record, error, redeliveries=redeliveries, **{**kwargs, "wait": True})
        except BaseException:
            consumer.acknowledge(record, AcknowledgeType.RELEASE)
            raise
        consumer.acknowledge(record, AcknowledgeType.ACCEPT)
        return retry_id

    def dead_letter(self, record: FailedRecord, error: BaseException | None = None, **kwargs: Any) -> str:
        """Send ``record`` straight to the DLQ (``retry.send-to=dlq``), keeping it in PostgreSQL."""
        return self.retry(record, error, dead=True, **kwargs)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait for every record sent so far to be acknowledged."""
        remaining = self.producer.flush(self.timeout_s if timeout_s is None else timeout_s)
        if self._errors:
            first, count = self._errors[0], len(self._errors)
            self._errors.clear()
            raise RetryDeliveryError(f"{count} retry records not acknowledged: {first.str()}")
        if remaining:
            raise RetryDeliveryError(f"{remaining} retry records still unacknowledged after flush")


#: Whether the installed confluent-kafka has share consumers (2.16+): :meth:`RetryClient.retry_shared`
#: exists only then.
SHARE_CONSUMERS = hasattr(confluent_kafka, "AcknowledgeType") and hasattr(confluent_kafka, "ShareConsumer")
if not SHARE_CONSUMERS:
    del RetryClient.retry_shared
