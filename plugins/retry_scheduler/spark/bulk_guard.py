"""The bulk replay's lock and audit row: one run at a time, each recorded like a DLQ replay.

A bulk replay holds a session-level advisory lock for its whole run (freed when its connection
closes, even if the driver dies), so two runs cannot publish the same jobs side by side; a second
one exits 2 saying so. Each run, dry runs included, writes a row in ``retry_dlq_audit``
(action ``bulk_replay``): who asked, from where, the filter, how many jobs matched, which were
left alone and why, and, when it ends, how many were published.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from retry_scheduler.db.bulk_retry import BulkAudit, locked_run
from retry_scheduler.spark.selection import BulkRetryError

SOURCES = ("cli", "dag")


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
) -> Iterator[Callable[[int, dict[str, int]], BulkAudit]]:
    """Hold the bulk replay lock (not for a dry run) and open the run's audit row; yields ``start``.

    ``start(matched, skipped)`` writes the audit row once the run has counted its selection and
    returns the :class:`~retry_scheduler.db.bulk_retry.BulkAudit`; the lock is released when the
    block ends.
    """
    if source not in SOURCES:
        raise BulkRetryError(f"--source must be one of {', '.join(SOURCES)}")
    if not actor or len(actor) > 200 or not actor.isprintable():
        raise BulkRetryError("--actor must be 1-200 printable characters")
    fields = {
        "action": "bulk_replay", "dry_run": dry_run, "actor": actor, "source": source, "run_id": run_id,
        "filter": selection, "reset_attempts": False, "rate_per_s": rate_per_s, "watch": None,
        "approved_by": None,
    }  # fmt: skip
    with locked_run(database_url, lock=not dry_run, fields=fields) as audit:
        if audit is None:
            raise BulkRetryError("another bulk replay is in progress; run again when it has finished")
        yield audit.start
