"""A breaker per destination, declared in the policies module (``Destination(..., breaker=Breaker())``,
or the older ``BREAKERS`` dict), and how it moves.

When the records sent to a destination fail to be delivered, or come back to the retry topics
(their consumer failed them again on their next attempt), past a share, the destination's breaker
opens: its due jobs are paused, pending and with their attempts unspent, rather than published into
a consumer that fails them again. After a cool-down one probe record goes out; if it is delivered
and does not come back within the probe window, the breaker closes and the paused jobs go, the oldest
first; otherwise it opens again for another cool-down::

    from retry_scheduler.core.breakers import Breaker

    DESTINATIONS = [
        Destination("payments", breaker=Breaker(failure_rate=0.5, min_records=20, window="1m", cool_down="30s")),
        Destination("*", breaker=Breaker(), allow=False),  # every other destination, allowing none
    ]

closed --(share of bad records >= failure_rate, over >= min_records)--> open
open --(cool_down elapsed)--> probing: one paused job goes out (not when opened by hand: it stays open)
probing --(the probe delivered and away for probe_window)--> closed: the paused jobs go
probing --(the probe came back, or was not delivered within probe_window)--> open

The share is taken over a sliding window (the current window and the one before, weighted by how
much of it is still inside ``window``). Everything here is a pure function of its inputs (the time
is a parameter); :mod:`retry_scheduler.loops.breakers` applies it to the destinations' rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from retry_scheduler.core.durations import format_duration_ms, parse_duration_ms

CLOSED, OPEN, PROBING = "closed", "open", "probing"
STATES = (CLOSED, OPEN, PROBING)


class BreakerError(ValueError):
    """A :class:`Breaker` is declared wrong; the message names the field."""


@dataclass(frozen=True)
class Breaker:
    """When a destination's breaker opens, and how it closes again (see the module)."""

    #: The share of the records sent (failed deliveries plus records come back, over records sent)
    #: at which the breaker opens: above 0, at most 1.
    failure_rate: float = 0.5
    #: The fewest records sent within ``window`` before the breaker may open (a few records failing
    #: say little).
    min_records: int = 20
    #: How far back the share is counted.
    window: str | float = "1m"
    #: How long the breaker stays open before its probe goes out.
    cool_down: str | float = "30s"
    #: How long the probe must stay away (delivered, not back on the retry topics) to close the breaker.
    probe_window: str | float = "30s"

    def __post_init__(self) -> None:
        rate = self.failure_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise BreakerError(f"failure_rate={rate!r}: give a share above 0 and at most 1, e.g. 0.5")
        if (
            isinstance(self.min_records, bool)
            or not isinstance(self.min_records, int)
            or self.min_records < 1
        ):
            raise BreakerError(
                f"min_records={self.min_records!r}: give a whole number of records, at least 1"
            )
        for name in ("window", "cool_down", "probe_window"):
            try:
                ms = parse_duration_ms(getattr(self, name))
            except (ValueError, TypeError) as exc:
                raise BreakerError(f"{name}: {exc}") from None
            if ms < 1000:
                raise BreakerError(f"{name}={getattr(self, name)!r}: give at least 1s")

    @property
    def window_s(self) -> float:
        return parse_duration_ms(self.window) / 1000

    @property
    def cool_down_s(self) -> float:
        return parse_duration_ms(self.cool_down) / 1000

    @property
    def probe_window_s(self) -> float:
        return parse_duration_ms(self.probe_window) / 1000

    def describe(self) -> str:
        return (
            f"opens at {self.failure_rate:.0%} of >= {self.min_records} records over "
            f"{format_duration_ms(parse_duration_ms(self.window))}, probes after "
            f"{format_duration_ms(parse_duration_ms(self.cool_down))}, closes when the probe stays away "
            f"{format_duration_ms(parse_duration_ms(self.probe_window))}"
        )


@dataclass(frozen=True)
class BreakerRow:
    """A destination's breaker as its row keeps it (``retry_destinations``, migration 0024)."""

    destination: str
    state: str = CLOSED
    since: datetime | None = None
    reason: str | None = None
    #: Who opened it by hand (``breakers open``): it stays open, without a probe, until closed by hand.
    by: str | None = None
    trips: int = 0
    window_at: datetime | None = None
    sent: int = 0
    failed: int = 0
    came_back: int = 0
    prev_sent: int = 0
    prev_failed: int = 0
    prev_came_back: int = 0
    probe_job: int | None = None
    probe_retry_id: str | None = None
    probe_at: datetime | None = None
    probe_came_back: bool = False
    #: When the probe was acknowledged by the broker (None: not published yet).
    probe_published_at: datetime | None = None
    #: The probe's last delivery error, if its delivery failed.
    probe_error: str | None = None


#: What the loop must do besides writing the row: let the probe out, or let every paused job go.
LET_PROBE_OUT, LET_ALL_GO = "probe", "all"


def _fresh(row: BreakerRow, now: datetime) -> BreakerRow:
    return replace(
        row, window_at=now, sent=0, failed=0, came_back=0, prev_sent=0, prev_failed=0, prev_came_back=0,
        probe_job=None, probe_retry_id=None, probe_at=None, probe_came_back=False,
        probe_published_at=None, probe_error=None,
    )  # fmt: skip


def _open(row: BreakerRow, now: datetime, reason: str) -> BreakerRow:
    return replace(_fresh(row, now), state=OPEN, since=now, reason=reason, trips=row.trips + 1)


def windowed(row: BreakerRow, breaker: Breaker, now: datetime) -> BreakerRow:
    """The row's counts rolled over to the window ``now`` is in."""
    if row.window_at is None:
        return replace(row, window_at=now)
    elapsed = (now - row.window_at).total_seconds()
    width = breaker.window_s
    if elapsed < width:
        return row
    if elapsed < 2 * width:
        return replace(
            row, window_at=row.window_at + timedelta(seconds=width),
            prev_sent=row.sent, prev_failed=row.failed, prev_came_back=row.came_back,
            sent=0, failed=0, came_back=0,
        )  # fmt: skip
    return replace(
        row, window_at=now, prev_sent=0, prev_failed=0, prev_came_back=0, sent=0, failed=0, came_back=0
    )


def share(row: BreakerRow, breaker: Breaker, now: datetime) -> tuple[float, float, float]:
    """Over the sliding window: records sent, failed deliveries, records come back (estimates)."""
    elapsed = 0.0 if row.window_at is None else (now - row.window_at).total_seconds()
    weight = max(0.0, 1 - elapsed / breaker.window_s)
    return (
        row.sent + row.failed + weight * (row.prev_sent + row.prev_failed),
        row.failed + weight * row.prev_failed,
        row.came_back + weight * row.prev_came_back,
    )


def step(row: BreakerRow, breaker: Breaker, now: datetime) -> tuple[BreakerRow, str | None]:
    """The breaker's next row at ``now``, and what to do (:data:`LET_PROBE_OUT`, :data:`LET_ALL_GO`)."""
    if row.state == CLOSED:
        row = windowed(row, breaker, now)
        sent, failed, back = share(row, breaker, now)
        bad = failed + back
        if sent >= breaker.min_records and bad >= breaker.failure_rate * sent:
            window = format_duration_ms(parse_duration_ms(breaker.window))
            return _open(
                row, now,
                f"{round(bad)} of {round(sent)} records sent in the last {window} failed "
                f"({round(failed)} not delivered, {round(back)} came back): at least "
                f"{breaker.failure_rate:.0%} opens the breaker",
            ), None  # fmt: skip
        return row, None
    if row.state == OPEN:
        if row.by is not None:
            return row, None
        if row.since is None or (now - row.since).total_seconds() >= breaker.cool_down_s:
            return replace(_fresh(row, now), state=PROBING), LET_PROBE_OUT
        return row, None
    # PROBING
    if row.probe_job is None:
        return row, LET_PROBE_OUT  # nothing was paused when it started probing: the next paused job is
    if row.probe_came_back:
        return _open(
            row, now, f"the probe {row.probe_retry_id} came back: its consumer failed it again"
        ), None
    if row.probe_published_at is not None:
        if (now - row.probe_published_at).total_seconds() >= breaker.probe_window_s:
            return replace(
                _fresh(row, now), state=CLOSED, since=now, reason="the probe stayed away"
            ), LET_ALL_GO
        return row, None
    if row.probe_at is not None and (now - row.probe_at).total_seconds() >= breaker.probe_window_s:
        why = f": {row.probe_error}" if row.probe_error else ""
        return _open(row, now, f"the probe {row.probe_retry_id} was not delivered{why}"), None
    return row, None
