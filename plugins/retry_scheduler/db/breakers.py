"""Destinations' breakers in the job store (``BREAKERS``, :mod:`retry_scheduler.core.breakers`):
:class:`BreakerRecords` is a mixin of :class:`retry_scheduler.db.store.Store`; its SQL is
``sql/breakers.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg

from retry_scheduler.core.breakers import BreakerRow
from retry_scheduler.db.connection import joined, require_transaction
from retry_scheduler.db.schema import q

#: The due time of a job a breaker paused (9999-12-30 UTC): never claimed until the breaker lets it go.
#: A day before ordered mode's waiting records' (9999-12-31): those queries do not take it for one of theirs.
BREAKER_DUE_AT = datetime(9999, 12, 30, tzinfo=UTC)


class BreakerStatus(NamedTuple):
    """A destination's breaker as ``status``, the metrics, ``retry_monitor`` and the page show it."""

    destination: str
    state: str
    since: datetime | None
    reason: str | None
    #: Who opened it by hand (None: the breaker opened by itself).
    by: str | None
    trips: int
    #: Jobs its breaker paused (pending, attempts unspent), and how long the oldest has waited.
    paused: int
    oldest_paused_s: float | None
    probe_retry_id: str | None
    probe_at: datetime | None
    sent: int
    failed: int
    came_back: int

    def as_dict(self) -> dict[str, Any]:
        d = self._asdict()
        for key in ("since", "probe_at"):
            d[key] = None if d[key] is None else d[key].isoformat()
        if d["oldest_paused_s"] is not None:
            d["oldest_paused_s"] = round(d["oldest_paused_s"], 3)
        return d


def breaker_statuses(conn: psycopg.Connection[Any], destinations: Sequence[str] = ()) -> list[BreakerStatus]:
    """Every breaker not closed or with jobs still paused, and those of ``destinations``."""
    with joined(conn):
        rows = conn.execute(q("breaker_list"), {"destinations": list(destinations)}).fetchall()
    return [
        BreakerStatus(
            str(r[0]),
            str(r[1]),
            r[2],
            r[3],
            r[4],
            int(r[5]),
            int(r[6]),
            None if r[7] is None else float(r[7]),
            r[8],
            r[9],
            int(r[10]),
            int(r[11]),
            int(r[12]),
        )
        for r in rows
    ]


def count_came_back(cur: psycopg.Cursor[Any], came_back: Sequence[tuple[str, str]]) -> None:
    """Add the records come back (``(destination, retry id)``), in the ingest's transaction."""
    if came_back:
        cur.execute(
            q("breaker_count_back"),
            {"destinations": [c[0] for c in came_back], "retry_ids": [c[1] for c in came_back]},
        )


class BreakerRecords:
    """The breakers' rows and the jobs they paused, through the store's connection ``conn``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def states(self, destinations: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """Of ``destinations``, those whose breaker is not closed: its state and probe job."""
        if not destinations:
            return {}
        with joined(self.conn):
            rows = self.conn.execute(q("breaker_states"), {"destinations": list(destinations)}).fetchall()
        return {str(d): (str(state), probe) for d, state, probe in rows}

    def pause_jobs(self, ids: Sequence[int]) -> int:
        """Pause claimed jobs (in the round's transaction, whose claim locked them)."""
        if not ids:
            return 0
        with joined(self.conn):
            return self.conn.execute(
                q("breaker_pause"), {"ids": list(ids), "breaker_due": BREAKER_DUE_AT}
            ).rowcount

    def let_go(self, destination: str, limit: int) -> list[tuple[int, str]]:
        """Let up to ``limit`` of ``destination``'s paused jobs go, the oldest due first: their ids and
        retry ids."""
        with joined(self.conn):
            rows = self.conn.execute(
                q("breaker_let_go"),
                {"destination": destination, "limit": limit, "breaker_due": BREAKER_DUE_AT},
            ).fetchall()
        return [(int(i), str(r)) for i, r in rows]

    def paused_destinations(self) -> list[str]:
        """The destinations some of whose jobs a breaker paused."""
        with joined(self.conn):
            return [str(r[0]) for r in self.conn.execute(q("breaker_paused_destinations")).fetchall()]

    def lock(self, destinations: Sequence[str]) -> list[tuple[BreakerRow, bool]]:
        """The breaker rows of ``destinations``, locked until the caller's transaction ends, each with
        whether it paused jobs."""
        require_transaction(self.conn, "lock_breakers")
        rows = self.conn.execute(q("breaker_lock"), {"destinations": sorted(destinations)}).fetchall()
        return [
            (
                BreakerRow(
                    destination=r[0],
                    state=r[1],
                    since=r[2],
                    reason=r[3],
                    by=r[4],
                    trips=r[5],
                    window_at=r[6],
                    sent=r[7],
                    failed=r[8],
                    came_back=r[9],
                    prev_sent=r[10],
                    prev_failed=r[11],
                    prev_came_back=r[12],
                    probe_job=r[13],
                    probe_retry_id=r[14],
                    probe_at=r[15],
                    probe_came_back=r[16],
                    probe_published_at=r[17],
                    probe_error=r[18],
                ),
                bool(r[19]),
            )
            for r in rows
        ]

    def save(self, row: BreakerRow) -> None:
        values = asdict(row)
        values.pop("probe_published_at")
        values.pop("probe_error")
        with joined(self.conn):
            self.conn.execute(q("breaker_save"), values)

    def count_sent(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Add a round's records sent and deliveries failed (``destination -> (sent, failed)``)."""
        if not counts:
            return
        names = sorted(counts)
        with joined(self.conn):
            self.conn.execute(
                q("breaker_count_sent"),
                {
                    "destinations": names,
                    "sent": [counts[n][0] for n in names],
                    "failed": [counts[n][1] for n in names],
                },
            )

    def statuses(self, destinations: Sequence[str] = ()) -> list[BreakerStatus]:
        """Every breaker not closed or with jobs still paused, and those of ``destinations``."""
        return breaker_statuses(self.conn, destinations)

    def set_states(self, destinations: Sequence[str], state: str, reason: str, by: str) -> list[str]:
        """Open (``by`` an operator: it stays open until closed by hand) or close breakers by hand
        (``breakers open|close``); the destinations set."""
        with self.conn.transaction():
            self.conn.execute(q("register_destinations"), {"destinations": sorted(destinations)})
            rows = self.conn.execute(
                q("breaker_set"),
                {"destinations": sorted(destinations), "state": state, "reason": reason, "by": by},
            ).fetchall()
        return [str(r[0]) for r in rows]
