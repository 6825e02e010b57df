"""What the ingest moves around: a batch of records turned into rows (:class:`Batch`), and what a run
of the ingest did (:class:`IngestCounts`, returned to Airflow and reported by worker processes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from retry_scheduler.core.jobs import CopyRow


@dataclass
class IngestCounts:
    """What one ingest run did; logged and returned to Airflow as XCom."""

    consumed: int = 0
    stored: int = 0
    duplicates: int = 0
    pending: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    #: Records whose timestamp was outside the trusted window: their ingest time counted instead.
    untrusted_timestamps: int = 0
    #: The batch that took longest to store: its seconds and records.
    slowest_batch_s: float = 0.0
    slowest_batch_records: int = 0
    #: Letters read from other tools' dead-letter topics, by format (``core/adopt.py``).
    adopted: Counter[str] = field(default_factory=Counter)
    #: Pointer-only letters whose source record could not be read (``loops/sources.py``).
    letters_unreadable: int = 0

    def add(self, other: IngestCounts) -> None:
        self.consumed += other.consumed
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.pending += other.pending
        self.dead.update(other.dead)
        self.batches += other.batches
        self.untrusted_timestamps += other.untrusted_timestamps
        self.adopted.update(other.adopted)
        self.letters_unreadable += other.letters_unreadable
        if other.slowest_batch_s > self.slowest_batch_s:
            self.slowest_batch_s, self.slowest_batch_records = (
                other.slowest_batch_s,
                other.slowest_batch_records,
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IngestCounts:
        """Inverse of :meth:`as_dict` (counts come back from worker processes as dicts)."""
        return cls(**{**d, "dead": Counter(d["dead"]), "adopted": Counter(d.get("adopted", {}))})

    def as_dict(self) -> dict[str, Any]:
        counts = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**counts, "dead": dict(self.dead), "adopted": dict(self.adopted),
                "slowest_batch_s": round(self.slowest_batch_s, 3)}  # fmt: skip


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
    #: place with the record's headers as they came (:meth:`Ingestor.refused_row`).
    messages: Sequence[Any] = ()
    #: Ordered mode: notice rows among ``rows`` (:func:`~retry_scheduler.core.records.notice_of`).
    notices: int = 0
    #: How far each partition was read, when rows read wait (:mod:`retry_scheduler.loops.read_ahead`).
    read_to: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Some rows may be stored already (read again below the ``read_to`` a loop before stored).
    maybe_stored: bool = False
