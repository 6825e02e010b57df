"""The Spark bulk retry's statements on PostgreSQL through psycopg (its read of the selected jobs is
Spark's JDBC, rendered by :mod:`retry_scheduler.spark.selection`): the summary of its selection, the
breakers it leaves alone, its lock and audit row, and the batches its executors mark published.

A bulk replay holds a session-level advisory lock for its whole run (freed when its connection
closes, even if the driver dies), so two runs cannot publish the same jobs side by side. Each run,
dry runs included, writes a row in ``retry_dlq_audit`` (action ``bulk_replay``), as a dead-letter
replay does (the same statements: :class:`~retry_scheduler.db.dead_letters.DeadLetters`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from retry_scheduler.db.breakers import BreakerRecords
from retry_scheduler.db.connection import connect, require_migrated
from retry_scheduler.db.dead_letters import DeadLetters
from retry_scheduler.db.schema import q, queries
from retry_scheduler.db.selection import PAYLOAD_BYTES_SQL, Selection

SUMMARY_SQL: LiteralString = (
    "SELECT destination, count(*), min(id), max(id), max(payload_bytes) FROM ({inner}) AS selection "
    "GROUP BY destination ORDER BY destination"
)
SELECT_IDS_SQL: LiteralString = (
    f"SELECT id, destination, {PAYLOAD_BYTES_SQL} AS payload_bytes FROM retry_jobs WHERE {{where}}"
)
SELECT_FIRST_IDS_SQL: LiteralString = SELECT_IDS_SQL + " ORDER BY id LIMIT %(limit)s"
#: Marks one batch of acknowledged jobs published (moved to retry_published_jobs): the loop's own
#: mark (sql/queries.sql, ``mark_published``), given the ids and ack times as two array literals.
MARK_BATCH_SQL = sql.SQL(queries()["mark_published"])


def summary_query(selection: Selection, *fragments: LiteralString) -> tuple[sql.Composed, dict[str, object]]:
    """Count per destination (with min and max id, and the largest payload) of the selection and
    ``fragments`` (what the bulk retry can publish), parameterised for psycopg."""
    where, params = selection.where(*fragments)
    if selection.limit is None:
        inner = sql.SQL(SELECT_IDS_SQL).format(where=where)
    else:
        inner = sql.SQL(SELECT_FIRST_IDS_SQL).format(where=where)
        params["limit"] = selection.limit
    return sql.SQL(SUMMARY_SQL).format(inner=inner), params


def summarize(
    database_url: str, selection: Selection, *fragments: LiteralString
) -> list[tuple[str, int, int, int, int]]:
    """Per destination of the selection (and ``fragments``): its jobs, their lowest and highest id,
    and the largest payload in bytes."""
    query, params = summary_query(selection, *fragments)
    with connect(database_url) as conn:
        require_migrated(conn, database_url)
        rows = conn.execute(query, params).fetchall()
    return [(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4] or 0)) for r in rows]


def open_breakers(database_url: str, destinations: Sequence[str]) -> set[str]:
    """Of ``destinations``, those whose breaker is open or probing."""
    if not destinations:
        return set()
    with connect(database_url) as conn:
        return set(BreakerRecords(conn).states(sorted(destinations)))


class BulkAudit:
    """A run's audit row, on the run's locked connection: :meth:`start` writes it, :meth:`finish`
    records what the run published."""

    def __init__(self, conn: psycopg.Connection[Any], fields: Mapping[str, Any]) -> None:
        self._letters = DeadLetters(conn)
        self._fields = dict(fields)
        self.audit_id: int | None = None

    def start(self, matched: int, skipped: Mapping[str, int]) -> BulkAudit:
        """Write the row once the run has counted its selection (``skipped``: left alone, by cause)."""
        self.audit_id = self._letters.start_audit(
            {**self._fields, "matched": matched, "skipped": {k: v for k, v in skipped.items() if v}}
        )
        return self

    def finish(self, published: int) -> None:
        assert self.audit_id is not None
        self._letters.count_affected(self.audit_id, published)
        self._letters.finish_audit(self.audit_id)


@contextmanager
def locked_run(database_url: str, *, lock: bool, fields: Mapping[str, Any]) -> Iterator[BulkAudit | None]:
    """The run's connection (autocommit), holding the bulk replay lock when ``lock`` (None: another
    run holds it), and its audit row to start (``fields``: ``dlq_audit_start``'s but the counts)."""
    with connect(database_url, autocommit=True) as conn:
        require_migrated(conn, database_url)
        if lock:
            row = conn.execute(q("bulk_replay_lock")).fetchone()
            if not (row and row[0]):
                yield None
                return
        yield BulkAudit(conn, fields)


def marking_connection(database_url: str) -> psycopg.Connection[Any]:
    """An executor's connection for :func:`mark_batch` (autocommit: each batch commits by itself)."""
    return connect(database_url, autocommit=True)


def mark_batch(conn: psycopg.Connection[Any], ids: str | Sequence[int], acked_ms: str | Sequence[int]) -> int:
    """Mark a batch of acknowledged jobs published (``ids`` and their ack times in ms, as lists or array
    literals); how many were marked."""
    return conn.execute(MARK_BATCH_SQL, {"ids": ids, "acked_ms": acked_ms}).rowcount
