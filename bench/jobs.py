"""Jobs built by hand, for the benchmarks and the tests: a failed record and what to do with it, stored
as the ingest loop stores its rows. Not part of the service (the ingest builds ``CopyRow``s from
records, :mod:`retry_scheduler.core.records`); kept out of the installed package."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import CopyRow, Status, decode_headers, encode_headers, ms_of_pg_time, pg_time
from retry_scheduler.db.store import Store


@dataclass(frozen=True)
class Job:
    """A failed record and what to do with it. Times are epoch milliseconds."""

    source_topic: str
    source_partition: int
    source_offset: int
    #: The record's timestamp (ms); with topic, partition and offset it identifies the source record.
    source_timestamp_ms: int
    destination: str | None
    destination_partition: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    attempt: int
    policy: str
    reason: str | None
    error_class: str | None
    consumer_group: str | None
    retry_id: str
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int
    due_ms: int
    status: Status
    dead_reason: str | None
    dlq_topic: str
    id: int | None = None
    held_by: str | None = None

    def copy_row(self) -> CopyRow:
        """The job as the ingest loop COPYs it into ``retry_jobs`` (``COPY_COLUMNS``, ``COPY_TYPES``)."""
        return CopyRow(
            self.source_topic, self.source_partition, self.source_offset, self.source_timestamp_ms,
            self.destination, self.destination_partition, self.key, self.value, encode_headers(self.headers),
            self.attempt, self.policy, self.reason, self.error_class, self.consumer_group, self.retry_id,
            self.original_topic, self.original_partition, self.original_offset,
            pg_time(self.original_timestamp_ms), pg_time(self.due_ms), self.status.value, self.dead_reason,
            self.dlq_topic, pg_time(self.due_ms) if self.status is Status.DEAD else None, self.held_by,
        )  # fmt: skip

    @classmethod
    def from_copy_row(cls, row: CopyRow) -> Job:
        """Inverse of :meth:`copy_row`."""
        return cls(
            source_topic=row.source_topic, source_partition=row.source_partition,
            source_offset=row.source_offset, source_timestamp_ms=row.source_timestamp_ms,
            destination=row.destination, destination_partition=row.destination_partition, key=row.msg_key,
            value=row.msg_value, headers=tuple(decode_headers(row.headers)), attempt=row.attempt,
            policy=row.policy, reason=row.reason, error_class=row.error_class, consumer_group=row.consumer_group,
            retry_id=row.retry_id, original_topic=row.original_topic, original_partition=row.original_partition,
            original_offset=row.original_offset, original_timestamp_ms=ms_of_pg_time(row.first_seen_at),
            due_ms=ms_of_pg_time(row.due_at), status=Status(row.status), dead_reason=row.dead_reason,
            dlq_topic=row.dlq_topic, held_by=row.held_by,
        )  # fmt: skip


def insert_jobs(store: Store, jobs: Sequence[Job]) -> list[str | None]:
    """Store ``jobs`` as the ingest loop stores its rows (:meth:`Queue.insert_rows`); the dead reason
    of each row stored (None: pending)."""
    return store.queue.insert_rows([job.copy_row() for job in jobs])
