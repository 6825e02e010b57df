"""The service's own VACUUM of ``retry_jobs`` where the server runs none.

``retry_jobs`` is a queue: every published job leaves a dead row version behind. With the server's
autovacuum off (as on this project's CI machines and some tuned deployments), or disabled on the
table, nothing removes them: at 5 000 retries/s the table grew by 570 MB in three minutes, and every
scan of it with it. The publish loop asks every :data:`CHECK_EVERY_S` whether autovacuum covers the
table; when it does not and the dead rows exceed :data:`DEAD_ROWS_MIN` plus :data:`DEAD_SHARE` of the
live ones (the thresholds the service gives autovacuum, migration 0009), it runs ``VACUUM`` itself, on
a connection and a thread of its own: its rounds never wait for it. One at a time, the next no sooner
than :data:`MIN_EVERY_S`, or :data:`REST_FACTOR` times the last one's duration, after it ended (VACUUM
stays under a tenth of a core), and none while the oldest snapshot a session holds is the one that was oldest at the last
VACUUM: that VACUUM removed what the snapshot let it, nothing that died since can be removed before
the snapshot ends, and each VACUUM of a table that only grows costs more (measured: one of 800 000
dead rows it could not remove held the loop's rounds back for two seconds). ``TRUNCATE false``: the end-of-table truncation takes a lock that would stop every
claim while it waits; ``SKIP_LOCKED``: a VACUUM still running (a previous loop's, an operator's) is
left to finish alone. ``RETRY_SELF_VACUUM=false`` turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from retry_scheduler.db.connection import connect
from retry_scheduler.db.queue import Queue

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
DEAD_ROWS_MIN = 10_000
DEAD_SHARE = 0.01
REST_FACTOR = 10.0
#: Never two VACUUMs closer than this (autovacuum's own naptime): each one scans every index of the
#: table whole, so a few large ones cost far less than many small ones.
MIN_EVERY_S = 60.0


class SelfVacuum:
    """Vacuums ``retry_jobs`` in the background when the server's autovacuum does not cover it."""

    def __init__(self, database_url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.database_url = database_url
        self.clock = clock
        self._checked_at = float("-inf")
        self._not_before = float("-inf")
        self._thread: threading.Thread | None = None
        self._left = 0  # dead rows the last VACUUM could not remove
        self._horizon: str | None = None  # the oldest snapshot's xmin when it ran
        #: The seconds each VACUUM this loop ran took.
        self.runs: list[float] = []

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def tick(self, queue: Queue) -> bool:
        """Called between publish rounds; every :data:`CHECK_EVERY_S` at most, reads the table's state
        on ``queue`` (one statistics read) and starts a VACUUM when one is due. True when it did."""
        now = self.clock()
        if now - self._checked_at < CHECK_EVERY_S or now < self._not_before or self.running():
            return False
        self._checked_at = now
        covered, dead, live, horizon = queue.vacuum_need()
        held = horizon is not None and horizon == self._horizon  # the same old snapshot: still held
        if covered or held or dead <= DEAD_ROWS_MIN + DEAD_SHARE * live:
            return False
        self._horizon = horizon
        log.info("retry_jobs has %s dead rows and the server's autovacuum does not cover it: vacuuming", dead)
        self._thread = threading.Thread(target=self._vacuum, name="retry-self-vacuum", daemon=True)
        self._thread.start()
        return True

    def _vacuum(self) -> None:
        began = time.monotonic()
        try:
            with connect(self.database_url, autocommit=True, statement_timeout=0) as conn:
                conn.execute("VACUUM (SKIP_LOCKED, TRUNCATE false) retry_jobs")
                left = conn.execute(
                    "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'retry_jobs'::regclass"
                ).fetchone()
                self._left = int(left[0]) if left and left[0] is not None else 0
        except Exception as exc:  # never stops the loop; the next check tries again
            log.warning("VACUUM retry_jobs failed: %s: %s", type(exc).__name__, exc)
        took = time.monotonic() - began
        self.runs.append(took)
        self._not_before = self.clock() + max(MIN_EVERY_S, REST_FACTOR * took)
        log.info("VACUUM retry_jobs took %.1f s; %s dead rows it could not remove yet", took, self._left)

    def close(self, timeout_s: float = 0.0) -> None:
        """Wait up to ``timeout_s`` for a VACUUM under way. One still running when the loop's process
        exits goes on in the server (a VACUUM does not notice its client leaving) until it is done."""
        if self._thread is not None:
            self._thread.join(timeout_s)
