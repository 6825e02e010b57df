"""Notices of jobs stored after their due time, from the batch that stores them to the publishers.

A publisher claims from its *floor* in the due index (:mod:`retry_scheduler.loops.claim_floors`), not
from the index's head: under a held snapshot the head is a long walk through entries PostgreSQL cannot
remove. A job stored with a due time below that floor (its ``retry.at`` already past, or an ingest
that fell behind) would wait for the next sweep, up to a minute while a snapshot is held. So the
transaction that stores such jobs notifies channel :data:`CHANNEL` with the earliest of their due
times (``pg_notify``: delivered only if that transaction commits, after the rows are visible), every
publisher listens on its own connection, and its next claim starts just below that due time: a
walk of the index from there, not from its head. A batch that was not overdue when stored but whose
transaction committed a second or more after its jobs fell due is told of just after it commits
(:func:`notify_committed_late`): its jobs were out of the claims' sight until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from retry_scheduler.core.jobs import CopyRow, Status, ms_of_pg_time
from retry_scheduler.db.schema import q

log = logging.getLogger(__name__)

#: The channel of the notices (PostgreSQL's LISTEN/NOTIFY); the payload is epoch milliseconds.
CHANNEL = "retry_overdue"
#: A job counts as stored overdue when it is stored this long after its due time or later (what a
#: publisher's floor trails its last claim by: anything later is above the floor anyway).
OVERDUE_AFTER_MS = 1000


def earliest_overdue_ms(rows: Sequence[CopyRow], now_ms: int) -> int | None:
    """The earliest due time (epoch ms) of the pending, unheld ``rows`` due before ``now_ms`` less
    :data:`OVERDUE_AFTER_MS`; None when there is none."""
    due = [ms_of_pg_time(r.due_at) for r in rows if r.status == Status.PENDING and r.held_by is None]
    earliest = min(due, default=None)
    return earliest if earliest is not None and earliest < now_ms - OVERDUE_AFTER_MS else None


def notify_overdue(cur: psycopg.Cursor[Any], rows: Sequence[CopyRow]) -> int | None:
    """In the transaction that stores ``rows``: tell the publishers of the overdue ones, if any; the
    earliest due time told (epoch ms), or None."""
    earliest = earliest_overdue_ms(rows, int(time.time() * 1000))
    if earliest is not None:
        _tell(cur, earliest)
    return earliest


def _tell(db: psycopg.Cursor[Any] | psycopg.Connection[Any], due_ms: int) -> None:
    """Notify :data:`CHANNEL` of ``due_ms`` (delivered when the transaction it runs in commits)."""
    db.execute(q("notify_overdue"), {"channel": CHANNEL, "due_ms": str(due_ms)})


def notify_committed_late(conn: psycopg.Connection[Any], rows: Sequence[CopyRow], began: float) -> int | None:
    """After the transaction that stored ``rows`` (begun at ``began``, epoch s) committed without a
    notice: tell the publishers if it committed :data:`OVERDUE_AFTER_MS` or more after the earliest of
    them fell due. Until it committed no claim could see them, and the claims' floors moved past
    them meanwhile: a batch whose commit waited (a lock, a slow disk, a busy server) would otherwise
    wait for the publishers' next sweep, up to a minute while a snapshot is held. The earliest due
    time told (epoch ms), or None."""
    now_ms = int(time.time() * 1000)
    earliest = earliest_overdue_ms(rows, now_ms)
    if earliest is None:
        return None
    with conn.transaction():
        _tell(conn, earliest)
    log.info(
        "%s jobs committed %.1f s after the earliest fell due (the batch took %.1f s to store): the "
        "publishers' claims start below them", len(rows), (now_ms - earliest) / 1000, now_ms / 1000 - began,
    )  # fmt: skip
    return earliest


class OverdueNotices:
    """A publisher's ear for :data:`CHANNEL` on its own connection (``conn``, not in autocommit: the
    ``LISTEN`` is committed here). PostgreSQL hands a notice over between the connection's
    transactions; psycopg calls :meth:`_heard` while the publisher's next statement runs."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._earliest_ms: int | None = None
        conn.add_notify_handler(self._heard)
        with conn.transaction():
            conn.execute(q("listen_overdue"))

    def _heard(self, notice: psycopg.Notify) -> None:
        if notice.channel != CHANNEL:
            return
        try:
            due_ms = int(notice.payload)
        except ValueError:  # nothing of ours: ignored
            log.warning("a notice on %s that is no due time: %r", CHANNEL, notice.payload[:100])
            return
        self._earliest_ms = due_ms if self._earliest_ms is None else min(self._earliest_ms, due_ms)

    def peek(self) -> int | None:
        """The earliest due time heard since the last :meth:`take`, left to the next one."""
        return self._earliest_ms

    def take(self) -> int | None:
        """The earliest due time (epoch ms) of the overdue jobs stored since the last call, or None."""
        earliest, self._earliest_ms = self._earliest_ms, None
        return earliest
