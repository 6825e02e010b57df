"""An ingest batch: the consumed records turned into rows, stored in one transaction with their
partitions' next offsets; a row PostgreSQL refuses is stored dead in its place, the record's bytes
kept (:meth:`Batch.store`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from retry_scheduler.core.headers import Header
from retry_scheduler.core.jobs import CopyRow
from retry_scheduler.core.records import Consumed, RowBuilder, new_retry_id
from retry_scheduler.db.queue import Queue, RowsRefused


@dataclass
class Batch:
    """Consumed records turned into rows, and the next offset of each partition they came from."""

    rows: list[CopyRow]
    offsets: dict[tuple[str, int], int]
    #: Rows whose record timestamp was not trusted (their ingest time counted instead).
    untrusted_timestamps: int = 0
    #: Ordered mode: what the batch's records say of their chains, in their order (released, blocked
    #: or dead; :attr:`~retry_scheduler.core.records.RowBuilder.chain_events`).
    chain_events: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: Release records read (they store no job).
    release_records: int = 0
    #: The consumed records (confluent-kafka messages): a row PostgreSQL refuses is stored dead in its
    #: place with the record's headers as they came (:meth:`refused_row`).
    messages: Sequence[Any] = ()
    #: Ordered mode: notice rows among ``rows`` (:func:`~retry_scheduler.core.records.notice_of`).
    notices: int = 0

    def store(
        self,
        queue: Queue,
        builder: RowBuilder,
        now_ms: int,
        *,
        consumer_group: str,
        adopted_topics: Collection[str],
        counted_back: Collection[str],
    ) -> list[str | None]:
        """Store the rows and the next offsets in one transaction (:meth:`Queue.insert_rows`); the dead
        reason of each row stored. When the server refuses rows, each is replaced by its dead row
        (:meth:`refused_row`) and the batch stored again; a dead row refused again is not the record's
        fault: raised, and the batch is read again from its offsets."""
        replaced: set[int] = set()
        while True:
            try:
                return queue.insert_rows(
                    self.rows,
                    consumer_group=consumer_group,
                    offsets=self.offsets,
                    adopted_topics=adopted_topics,
                    chain_events=self.chain_events,
                    counted_back=counted_back,
                )
            except RowsRefused as refused:
                if any(i in replaced for i, _ in refused.refusals):
                    raise
                for i, reason in refused.refusals:
                    self.rows[i] = self.refused_row(builder, self.rows[i], reason, now_ms)
                    replaced.add(i)

    def refused_row(self, builder: RowBuilder, row: CopyRow, reason: str, now_ms: int) -> CopyRow:
        """The dead (``invalid``) row stored in place of ``row``, which PostgreSQL refused: the record's
        key, value and headers as they came (from :attr:`messages`), the server's error as reason."""
        headers: Sequence[Header] = ()
        for msg in self.messages:
            if (msg.offset(), msg.partition(), msg.topic()) == (
                row.source_offset, row.source_partition, row.source_topic,
            ):  # fmt: skip
                try:
                    headers = msg.headers() or ()
                except Exception as exc:
                    reason = f"{reason}; its headers could not be read ({type(exc).__name__})"
                break
        record = Consumed(
            row.source_topic, row.source_partition, row.source_offset, row.source_timestamp_ms or None,
            row.msg_key, row.msg_value, headers,
        )  # fmt: skip
        dead = builder.invalid(record, now_ms, reason)
        # Its id is stored as text too: one the server's encoding may refuse is replaced.
        return dead if dead.retry_id.isascii() else dead._replace(retry_id=new_retry_id())
