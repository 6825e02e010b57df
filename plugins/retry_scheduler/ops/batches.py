"""A dead-letter operation's batches: replay or purge what a statement selects, a batch per
transaction, each counted on the audit row in its own transaction (its count exact after a crash);
and a watched wave's verdict, counted (:func:`retry_scheduler.ops.dlq.run_action` calls them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from retry_scheduler.core import faults
from retry_scheduler.db.schema import queries
from retry_scheduler.ops.outcome import Outcome
from retry_scheduler.ops.watch import WaveVerdict

if TYPE_CHECKING:
    from retry_scheduler.ops.dlq import Operation


@dataclass
class Pace:
    """A paced replay's clock, kept across its batches and waves."""

    start: datetime | None
    sent: dict[str, int]


def apply_batches(
    conn: psycopg.Connection[Any],
    operation: Operation,
    outcome: Outcome,
    batch_query: sql.Composed,
    params: dict[str, Any],
    pace: Pace,
    batch_size: int,
    progress: Callable[[int, int], None],
    *,
    keep: bool,
) -> tuple[list[int], list[str]]:
    """Replay or purge what ``batch_query`` selects, a batch per transaction, each audited in its
    transaction. ``keep`` (a watched wave, at most a batch of ids): returns the ids changed and their
    retry ids; otherwise none are kept (an unwatched replay or purge may change millions)."""
    changed: list[int] = []
    retry_ids: list[str] = []
    after_id = 0
    while True:
        with conn.transaction():
            rows = conn.execute(
                batch_query,
                {
                    **params,
                    "after_id": after_id,
                    "batch": batch_size,
                    "reset_attempts": operation.reset_attempts,
                    "start": pace.start,
                    "sent": Jsonb(pace.sent),
                },
            ).fetchall()
            done = [r[0] for r in rows]
            for row in rows:
                if len(row) > 1:  # a replay: its destination's count, for the next batch's pace
                    pace.sent[row[1]] = pace.sent.get(row[1], 0) + 1
                    pace.start = pace.start or row[2]
                    if keep:
                        retry_ids.append(row[3])
            if done:
                conn.execute(
                    sql.SQL(queries()["dlq_audit_progress"]),
                    {"affected": len(done), "audit_id": outcome.audit_id},
                )
                faults.checkpoint("dlq.batch")  # chaos: die before this batch commits
        if not done:
            return changed, retry_ids
        if keep:
            changed += done
        outcome.affected += len(done)
        after_id = max(done)
        progress(outcome.affected, outcome.would_affect)


def record_wave(conn: psycopg.Connection[Any], outcome: Outcome, verdict: WaveVerdict) -> None:
    """Count a watched wave in the outcome and its audit row."""
    outcome.published += verdict.published
    outcome.came_back += verdict.came_back
    outcome.stopped = verdict.stopped
    with conn.transaction():
        conn.execute(
            sql.SQL(queries()["watch_progress"]),
            {
                "published": outcome.published,
                "came_back": outcome.came_back,
                "stopped": outcome.stopped,
                "audit_id": outcome.audit_id,
            },
        )
