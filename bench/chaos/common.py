"""Names and settings every part of a chaos run shares."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

Say = Callable[[str], None]
Header = tuple[str, bytes | None]

FAULTS = (
    "kill_ingest_consumed",
    "kill_ingest_stored",
    "kill_publish_produced",
    "kill_publish_dlq_produced",
    "kill_anytime",
    "broker_pause",
    "postgres_restart_ingest",
    "postgres_restart_publish",
    # A destination's breaker (bench/chaos/breaker.py): the publish loop killed holding or letting go.
    "kill_breaker_paused",
    "kill_breaker_let_go",
    # The bulk paths (bench/chaos/bulk.py): the operation killed mid-way, then run again.
    "bulk_retry_kill",
    "compaction_kill",
    "dlq_replay_kill",
    "watched_replay_kill",
)
POLICIES_PATH = Path(__file__).resolve().parents[1] / "chaos_policies.py"
MAX_ATTEMPTS, FATAL_ERROR = 3, "ChaosFatalError"  # as in bench/chaos_policies.py
KIND_HEADER = "chaos.kind"
INGEST_BATCH, PUBLISH_BATCH = 200, 100
#: The ingest loop's worker processes (the service's default).
INGEST_WORKERS = 2
#: Short leases so that a job held by a killed publisher is claimed again within seconds.
LEASE_MS, DELIVERY_TIMEOUT_MS = 4000, 2500
RESTART_DELAY_S = 1.0

COUNTS_SQL = "SELECT count(*), count(*) FILTER (WHERE status = 'published') FROM retry_jobs_all"
DONE_SQL = (
    "SELECT count(*), count(*) FILTER (WHERE status = 'published'"
    " OR (status = 'dead' AND dlq_published_at IS NOT NULL)) FROM retry_jobs_all"
)


class ChaosError(RuntimeError):
    """The chaos harness itself could not do its job (not a finding about the service)."""


def reached(database_url: str, after: str, count: int, timeout_s: float) -> bool:
    """Wait until ``count`` jobs are stored (or published); False on timeout."""
    import psycopg

    column = 0 if after == "stored" else 1
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(COUNTS_SQL).fetchone()
            if row and row[column] >= count:
                return True
            time.sleep(0.02)
    return False
