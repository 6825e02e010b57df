"""The ingest's read-ahead: records due later wait in memory while those due sooner are stored first.

A burst of a million records due in two minutes lands in the same partitions as steady records due
in five seconds. Stored in the order they were read, each steady record would wait behind every
burst record ahead of it for as long as PostgreSQL takes to store them. Instead an ingest worker
reads on: the rows of a batch due more than ``RETRY_INGEST_READ_AHEAD_MS`` after they are read wait
in its memory (up to ``RETRY_INGEST_READ_AHEAD_MB``), and the rest is stored at once. Rows that wait
are stored, in the order they were read:

- when their soonest due time comes within half that horizon;
- the oldest first, while more than the memory allowed waits;
- whenever the consumer has caught up (a batch read came back less than half full).

Nothing is lost and nothing is stored twice. A partition's next offset, stored with the rows and
committed to Kafka, stays its lowest record not stored yet; beside it PostgreSQL keeps the offset it
was read up to (``read_to``). A loop that resumes (after a handover, or kill -9) reads the records in
between again, and those go through the staging path, which skips the ones stored already
(:meth:`retry_scheduler.db.store.Store.insert_rows`). A loop that is asked to stop stores every row
waiting first (:meth:`ReadAhead.drain`), so that a handover reads nothing again; one killed leaves them
to the next.

A waiting row keeps no message object (they would double its memory): one PostgreSQL refuses is
stored dead with its pass-through headers only (:meth:`~retry_scheduler.loops.ingest.Ingestor.refused_row`).

Ordered mode is never reordered: a batch with chain events, notices or release records has every row
waiting stored before its own, in one transaction. Held rows and dead rows never wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import chain

from retry_scheduler.core.jobs import CopyRow, pg_time
from retry_scheduler.loops.ingest_types import Batch

#: What a waiting row costs in memory beyond its key, value and headers: measured on the benchmark's
#: records (359 bytes of key, value and headers), a worker's resident memory grew 3 960 bytes a row.
ROW_OVERHEAD_BYTES = 3600


@dataclass
class _Waiting:
    """Rows of one batch that wait, with what the rules ask of them."""

    rows: list[CopyRow]
    soonest_due: int
    size: int
    #: The lowest offset of each partition among the rows.
    lowest: dict[tuple[str, int], int]


class ReadAhead:
    """What one ingest pipeline lets wait, and what it stores each round (:meth:`arrange`)."""

    def __init__(
        self, horizon_ms: int, max_mb: int, batch_size: int, read_marks: Mapping[tuple[str, int], int]
    ) -> None:
        """``read_marks``: each partition's ``read_to`` stored by the loop before, above its next
        offset (:meth:`~retry_scheduler.db.store.Store.read_marks`)."""
        self.horizon_us = horizon_ms * 1000
        self.max_bytes = max_mb * 1024 * 1024
        self.batch_size = batch_size
        self.read_marks = dict(read_marks)
        self.waiting: list[_Waiting] = []
        self.waiting_bytes = 0
        #: The next offset to read of each partition, as far as this pipeline read.
        self.read_next: dict[tuple[str, int], int] = {}

    @property
    def waiting_rows(self) -> int:
        return sum(len(w.rows) for w in self.waiting)

    def arrange(self, batch: Batch | None, now_ms: int, *, caught_up: bool) -> Batch | None:
        """What to store this round: ``batch`` (just read; None if nothing was) less the rows that may
        wait, after the waiting rows whose turn came. Its offsets are each partition's lowest record
        not stored once it is, its ``read_to`` how far the partition was read. None: nothing to store."""
        now = pg_time(now_ms)
        parts: list[Batch] = []
        if batch is not None:
            self.read_next.update(batch.offsets)
            if self.horizon_us <= 0 or self.max_bytes <= 0:
                parts.append(batch)
            elif batch.chain_events or batch.notices or batch.release_records:
                parts.extend([*self._take(list(self.waiting)), batch])  # ordered mode: in order
            else:
                parts.append(self._let_wait(batch, now + self.horizon_us))
        taken = self._take(self._turns(now, caught_up))
        if not parts and not taken:
            return None
        return self._combine([*taken, *parts])

    def drain(self) -> Batch | None:
        """Every row waiting, to store before the loop stops (None: none waits)."""
        return self._combine(self._take(list(self.waiting))) if self.waiting else None

    def _let_wait(self, batch: Batch, later_than: int) -> Batch:
        now_rows: list[CopyRow] = []
        later: list[CopyRow] = []
        for row in batch.rows:
            if row.due_at > later_than and row.dead_reason is None and row.held_by is None:
                later.append(row)
            else:
                now_rows.append(row)
        if not later:
            return batch
        lowest: dict[tuple[str, int], int] = {}
        size = 0
        for row in later:
            key = (row.source_topic, row.source_partition)
            if key not in lowest or row.source_offset < lowest[key]:
                lowest[key] = row.source_offset
            size += (
                len(row.msg_value or b"") + len(row.msg_key or b"") + len(row.headers) + ROW_OVERHEAD_BYTES
            )
        self.waiting.append(_Waiting(later, min(r.due_at for r in later), size, lowest))
        self.waiting_bytes += size
        return replace(batch, rows=now_rows)

    def _turns(self, now: int, caught_up: bool) -> list[_Waiting]:
        """The waiting rows whose turn came: due within half the horizon, then the oldest past the
        memory allowed, then (caught up) the oldest up to a batch."""
        soon = now + self.horizon_us // 2
        turns = [w for w in self.waiting if w.soonest_due <= soon]
        chosen = {id(w) for w in turns}
        left = self.waiting_bytes - sum(w.size for w in turns)
        rows = sum(len(w.rows) for w in turns)
        for w in self.waiting:
            if id(w) in chosen:
                continue
            if left > self.max_bytes or (caught_up and rows < self.batch_size):
                turns.append(w)
                left -= w.size
                rows += len(w.rows)
        return turns

    def _take(self, turns: list[_Waiting]) -> list[Batch]:
        if not turns:
            return []
        ids = {id(w) for w in turns}
        self.waiting = [w for w in self.waiting if id(w) not in ids]
        self.waiting_bytes -= sum(w.size for w in turns)
        return [Batch(w.rows, {}) for w in turns]

    def _combine(self, parts: list[Batch]) -> Batch | None:
        rows = list(chain.from_iterable(p.rows for p in parts))
        events = list(chain.from_iterable(p.chain_events for p in parts))
        if not rows and not events:
            return None
        touched = {(r.source_topic, r.source_partition) for r in rows} | {k for p in parts for k in p.offsets}
        offsets, read_to = {}, {}
        for key in touched:
            if key not in self.read_next:
                continue
            waiting = [w.lowest[key] for w in self.waiting if key in w.lowest]
            offsets[key] = min(waiting, default=self.read_next[key])
            # a loop before read further: its mark stays until this one has read past it (a loop
            # stopped before would leave the next one no mark there, and it would store twice)
            read_to[key] = max(self.read_next[key], self.read_marks.get(key, 0))
        again = bool(self.read_marks) and any(
            r.source_offset < self.read_marks.get((r.source_topic, r.source_partition), -1) for r in rows
        )
        messages = (
            parts[0].messages if len(parts) == 1 else list(chain.from_iterable(p.messages for p in parts))
        )
        return Batch(
            rows,
            offsets,
            untrusted_timestamps=sum(p.untrusted_timestamps for p in parts),
            chain_events=events,
            release_records=sum(p.release_records for p in parts),
            messages=messages,
            notices=sum(p.notices for p in parts),
            read_to=read_to,
            maybe_stored=again,
        )
