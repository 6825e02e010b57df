"""Where a publisher's claims start: its floor in the due index, the sweeps below it, and the lanes
of fair publishing (a mixin of :class:`~retry_scheduler.loops.publish.Publisher`).

A claim from the due index's head walks every entry PostgreSQL cannot remove yet (jobs published
since the oldest snapshot any session holds): so a publisher claims from its *floor*, where its last
claim left nothing claimable behind, and *sweeps* from the head now and then for what fell due below
it. While the oldest-first claim is behind, every other destination gets a *lane* of its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.db.store import Store
from retry_scheduler.loops.handover import LoopTenure

log = logging.getLogger(__name__)

#: A claim's scan of the due index starts this long before where the publisher's previous claim
#: left nothing behind: jobs stored (or released) with a due time just past while it claimed.
FLOOR_LAG = timedelta(seconds=1)
#: A sweep (a claim of every due job however old) comes at the latest this many times its own
#: duration after the last one, and never more than SWEEP_MAX_EVERY_S after it.
SWEEP_COST_SHARE = 20
SWEEP_MAX_EVERY_S = 60.0
#: How often a publish loop records its floor and next sweep (``retry_loops``) for the loop that
#: relieves it, whose publishers start from there instead of sweeping at once.
SHARE_FLOOR_EVERY_S = 2.0

#: Fair publishing: while the oldest-first claim is behind (full, its newest job due more than
#: LANE_BEHIND before the claim began), every other destination the publisher knows of gets a lane: a
#: claim of its own oldest due jobs in the same round (Publisher.claim_lanes), up to an equal share of
#: the batch (at least LANE_MIN_QUOTA each). A destination with a million due jobs then delays another
#: destination's jobs by a round, not by the million.
LANE_BEHIND = timedelta(seconds=0.5)
LANE_MIN_QUOTA = 10
#: How often a publisher that is behind reads the destinations jobs were stored for (retry_destinations).
LANE_REFRESH_S = 5.0


class ClaimFloors:
    """A publisher's claim floor, sweeps and lanes; the publisher sets the attributes below."""

    settings: Settings
    store: Store
    helpers: Sequence[ClaimFloors]
    _tenure: LoopTenure | None

    def _init_floors(self) -> None:
        self._floor: datetime | None = None
        self._sweep_after = 0.0  # monotonic; 0: the first claim is a sweep
        #: Held by the publisher of the loop that sweeps (shared with the helpers by ``run``): one
        #: sweeps at a time, the others claim from their floors meanwhile.
        self._sweeping = threading.Lock()
        self._holds_sweep = False
        self._shared_at = float("-inf")  # monotonic: when it last recorded its floor
        #: Every destination this publisher knows of, and where its lane's claims start (None: its
        #: oldest due job); see :meth:`claim_lanes`.
        self._lane_floors: dict[str, datetime | None] = {}
        self._lanes_read_at = float("-inf")  # monotonic: when it last read retry_destinations
        #: Jobs stored below the floor, told by the batches that stored them (LISTEN/NOTIFY).
        self._overdue = self.store.queue.listen_overdue()
        #: Jobs this publisher failed to deliver, claimable again after their backoff: [monotonic time
        #: their backoff ends, their due time] (see :meth:`come_back`).
        self._comebacks: list[tuple[float, datetime]] = []
        #: What the last sweep found below the floor, and when it began (see :meth:`say_found_below`).
        self._found_below: list[datetime] = []
        self._found_at: datetime | None = None

    @property
    def floor(self) -> datetime | None:
        """Where this publisher's claims start in the due index between sweeps (None before its first)."""
        return self._floor

    def claim_floor(self) -> datetime | None:
        """Where this round's claim starts in the due index; None for a sweep, from its head.

        Every job published since the oldest snapshot any session holds (a long report, a dump, a
        Spark job reading over JDBC) keeps its entry in the due index, below the jobs still pending,
        and PostgreSQL can neither remove those entries nor mark them dead until that snapshot ends:
        a claim from the index's head walks all of them, and at thousands of retries a second claims
        grow to seconds. So a claim starts where this publisher's previous claim left nothing
        claimable behind (less :data:`FLOOR_LAG`). A job stored below that mark (a record stored
        long after its due time) is told of by the batch that stored it
        (:mod:`retry_scheduler.db.overdue`), so is a batch whose transaction committed a second or
        more after its jobs fell due, and this publisher knows of the jobs whose delivery it saw
        fail (:meth:`come_back`): the claims start just below them, and from there they claim
        upwards round after round until a claim is not full. What else falls due below the mark (a
        job another publisher's delivery failed, one a crashed publisher released) is claimed by
        the next sweep, which comes after at most
        :data:`SWEEP_COST_SHARE` times the last sweep's duration (so within milliseconds when the
        index is clean, and rarely while a snapshot is held: sweeps stay about 5 % of the
        publisher's time) and never more than :data:`SWEEP_MAX_EVERY_S` apart. One publisher of a
        loop sweeps at a time (a sweep under a held snapshot takes seconds): one whose sweep is due
        while another sweeps claims from its floor, and sweeps at its next round.
        """
        if self._floor is None:
            return None
        overdue_ms = self._overdue.take()
        if overdue_ms is not None:  # stored below the floor: claimed from just below them, at once
            self._lower_floor(datetime.fromtimestamp(overdue_ms / 1000, tz=UTC))
        now = time.monotonic()
        back = [due for at, due in self._comebacks if at <= now]
        if back:  # their backoff is over: claimed from just below the earliest
            self._comebacks = [(at, due) for at, due in self._comebacks if at > now]
            self._lower_floor(min(back))
        if now < self._sweep_after or not self._sweeping.acquire(blocking=False):
            return self._floor
        self._holds_sweep = True
        return None

    def _lower_floor(self, due: datetime) -> None:
        """Start the claims just below ``due`` (a job claimable below the floor) until they have
        claimed everything from there: a claim that comes back full leaves the floor at its newest job
        (:meth:`_after_claim`), so a thousand such jobs are claimed round after round, in due order,
        not one claim's worth and the rest at the next sweep."""
        below = due - FLOOR_LAG
        if self._floor is not None and below < self._floor:
            self._floor = below

    def come_back(self, due: list[tuple[datetime | None, float]]) -> None:
        """Jobs whose delivery failed (``(due time, seconds until their backoff ends)`` each): the
        first claim after a backoff ends starts below them. Their due time is past, below the floor
        the claims have moved on to, and a sweep may be a minute away (a held snapshot makes sweeps
        rare): without this a failed delivery backed off for one second would wait for it. One
        entry per backoff ending in the same tenth of a second (rounded up), with the earliest due
        time: a destination whose every delivery fails keeps a few entries a round, not one a job."""
        now = time.monotonic()
        earliest: dict[float, datetime] = {}
        for at, in_s in due:
            if at is not None:
                ends = math.ceil(max(0.0, in_s) * 10) / 10  # up: never before the backoff ends
                earliest[ends] = min(earliest.get(ends, at), at)
        self._comebacks += [(now + ends, at) for ends, at in earliest.items()]

    def _swept(self) -> None:
        """After a claim: let another publisher of the loop sweep."""
        if self._holds_sweep:
            self._holds_sweep = False
            self._sweeping.release()

    def take_over(self, floor: datetime, sweep_in_s: float) -> None:
        """Start from a predecessor's ``floor`` and sweep when it would have, ``sweep_in_s`` from now,
        instead of sweeping at once (see :meth:`claim_floor`): the predecessor's claims left nothing
        claimable below its floor, and what fell due there since is the sweep's, as it would have
        been the predecessor's."""
        self._floor = floor
        self._sweep_after = time.monotonic() + max(0.0, min(sweep_in_s, SWEEP_MAX_EVERY_S))

    def _share_floor(self) -> None:
        """Every :data:`SHARE_FLOOR_EVERY_S`, record the loop's floor (its publishers' lowest) and its
        soonest sweep, for the loop that relieves it; nothing until each of them has claimed once."""
        if self._tenure is None or time.monotonic() - self._shared_at < SHARE_FLOOR_EVERY_S:
            return
        publishers = (self, *self.helpers)
        floors = [p._floor for p in publishers if p._floor is not None]
        if len(floors) < len(publishers):
            return
        self._shared_at = time.monotonic()
        sweep_in_s = min(p._sweep_after for p in publishers) - time.monotonic()
        self.store.loops.claim_state(self._tenure.worker, min(floors), sweep_in_s)

    def _after_claim(self, floor: datetime | None, rows: list[OutgoingRow], began: float) -> None:
        """Move the floor to where this claim left nothing claimable behind; time the next sweep."""
        if floor is None:
            took = time.monotonic() - began
            self._sweep_after = time.monotonic() + min(SWEEP_MAX_EVERY_S, SWEEP_COST_SHARE * took)
            self._note_found_below(rows)
        if len(rows) < self.settings.publish_batch:
            # Every job due by the claim's start was claimed, is another publisher's, or waits out
            # a backoff.
            mark = self.store.queue.claimed_up_to
        else:
            # Full: every job due before the last one claimed was claimed or is someone else's.
            mark = max((row.due_at for row in rows if row.due_at is not None), default=None)
        if mark is not None:
            new_floor = mark - FLOOR_LAG
            self._floor = new_floor if floor is None or self._floor is None else max(self._floor, new_floor)

    def _note_found_below(self, swept: list[OutgoingRow]) -> None:
        """Keep the due times of the jobs a sweep found below the floor and below what this publisher
        knew of (its backoffs), for :meth:`say_found_below` once the round's transaction ended."""
        if self._floor is None:
            return
        floor = min([self._floor, *(due for _, due in self._comebacks)])
        self._found_below = [row.due_at for row in swept if row.due_at is not None and row.due_at < floor]
        self._found_at = self.store.queue.claimed_up_to

    def say_found_below(self) -> None:
        """After the round's transaction: log the jobs its sweep found below the floor that no notice
        covers, claimable there with no one told (another publisher's failed delivery, a crashed
        publisher's jobs): they waited for a sweep. A notice of jobs the sweep saw just stored reaches
        this session only once its transaction ends (PostgreSQL holds notices back until then): those
        did not wait, and are left out."""
        found, self._found_below = self._found_below, []
        if not found:
            return
        told = self._overdue.peek()
        if told is not None:
            found = [due for due in found if due < datetime.fromtimestamp(told / 1000, tz=UTC)]
        if found and self._found_at is not None:
            log.info(
                "a sweep claimed %s jobs due below the claims' floor, the oldest due %.1f s before it",
                len(found), (self._found_at - min(found)).total_seconds(),
            )  # fmt: skip

    def claim_lanes(self, claimed: list[OutgoingRow]) -> list[OutgoingRow]:
        """After the oldest-first claim (``claimed``): when it is behind, each other destination's
        oldest due jobs, up to an equal share of the batch each (fair publishing).

        The oldest-first claim serves a backlog in due order, so without lanes a destination whose
        jobs fell due during another's flood would wait for the whole flood. A lane starts at the
        higher of the publisher's floor and its own (where its last lane claim left nothing
        claimable of that destination behind, less :data:`FLOOR_LAG`), for the reason the floor
        exists (see :meth:`claim_floor`); what falls due below it later is the oldest-first claim's.
        """
        for row in claimed:
            if row.destination:
                self._lane_floors.setdefault(row.destination, None)
        began = self.store.queue.claimed_up_to
        if len(claimed) < self.settings.publish_batch or began is None:
            return []
        newest = max((row.due_at for row in claimed if row.due_at is not None), default=None)
        if newest is None or newest > began - LANE_BEHIND:
            return []
        if time.monotonic() - self._lanes_read_at >= LANE_REFRESH_S:
            for destination in self.store.queue.known_destinations():
                self._lane_floors.setdefault(destination, None)
            self._lanes_read_at = time.monotonic()
        served = {row.destination for row in claimed}
        lanes = {d: self._lane_floor(d) for d in self._lane_floors if d not in served}
        if not lanes:
            return []
        quota = max(LANE_MIN_QUOTA, self.settings.publish_batch // len(lanes))
        rows, lanes_began = self.store.queue.claim_lanes(lanes, quota)
        # SKIP LOCKED does not skip the rows of this very transaction: none is claimed twice because
        # no lane is of a destination that claim served, and this keeps it so.
        ids = {row.id for row in claimed}
        rows = [row for row in rows if row.id not in ids]
        newest_of: dict[str, datetime] = {}
        count_of: dict[str, int] = {}
        for row in rows:
            assert row.destination is not None and row.due_at is not None
            count_of[row.destination] = count_of.get(row.destination, 0) + 1
            newest_of[row.destination] = max(newest_of.get(row.destination, row.due_at), row.due_at)
        for destination, floor in lanes.items():
            full = count_of.get(destination, 0) >= quota
            mark = newest_of[destination] if full else lanes_began
            self._lane_floors[destination] = (
                mark - FLOOR_LAG if floor is None else max(floor, mark - FLOOR_LAG)
            )
        return rows

    def _lane_floor(self, destination: str) -> datetime | None:
        own, floor = self._lane_floors.get(destination), self._floor
        if own is None or floor is None:
            return own if floor is None else floor
        return max(own, floor)
