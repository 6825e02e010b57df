"""What a publish run did: its counts, logged and returned to Airflow as XCom."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PublishCounts:
    """What one publish run did; logged and returned to Airflow as XCom."""

    claimed: int = 0
    #: Of those, claimed in lanes (fair publishing while the oldest-first claim was behind).
    fair_claimed: int = 0
    #: Of those, put off to later slots by their destination's rate limit.
    deferred: int = 0
    #: Of those, paused by their destination's open breaker.
    paused: int = 0
    #: Of those, kept back by another gate (:mod:`retry_scheduler.loops.gates`), by what it counts them as.
    gated: dict[str, int] = field(default_factory=dict)
    published: int = 0
    dead_published: int = 0
    failed: int = 0
    lateness_max_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    #: The round that took longest (claim, produce, acknowledgements, mark): its seconds and jobs.
    slowest_round_s: float = 0.0
    slowest_round_jobs: int = 0

    def keep(self, counted_as: str, n: int) -> None:
        """Count ``n`` jobs a gate kept back, as ``paused``, ``deferred`` or its own name (``gated``)."""
        if counted_as in ("paused", "deferred"):
            setattr(self, counted_as, getattr(self, counted_as) + n)
        elif n:
            self.gated[counted_as] = self.gated.get(counted_as, 0) + n

    @property
    def kept_back(self) -> int:
        """The jobs every gate kept back."""
        return self.paused + self.deferred + sum(self.gated.values())

    def add(self, other: PublishCounts) -> None:
        self.claimed += other.claimed
        self.fair_claimed += other.fair_claimed
        self.deferred += other.deferred
        self.paused += other.paused
        for k, v in other.gated.items():
            self.gated[k] = self.gated.get(k, 0) + v
        self.published += other.published
        self.dead_published += other.dead_published
        self.failed += other.failed
        self.lateness_max_s = max(self.lateness_max_s, other.lateness_max_s)
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        if other.slowest_round_s > self.slowest_round_s:
            self.slowest_round_s, self.slowest_round_jobs = other.slowest_round_s, other.slowest_round_jobs

    def as_dict(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "fair_claimed": self.fair_claimed,
            "deferred": self.deferred,
            "paused": self.paused,
            **({"gated": dict(self.gated)} if self.gated else {}),
            "published": self.published,
            "dead_published": self.dead_published,
            "failed": self.failed,
            "errors": dict(self.errors),
            "slowest_round_s": round(self.slowest_round_s, 3),
            "slowest_round_jobs": self.slowest_round_jobs,
        }
