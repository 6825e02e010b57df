"""The job store: one connection to the retry database, and its parts, each the statements of the
code that uses them (as procrastinate builds its parts in one ``App``):

- :attr:`Store.queue`: the ingest and the publish loop (:mod:`retry_scheduler.db.queue`);
- :attr:`Store.readings`: ``status``, the metrics and ``retry_monitor`` (:mod:`retry_scheduler.db.readings`);
- :attr:`Store.breakers`: the destinations' breakers (:mod:`retry_scheduler.db.breakers`);
- :attr:`Store.slots`: the rate-limited destinations' slots (:mod:`retry_scheduler.db.slots`);
- :attr:`Store.loops`: the loops' heartbeats and handover (:mod:`retry_scheduler.db.loop_records`).

A user takes the part it needs, typed as that part (a gate takes ``BreakerRecords``, the monitor
``Readings``). The dead-letter operations have a port of their own on a connection of their own
(:mod:`retry_scheduler.db.dead_letters`), and so do held chains (:mod:`retry_scheduler.db.chains`).
"""

from __future__ import annotations

from retry_scheduler.db.breakers import BreakerRecords
from retry_scheduler.db.connection import connect, require_migrated
from retry_scheduler.db.loop_records import LoopRecords
from retry_scheduler.db.queue import Queue, RowsRefused, refusal_reason
from retry_scheduler.db.readings import Readings
from retry_scheduler.db.slots import DestinationSlots

__all__ = ["RowsRefused", "Store", "refusal_reason"]


class Store:
    """One connection to the retry database (checked for the schema) and its parts."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.conn = connect(database_url)
        require_migrated(self.conn, database_url)
        self.queue = Queue(self.conn)
        self.readings = Readings(self.conn)
        self.breakers = BreakerRecords(self.conn)
        self.slots = DestinationSlots(self.conn)
        self.loops = LoopRecords(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
