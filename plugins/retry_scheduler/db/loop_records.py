"""The loops' records in the job store: the ingest lock, heartbeats, and the state one loop hands to
the loop that relieves it (``retry_loops``). :class:`LoopRecords` is a mixin of
:class:`retry_scheduler.db.store.Store` (one connection); :class:`IngestLock` holds a connection of
its own. Their SQL is the named queries of ``sql/queries.sql``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import psycopg

from retry_scheduler.db.connection import connect
from retry_scheduler.db.schema import q


class IngestLock:
    """A session-level advisory lock making one ingest loop at a time own the retry topics.

    Held on its own connection: if the process dies, PostgreSQL ends the session and frees it.
    """

    _NAMESPACE = 7311

    def __init__(self, database_url: str, name: str, poll_s: float = 0.05) -> None:
        self.conn = connect(database_url, autocommit=True)
        self.name = name
        self.poll_s = poll_s

    def acquire(self, timeout_s: float, on_wait: Callable[[], None] = lambda: None) -> bool:
        """Try for ``timeout_s``; ``on_wait`` runs between tries (the waiting loop heartbeats)."""
        deadline = time.monotonic() + timeout_s
        while True:
            row = self.conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (self._NAMESPACE, self.name)
            ).fetchone()
            if row and row[0]:
                return True
            if time.monotonic() >= deadline:
                return False
            on_wait()
            time.sleep(self.poll_s)

    def release(self) -> None:
        self.conn.close()  # ends the session, which frees the lock


class LoopRecords:
    """A loop's heartbeat and handover state, written and read through the store's connection ``conn``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def heartbeat(self, worker: str, kind: str) -> datetime:
        """Record that loop ``worker`` is alive; returns when it started."""
        with self.conn.transaction():
            row = self.conn.execute(q("loop_heartbeat"), {"worker": worker, "kind": kind}).fetchone()
        assert row is not None
        return cast(datetime, row[0])

    def claim_state(self, worker: str, floor: datetime, sweep_in_s: float) -> None:
        """Record publish loop ``worker``'s claim floor and the seconds until its next sweep, for the
        loop that relieves it (:meth:`loop_claim_state_alive`)."""
        with self.conn.transaction():
            self.conn.execute(
                q("loop_claim_state"), {"worker": worker, "floor": floor, "sweep_in_s": sweep_in_s}
            )

    def claim_state_alive(self, alive_s: float) -> tuple[datetime, float] | None:
        """The lowest claim floor of the publish loops alive (a heartbeat within ``alive_s``) and the
        seconds until the soonest of their sweeps (negative: overdue); None when none recorded one."""
        with self.conn.transaction():
            row = self.conn.execute(q("loop_claim_state_alive"), {"alive_s": alive_s}).fetchone()
        if row is None or row[0] is None:
            return None
        return cast(datetime, row[0]), float(row[1])

    def relieved(self, worker: str, kind: str, started_at: datetime, alive_s: float) -> bool:
        """Whether a loop of ``kind`` started after ``started_at`` is alive."""
        params = {"worker": worker, "kind": kind, "started_at": started_at, "alive_s": alive_s}
        with self.conn.transaction():
            row = self.conn.execute(q("loop_relieved"), params).fetchone()
        return bool(row and row[0])

    def finish(self, worker: str) -> None:
        with self.conn.transaction():
            self.conn.execute(q("loop_finish"), {"worker": worker})
