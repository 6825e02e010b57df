"""Destinations' publishing slots in the job store: the rate limits' shared state (``RATE_LIMITS``,
:mod:`retry_scheduler.loops.rate_limits`). :class:`DestinationSlots` is a mixin of
:class:`retry_scheduler.db.store.Store`; its SQL is ``pace_destinations`` and ``defer_jobs`` in
``sql/queries.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from retry_scheduler.db.connection import StoreError
from retry_scheduler.db.schema import q


class DestinationSlots:
    """The slots of rate-limited destinations, through the store's connection ``conn``, inside the
    publish round's transaction (its claim's locks)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def _in_round(self, what: str) -> None:
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            raise StoreError(f"{what} must be called inside the round's transaction")

    def pace_destinations(
        self, claimed: Mapping[str, tuple[int, float]], burst_s: float
    ) -> dict[str, tuple[int, datetime]]:
        """For each destination of ``claimed`` (the count of its jobs the round claimed, and its rate
        in records/s): how many it may publish now, and from when the rest are due (one slot each,
        1 / rate apart). The destinations' rows stay locked until the round's transaction ends."""
        self._in_round("pace_destinations")
        names = sorted(claimed)
        self.conn.execute(q("register_destinations"), {"destinations": names})
        rows = self.conn.execute(
            q("pace_destinations"),
            {
                "destinations": names,
                "counts": [claimed[n][0] for n in names],
                "rates": [claimed[n][1] for n in names],
                "burst_s": burst_s,
            },
        ).fetchall()
        return {name: (int(n), start) for name, n, start in rows}

    def defer_jobs(self, deferred: Sequence[tuple[int, datetime]]) -> int:
        """Make claimed jobs due later (``(id, due time)``; never earlier than they were), in the
        round's transaction whose claim locked them."""
        self._in_round("defer_jobs")
        if not deferred:
            return 0
        return self.conn.execute(
            q("defer_jobs"), {"ids": [d[0] for d in deferred], "due": [d[1] for d in deferred]}
        ).rowcount
