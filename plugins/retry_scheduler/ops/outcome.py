"""What a dead-letter replay or purge did (or, on a dry run, would do): its :class:`Outcome`, said in
one line by :meth:`Outcome.summary`, and the :class:`Plan` of the jobs it would leave alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

from retry_scheduler.core.rates import UNPACED_UP_TO
from retry_scheduler.ops.watch import Watch

Action = Literal["replay", "purge", "reevaluate"]


@dataclass
class Outcome:
    """What a replay or purge did (or, on a dry run, would do)."""

    action: Action
    dry_run: bool
    filter: dict[str, Any]
    matched: int  # dead jobs the filter selected
    would_affect: int  # of those, the ones the action applies to
    affected: int  # changed (0 on a dry run)
    skipped: dict[str, int] = field(default_factory=dict)  # selected but left alone, by cause
    audit_id: int | None = None
    reset_attempts: bool = False
    #: A replay's pace (jobs per second per destination; None: not paced), and the seconds from its
    #: start to when its last job falls due.
    rate_per_s: float | None = None
    paced_s: float = 0.0
    #: Whether the pace is the default's (no rate was given).
    default_pace: bool = False
    #: The destinations paced at their rate limit (RATE_LIMITS) rather than the replay's pace, and theirs.
    rate_limited: dict[str, float] = field(default_factory=dict)
    #: A replay's jobs by destination (of those it would send).
    per_destination: dict[str, int] = field(default_factory=dict)
    #: A watched replay: how (``Watch.as_dict``), its waves, its records published and come back
    #: (within each wave's window), and why it stopped by itself (None: it did not).
    watch: dict[str, Any] | None = None
    waves: int = 0
    published: int = 0
    came_back: int = 0
    stopped: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verb = {"replay": "replayed", "purge": "purged", "reevaluate": "re-evaluated and made pending"}[
            self.action
        ]
        left = "; ".join(f"{n} {cause}" for cause, n in self.skipped.items() if n)
        head = (
            f"dry run: {self.would_affect} of {self.matched} selected dead jobs would be {verb}"
            if self.dry_run
            else f"{self.affected} of {self.matched} selected dead jobs {verb}"
        )
        return (
            head + (f" (left alone: {left})" if left else "") + self._pace() + self._watched()
            + f" [audit {self.audit_id}]"
        )  # fmt: skip

    def _watched(self) -> str:
        if self.watch is None:
            return ""
        how = Watch(**self.watch).describe()
        if self.dry_run:
            return f"; watched in {self.waves} waves ({how})"
        done = f"; watched ({how}): {self.published} published, {self.came_back} came back"
        return done + (f"; STOPPED: {self.stopped}" if self.stopped else "")

    def _pace(self) -> str:
        if self.action != "replay" or not self.would_affect:
            return ""
        shown = sorted(self.rate_limited.items())[:5]
        limits = ", ".join(f"{d} at most {r:,g}/s" for d, r in shown) + (
            ", ..." if len(self.rate_limited) > 5 else ""
        )
        if self.rate_per_s is None and self.rate_limited:
            # Not "not paced ... at most 20/s": the destinations with a rate limit are paced by it.
            return f"; paced only by the destinations' rate limits ({limits}); every other job due at once"
        return self._replay_pace() + (f"; {limits} (their rate limits, below the pace)" if limits else "")

    def _replay_pace(self) -> str:
        why = (
            f" (the default for a replay of more than {UNPACED_UP_TO:,} jobs of a destination; give a rate "
            "to change it, 0 for none)"
            if self.default_pace
            else ""
        )
        if self.rate_per_s is None:
            return "; not paced: every job due at once" + (
                f" (the default up to {UNPACED_UP_TO:,} jobs per destination)" if self.default_pace else ""
            )
        return (
            f"; paced at {self.rate_per_s:,g} jobs/s per destination{why}: the last "
            f"{'would fall' if self.dry_run else 'falls'} due about {self.paced_s:,.0f} s after the start"
        )


class Plan(NamedTuple):
    """What a replay or purge of a filter would do (``dlq_plan``): the jobs it selects, and of those
    the ones it would leave alone, by why."""

    matched: int
    invalid: int  # no usable destination
    not_on_dlq: int  # not yet published to their DLQ topic
    in_flight: int  # being sent to their DLQ topic right now (leased)
    refused: int  # of a destination the rules no longer allow
    parked: int  # replayed RETRY_PARK_AFTER_REPLAYS times and dead again, not asked for

    def skipped(self, action: Action) -> dict[str, int]:
        """The jobs ``action`` would leave alone, by why (in the words the outcome and audit use)."""
        if action == "replay":
            return {
                "invalid, no usable destination": self.invalid,
                "being sent to the DLQ topic now": self.in_flight,
                "destination not allowed": self.refused,
                "parked, replayed and dead again that often (ask for dead reason parked, or their ids)": (
                    self.parked
                ),
            }
        return {"not yet on the DLQ topic": self.not_on_dlq}
