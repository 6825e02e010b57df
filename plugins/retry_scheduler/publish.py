"""Publish: claim due jobs, produce them to their destination (dead ones to the DLQ), mark them.

A job is marked published only after the broker acknowledged it. A crash between produce and
mark leaves the job leased; when the lease runs out it is claimed and produced again, with the
same ``retry.id`` and ``retry.attempt`` (at-least-once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from retry_scheduler.config import Settings
from retry_scheduler.handover import LoopTenure, new_worker_id
from retry_scheduler.jobs import OutgoingRow, destination_headers, dlq_headers
from retry_scheduler.kafka import TopicManager, make_producer
from retry_scheduler.store import Store

log = logging.getLogger(__name__)


@dataclass
class PublishCounts:
    """What one publish run did; logged and returned to Airflow as XCom."""

    claimed: int = 0
    published: int = 0
    dead_published: int = 0
    failed: int = 0
    lateness_max_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, other: PublishCounts) -> None:
        self.claimed += other.claimed
        self.published += other.published
        self.dead_published += other.dead_published
        self.failed += other.failed
        self.lateness_max_s = max(self.lateness_max_s, other.lateness_max_s)
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v

    def as_dict(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "published": self.published,
            "dead_published": self.dead_published,
            "failed": self.failed,
            "errors": dict(self.errors),
        }


class Publisher:
    """Publishes due jobs and dead jobs; many publishers may run at once (SKIP LOCKED)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        producer: Producer | None = None,
        topics: TopicManager | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.producer = producer or make_producer(settings)
        self.topics = topics or TopicManager(settings)
        self.clock = clock
        self.worker = new_worker_id("publish")

    def close(self) -> None:
        self.producer.flush(self.settings.delivery_timeout_ms / 1000)

    def _produce_all(
        self, rows: list[OutgoingRow], to_dlq: bool
    ) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        acked: list[tuple[int, int]] = []
        failed: list[tuple[int, str]] = []

        def delivered(job_id: int) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, _msg: Message) -> None:
                if err is None:
                    acked.append((job_id, int(self.clock() * 1000)))
                else:
                    failed.append((job_id, f"delivery failed: {err.str()}"))

            return callback

        targets = {row.dlq_topic if to_dlq else row.destination for row in rows}
        missing = set(self.topics.ensure((t for t in targets if t), create=self.settings.create_topics))
        for row in rows:
            topic = row.dlq_topic if to_dlq else row.destination
            if not topic:
                failed.append((row.id, "job has no destination"))
                continue
            if topic in missing:
                failed.append(
                    (row.id, f"topic {topic} does not exist: create it, or set RETRY_CREATE_TOPICS=true")
                )
                continue
            kwargs: dict[str, Any] = {
                "key": row.key,
                "value": row.value,
                "headers": dlq_headers(row) if to_dlq else destination_headers(row),
                "on_delivery": delivered(row.id),
            }
            if not to_dlq and row.destination_partition is not None:
                kwargs["partition"] = row.destination_partition
            while True:
                try:
                    self.producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    self.producer.poll(0.05)  # local queue full: let deliveries drain
                except KafkaException as exc:
                    failed.append((row.id, f"produce failed: {exc}"))
                    break
            self.producer.poll(0)
        remaining = self.producer.flush(self.settings.delivery_timeout_ms / 1000 + 5)
        if remaining:
            log.warning("%s messages still unacknowledged after flush; their jobs stay leased", remaining)
        return acked, failed

    def publish_once(self) -> PublishCounts:
        """One round: claim up to a batch of dead and of due jobs, produce, wait for acks, mark."""
        counts = PublishCounts()
        s = self.settings
        dead_rows = self.store.claim_dead(s.publish_batch, s.lease_ms, self.worker)
        due_rows = self.store.claim_due(s.publish_batch, s.lease_ms, self.worker)
        counts.claimed = len(dead_rows) + len(due_rows)
        if not counts.claimed:
            return counts
        failed: list[tuple[int, str]] = []
        if dead_rows:
            acked_dead, failed_dead = self._produce_all(dead_rows, to_dlq=True)
            counts.dead_published = self.store.mark_dlq_published(acked_dead)
            failed += failed_dead
        if due_rows:
            acked, failed_due = self._produce_all(due_rows, to_dlq=False)
            counts.published = self.store.mark_published(acked)
            failed += failed_due
        if failed:
            counts.failed = self.store.mark_failed(failed)
            for _, error in failed:
                counts.errors[error] = counts.errors.get(error, 0) + 1
            log.warning("%s deliveries failed, will retry after backoff: %s", len(failed), counts.errors)
        return counts

    def run(
        self, duration_s: float, should_stop: Callable[[], bool] = lambda: False, grace_s: float | None = None
    ) -> PublishCounts:
        """Publish for ``duration_s`` (then until a newer loop takes over, within the grace),
        waking up as jobs fall due."""
        total = PublishCounts()
        grace = self.settings.loop_grace_ms / 1000 if grace_s is None else grace_s
        tenure = LoopTenure(self.store, "publish", duration_s, grace)
        poll_s = self.settings.poll_interval_ms / 1000
        try:
            while tenure.go_on() and not should_stop():
                batch = self.publish_once()
                if batch.claimed:
                    log.info(
                        "claimed %s jobs: %s published, %s to DLQ, %s failed",
                        batch.claimed, batch.published, batch.dead_published, batch.failed,
                    )  # fmt: skip
                total.add(batch)
                if batch.claimed >= self.settings.publish_batch:
                    continue  # more may be waiting
                wait = self.store.seconds_until_next_due()
                nap = poll_s if wait is None else min(poll_s, max(0.0, wait))
                time.sleep(min(nap, tenure.remaining_s()))
        finally:
            tenure.finish()
        return total
