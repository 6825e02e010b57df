"""What a loop run counted (the ingest's and the publish loop's), added up field by field, logged and
returned to Airflow as XCom."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

log = logging.getLogger(__name__)

#: A publish round slower than this is logged with where its time went (the claim, the broker's
#: acknowledgements, the marks and the commit): a stalled round says which part stalled.
SLOW_ROUND_S = 5.0


@dataclass
class RunCounts:
    """Counts added up over batches, rounds, helpers and worker processes, by their fields: numbers
    add, dicts of counts add key by key, the fields in ``LARGEST`` keep the larger, and the ``SLOWEST``
    pair (seconds, how much work) keeps the slower unit of work's. A new count is one field."""

    #: The seconds of the slowest unit of work and how much it held (records, jobs).
    SLOWEST: ClassVar[tuple[str, str]]
    #: Fields that keep the larger of two values rather than their sum.
    LARGEST: ClassVar[tuple[str, ...]] = ()
    #: Dict fields left out of :meth:`as_dict` while empty.
    OMIT_EMPTY: ClassVar[tuple[str, ...]] = ()

    #: Times the run lost its database (a failover, a restart) and went on once connected again.
    reconnects: int = 0

    def add(self, other: Self) -> None:
        slowest_s, slowest_n = self.SLOWEST
        for f in fields(self):
            name = f.name
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in (slowest_s, slowest_n):
                continue
            if name in self.LARGEST:
                setattr(self, name, max(mine, theirs))
            elif isinstance(mine, dict):
                for key, n in theirs.items():
                    mine[key] = mine.get(key, 0) + n
            else:
                setattr(self, name, mine + theirs)
        if getattr(other, slowest_s) > getattr(self, slowest_s):
            setattr(self, slowest_s, getattr(other, slowest_s))
            setattr(self, slowest_n, getattr(other, slowest_n))

    def as_dict(self) -> dict[str, Any]:
        """Every field (dicts as plain dicts, seconds to the millisecond)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                if not value and f.name in self.OMIT_EMPTY:
                    continue
                value = dict(value)
            elif isinstance(value, float):
                value = round(value, 3)
            out[f.name] = value
        return out


@dataclass
class IngestCounts(RunCounts):
    """What one ingest run did; logged and returned to Airflow as XCom."""

    consumed: int = 0
    stored: int = 0
    duplicates: int = 0
    pending: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    #: Records whose timestamp was outside the trusted window: their ingest time counted instead.
    untrusted_timestamps: int = 0
    #: The batch that took longest to store: its seconds and records.
    slowest_batch_s: float = 0.0
    slowest_batch_records: int = 0
    #: Letters read from other tools' dead-letter topics, by format (``core/adopt.py``).
    adopted: Counter[str] = field(default_factory=Counter)
    #: Pointer-only letters whose source record could not be read (``loops/sources.py``).
    letters_unreadable: int = 0

    SLOWEST = ("slowest_batch_s", "slowest_batch_records")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IngestCounts:
        """Inverse of :meth:`as_dict` (counts come back from worker processes as dicts)."""
        return cls(**{**d, "dead": Counter(d["dead"]), "adopted": Counter(d.get("adopted", {}))})


@dataclass
class PublishCounts(RunCounts):
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

    SLOWEST = ("slowest_round_s", "slowest_round_jobs")
    LARGEST = ("lateness_max_s",)
    OMIT_EMPTY = ("gated",)

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

    def say_slow(self, phases: dict[str, float]) -> None:
        """Log this round (slower than :data:`SLOW_ROUND_S`) with the seconds of its parts; what is left
        of its time went to the marks and the commit."""
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items() if seconds >= 0.05)
        rest = self.slowest_round_s - sum(phases.values())
        log.warning(
            "slow publish round: %.1f s for %s jobs (%s%smarks and commit %.1f s)",
            self.slowest_round_s, self.claimed, parts, ", " if parts else "", max(0.0, rest),
        )  # fmt: skip
