"""The bulk replay's lock and audit row: one run at a time, each recorded like a DLQ replay.

A bulk replay holds a session-level advisory lock for its whole run (freed when its connection
closes, even if the driver dies), so two runs cannot publish the same jobs side by side; a second
one exits 2 saying so. Each run, dry runs included, writes a row in ``retry_dlq_audit``
(action ``bulk_replay``): who asked, from where, the filter, how many jobs matched, which were
left alone and why, and, when it ends, how many were published.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from retry_scheduler.db.connection import connect, require_migrated
from retry_scheduler.db.schema import queries
from retry_scheduler.spark.selection import BulkRetryError

_LOCK = (7311, "retry_bulk_replay")
SOURCES = ("cli", "dag")


@dataclass
class BulkAudit:
    """The open audit row of a run; :meth:`finish` records what it published."""

    conn: psycopg.Connection[Any]
    audit_id: int

    def finish(self, published: int) -> None:
        self.conn.execute(
            sql.SQL(queries()["dlq_audit_progress"]), {"affected": published, "audit_id": self.audit_id}
        )
        self.conn.execute(sql.SQL(queries()["dlq_audit_finish"]), {"audit_id": self.audit_id})


@contextmanager
def guarded_run(
    database_url: str,
    *,
    actor: str,
    source: str,
    run_id: str,
    dry_run: bool,
    selection: dict[str, Any],
    rate_per_s: float | None = None,
) -> Iterator[Any]:
    """Hold the bulk replay lock (not for a dry run) and open the run's audit row; yields ``start``.

    ``start(matched, skipped)`` writes the audit row once the run has counted its selection and
    returns the :class:`BulkAudit`; the lock is released when the block ends.
    """
    if source not in SOURCES:
        raise BulkRetryError(f"--source must be one of {', '.join(SOURCES)}")
    if not actor or len(actor) > 200 or not actor.isprintable():
        raise BulkRetryError("--actor must be 1-200 printable characters")
    with connect(database_url, autocommit=True) as conn:
        require_migrated(conn, database_url)
        if not dry_run:
            row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", _LOCK).fetchone()
            if not (row and row[0]):
                raise BulkRetryError("another bulk replay is in progress; run again when it has finished")

        def start(matched: int, skipped: dict[str, int]) -> BulkAudit:
            row = conn.execute(
                sql.SQL(queries()["dlq_audit_start"]),
                {
                    "action": "bulk_replay",
                    "dry_run": dry_run,
                    "actor": actor,
                    "source": source,
                    "run_id": run_id,
                    "filter": Jsonb(selection),
                    "reset_attempts": False,
                    "rate_per_s": rate_per_s,
                    "matched": matched,
                    "skipped": Jsonb({k: v for k, v in skipped.items() if v}),
                    "watch": None,
                    "approved_by": None,
                },
            ).fetchone()
            assert row is not None
            return BulkAudit(conn, int(row[0]))

        yield start
