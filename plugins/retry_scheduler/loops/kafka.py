"""Kafka clients of the service: consumer, idempotent producer, topic creation."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings
from retry_scheduler.holds import wait_until_listed
from retry_scheduler.replication import resolved, under_replicated

log = logging.getLogger(__name__)


class KafkaUnreachableError(RuntimeError):
    """The brokers did not answer; the message names the setting and what was tried."""


class _RepeatsOnceAMinute(logging.Filter):
    """Lets each distinct librdkafka message through once a minute (numbers aside: the client's
    name, the milliseconds): with the broker down, every client says so twice a second."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = re.sub(r"[0-9]+", "#", record.getMessage())
        now, last = time.monotonic(), self._last.get(key)
        if last is not None and now - last < self.every_s:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


#: Where the service's own Kafka clients log (librdkafka's messages, at their level), instead of
#: straight to stderr: through Python's logging (the task log under Airflow), repeats held back.
LIBRDKAFKA_LOG = logging.getLogger("retry_scheduler.librdkafka")
LIBRDKAFKA_LOG.addFilter(_RepeatsOnceAMinute())


#: The reachability check's own client says nothing: its one error says it all.
_PREFLIGHT_LOG = logging.getLogger("retry_scheduler.librdkafka.preflight")
_PREFLIGHT_LOG.propagate = False
_PREFLIGHT_LOG.addHandler(logging.NullHandler())


def _logged(config: dict[str, Any]) -> dict[str, Any]:
    """A client configuration whose librdkafka messages go to :data:`LIBRDKAFKA_LOG` (unless the
    settings name a logger of their own)."""
    return {"logger": LIBRDKAFKA_LOG, **config}


def require_reachable(settings: Settings, timeout_s: float = 10.0) -> None:
    """Raise :class:`KafkaUnreachableError` unless the brokers answer a metadata request within
    ``timeout_s``: one line that says what to check, instead of librdkafka's retries and a traceback."""
    bootstrap = settings.kafka.get("bootstrap.servers", "")
    config: dict[str, Any] = {**admin_client_config(settings), "logger": _PREFLIGHT_LOG}
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        text = error.str() if isinstance(error, KafkaError) else str(exc)
        raise KafkaUnreachableError(
            f"cannot reach Kafka at {bootstrap} within {timeout_s:g} s ({text}): set KAFKA_BOOTSTRAP_SERVERS "
            "(or the retry_kafka connection) to brokers this machine can reach, and check that they run and "
            "advertise addresses their clients can use"
        ) from None


def consumer_config(settings: Settings) -> dict[str, Any]:
    return {
        # Embedded and small deployments: a 6 s session keeps group joins quick.
        "session.timeout.ms": 6000,
        "topic.metadata.refresh.interval.ms": 5000,
        # Fetch only a little ahead: librdkafka queues up to 64 MB of fetched records by default, and
        # a record of a quiet retry topic arriving behind that much of another topic's backlog (a burst)
        # waited for all of it to be ingested first (10 s in the burst benchmark). About a megabyte
        # queued and a quarter of one per partition per fetch (grown by librdkafka for a larger
        # record) keep that wait a fraction of a second; a full queue is checked again after 20 ms,
        # not librdkafka's 1 s, so the workers never wait for records (ingest as fast as before).
        "queued.max.messages.kbytes": 1024,
        "max.partition.fetch.bytes": 262_144,
        "fetch.queue.backoff.ms": 20,
        **settings.kafka,
        "group.id": settings.consumer_group,
        # Offsets are committed by hand, only after the rows are committed in PostgreSQL.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
    }


def producer_config(settings: Settings) -> dict[str, Any]:
    return {
        "linger.ms": 2,
        # Destination and DLQ topics are read by other teams' consumers, and not every client reads
        # every codec (kafkajs has no built-in LZ4): no compression unless the settings ask for one.
        "compression.type": "none",
        # A record without a partition goes where a Java producer puts its key (murmur2), not where
        # librdkafka's default (CRC32) would: a key's retries land on the partition of its first delivery.
        "partitioner": "murmur2_random",
        # librdkafka itself refuses records over 1 000 000 bytes, less than RETRY_MAX_RECORD_BYTES, and an
        # oversize record still goes to the DLQ: the broker, which accepted it once, judges what fits.
        "message.max.bytes": min(1_000_000_000, max(64 * 1024 * 1024, 2 * settings.max_record_bytes)),
        **settings.kafka,
        "enable.idempotence": True,
        "acks": "all",
        "delivery.timeout.ms": settings.delivery_timeout_ms,
    }


def make_consumer(settings: Settings) -> Consumer:
    return Consumer(_logged(consumer_config(settings)))


#: How often librdkafka reports a service producer's state; the first report after the broker gave it
#: a producer id makes it ready (see :class:`ServiceProducer`). Settings' ``statistics.interval.ms``
#: overrides it; 0 turns the reports, and the wait, off.
STATS_EVERY_MS = 1000


class _IdState:
    """Whether a producer has its producer id, from librdkafka's statistics (apart from the producer:
    a callback bound to the producer itself would keep it alive, connections and threads, after its
    last use)."""

    def __init__(self) -> None:
        self.assigned = threading.Event()
        self.at: float | None = None

    def set(self) -> None:
        self.at = time.time()
        self.assigned.set()

    def on_stats(self, raw: str) -> None:
        if self.assigned.is_set():
            return
        try:
            state = json.loads(raw).get("eos", {}).get("idemp_state")
        except ValueError:
            return
        if state == "Assigned":
            self.set()


class ServiceProducer(Producer):
    """The service's idempotent producer, which knows when it can publish without delay.

    An idempotent producer sends nothing until the broker has given it a producer id, and librdkafka
    asks for one only about 0.5 s after it starts: records produced before then wait, which for a
    publisher holding a round's claimed jobs means lateness. A publisher taking over from another
    waits (:meth:`wait_ready`) before it claims anything, while the other goes on publishing.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._id = _IdState()
        config = {"statistics.interval.ms": STATS_EVERY_MS, **config, "stats_cb": self._id.on_stats}
        if not int(config["statistics.interval.ms"]):
            self._id.set()  # no reports to wait for
        super().__init__(config)

    @property
    def id_assigned(self) -> threading.Event:
        """Set once the producer has its producer id."""
        return self._id.assigned

    @property
    def ready_at(self) -> float | None:
        """When (``time.time()``) the producer was known to have its id; None until then."""
        return self._id.at

    def wait_ready(self, timeout_s: float) -> bool:
        """Serve the producer's events until it has its producer id, for at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._id.assigned.is_set() and time.monotonic() < deadline:
            self.poll(min(0.05, max(0.0, deadline - time.monotonic())))
        return self._id.assigned.is_set()


def make_producer(settings: Settings) -> ServiceProducer:
    return ServiceProducer(_logged(producer_config(settings)))


def wait_until_ready(producers: Iterable[Producer], timeout_s: float) -> bool:
    """Wait for every :class:`ServiceProducer` among ``producers`` to be ready (others are taken as
    ready), for ``timeout_s`` in all; False, with a warning, when one is still waiting then."""
    deadline = time.monotonic() + timeout_s
    waiting = [p for p in producers if isinstance(p, ServiceProducer)]
    ready = all(p.wait_ready(max(0.0, deadline - time.monotonic())) for p in waiting)
    if not ready:
        log.warning(
            "the producer has no producer id from the broker after %.0f s: publishing anyway "
            "(its first records wait until the broker answers)", timeout_s,
        )  # fmt: skip
    return ready


def admin_client_config(settings: Settings) -> dict[str, Any]:
    return {k: v for k, v in settings.kafka.items() if not k.startswith("session.")}


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(_logged(admin_client_config(settings)))


def topics_at_risk(settings: Settings, topics: Iterable[str], timeout_s: float = 5.0) -> dict[str, str]:
    """Of ``topics`` (those that exist), each whose replication loses records with one broker on
    this cluster, with why (:func:`~retry_scheduler.replication.under_replicated`); ``{"": why}``
    when the cluster cannot be asked."""
    try:
        meta = admin_client(settings).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        return {"": f"Kafka at {settings.bootstrap_servers} did not answer: {exc}"}
    risks = {}
    for topic in dict.fromkeys(topics):
        if topic in meta.topics and meta.topics[topic].partitions:
            replicas = min(len(pm.replicas) for pm in meta.topics[topic].partitions.values())
            if (why := under_replicated(len(meta.brokers), replicas)) is not None:
                risks[topic] = why
    return risks


def retry_topic_config(settings: Settings) -> dict[str, str]:
    """The configuration of the retry topics the service creates: their retention, stated."""
    return {
        "retention.ms": str(settings.retry_topic_retention_ms),
        "retention.bytes": str(settings.retry_topic_retention_bytes),
    }


class TopicManager:
    """Knows which topics exist and creates missing ones where configuration allows."""

    def __init__(self, settings: Settings, admin: AdminClient | None = None) -> None:
        self.settings = settings
        self.admin = admin or admin_client(settings)
        self.known: set[str] = set()
        #: The cluster's brokers, as last listed: a topic created gets as many replicas, three at most.
        self.brokers = 1
        #: Partitions of each topic, as last listed.
        self.partition_counts: dict[str, int] = {}

    def refresh(self) -> None:
        meta = self.admin.list_topics(timeout=10)
        topics = meta.topics
        self.brokers = len(meta.brokers)
        self.known = set(topics)
        self.partition_counts = {name: len(meta.partitions) for name, meta in topics.items()}

    def _partitions_for(self, topic: str, default: int) -> int:
        """A group's redelivery topic gets as many partitions as its topic, so that a key's retry comes
        back on the partition numbered as its own (read by the member that reads the key: ordered mode);
        any other topic ``default``."""
        for base in protocol.redelivery_bases(topic):
            if self.partition_counts.get(base):
                return self.partition_counts[base]
        return default

    def ensure(
        self,
        topics: Iterable[str],
        *,
        create: bool,
        partitions: int = 3,
        config: dict[str, str] | None = None,
    ) -> list[str]:
        """Return the topics still missing after creating what ``create`` allows, with ``config``
        added to the topic configuration the settings give (``min.insync.replicas``)."""
        wanted = set(topics) - self.known
        if not wanted:
            return []
        self.refresh()
        missing = sorted(wanted - self.known)
        if not missing or not create:
            return missing
        s = self.settings
        new = {
            t: resolved(
                NewTopic(
                    t, self._partitions_for(t, partitions), s.topic_replication_factor, config=config or {}
                ),
                self.brokers,
                s.topic_min_insync_replicas,
            )
            for t in missing
        }
        futures = self.admin.create_topics(list(new.values()))
        for topic, future in futures.items():
            try:
                future.result(timeout=15)
                made = new[topic]
                log.info(
                    "created topic %s (%s partitions, replication factor %s, min.insync.replicas %s)",
                    topic, made.num_partitions,
                    "the broker's default" if made.replication_factor < 0 else made.replication_factor,
                    made.config.get("min.insync.replicas", "the broker's default"),
                )  # fmt: skip
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    log.warning("could not create topic %s: %s", topic, exc)
                    continue
            self.known.add(topic)
        wait_until_listed(self.admin, sorted(set(missing) & self.known))  # before anyone subscribes
        return sorted(set(missing) - self.known)


#: Partitions of a retry topic the ingest loop creates: a multiple of 1, 2, 3 and 6 worker processes.
RETRY_TOPIC_PARTITIONS = 6


def few_partitions(partitions: int, workers: int, topics: Sequence[str]) -> str:
    """What to do when the retry topics have fewer partitions than ingest worker processes: a
    partition is read by one process, so the others have nothing to do (a topic the broker created
    on a first record sent to it has the broker's ``num.partitions``, 1 by default)."""
    return (
        f"the retry topics ({', '.join(topics)}) have {partitions} partition(s) in all: only {partitions or 1} "
        f"of RETRY_INGEST_WORKERS={workers} ingest processes can ingest. Add partitions (kafka-topics.sh "
        f"--alter --topic TOPIC --partitions {RETRY_TOPIC_PARTITIONS}; it moves keys to other partitions, so "
        "in ordered mode do it while no key is held), or set RETRY_INGEST_WORKERS to match."
    )


def ensure_retry_topics(settings: Settings, partitions: int = RETRY_TOPIC_PARTITIONS) -> None:
    """Create the topics the ingest loop reads when missing, whatever the destination setting: the
    service's own (the retry and delay topics) with ``partitions`` and the stated retention
    (:func:`retry_topic_config`), an adopted topic (another tool's) with the broker's defaults."""
    topics = TopicManager(settings)
    own = [t for t in settings.retry_topics if t not in settings.adopt_topics]
    topics.ensure(own, create=True, partitions=partitions, config=retry_topic_config(settings))
    topics.ensure(settings.adopt_topics, create=True, partitions=partitions)
