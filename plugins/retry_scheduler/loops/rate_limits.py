"""Per-destination rate limits, a gate of the publish round (:mod:`retry_scheduler.loops.gates`): at most
a destination's ``rate_limit`` records per second go to it, whatever its backlog and however many
publishers run.

A round claims due jobs as always; of a rate-limited destination's, it publishes what the destination's
slots allow now and makes the rest due later, one slot each (``pace_destinations`` in queries.sql keeps
the slots in the destination's row, shared by every publisher). Put off, a job stays pending with its
attempt: it is only due later (never earlier), so the due index ahead of the claim holds only what may
go now, and the other destinations' jobs are not held up behind it. Its lateness is then counted from
its slot: a rate limit is the deployment's own choice, not a late publish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from retry_scheduler.core.declarations import DestinationRules
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.db.slots import DestinationSlots

#: A destination idle for a while may receive this many seconds' worth of its rate at once.
BURST_S = 0.1


class DestinationRateLimits:
    """Applies the destinations' rate limits to the jobs of a round (see the module)."""

    counts_as = "deferred"

    def __init__(
        self, rules: Callable[[str], DestinationRules], slots: DestinationSlots, *, any_limit: bool = True
    ) -> None:
        """``rules``: a destination's resolved rules; ``any_limit``: whether the deployment declares
        any limit (without, a round costs nothing)."""
        self._rules = rules
        self.slots = slots
        self.any_limit = any_limit

    def rate(self, destination: str | None) -> float | None:
        return None if destination is None else self._rules(destination).rate_limit

    def apply(self, rows: list[OutgoingRow]) -> tuple[list[OutgoingRow], int]:
        """The claimed ``rows`` that may be published now, and how many were put off to later slots;
        in the round's transaction (the claim's locks and the destinations' rows)."""
        if not self.any_limit:
            return rows, 0
        limited: dict[str, list[OutgoingRow]] = {}
        for row in rows:
            if self.rate(row.destination) is not None:
                limited.setdefault(row.destination or "", []).append(row)
        if not limited:
            return rows, 0
        rates = {d: self.rate(d) or 0.0 for d in limited}
        slots = self.slots.pace_destinations({d: (len(rs), rates[d]) for d, rs in limited.items()}, BURST_S)
        put_off: list[tuple[int, datetime]] = []
        for destination, claimed in limited.items():
            allowed, first_slot = slots.get(destination, (len(claimed), None))
            if first_slot is None or allowed >= len(claimed):
                continue
            gap = timedelta(seconds=1 / rates[destination])
            # The oldest due go first (the claim's order spans its lanes: sort again).
            claimed.sort(key=lambda r: (r.due_at, r.id))
            put_off += [(row.id, first_slot + n * gap) for n, row in enumerate(claimed[allowed:])]
        if not put_off:
            return rows, 0
        self.slots.defer_jobs(put_off)
        later = {job_id for job_id, _ in put_off}
        return [row for row in rows if row.id not in later], len(put_off)

    def after(
        self, rows: Sequence[OutgoingRow], acked: Sequence[tuple[int, int]], failed: Sequence[tuple[int, str]]
    ) -> None:
        """Nothing: the slots were taken in the round."""

    def tick(self) -> None:
        """Nothing: the slots live in the destinations' rows."""
