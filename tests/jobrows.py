"""Published jobs for tests, made as the publish loop makes them.

A published job leaves ``retry_jobs`` for ``retry_published_jobs`` (migration 0014), so a test that
needs published jobs marks stored ones with the loop's own statement (``mark_published``) instead of
updating their status.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from retry_scheduler.db.schema import queries


def publish(conn: psycopg.Connection[Any], where: str, params: Any = (), *, at: datetime) -> int:
    """Mark the jobs of ``retry_jobs`` matching ``where`` published at ``at`` (timezone-aware);
    returns how many moved."""
    ids = [row[0] for row in conn.execute(f"SELECT id FROM retry_jobs WHERE {where}", params)]  # type: ignore[arg-type]
    acked_ms = round(at.timestamp() * 1000)
    moved = conn.execute(
        queries()["mark_published"], {"ids": ids, "acked_ms": [acked_ms] * len(ids)}
    ).rowcount  # type: ignore[arg-type]
    # to the microsecond (an acknowledgement time is whole milliseconds)
    conn.execute("UPDATE retry_published_jobs SET published_at = %s WHERE id = ANY(%s)", (at, ids))
    return moved
