"""Destinations' breakers, a gate of the publish round (:mod:`retry_scheduler.loops.gates`;
:mod:`retry_scheduler.core.breakers` says how a breaker moves).

Three parts, each a no-op when the policies declare no breaker (but for one query a minute: jobs
paused by a breaker since taken out of the declarations are let go):

- in a round (its transaction, its claim's locks), the claimed jobs of a destination whose breaker is
  open are paused: pending, attempts unspent, kept out of the claim until the breaker lets them go
  (``breaker_pause``); while it probes, only its probe goes out;
- after a round, the records it sent to destinations with a breaker and the deliveries that failed
  are added to their rows (the ingest adds the records that come back, ``Queue.insert_rows``);
- every :data:`TICK_S`, the loop (not its helpers) moves each breaker as
  :func:`~retry_scheduler.core.breakers.step` says: opens it, lets its probe out after the cool-down,
  closes it and lets its paused jobs go (:data:`LET_GO_BATCH` a tick, the oldest due first).

A round reads the breakers' states without locking their rows, and only the tick changes a state: a
job claimed as the breaker opens may still go out in that round (it was claimed while closed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from retry_scheduler.core import faults
from retry_scheduler.core.breakers import CLOSED, LET_ALL_GO, LET_PROBE_OUT, OPEN, step
from retry_scheduler.core.declarations import DestinationRules
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.core.metrics import Metrics, NoMetrics
from retry_scheduler.db.breakers import BreakerRecords
from retry_scheduler.db.queue import Queue

log = logging.getLogger(__name__)

#: How often the loop moves its breakers, in seconds.
TICK_S = 1.0
#: The most paused jobs a closed breaker lets go in one tick (the claim takes them in due order anyway).
LET_GO_BATCH = 10_000
#: Without any breaker declared, how often the loop looks for jobs a breaker no longer declared left
#: paused (none, but for such a change).
ORPHANS_EVERY_S = 60.0


class DestinationBreakers:
    """Applies the destinations' breakers to the publish loop (see the module)."""

    counts_as = "paused"

    def __init__(
        self,
        rules: Callable[[str], DestinationRules],
        records: BreakerRecords,
        queue: Queue,
        *,
        any_breaker: bool = True,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self._rules = rules
        self.records, self.queue = records, queue
        self.any_breaker = any_breaker
        self.clock = clock
        self.metrics: Metrics = metrics or NoMetrics()
        self._ticked_at = float("-inf")  # monotonic

    def covers(self, destination: str | None) -> bool:
        """Whether ``destination`` has a breaker (a round asks for each of its jobs)."""
        return bool(destination) and self._rules(destination or "").breaker is not None

    def apply(self, rows: list[OutgoingRow]) -> tuple[list[OutgoingRow], int]:
        """The claimed ``rows`` that may go out now, and how many were paused; in the round's transaction."""
        if not self.any_breaker or not rows:
            return rows, 0
        covered = sorted({r.destination for r in rows if r.destination and self.covers(r.destination)})
        states = self.records.states(covered)
        if not states:
            return rows, 0
        paused = [
            row.id
            for row in rows
            if row.destination in states and row.id != states[row.destination][1]  # the probe goes
        ]
        if not paused:
            return rows, 0
        self.records.pause_jobs(paused)
        faults.checkpoint("publish.paused")
        pausing = set(paused)
        return [row for row in rows if row.id not in pausing], len(paused)

    def after(
        self, rows: Sequence[OutgoingRow], acked: Sequence[tuple[int, int]], failed: Sequence[tuple[int, str]]
    ) -> None:
        """Add a round's records sent and deliveries failed to their destinations' breakers (after the
        round committed: a count lost to a crash only makes a share a little smaller)."""
        if not self.any_breaker or not rows:
            return
        destination = {row.id: row.destination for row in rows}
        counts: dict[str, list[int]] = {}
        for ids, slot in ((acked, 0), (failed, 1)):
            for job_id, _ in ids:
                d = destination.get(job_id)
                if d and self.covers(d):
                    counts.setdefault(d, [0, 0])[slot] += 1
        if counts:
            self.records.count_sent({d: (c[0], c[1]) for d, c in counts.items()})

    def _let_orphans_go(self) -> None:
        """Jobs paused for a destination whose breaker is no longer declared (taken out while open) go:
        nothing else would ever let them go."""
        orphans = [d for d in self.records.paused_destinations() if not self.covers(d)]
        if not orphans:
            return
        self.records.set_states(orphans, CLOSED, "its breaker is no longer declared", "")
        for destination in orphans:
            gone = self.records.let_go(destination, LET_GO_BATCH)
            log.warning(
                "%s job(s) paused for %s go: its breaker is no longer declared",
                len(gone),
                destination,
            )

    def tick(self) -> None:
        """Once a loop pass: every :data:`TICK_S`, move the breakers (:meth:`step_breakers`)."""
        self.step_breakers()

    def step_breakers(self, *, force: bool = False) -> list[tuple[str, str, str | None]]:
        """Every :data:`TICK_S` (or now, with ``force``): move every breaker; the changes made
        (destination, new state, why). Without breakers declared, only every :data:`ORPHANS_EVERY_S`
        the paused jobs of breakers no longer declared are let go."""
        began = time.monotonic()
        if not force and began - self._ticked_at < (TICK_S if self.any_breaker else ORPHANS_EVERY_S):
            return []
        self._ticked_at = began
        self._let_orphans_go()
        if not self.any_breaker:
            return []
        covered = [d for d in self.queue.known_destinations() if self.covers(d)]
        if not covered:
            return []
        now = datetime.fromtimestamp(self.clock(), UTC)
        changes: list[tuple[str, str, str | None]] = []
        with self.records.conn.transaction():
            for row, paused in self.records.lock(covered):
                breaker = self._rules(row.destination).breaker
                assert breaker is not None
                new, action = step(row, breaker, now)
                if action == LET_PROBE_OUT:
                    probe = self.records.let_go(row.destination, 1)
                    if probe:
                        new = replace(new, probe_job=probe[0][0], probe_retry_id=probe[0][1], probe_at=now)
                        log.info("breaker of %s: probe %s goes out", row.destination, probe[0][1])
                if new.state == CLOSED and (action == LET_ALL_GO or paused):
                    gone = self.records.let_go(row.destination, LET_GO_BATCH)
                    if gone:
                        faults.checkpoint("breaker.let_go")
                        log.info("breaker of %s closed: %s paused job(s) go", row.destination, len(gone))
                if new != row:
                    self.records.save(new)
                if new.state != row.state:
                    changes.append((row.destination, new.state, new.reason))
        for destination, state, reason in changes:
            if state == OPEN:
                self.metrics.incr("retry_scheduler.breakers.opened", 1)
                log.warning("breaker of %s open, its due jobs paused: %s", destination, reason)
            elif state == CLOSED:
                log.info("breaker of %s closed: %s", destination, reason)
            else:
                log.info("breaker of %s probing: its cool-down is over", destination)
        if not isinstance(self.metrics, NoMetrics):
            try:
                listed = self.records.statuses()
            except Exception as exc:  # metrics never stop the loop
                log.warning("breakers' gauges skipped: %s: %s", type(exc).__name__, exc)
            else:
                self.metrics.gauge("retry_scheduler.breakers.open", sum(b.state != CLOSED for b in listed))
                self.metrics.gauge("retry_scheduler.breakers.paused", sum(b.paused for b in listed))
        return changes
